package cascade

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/google/uuid"
	"github.com/telha/telha-cascade/storage"
)

// Model-based tests of the store's change feed (storage/feed.go): a
// publisher loop like queue.FeedPublisher.Round, without NATS, reads the
// feed while a random history is written; what it collected is checked
// against the store and the reference model.

// feedKey names a change as its Nats-Msg-Id does (client.ChangeMsgID).
type feedKey struct {
	kind  storage.Kind
	id    uuid.UUID
	tx    storage.Ts
	valid storage.Ts
}

func keyOfChange(c *storage.Change) feedKey {
	return feedKey{kind: c.V.Kind, id: c.V.ID, tx: c.V.Tx.Start, valid: c.V.Valid.Start}
}

// feedLoop is one publisher of one tenant's feed: it "publishes" into got.
type feedLoop struct {
	st  *storage.Store
	sc  storage.Scope
	r   *rand.Rand
	pos storage.FeedPos // the cached cursor (what the last SaveFeed stored)
	// last is the change right before pos (nil at the feed's start): every
	// read from pos must start strictly after it.
	last *storage.Change
	got  []storage.Change
	// saveErrs counts failed SaveFeed calls (their changes come again).
	saveErrs int
	// dropSave, when > 0, skips the save of one read in dropSave at random
	// (the publisher's acks failed): those changes come again.
	dropSave int
	dropped  int
}

func newFeedLoop(t testing.TB, st *storage.Store, sc storage.Scope, seed uint64) *feedLoop {
	t.Helper()
	pos, err := st.FeedCursor(sc)
	if err != nil {
		t.Fatalf("feed cursor: %v", err)
	}
	return &feedLoop{st: st, sc: sc, r: rand.New(rand.NewPCG(seed, 7)), pos: pos}
}

// round is one read and, when it moved, one save. n: changes read.
func (f *feedLoop) round(maxRead int) (n int, err error) {
	from, prev := f.pos, f.last
	var order error
	pos, err := f.st.ReadFeed(ctx, storage.FeedRead{Scope: f.sc, From: from, UpTo: f.st.FeedHorizon(f.sc), Max: maxRead}, func(c *storage.Change) error {
		cc := *c
		cc.V.Props = bytes.Clone(c.V.Props)
		cc.EraseKey = bytes.Clone(c.EraseKey)
		if prev != nil && !feedOrderLess(prev, &cc) && order == nil {
			order = fmt.Errorf("read from %+v (max %d): change %+v is not after %+v", from, maxRead, keyOfChange(&cc), keyOfChange(prev))
		}
		f.got = append(f.got, cc)
		prev = &f.got[len(f.got)-1]
		n++
		return nil
	})
	if err != nil {
		return n, fmt.Errorf("read feed from %+v: %w", from, err)
	}
	if order != nil {
		return n, order
	}
	if n > maxRead {
		return n, fmt.Errorf("read %d changes at max %d", n, maxRead)
	}
	if pos == from {
		if n > 0 {
			return n, fmt.Errorf("read %d changes from %+v but the position did not move", n, from)
		}
		return 0, nil
	}
	if n == 0 {
		return 0, fmt.Errorf("position moved from %+v to %+v without a change", from, pos)
	}
	if f.dropSave > 0 && f.r.IntN(f.dropSave) == 0 {
		f.dropped++
		return n, nil
	}
	if err := f.st.SaveFeed(ctx, map[storage.Scope]storage.FeedPos{f.sc: pos}, nil); err != nil {
		f.saveErrs++
		return n, nil // the cursor stays: published again from it
	}
	f.pos = pos
	last := *prev
	f.last = &last
	return n, nil
}

// randMax is a read's Max: often small, so that reads stop inside a
// cascade's tx.
func (f *feedLoop) randMax() int {
	if f.r.IntN(2) == 0 {
		return 1 + f.r.IntN(3)
	}
	return 1 + f.r.IntN(50)
}

// start runs the loop in a goroutine until the returned stop is called
// (idempotent; also called at the test's cleanup, before the store closes).
func (f *feedLoop) start(t testing.TB) (stop func()) {
	stopCh, done := make(chan struct{}), make(chan struct{})
	go f.run(t, stopCh, done)
	var once sync.Once
	stop = func() {
		once.Do(func() { close(stopCh) })
		<-done
	}
	t.Cleanup(stop)
	return stop
}

// run reads until stop is closed, at a random Max per read, waiting for a
// commit when the feed is empty. Errors go to t.Errorf.
func (f *feedLoop) run(t testing.TB, stop <-chan struct{}, done chan<- struct{}) {
	defer close(done)
	for {
		select {
		case <-stop:
			return
		default:
		}
		wake := f.st.Changed()
		n, err := f.round(f.randMax())
		if err != nil {
			t.Errorf("feed loop: %v", err)
			return
		}
		if n > 0 {
			continue
		}
		select {
		case <-stop:
			return
		case <-wake:
		case <-time.After(20 * time.Millisecond): // a journal's end only pokes
		}
	}
}

// drain reads until a read returns nothing; the horizon must then be the
// committed tx (no journal left in flight).
func (f *feedLoop) drain(t testing.TB) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		n, err := f.round(f.randMax())
		if err != nil {
			t.Fatalf("drain: %v", err)
		}
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("drain: the feed never ran dry")
		}
	}
	if h, c := f.st.FeedHorizon(f.sc), f.st.Committed(); h != c {
		t.Fatalf("drained with the horizon %s below the committed tx %s", h, c)
	}
}

// dedup keeps the first copy of every change, as the stream's duplicate
// window would; a copy must be identical to the first.
func dedupChanges(t testing.TB, cs []storage.Change) []storage.Change {
	t.Helper()
	first := map[feedKey]int{}
	var out []storage.Change
	for i := range cs {
		c := &cs[i]
		k := keyOfChange(c)
		if j, ok := first[k]; ok {
			if !reflect.DeepEqual(out[j], *c) {
				t.Fatalf("change %+v read twice, differently:\n%+v\n%+v", k, out[j], *c)
			}
			continue
		}
		first[k] = len(out)
		out = append(out, *c)
	}
	return out
}

// feedOrderLess is the feed's order: tx, then edges before nodes, then id,
// then valid_from.
func feedOrderLess(a, b *storage.Change) bool {
	if a.V.Tx.Start != b.V.Tx.Start {
		return a.V.Tx.Start < b.V.Tx.Start
	}
	ak, bk := a.V.Kind == storage.KindNode, b.V.Kind == storage.KindNode
	if ak != bk {
		return !ak
	}
	if c := bytes.Compare(a.V.ID[:], b.V.ID[:]); c != 0 {
		return c < 0
	}
	return a.V.Valid.Start < b.V.Valid.Start
}

// checkFeed checks a duplicate-free feed against the store and the model:
// exactly-once, order, causes, every version present, and a replay that
// reads like the store.
func checkFeed(t testing.TB, w *world, cs []storage.Change, cascades []cascadeRecord) {
	t.Helper()
	st := w.e.store
	// (a) exactly once.
	seen := map[feedKey]int{}
	for i := range cs {
		c := &cs[i]
		if c.Op != storage.FeedPut && c.Op != storage.FeedTombstone {
			t.Fatalf("change %d: unexpected op %s", i, c.Op)
		}
		if (c.Op == storage.FeedTombstone) != c.V.Tombstone {
			t.Fatalf("change %d: op %s for a version with tombstone=%v", i, c.Op, c.V.Tombstone)
		}
		k := keyOfChange(c)
		if j, ok := seen[k]; ok {
			t.Fatalf("change %+v published twice (changes %d and %d)", k, j, i)
		}
		seen[k] = i
	}
	// (b) order: tx non-decreasing, edges before nodes within a tx (and the
	// index's order within a kind).
	for i := 1; i < len(cs); i++ {
		a, b := &cs[i-1], &cs[i]
		if b.V.Tx.Start < a.V.Tx.Start {
			t.Fatalf("change %d: tx %s after tx %s", i, b.V.Tx.Start, a.V.Tx.Start)
		}
		if b.V.Tx.Start == a.V.Tx.Start && a.V.Kind == storage.KindNode && b.V.Kind == storage.KindEdge {
			t.Fatalf("change %d: edge %s after node %s in tx %s", i, b.V.ID, a.V.ID, b.V.Tx.Start)
		}
		if !feedOrderLess(a, b) {
			t.Fatalf("change %d (%+v) not after change %d (%+v) in feed order", i, keyOfChange(b), i-1, keyOfChange(a))
		}
	}
	// (c) causes: every edge tombstone of a cascade's tx names the node;
	// nothing else has a cause.
	causeAt := map[storage.Ts]uuid.UUID{}
	for _, rec := range cascades {
		causeAt[rec.tx] = rec.node
	}
	for i := range cs {
		c := &cs[i]
		node, isCascade := causeAt[c.V.Tx.Start]
		switch {
		case c.V.Kind == storage.KindEdge && c.V.Tombstone && isCascade:
			if c.V.Src != node && c.V.Dst != node {
				t.Fatalf("edge %s tombstoned at the cascade tx %s of %s does not touch it", c.V.ID, c.V.Tx.Start, node)
			}
			if c.Cause != node {
				t.Fatalf("edge %s tombstoned by the cascade of %s at %s: Cause=%s", c.V.ID, node, c.V.Tx.Start, c.Cause)
			}
		case c.Cause != uuid.Nil:
			t.Fatalf("change %+v (op %s) has Cause %s but is no cascade's edge tombstone", keyOfChange(c), c.Op, c.Cause)
		}
	}
	// No version of the store is missing, none is invented: every version
	// of every entity ever written, tombstones included.
	stored := map[feedKey]storage.Version{}
	for _, k := range []storage.Kind{storage.KindNode, storage.KindEdge} {
		for _, id := range w.m.all(k) {
			vs, err := storage.History(st.Reader(), w.sc, k, id)
			if err != nil {
				t.Fatal(err)
			}
			for _, v := range vs {
				stored[feedKey{kind: k, id: id, tx: v.Tx.Start, valid: v.Valid.Start}] = v
			}
		}
	}
	for k, v := range stored {
		i, ok := seen[k]
		if !ok {
			t.Fatalf("stored version %+v (tombstone=%v) missing from the feed", k, v.Tombstone)
		}
		if got := cs[i].V; got.Valid != v.Valid || got.Tx.Start != v.Tx.Start || got.Tombstone != v.Tombstone || got.Src != v.Src || got.Dst != v.Dst || got.Label != v.Label {
			t.Fatalf("change %+v differs from the stored version:\nfeed  %+v\nstore %+v", k, got, v)
		}
	}
	if len(stored) != len(cs) {
		t.Fatalf("the feed has %d changes, the store %d versions", len(cs), len(stored))
	}
	// The model's versions are the feed's too.
	nModel := 0
	for id, vs := range w.m.vers {
		for _, v := range vs {
			nModel++
			k := feedKey{kind: v.kind, id: id, tx: v.tx, valid: v.valid.Start}
			i, ok := seen[k]
			if !ok {
				t.Fatalf("model version %+v missing from the feed", k)
			}
			if g := cs[i].V; g.Valid != v.valid || g.Tombstone != v.tombstone || (v.kind == storage.KindEdge && (g.Src != v.src || g.Dst != v.dst || g.Label != v.label)) {
				t.Fatalf("change %+v differs from the model's version %+v", k, v)
			}
		}
	}
	if nModel != len(cs) {
		t.Fatalf("the feed has %d changes, the model %d versions", len(cs), nModel)
	}
	// (d) a replay of the feed reads like the store.
	rm := newRModel()
	for i := range cs {
		v := &cs[i].V
		rm.add(v.ID, mv{kind: v.Kind, src: v.Src, dst: v.Dst, label: v.Label, valid: v.Valid, tx: v.Tx.Start, tombstone: v.Tombstone})
	}
	r := st.Reader()
	ids := map[storage.Kind][]uuid.UUID{storage.KindNode: w.m.all(storage.KindNode), storage.KindEdge: w.m.all(storage.KindEdge)}
	compare := func(v, tt storage.Ts) {
		for _, k := range []storage.Kind{storage.KindNode, storage.KindEdge} {
			for _, id := range ids[k] {
				mvv, mok := rm.asOf(id, v, tt)
				sv, sok, err := storage.AsOf(r, w.sc, k, id, v, tt)
				if err != nil {
					t.Fatal(err)
				}
				if mok != sok || (mok && sv.Tx.Start != mvv.tx) {
					t.Fatalf("replayed feed: %s %s at (v=%s, t=%s): store live=%v (tx %s), replay live=%v (tx %s)", k, id, v, tt, sok, sv.Tx.Start, mok, mvv.tx)
				}
			}
		}
	}
	for i := 0; i < 60; i++ {
		compare(w.randCoord())
	}
	for _, tx := range w.txs {
		v, _ := w.randCoord()
		compare(v, tx)
		compare(tx, tx)
		compare(tx-1, tx-1)
	}
}

// TestFeedReplaysTheStoreOnRandomHistories: a publisher loop reads the feed
// while a random history (inline and journaled cascades) is written; then
// the feed is drained. No crash, a save after every read: every version is
// published exactly once, in feed order, with its cascade's cause, and a
// replay of the feed reads like the store.
func TestFeedReplaysTheStoreOnRandomHistories(t *testing.T) {
	for seed := 0; seed < seeds(t, 12); seed++ {
		maxOps := maxBatchChoices[seed%len(maxBatchChoices)]
		t.Run(fmt.Sprintf("seed%d_max%d", seed, maxOps), func(t *testing.T) {
			e := openEnv(t, "", Options{MaxBatchOps: maxOps})
			w := newWorld(t, uint64(900+seed), e, 8+seed%5, 30)
			fl := newFeedLoop(t, e.store, w.sc, uint64(seed))
			stop := fl.start(t)
			for i := 0; i < 150; i++ {
				w.step()
			}
			stop()
			if t.Failed() {
				return
			}
			concurrent := len(fl.got)
			fl.drain(t)
			if len(w.cascades) == 0 {
				t.Fatal("history ran no cascade")
			}
			if fl.saveErrs != 0 {
				t.Fatalf("%d saves failed", fl.saveErrs)
			}
			checkFeed(t, w, fl.got, w.cascades)
			if cur, err := e.store.FeedCursor(w.sc); err != nil || cur != fl.pos {
				t.Fatalf("saved cursor %+v (%v), the loop's %+v", cur, err, fl.pos)
			}
			t.Logf("%d changes (%d read concurrently), %d cascades", len(fl.got), concurrent, len(w.cascades))
		})
	}
}

// TestFeedThroughACrashMidJournal: a hub's journaled cascade crashes
// mid-journal while the feed is read; the reader stops, the process
// restarts, a new reader resumes from the saved cursor while the journal
// is resumed, and the feed is drained. Deduplicated as the stream would,
// the feed holds every version once, in order, and the hub's edges come
// before it, each with the hub as its cause.
func TestFeedThroughACrashMidJournal(t *testing.T) {
	for seed := 0; seed < seeds(t, 8); seed++ {
		maxOps := []int{7, 12, 23}[seed%3]
		t.Run(fmt.Sprintf("seed%d_max%d", seed, maxOps), func(t *testing.T) {
			const hubEdges = 40
			build := func(e *env) (*world, uuid.UUID) {
				w := newWorld(t, uint64(1300+seed), e, 10, 40)
				for i := 0; i < 100; i++ {
					w.step()
				}
				// A fresh hub with edges to the nodes that still live.
				var live []uuid.UUID
				for _, n := range w.nodes {
					if l, ok := w.m.latest(n); ok && !l.tombstone {
						live = append(live, n)
					}
				}
				if len(live) == 0 {
					t.Skip("every node died in this history")
				}
				hub := detUUID(w.r)
				w.putNode(hub)
				for i := 0; i < hubEdges; i++ {
					id := detUUID(w.r)
					other := live[w.r.IntN(len(live))]
					if i%2 == 0 {
						w.putEdge(id, hub, other)
					} else {
						w.putEdge(id, other, hub)
					}
					w.e.clock.Advance(1000)
				}
				return w, hub
			}
			// The reference run counts the cascade's durable calls.
			ref := openEnv(t, "", Options{MaxBatchOps: maxOps})
			_, refHub := build(ref)
			calls0 := ref.fault.Calls()
			if _, err := ref.ops.TombstoneNode(ctx, storage.MustScope("w"), refHub, storage.NoTs, anon); err != nil {
				t.Fatal(err)
			}
			calls := ref.fault.Calls() - calls0
			if calls < 4 {
				t.Fatalf("the hub's cascade took %d durable calls: not journaled", calls)
			}
			crashAt := 2 + int(uint(seed*7919)%uint(calls-3)) // after the head, before the end

			e := openEnv(t, "", Options{MaxBatchOps: maxOps})
			w, hub := build(e)
			if hub != refHub {
				t.Fatal("the two runs diverged")
			}
			// The reader starts with the cascade: it reads the history while
			// the journal's chunks land, and some of its saves fail.
			fl := newFeedLoop(t, e.store, w.sc, uint64(seed))
			fl.dropSave = 3
			// Crash after crashAt of the cascade's own durable calls (the
			// reader's saves are not counted; they fail too after the crash).
			cursorKey := storage.FeedCursorKey(w.sc)
			var mu sync.Mutex
			isSave := map[int]bool{}
			own, crashed := 0, false
			e.fault.SetObserve(func(n int, b *pebble.Batch) {
				mu.Lock()
				isSave[n] = bytes.Contains(b.Repr(), cursorKey)
				mu.Unlock()
			})
			e.fault.SetInject(func(n int) error {
				mu.Lock()
				defer mu.Unlock()
				if !crashed && !isSave[n] {
					own++
					crashed = own > crashAt
				}
				if crashed {
					return fmt.Errorf("%w: crash after the cascade's durable call %d", storage.ErrInjected, crashAt)
				}
				return nil
			})
			stop := fl.start(t)
			if _, err := e.ops.TombstoneNode(ctx, w.sc, hub, storage.NoTs, anon); err == nil {
				t.Fatalf("crash at call %d of %d did not fail the cascade", crashAt, calls)
			}
			// The reader goes on (its saves fail) until it is stopped; then
			// the process restarts.
			stop()
			if t.Failed() {
				return
			}
			before, saveErrs, dropped := len(fl.got), fl.saveErrs, fl.dropped
			e.restart()
			if rows := journalRows(t, e.store, w.sc); rows == 0 {
				t.Fatalf("crash at call %d of %d left no journal", crashAt, calls)
			}
			if h := e.store.FeedHorizon(w.sc); h >= e.store.Committed() {
				t.Fatalf("a journal is in flight but the horizon %s is not below the committed tx %s", h, e.store.Committed())
			}
			// A new reader, from the saved cursor, while the journal resumes.
			fl2 := newFeedLoop(t, e.store, w.sc, uint64(seed)+1000)
			fl2.dropSave = 3
			stop2 := fl2.start(t)
			n, err := e.ops.ResumeJournals(ctx, w.sc)
			if err != nil || n != 1 {
				t.Fatalf("resume: %d journals, %v", n, err)
			}
			stop2()
			if t.Failed() {
				return
			}
			fl2.drain(t)
			// The model follows the cascade at its journal's tx.
			hv, ok, err := e.store.Latest(w.sc, storage.KindNode, hub)
			if err != nil || !ok || !hv.Tombstone {
				t.Fatalf("hub after resume: %+v %v %v", hv, ok, err)
			}
			rec := cascadeRecord{node: hub, validEnd: hv.Valid.Start, tx: hv.Tx.Start, touched: w.m.touching(hub)}
			set := w.m.tombstoneNode(hub, rec.validEnd, rec.tx)
			w.cascades = append(w.cascades, rec)
			w.txs = append(w.txs, rec.tx)

			all := append(append([]storage.Change(nil), fl.got...), fl2.got...)
			cs := dedupChanges(t, all)
			checkFeed(t, w, cs, w.cascades)
			// The hub's edge tombstones, all caused by it, before it.
			hubAt, edgesOfHub := -1, 0
			for i := range cs {
				c := &cs[i]
				if c.V.Tx.Start != rec.tx {
					continue
				}
				switch {
				case c.V.Kind == storage.KindNode && c.V.ID == hub:
					hubAt = i
				case c.V.Kind == storage.KindEdge:
					if hubAt >= 0 {
						t.Fatalf("edge %s of the hub after the hub's tombstone", c.V.ID)
					}
					if !c.V.Tombstone || c.Cause != hub {
						t.Fatalf("edge %s at the hub's tx: tombstone=%v cause=%s", c.V.ID, c.V.Tombstone, c.Cause)
					}
					edgesOfHub++
				default:
					t.Fatalf("node %s at the hub's tx %s", c.V.ID, rec.tx)
				}
			}
			if hubAt < 0 || edgesOfHub != set {
				t.Fatalf("the hub's cascade in the feed: hub at %d, %d edges, model %d", hubAt, edgesOfHub, set)
			}
			t.Logf("crash at call %d of %d: %d changes read before the restart (%d failed saves, %d dropped), %d after (%d dropped); %d distinct; hub edges %d",
				crashAt, calls, before, saveErrs, dropped, len(fl2.got), fl2.dropped, len(cs), edgesOfHub)
		})
	}
}
