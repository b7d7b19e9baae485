package queue

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/telha/telha-cascade/cascade"
	"github.com/telha/telha-cascade/internal/diskscan"
	"github.com/telha/telha-cascade/internal/testnats"
	"github.com/telha/telha-cascade/storage"
)

// scrubFixture is a tenant's feed on a real stream: others puts of nodes
// with propsBytes of props each, then a node t (two versions), nodes a
// and b, the edges t->a, b->t and a->b, and hub more edges from t to a,
// all published.
type scrubFixture struct {
	p                *FeedPublisher
	stream           jetstream.Stream
	sc               storage.Scope
	t, ta, bt, ab    uuid.UUID
	a, b             uuid.UUID // t->a, b->t, a->b
	puts             int       // the tenant's puts on the feed
	putSubjectFilter string
	marker           string // in t's props only
	storeDir         string // the NATS server's
}

func newScrubFixture(tb testing.TB, others, propsBytes, hub int) *scrubFixture {
	tb.Helper()
	ns := testnats.Start(tb)
	nc := testnats.Connect(tb, ns.ClientURL())
	st, err := storage.OpenStore(tb.TempDir(), storage.Options{})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = st.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	f := &scrubFixture{sc: storage.MustScope("acme"), t: uuid.New(), ta: uuid.New(), bt: uuid.New(), ab: uuid.New(),
		putSubjectFilter: "telha.chg.acme.*.put", marker: diskscan.Marker("tprops"), storeDir: ns.Opts.StoreDir}
	ops := cascade.New(st, cascade.Options{})
	props := []byte(`{"blob":"` + strings.Repeat("x", propsBytes) + `"}`)
	var reqs []cascade.Request
	for i := 0; i < others; i++ {
		reqs = append(reqs, cascade.Request{Scope: f.sc, Op: storage.OpPutNode, ID: uuid.New(), ValidFrom: storage.NoTs, ValidTo: storage.NoTs, Props: props, Prov: storage.Provenance{RequestID: fmt.Sprint("o", i)}})
	}
	a, b := uuid.New(), uuid.New()
	f.a, f.b = a, b
	for i, id := range []uuid.UUID{f.t, f.t, a, b} {
		pr := props
		if id == f.t {
			pr = []byte(`{"secret":"` + f.marker + `","n":` + fmt.Sprint(i) + `}`)
		}
		reqs = append(reqs, cascade.Request{Scope: f.sc, Op: storage.OpPutNode, ID: id, ValidFrom: storage.NoTs, ValidTo: storage.NoTs, Props: pr, Prov: storage.Provenance{RequestID: fmt.Sprint("n", i)}})
	}
	for i, e := range [][3]uuid.UUID{{f.ta, f.t, a}, {f.bt, b, f.t}, {f.ab, a, b}} {
		reqs = append(reqs, cascade.Request{Scope: f.sc, Op: storage.OpPutEdge, ID: e[0], Src: e[1], Dst: e[2], Label: "knows", ValidFrom: storage.NoTs, ValidTo: storage.NoTs, Props: props,
			Prov: storage.Provenance{RequestID: fmt.Sprint("e", i)}})
	}
	for i := 0; i < hub; i++ {
		reqs = append(reqs, cascade.Request{Scope: f.sc, Op: storage.OpPutEdge, ID: uuid.New(), Src: f.t, Dst: a, Label: "hub", ValidFrom: storage.NoTs, ValidTo: storage.NoTs,
			Props: props, Prov: storage.Provenance{RequestID: fmt.Sprint("h", i)}})
	}
	for len(reqs) > 0 {
		n := min(len(reqs), 64)
		out, _, err := ops.Apply(ctx, reqs[:n])
		if err != nil {
			tb.Fatal(err)
		}
		for _, o := range out {
			if o.Err != nil {
				tb.Fatal(o.Err)
			}
		}
		reqs = reqs[n:]
	}
	f.puts = others + 4 + 3 + hub
	cfg := Config{}.Defaults()
	js, err := jetstream.New(nc)
	if err != nil {
		tb.Fatal(err)
	}
	if f.stream, err = js.CreateStream(ctx, ChangesStreamConfig(cfg)); err != nil {
		tb.Fatal(err)
	}
	if f.p, err = NewFeedPublisher(nil, nc, st, Config{ChangesMaxRate: -1}, nil, FeedHooks{}); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(f.p.Close)
	for more := true; more; {
		if more, err = f.p.Round(ctx); err != nil {
			tb.Fatal(err)
		}
	}
	if got := f.kept(tb); got != f.puts {
		tb.Fatalf("%d puts on the feed, want %d", got, f.puts)
	}
	return f
}

func (f *scrubFixture) kept(tb testing.TB) int {
	tb.Helper()
	info, err := f.stream.Info(context.Background(), jetstream.WithSubjectFilter(f.putSubjectFilter))
	if err != nil {
		tb.Fatal(err)
	}
	n := 0
	for _, c := range info.State.Subjects {
		n += int(c)
	}
	return n
}

func eraseOf(kind storage.Kind, id uuid.UUID) *storage.Change {
	return &storage.Change{Op: storage.FeedErase, V: storage.Version{Kind: kind, ID: id}}
}

// scrubOne is scrubFeed of one erase.
func (f *scrubFixture) scrubOne(ctx context.Context, c *storage.Change) (n, overwritten int, err error) {
	del, err := f.p.scrubFeed(ctx, f.sc, []*storage.Change{c})
	if err != nil {
		return 0, 0, err
	}
	return del[0].Deleted, del[0].Overwritten, nil
}

// An erase's scrub of the feed deletes exactly the puts that carried what
// it erased: a node's own (every version) and the puts of the edges with
// it as source or destination; an edge's erase, that edge's. It finds
// them from the messages' headers (it reads no body).
func TestScrubFeedDeletesTheErasedPutsOnly(t *testing.T) {
	f := newScrubFixture(t, 50, 100, 0)
	ctx := context.Background()
	if n, overwritten, err := f.scrubOne(ctx, eraseOf(storage.KindNode, f.t)); err != nil || n != 4 || overwritten != 4 {
		t.Fatalf("erase of the node: %d puts deleted (%d overwritten, %v), want its 2 and its 2 edges', overwritten", n, overwritten, err)
	}
	if got, want := f.kept(t), f.puts-4; got != want {
		t.Fatalf("%d puts kept, want %d", got, want)
	}
	if n, _, err := f.scrubOne(ctx, eraseOf(storage.KindEdge, f.ab)); err != nil || n != 1 {
		t.Fatalf("erase of the edge a->b: %d puts deleted (%v), want 1", n, err)
	}
	if n, _, err := f.scrubOne(ctx, eraseOf(storage.KindNode, f.t)); err != nil || n != 0 {
		t.Fatalf("the node's erase again: %d deleted (%v), want 0", n, err)
	}
	if got, want := f.kept(t), f.puts-5; got != want {
		t.Fatalf("%d puts kept, want %d", got, want)
	}
}

// Erases that waited together share one read of the feed, and each
// deletes what it alone would have: a node's erase its own puts and its
// edges', an edge's its own; an edge of two nodes erased together is
// deleted once (the first's); a second erase of the same entity finds
// nothing left.
func TestScrubFeedOfErasesTogether(t *testing.T) {
	f := newScrubFixture(t, 50, 100, 0)
	ctx := context.Background()
	if files, err := diskscan.FilesContaining(f.storeDir, f.marker); err != nil || len(files) == 0 {
		t.Fatalf("the node's props are in no server file before its erase (%v): the scan is wrong", err)
	}
	// t (2 puts) with its edges t->a and b->t; a->b; t again.
	del, err := f.p.scrubFeed(ctx, f.sc, []*storage.Change{eraseOf(storage.KindNode, f.t), eraseOf(storage.KindEdge, f.ab), eraseOf(storage.KindNode, f.t)})
	if err != nil {
		t.Fatal(err)
	}
	if want := []scrubbedPuts{{4, 4}, {1, 1}, {0, 0}}; fmt.Sprint(del) != fmt.Sprint(want) {
		t.Fatalf("deleted %v, want %v", del, want)
	}
	if got, want := f.kept(t), f.puts-5; got != want {
		t.Fatalf("%d puts kept, want %d", got, want)
	}
	if files, err := diskscan.FilesContaining(f.storeDir, f.marker); err != nil || len(files) > 0 {
		t.Fatalf("the erased node's props are still in %v (%v)", files, err)
	}
	// Erases of a tenant the feed keeps no put of (the benchmark's first
	// erase panicked here: the read returned before it had a row for each).
	other := storage.MustScope("other")
	if del, err := f.p.scrubFeed(ctx, other, []*storage.Change{eraseOf(storage.KindNode, f.t), eraseOf(storage.KindEdge, f.ab)}); err != nil || fmt.Sprint(del) != "[{0 0} {0 0}]" {
		t.Fatalf("erases of a tenant with no put kept: %v %v, want nothing deleted", del, err)
	}
}

// Two nodes erased together whose edges join them: each edge's put is
// deleted once, by the first erase that carried it.
func TestScrubFeedOfTwoJoinedNodesTogether(t *testing.T) {
	f := newScrubFixture(t, 10, 100, 0)
	// Nodes of the fixture: t, a (t->a, a->b), b (b->t, a->b). Erase a
	// and t: a's own put and t->a, a->b are a's; t's two puts and b->t
	// are t's (t->a was a's).
	del, err := f.p.scrubFeed(context.Background(), f.sc, []*storage.Change{eraseOf(storage.KindNode, f.a), eraseOf(storage.KindNode, f.t)})
	if err != nil {
		t.Fatal(err)
	}
	if want := []scrubbedPuts{{3, 3}, {3, 3}}; fmt.Sprint(del) != fmt.Sprint(want) {
		t.Fatalf("deleted %v, want %v", del, want)
	}
	if got, want := f.kept(t), f.puts-6; got != want {
		t.Fatalf("%d puts kept, want %d", got, want)
	}
}

// A hub's erase deletes its edges' puts too, beyond scrubSecureMax
// plainly (an overwrite rewrites a whole block of the stream per
// message): every one is gone from the stream all the same, and the
// node's own puts are among those overwritten: its props are in no file
// of the server. Before, a hub's puts were all deleted plainly, its own
// with them, and the node's props stayed in the stream's block file.
func TestScrubFeedOfAHubDeletesPlainly(t *testing.T) {
	f := newScrubFixture(t, 10, 100, scrubSecureMax)
	if files, err := diskscan.FilesContaining(f.storeDir, f.marker); err != nil || len(files) == 0 {
		t.Fatalf("the node's props are in no server file before its erase (%v): the scan is wrong", err)
	}
	n, overwritten, err := f.scrubOne(context.Background(), eraseOf(storage.KindNode, f.t))
	if want := 2 + 2 + scrubSecureMax; err != nil || n != want || overwritten != scrubSecureMax {
		t.Fatalf("erase of the hub: %d puts deleted (%d overwritten, %v), want %d, %d overwritten", n, overwritten, err, want, scrubSecureMax)
	}
	if got, want := f.kept(t), f.puts-n; got != want {
		t.Fatalf("%d puts kept, want %d", got, want)
	}
	if files, err := diskscan.FilesContaining(f.storeDir, f.marker); err != nil || len(files) > 0 {
		t.Fatalf("the hub's own props are still in %v (%v)", files, err)
	}
}

// BenchmarkScrubFeed: the scrub of a node's erase on a tenant whose feed
// keeps 5,000 puts of 4 KB of props (what it costs is reading them).
func BenchmarkScrubFeed(b *testing.B) {
	f := newScrubFixture(b, 5000, 4096, 0)
	ctx := context.Background()
	b.ResetTimer()
	for range b.N {
		if _, _, err := f.scrubOne(ctx, eraseOf(storage.KindNode, uuid.New())); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkScrubFeedOfErasesWaiting: 16 erases of nodes waiting on a
// tenant whose feed keeps 5,000 puts of 4 KB, scrubbed one at a time (as
// before) and together (one read of the feed): compare side by side.
func BenchmarkScrubFeedOfErasesWaiting(b *testing.B) {
	f := newScrubFixture(b, 5000, 4096, 0)
	ctx := context.Background()
	erases := func() []*storage.Change {
		cs := make([]*storage.Change, 16)
		for i := range cs {
			cs[i] = eraseOf(storage.KindNode, uuid.New())
		}
		return cs
	}
	b.Run("one_at_a_time", func(b *testing.B) {
		for range b.N {
			for _, c := range erases() {
				if _, _, err := f.scrubOne(ctx, c); err != nil {
					b.Fatal(err)
				}
			}
		}
	})
	b.Run("together", func(b *testing.B) {
		for range b.N {
			if _, err := f.p.scrubFeed(ctx, f.sc, erases()); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkScrubFeedOfAHub: the scrub of the erase of a node with 2,000
// edges, whose 2,003 puts it deletes (what it costs is the deletes).
func BenchmarkScrubFeedOfAHub(b *testing.B) {
	for range b.N {
		b.StopTimer()
		f := newScrubFixture(b, 0, 100, 2000)
		b.StartTimer()
		n, _, err := f.scrubOne(context.Background(), eraseOf(storage.KindNode, f.t))
		if err != nil || n != 2+2+2000 {
			b.Fatalf("%d deleted (%v)", n, err)
		}
	}
}

// laggingStream is a real stream whose ordered consumers read, at their
// first fetch, from a replica that has applied the stream only up to
// replicaLast (the messages after it held back, the last one delivered
// saying nothing is pending), and from then on as caught up: what the
// server does when it places a consumer on a replica that lags behind
// the leader (a server just restarted or continued).
type laggingStream struct {
	jetstream.Stream
	replicaLast uint64
}

func (s laggingStream) OrderedConsumer(ctx context.Context, cfg jetstream.OrderedConsumerConfig) (jetstream.Consumer, error) {
	c, err := s.Stream.OrderedConsumer(ctx, cfg)
	if err != nil {
		return nil, err
	}
	return &laggingConsumer{Consumer: c, replicaLast: s.replicaLast}, nil
}

type laggingConsumer struct {
	jetstream.Consumer
	replicaLast uint64
	fetched     bool
	held        []jetstream.Msg
}

func (c *laggingConsumer) Fetch(n int, opts ...jetstream.FetchOpt) (jetstream.MessageBatch, error) {
	return c.lag(c.Consumer.Fetch(n, opts...))
}

func (c *laggingConsumer) FetchNoWait(n int) (jetstream.MessageBatch, error) {
	return c.lag(c.Consumer.FetchNoWait(n))
}

func (c *laggingConsumer) lag(b jetstream.MessageBatch, err error) (jetstream.MessageBatch, error) {
	if err != nil {
		return nil, err
	}
	out := c.held
	c.held = nil
	for m := range b.Messages() {
		md, err := m.Metadata()
		if err != nil {
			return nil, err
		}
		if !c.fetched && md.Sequence.Stream > c.replicaLast {
			c.held = append(c.held, m)
			continue
		}
		out = append(out, m)
	}
	if !c.fetched && len(c.held) > 0 && len(out) > 0 {
		out[len(out)-1] = nothingPending{out[len(out)-1]}
	}
	c.fetched = true
	ch := make(chan jetstream.Msg, len(out))
	for _, m := range out {
		ch <- m
	}
	close(ch)
	return batchOf{ch, b.Error()}, nil
}

type nothingPending struct{ jetstream.Msg }

func (m nothingPending) Metadata() (*jetstream.MsgMetadata, error) {
	md, err := m.Msg.Metadata()
	if err != nil {
		return nil, err
	}
	c := *md
	c.NumPending = 0
	return &c, nil
}

type batchOf struct {
	ch  chan jetstream.Msg
	err error
}

func (b batchOf) Messages() <-chan jetstream.Msg { return b.ch }
func (b batchOf) Error() error                   { return b.err }

// An erase's read of the feed goes on to the tenant's last put as the
// stream's leader has it, whichever replica serves it: a replica that
// lags says nothing is pending before the puts it has not applied yet.
// Before, the read ended there, and the erase was answered with those
// puts still on the feed (a black-box probe on three servers, after a
// slot moved: erased props read 2-14 s after the erase's result).
func TestScrubFeedReadsPastALaggingReplica(t *testing.T) {
	f := newScrubFixture(t, 50, 100, 5)
	ctx := context.Background()
	erases := []*storage.Change{eraseOf(storage.KindNode, f.t)}
	own, edges, err := erasedPuts(ctx, f.stream, "telha", f.sc, erases)
	if err != nil {
		t.Fatal(err)
	}
	all := append(append([]uint64(nil), own[0]...), edges[0]...)
	if len(own[0]) != 2 || len(edges[0]) != 7 {
		t.Fatalf("read from the leader: %d own puts and %d edges', want 2 and 7 (the test is wrong)", len(own[0]), len(edges[0]))
	}
	last := slices.Max(all)
	if last < 2 {
		t.Fatalf("the last erased put is at sequence %d: nothing to hold back (the test is wrong)", last)
	}
	lagOwn, lagEdges, err := erasedPuts(ctx, laggingStream{f.stream, last - 1}, "telha", f.sc, erases)
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(lagOwn, lagEdges) != fmt.Sprint(own, edges) {
		t.Fatalf("read through a replica that lagged before sequence %d: own %v edges %v, want own %v edges %v", last, lagOwn, lagEdges, own, edges)
	}
}
