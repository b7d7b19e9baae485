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
	p := newFeedPublisher(newFeedConn(nil, time.Second), nil, Config{}, nil, FeedHooks{})
	inProcess := &jetstream.APIError{Code: 409, ErrorCode: jsMsgIDInProcess, Description: "duplicate message id is in process"}
	x := refusedWith("chg.acme.node.x.1.1")
	p.roundBegan = time.Now()
	if p.deadInProcess(x, inProcess) {
		t.Fatal("dead at the first refusal")
	}
	if p.deadInProcess(x, inProcess) {
		t.Fatal("dead with no publish stored since")
	}
	p.inProcess.stored(p.roundBegan) // stored, but sent in the round of the refusal: maybe before it
	if p.deadInProcess(x, inProcess) {
		t.Fatal("dead on a publish that may have been sent before the refusal")
	}
	p.roundBegan = time.Now().Add(time.Millisecond) // the next round
	p.inProcess.stored(p.roundBegan)                // one of its publishes stored
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

// TestInProcessIDsLive: a result id proven dead is published under the
// next id not proven so; the proof needs a publish sent after the first
// refusal to have been stored, and only "in process" answers count.
func TestInProcessIDsLive(t *testing.T) {
	d := newInProcessIDs(2 * time.Minute)
	inProcess := &jetstream.APIError{Code: 409, ErrorCode: jsMsgIDInProcess}
	const id = "res.acme.r1.0123456789abcdef"
	before := time.Now()
	if d.refused(id, inProcess) || d.live(id) != id {
		t.Fatal("dead at its first refusal")
	}
	d.stored(before) // sent before the refusal: proves nothing
	if d.refused(id, inProcess) || d.live(id) != id {
		t.Fatal("dead on a publish sent before the refusal")
	}
	d.stored(time.Now())
	if !d.refused(id, inProcess) || d.live(id) != id+".1" {
		t.Fatalf("after a later publish stored: live %q, want %q", d.live(id), id+".1")
	}
	// id.1 refused in its turn (another leader change), then proven dead.
	if d.refused(id+".1", inProcess) {
		t.Fatal("id.1 dead at its first refusal")
	}
	d.stored(time.Now().Add(time.Millisecond))
	if !d.refused(id+".1", inProcess) || d.live(id) != id+".1.1" {
		t.Fatalf("live %q, want %q", d.live(id), id+".1.1")
	}
	if d.refused(id, errors.New("nats: timeout")) || d.live("res.acme.r2.0") != "res.acme.r2.0" {
		t.Fatal("an id never refused is not its own")
	}
}
