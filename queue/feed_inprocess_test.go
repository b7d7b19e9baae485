package queue

import (
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// refused is a publish answered with err.
type refused struct {
	msg *nats.Msg
	err chan error
}

func (f refused) Ok() <-chan *jetstream.PubAck { return nil }
func (f refused) Err() <-chan error            { return f.err }
func (f refused) Msg() *nats.Msg               { return f.msg }

func refusedWith(id string) refused {
	m := nats.NewMsg("telha.chg.acme.node.put")
	m.Header.Set(jetstream.MsgIDHeader, id)
	return refused{msg: m, err: make(chan error, 1)}
}

// TestDeadInProcess: a message id the stream keeps answering "in
// process" is taken for a proposal that will never be stored only once a
// publish sent after the first such answer was stored; before, it may
// still be stored late (a proposal in flight), and every other error
// proves nothing.
func TestDeadInProcess(t *testing.T) {
	const ackWait = 100 * time.Millisecond
	p := newFeedPublisher(newFeedConn(nil, ackWait), nil, Config{}, nil, FeedHooks{})
	inProcess := &jetstream.APIError{Code: 409, ErrorCode: jsMsgIDInProcess, Description: "duplicate message id is in process"}
	x := refusedWith("chg.acme.node.x.1.1")
	if p.deadInProcess(x, inProcess) {
		t.Fatal("dead at the first refusal")
	}
	if p.deadInProcess(x, inProcess) {
		t.Fatal("dead with no publish stored since")
	}
	p.lastAck = time.Now() // an ack within the ack wait: it may answer a publish sent before
	if p.deadInProcess(x, inProcess) {
		t.Fatal("dead on an ack that may answer a publish sent before the refusal")
	}
	p.inProcess["chg.acme.node.x.1.1"] = time.Now().Add(-time.Second)
	p.lastAck = time.Now() // an ack 1 s after the first refusal: a later publish was stored
	if !p.deadInProcess(x, inProcess) {
		t.Fatal("not dead though a publish sent after the refusal was stored since")
	}
	if p.deadInProcess(refusedWith("chg.acme.node.y.1.1"), inProcess) {
		t.Fatal("another id dead at its first refusal")
	}
	for _, err := range []error{jetstream.ErrAsyncPublishTimeout, errors.New("nats: timeout"), &jetstream.APIError{Code: 503, ErrorCode: 10008}} {
		if p.deadInProcess(x, err) {
			t.Fatalf("%v taken for a dead proposal", err)
		}
	}
}
