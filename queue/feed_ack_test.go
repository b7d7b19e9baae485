package queue

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/telha/telha-cascade/storage"
)

// TestFeedRoundGivesUpOnAnUnansweredPublish: a change whose publish the
// server never answers (here a plain subscriber takes it and no stream
// does; in a cluster, a stream leader lost with the publish in flight)
// fails its round once the ack wait passes, not when the slot stops; the
// cursor stays where it was, and the next round, with the stream there,
// stores the change. Before the bound, the round (and the tenant's feed
// with it) waited for ever: TestDynamicNATSServerLost's feed check once
// found 17 of 188 puts.
func TestFeedRoundGivesUpOnAnUnansweredPublish(t *testing.T) {
	nc, st, sc := feedFixture(t, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cfg := Config{}.Defaults()
	swallow, err := nc.SubscribeSync("telha.chg.>")
	if err != nil {
		t.Fatal(err)
	}
	p := testFeedPublisher(t, nc, st, cfg, FeedHooks{}, 200*time.Millisecond)
	if _, err := p.Round(ctx); !errors.Is(err, jetstream.ErrAsyncPublishTimeout) {
		t.Fatalf("round with its publish unanswered: %v, want %v", err, jetstream.ErrAsyncPublishTimeout)
	}
	if m, err := swallow.NextMsg(time.Second); err != nil || m.Subject != "telha.chg.acme.node.put" {
		t.Fatalf("the publish did not go out: %v", err)
	}
	if pos, err := st.FeedCursor(sc); err != nil || pos != (storage.FeedPos{}) || p.pos[sc] != (storage.FeedPos{}) {
		t.Fatalf("the cursor moved past a change never stored: saved %+v (%v), in memory %+v", pos, err, p.pos[sc])
	}

	_ = swallow.Unsubscribe()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	s, err := js.CreateStream(ctx, ChangesStreamConfig(cfg))
	if err != nil {
		t.Fatal(err)
	}
	// Its ack wait is short (200 ms, for the round above): a round may
	// time out again on a loaded machine, and the next publishes it again.
	roundsCatchUp(t, ctx, p, "a round with the stream there")
	m, err := s.GetLastMsgForSubject(ctx, "telha.chg.acme.node.put")
	if err != nil || m.Header.Get(nats.MsgIdHdr) == "" {
		t.Fatalf("the change is not in the stream after the retry: %v", err)
	}
}
