package queue

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
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
	p := testFeedPublisher(t, nc, st, cfg, FeedHooks{}, 10*time.Second)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	// The stream appears as soon as the server has answered every first
	// publish (a stream leader elected while the round waits).
	if err := p.dial(ctx); err != nil { // the feed's own connection, watched below
		t.Fatal(err)
	}
	own := p.nc
	in0 := own.Stats().InMsgs
	created := make(chan error, 1)
	go func() {
		for own.Stats().InMsgs < in0+n {
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
	if !errors.Is(roundErr, jetstream.ErrNoStreamResponse) {
		t.Fatalf("the round with no stream: %v, want %v (no retry within the round)", roundErr, jetstream.ErrNoStreamResponse)
	}
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
	checkStreamInOrder(t, ctx, s, n)
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
	p := testFeedPublisher(t, nc, st, Config{}.Defaults(), FeedHooks{}, 10*time.Second)
	for round := range 3 {
		var out0 uint64
		if p.nc != nil {
			out0 = p.nc.Stats().OutMsgs
		}
		if _, err := p.Round(ctx); !errors.Is(err, jetstream.ErrNoStreamResponse) {
			t.Fatalf("round %d with no stream: %v, want %v", round, err, jetstream.ErrNoStreamResponse)
		}
		// The first round sends every change; the ones after it, the
		// probe only.
		if sent, want := p.nc.Stats().OutMsgs-out0, map[bool]uint64{true: 3, false: 1}[round == 0]; sent != want {
			t.Fatalf("round %d sent %d changes, want %d", round, sent, want)
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
	st, sc := testStore(t), storage.MustScope("acme")
	putNodes(t, st, sc, n)
	return nc, st, sc
}

// testStore: an empty store in a temp dir, closed when the test ends.
func testStore(t *testing.T) *storage.Store {
	t.Helper()
	st, err := storage.OpenStore(t.TempDir(), storage.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	return st
}

// putNodes puts n nodes in sc, each by a request of its own.
func putNodes(t *testing.T, st *storage.Store, sc storage.Scope, n int) {
	t.Helper()
	cs := cascade.New(st, cascade.Options{})
	for i := range n {
		if _, err := cs.PutNode(context.Background(), sc, storage.NodeWrite{ID: uuid.New(), ValidFrom: storage.NoTs, ValidTo: storage.NoTs,
			Props: fmt.Appendf(nil, `{"n":%d}`, i), Prov: storage.Provenance{RequestID: uuid.NewString()}}); err != nil {
			t.Fatal(err)
		}
	}
}

// TestFeedPublishesOnAConnectionThatNeverReconnects: the feed publishes
// on a connection of its own that does not reconnect. A reconnecting one
// sends what it had not yet written when its server went away to the next
// server, while what was in the socket is lost: a tenant's later changes
// stored without an earlier one. Cut off, the feed's connection closes
// (the slot's reconnects), the next round dials a new one, and the stream
// holds every change once, in order.
func TestFeedPublishesOnAConnectionThatNeverReconnects(t *testing.T) {
	f := newProxiedFeed(t, 10*time.Second)
	px, slotConn, st, sc, s, p := f.px, f.slotConn, f.st, f.sc, f.s, f.p
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	putNodes(t, st, sc, 50)
	if _, err := p.Round(ctx); err != nil {
		t.Fatal(err)
	}
	first := p.nc
	if first == slotConn || first.Opts.AllowReconnect {
		t.Fatalf("the feed publishes on the slot's connection (%v) or on one that reconnects (%v)", first == slotConn, first.Opts.AllowReconnect)
	}
	px.Cut()
	testnats.Eventually(t, 10*time.Second, "the feed's connection closed by the cut", first.IsClosed)
	px.SetCut(false)
	putNodes(t, st, sc, 50)
	roundsCatchUp(t, ctx, p, "a round after the cut")
	if p.nc == first {
		t.Fatal("the feed published after the cut on the connection the cut closed")
	}
	checkStreamInOrder(t, ctx, s, 100)
}

// TestFeedDialLeavesWithItsContext: a server that takes the TCP connection
// and never answers (paused, behind the frozen proxy) holds a dial of the
// feed's connection for nats.go's Timeout per server, and nats.go's
// Connect takes no context. A round, and so a slot that stops, does not
// wait for it: the round ends with its context while the dial goes on by
// itself, and once the server answers, a round dials and publishes.
func TestFeedDialLeavesWithItsContext(t *testing.T) {
	f := newProxiedFeed(t, 10*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	putNodes(t, f.st, f.sc, 10)
	if _, err := f.p.Round(ctx); err != nil {
		t.Fatal(err)
	}
	f.px.SetFrozen(true)
	f.p.nc.Close() // the feed's connection is lost: the next round dials
	putNodes(t, f.st, f.sc, 10)
	rctx, rcancel := context.WithTimeout(ctx, 200*time.Millisecond)
	_, err := f.p.Round(rctx)
	rcancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a round whose dial hangs ended with %v, want its context's end", err)
	}
	f.px.SetFrozen(false)
	roundsCatchUp(t, ctx, f.p, "a round once the server answers")
	checkStreamInOrder(t, ctx, f.s, 20)
}

// roundsCatchUp runs rounds until one stores every change and has none
// left, within 30 s.
func roundsCatchUp(t *testing.T, ctx context.Context, p *FeedPublisher, what string) {
	t.Helper()
	testnats.Eventually(t, 30*time.Second, what, func() bool {
		more, err := p.Round(ctx)
		return err == nil && !more
	})
}

// checkStreamInOrder: the stream holds n changes, in ascending tx_time.
func checkStreamInOrder(t *testing.T, ctx context.Context, s jetstream.Stream, n uint64) {
	t.Helper()
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != n {
		t.Fatalf("the stream holds %d changes, want %d", info.State.Msgs, n)
	}
	last := ""
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq; seq++ {
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

// testFeedPublisher: a publisher of st's feed on a FeedConn of its own
// made from nc, its answers awaited at most ackWait; closed when the test
// ends.
func testFeedPublisher(t testing.TB, nc *nats.Conn, st *storage.Store, cfg Config, hooks FeedHooks, ackWait time.Duration) *FeedPublisher {
	fc := newFeedConn(nc, ackWait)
	t.Cleanup(fc.Close)
	return newFeedPublisher(fc, st, cfg, nil, hooks)
}

// TestFeedDialOrder: the feed's connection tries the server the process
// is connected to first, as the process was given it (its credentials
// kept), then the others it was given.
func TestFeedDialOrder(t *testing.T) {
	for _, c := range []struct {
		url     string
		servers []string
		cur     string
		want    []string
	}{
		{"", []string{"nats://u:p@a:4222", "nats://u:p@b:4222"}, "nats://u:p@b:4222", []string{"nats://u:p@b:4222", "nats://u:p@a:4222"}},
		{"", []string{"nats://u:p@a:4222", "nats://u:p@b:4222"}, "nats://b:4222", []string{"nats://u:p@b:4222", "nats://u:p@a:4222"}},
		{"", []string{"nats://a:4222"}, "nats://c:4222", []string{"nats://c:4222", "nats://a:4222"}},
		{"nats://a:4222", []string{"nats://b:4222", "nats://a:4222"}, "", []string{"nats://a:4222", "nats://b:4222"}},
		{"", []string{"a:4222"}, "nats://a:4222", []string{"a:4222"}},
	} {
		if got := dialOrder(c.url, c.servers, c.cur); !slices.Equal(got, c.want) {
			t.Errorf("dialOrder(%q, %q, %q) = %q, want %q", c.url, c.servers, c.cur, got, c.want)
		}
	}
}

// TestFeedRedialsAfterAnUnansweredRound: a server that stops answering
// while the TCP connection stays open (paused by SIGSTOP; here a proxy
// that forwards nothing) fails the round at the ack wait, and the feed
// closes that connection: the next round dials afresh rather than waiting
// the minutes pings take to notice.
func TestFeedRedialsAfterAnUnansweredRound(t *testing.T) {
	f := newProxiedFeed(t, 300*time.Millisecond)
	px, st, sc, s, p := f.px, f.st, f.sc, f.s, f.p
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	putNodes(t, st, sc, 20)
	roundsCatchUp(t, ctx, p, "the first round") // its ack wait is 300 ms: a loaded machine may need two
	first := p.nc
	px.SetFrozen(true)
	putNodes(t, st, sc, 20)
	if _, err := p.Round(ctx); !errors.Is(err, jetstream.ErrAsyncPublishTimeout) {
		t.Fatalf("round with its server paused: %v, want %v", err, jetstream.ErrAsyncPublishTimeout)
	}
	if !first.IsClosed() {
		t.Fatal("the feed kept the connection whose publishes went unanswered")
	}
	px.SetFrozen(false)
	roundsCatchUp(t, ctx, p, "a round after the pause")
	if p.nc == first {
		t.Fatal("the feed published after the pause on the connection it closed")
	}
	checkStreamInOrder(t, ctx, s, 40)
}

// proxiedFeed: a NATS server with the change stream, a slot's connection
// to it through a proxy the test cuts or freezes (reconnecting), an empty
// store of tenant "acme", and its feed's publisher, its answers awaited
// at most ackWait.
type proxiedFeed struct {
	px       *testnats.Proxy
	slotConn *nats.Conn
	st       *storage.Store
	sc       storage.Scope
	s        jetstream.Stream
	p        *FeedPublisher
}

func newProxiedFeed(t *testing.T, ackWait time.Duration) *proxiedFeed {
	t.Helper()
	ns := testnats.Start(t)
	f := &proxiedFeed{px: testnats.StartProxy(t, ns.Addr().String()), st: testStore(t), sc: storage.MustScope("acme")}
	f.slotConn = testnats.Connect(t, f.px.URL(), nats.ReconnectWait(10*time.Millisecond), nats.MaxReconnects(-1))
	js, err := jetstream.New(testnats.Connect(t, ns.ClientURL()))
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{}.Defaults()
	if f.s, err = js.CreateStream(context.Background(), ChangesStreamConfig(cfg)); err != nil {
		t.Fatal(err)
	}
	f.p = testFeedPublisher(t, f.slotConn, f.st, cfg, FeedHooks{}, ackWait)
	return f
}

// TestFeedStreamDeletedWhileRunningIsCreatedAgain: the feed's stream is
// deleted while the publisher runs. Every publish is then answered "no
// responders"; the publisher creates the stream again and publishes the
// changes after its cursors into it. Before, it failed every round until
// the slot restarted (and provisioned it), and erases waited as long.
func TestFeedStreamDeletedWhileRunningIsCreatedAgain(t *testing.T) {
	nc, st, sc := feedFixture(t, 5)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cfg := Config{}.Defaults()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateStream(ctx, ChangesStreamConfig(cfg)); err != nil {
		t.Fatal(err)
	}
	p := testFeedPublisher(t, nc, st, cfg, FeedHooks{}, 10*time.Second)
	done := make(chan error, 1)
	runCtx, stop := context.WithCancel(ctx)
	go func() { done <- p.Run(runCtx) }()
	defer func() {
		stop()
		<-done
	}()
	held := func(want uint64) func() bool {
		return func() bool {
			s, err := js.Stream(ctx, cfg.ChgStream)
			return err == nil && s.CachedInfo().State.Msgs == want
		}
	}
	testnats.Eventually(t, 30*time.Second, "the stream holds the 5 puts", held(5))
	if err := js.DeleteStream(ctx, cfg.ChgStream); err != nil {
		t.Fatal(err)
	}
	putNodes(t, st, sc, 3)
	testnats.Eventually(t, 30*time.Second, "the stream, created again, holds the 3 puts after the deletion", held(3))
}
