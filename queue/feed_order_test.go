package queue

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/telha/telha-cascade/cascade"
	"github.com/telha/telha-cascade/internal/testnats"
	"github.com/telha/telha-cascade/queue/client"
	"github.com/telha/telha-cascade/storage"
)

// TestFeedRoundWithNoStreamStoresNothingLate: a round published while
// the feed's stream has no leader (here: no stream; in a cluster, the
// seconds of an election after its leader was lost) is answered "no
// responders" for every change. nats.go's async publish retries such a
// publish after 250 ms, each retry from its own timer goroutine: once a
// leader is back, the retries race each other and the tenant's changes
// are stored out of order (TestDynamicNATSServerLost's feed check found
// a tenant's puts swapped in pairs). The feed retries nothing itself in a
// round: the round fails, and the next one publishes from the cursor, in
// order.
func TestFeedRoundWithNoStreamStoresNothingLate(t *testing.T) {
	const n = 200
	nc, st, _ := feedFixture(t, n)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cfg := Config{}.Defaults()
	p, err := newFeedPublisher(nc, st, cfg, nil, FeedHooks{}, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	// The stream appears as soon as the server has answered every first
	// publish (a stream leader elected while the round waits).
	in0 := nc.Stats().InMsgs
	created := make(chan error, 1)
	go func() {
		for nc.Stats().InMsgs < in0+n {
			if ctx.Err() != nil {
				created <- ctx.Err()
				return
			}
			time.Sleep(time.Millisecond) // polling the connection's counters, bounded by ctx
		}
		_, err := js.CreateStream(ctx, ChangesStreamConfig(cfg))
		created <- err
	}()
	_, roundErr := p.Round(ctx)
	if err := <-created; err != nil {
		t.Fatal(err)
	}
	t.Logf("the round with no stream: %v", roundErr)
	for more := true; more || roundErr != nil; {
		more, roundErr = p.Round(ctx)
		if roundErr != nil {
			t.Fatalf("round with the stream there: %v", roundErr)
		}
	}
	s, err := js.Stream(ctx, cfg.ChgStream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != n {
		t.Fatalf("the stream holds %d changes, want %d", info.State.Msgs, n)
	}
	last := ""
	for seq := uint64(1); seq <= info.State.LastSeq; seq++ {
		m, err := s.GetMsg(ctx, seq)
		if err != nil {
			t.Fatal(err)
		}
		var c client.Change
		if err := json.Unmarshal(m.Data, &c); err != nil {
			t.Fatal(err)
		}
		if c.TxTime < last {
			t.Fatalf("seq %d: a change at %s stored after one at %s", seq, c.TxTime, last)
		}
		last = c.TxTime
	}
}

// TestFeedRoundsWithNoStreamEachFail: rounds while the stream has no
// leader each fail with the server's answer, the one after a failed
// round too (it sends one change first and waits for it: the probe).
// The probe's answer, once received, must not be waited for again: a
// future answers once, and a round that waited on it again would hold
// the tenant's feed until its slot stops.
func TestFeedRoundsWithNoStreamEachFail(t *testing.T) {
	nc, st, sc := feedFixture(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p, err := newFeedPublisher(nc, st, Config{}.Defaults(), nil, FeedHooks{}, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	for round := range 3 {
		if _, err := p.Round(ctx); !errors.Is(err, jetstream.ErrNoStreamResponse) {
			t.Fatalf("round %d with no stream: %v, want %v", round, err, jetstream.ErrNoStreamResponse)
		}
		if !p.unclean[sc] {
			t.Fatalf("round %d failed and the tenant is not marked for a probe", round)
		}
	}
}

// feedFixture: an embedded NATS server with no change stream, and a store
// whose tenant "acme" put n nodes (props {"n":i}).
func feedFixture(t *testing.T, n int) (*nats.Conn, *storage.Store, storage.Scope) {
	t.Helper()
	ns := testnats.Start(t)
	nc := testnats.Connect(t, ns.ClientURL())
	st, err := storage.OpenStore(t.TempDir(), storage.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	sc := storage.MustScope("acme")
	cs := cascade.New(st, cascade.Options{})
	for i := range n {
		if _, err := cs.PutNode(context.Background(), sc, storage.NodeWrite{ID: uuid.New(), ValidFrom: storage.NoTs, ValidTo: storage.NoTs,
			Props: fmt.Appendf(nil, `{"n":%d}`, i), Prov: storage.Provenance{RequestID: fmt.Sprint("r", i)}}); err != nil {
			t.Fatal(err)
		}
	}
	return nc, st, sc
}
