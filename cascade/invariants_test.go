package cascade

import (
	"fmt"
	"testing"

	"github.com/google/uuid"
	"github.com/telha/telha-cascade/storage"
)

// randomized configurations: hubs above and below the threshold.
var maxBatchChoices = []int{7, 23, 60, DefaultMaxBatchOps}

func seeds(t *testing.T, n int) int {
	if testing.Short() {
		return max(2, n/4)
	}
	return n
}

// checkI1 asserts CONTRACT §3's I1 for one cascade: at every sampled
// coordinate v >= valid_end, t >= tx, the node and every edge that touched
// it read absent through every read path.
func checkI1(w *world, rec cascadeRecord, samples int) {
	w.t.Helper()
	r := w.e.store.Reader()
	touched := map[uuid.UUID]bool{}
	for _, e := range rec.touched {
		touched[e] = true
	}
	for i := 0; i < samples; i++ {
		v := rec.validEnd + storage.Ts(w.r.Int64N(int64(year(2100)-year(1900))))
		if i%4 == 0 {
			v = rec.validEnd
		}
		t := rec.tx + storage.Ts(w.r.Int64N(1_000_000))
		if i%5 == 0 {
			t = storage.OpenEnd - 1
		}
		if _, ok, _ := storage.AsOf(r, w.sc, storage.KindNode, rec.node, v, t); ok {
			w.t.Fatalf("I1: node %s reads live at (v=%s, t=%s) after its cascade (valid_end %s, tx %s)", rec.node, v, t, rec.validEnd, rec.tx)
		}
		for e := range touched {
			if _, ok, _ := storage.AsOf(r, w.sc, storage.KindEdge, e, v, t); ok {
				w.t.Fatalf("I1: edge %s of dead node %s reads live at (v=%s, t=%s): a ghost", e, rec.node, v, t)
			}
		}
		for _, n := range w.m.all(storage.KindNode) {
			es, err := storage.EdgesOf(r, w.sc, n, storage.DirBoth, v, t)
			if err != nil {
				w.t.Fatal(err)
			}
			for _, e := range es {
				if touched[e.ID] {
					w.t.Fatalf("I1: adjacency of %s lists edge %s of dead node %s at (v=%s, t=%s)", n, e.ID, rec.node, v, t)
				}
			}
		}
		live, err := storage.LiveAt(r, w.sc, storage.KindEdge, v, t)
		if err != nil {
			w.t.Fatal(err)
		}
		for _, e := range live {
			if touched[e.ID] {
				w.t.Fatalf("I1: index scan finds edge %s of dead node %s live at (v=%s, t=%s)", e.ID, rec.node, v, t)
			}
		}
		nodes, _ := storage.LiveAt(r, w.sc, storage.KindNode, v, t)
		for _, n := range nodes {
			if n.ID == rec.node {
				w.t.Fatalf("I1: index scan finds dead node %s live", rec.node)
			}
		}
	}
}

func TestI1ForwardNoGhostsOnRandomGraphs(t *testing.T) {
	for seed := 0; seed < seeds(t, 16); seed++ {
		max := maxBatchChoices[seed%len(maxBatchChoices)]
		t.Run(fmt.Sprintf("seed%d_max%d", seed, max), func(t *testing.T) {
			e := openEnv(t, "", Options{MaxBatchOps: max})
			w := newWorld(t, uint64(seed), e, 8+seed%5, 30)
			w.afterCascade = func(rec cascadeRecord) { checkI1(w, rec, 12) }
			for i := 0; i < 150; i++ {
				w.step()
			}
			if len(w.cascades) == 0 {
				t.Fatal("history ran no cascade")
			}
			// Every cascade's I1 still holds at the end of the history.
			for _, rec := range w.cascades {
				checkI1(w, rec, 6)
			}
			w.agree(15)
		})
	}
}

type readAt struct {
	v, t   storage.Ts
	node   map[uuid.UUID]storage.Ts // entity -> winning tx (absent: not live)
	adj    map[uuid.UUID]int
	liveEd int
}

func (w *world) snapshotReads(v, t storage.Ts) readAt {
	r := w.e.store.Reader()
	ra := readAt{v: v, t: t, node: map[uuid.UUID]storage.Ts{}, adj: map[uuid.UUID]int{}}
	for _, k := range []storage.Kind{storage.KindNode, storage.KindEdge} {
		for _, id := range w.m.all(k) {
			if ver, ok, _ := storage.AsOf(r, w.sc, k, id, v, t); ok {
				ra.node[id] = ver.Tx.Start
			}
		}
	}
	for _, n := range w.m.all(storage.KindNode) {
		es, _ := storage.EdgesOf(r, w.sc, n, storage.DirBoth, v, t)
		ra.adj[n] = len(es)
	}
	es, _ := storage.LiveAt(r, w.sc, storage.KindEdge, v, t)
	ra.liveEd = len(es)
	return ra
}

func TestI2BackwardHistoryUnchangedOnRandomGraphs(t *testing.T) {
	for seed := 0; seed < seeds(t, 16); seed++ {
		max := maxBatchChoices[seed%len(maxBatchChoices)]
		t.Run(fmt.Sprintf("seed%d_max%d", seed, max), func(t *testing.T) {
			e := openEnv(t, "", Options{MaxBatchOps: max})
			w := newWorld(t, uint64(100+seed), e, 8+seed%5, 30)
			var (
				before []readAt
				dump   map[string]string
			)
			w.beforeCascade = func(node uuid.UUID, validEnd storage.Ts) {
				before = before[:0]
				next := e.store.Clock().Last() + 1 // the cascade's tx is at least this
				for i := 0; i < 10 && len(w.txs) > 0; i++ {
					v, tt := w.randCoord()
					if tt >= next {
						tt = next - 1 // t < tx
					}
					before = append(before, w.snapshotReads(v, tt))
					if validEnd != storage.NoTs {
						// v < valid_end, any t.
						v2 := validEnd - 1 - storage.Ts(w.r.Int64N(int64(year(2000)-year(1950))))
						before = append(before, w.snapshotReads(v2, storage.OpenEnd-1))
					}
				}
				dump = map[string]string{}
				_ = storage.Dump(e.store.Reader(), func(k, v []byte) error { dump[string(k)] = string(v); return nil })
			}
			w.afterCascade = func(rec cascadeRecord) {
				for _, b := range before {
					after := w.snapshotReads(b.v, b.t)
					if fmt.Sprint(after.node) != fmt.Sprint(b.node) || fmt.Sprint(after.adj) != fmt.Sprint(b.adj) || after.liveEd != b.liveEd {
						t.Fatalf("I2: reads at (v=%s, t=%s) changed by the cascade of %s (valid_end %s, tx %s)", b.v, b.t, rec.node, rec.validEnd, rec.tx)
					}
				}
				// Puts only: every key held before holds the same bytes.
				held := 0
				_ = storage.Dump(e.store.Reader(), func(k, v []byte) error {
					if old, ok := dump[string(k)]; ok {
						held++
						if old != string(v) {
							t.Fatalf("I2: key %x rewritten by the cascade", k)
						}
					}
					return nil
				})
				if held != len(dump) {
					t.Fatalf("I2: %d of %d keys disappeared in the cascade", len(dump)-held, len(dump))
				}
			}
			for i := 0; i < 150; i++ {
				w.step()
			}
			if len(w.cascades) == 0 {
				t.Fatal("history ran no cascade")
			}
		})
	}
}

// TestI3CrashConvergenceOnRandomGraphs: a random history ends with a node
// cascade; the crash run injects a crash after a random durable call of it,
// restarts, resumes (redelivering the request if the commit point never
// landed) and must match the uninterrupted run byte for byte, leave no
// journal, and resume zero the second time. Every durable intermediate state
// is checked: never the node dead while a journaled edge reads live.
func TestI3CrashConvergenceOnRandomGraphs(t *testing.T) {
	for seed := 0; seed < seeds(t, 24); seed++ {
		max := []int{7, 12, 23, 40}[seed%4]
		t.Run(fmt.Sprintf("seed%d_max%d", seed, max), func(t *testing.T) {
			build := func(e *env) (*world, uuid.UUID) {
				w := newWorld(t, uint64(500+seed), e, 10, 40)
				for i := 0; i < 120; i++ {
					w.step()
				}
				// The hub (first node) is the target; make sure it lives.
				for _, n := range w.nodes {
					if l, ok := w.m.latest(n); ok && !l.tombstone {
						return w, n
					}
				}
				t.Skip("every node died in this history")
				return nil, uuid.Nil
			}
			ref := openEnv(t, "", Options{MaxBatchOps: max})
			rw, target := build(ref)
			calls0 := ref.fault.Calls()
			rrc, err := ref.ops.TombstoneNode(ctx, rw.sc, target, storage.NoTs, anon)
			if err != nil {
				t.Fatal(err)
			}
			calls := ref.fault.Calls() - calls0
			set := rw.m.cascadeSet(target, rrc.TxTime)

			crashAt := 1 + int(uint(seed*7919)%uint(calls))
			e := openEnv(t, "", Options{MaxBatchOps: max})
			w, target2 := build(e)
			if target2 != target {
				t.Fatal("the two runs diverged")
			}
			checkDurable := func(int) {
				r := e.store.Reader()
				nv, ok, _ := storage.Latest(r, w.sc, storage.KindNode, target)
				if !ok || !nv.Tombstone {
					return
				}
				for _, id := range set {
					ev, _, _ := storage.Latest(r, w.sc, storage.KindEdge, id)
					if !ev.Tombstone || ev.Tx.Start != nv.Tx.Start {
						t.Errorf("I3: durable state shows node %s dead while journaled edge %s is not tombstoned", target, id)
					}
				}
			}
			e.fault.SetAfter(checkDurable)
			e.fault.CrashAfter(e.fault.Calls() + crashAt - 1)
			if _, err := e.ops.TombstoneNode(ctx, w.sc, target, storage.NoTs, anon); err == nil {
				t.Fatalf("crash at call %d of %d did not fail the cascade", crashAt, calls)
			}
			e.restart()
			e.fault.SetAfter(checkDurable)
			n, err := e.ops.ResumeJournals(ctx, w.sc)
			if err != nil {
				t.Fatal(err)
			}
			if l, _, _ := e.store.Latest(w.sc, storage.KindNode, target); !l.Tombstone {
				if n != 0 {
					t.Fatalf("a journal was resumed but the node is alive")
				}
				if _, err := e.ops.TombstoneNode(ctx, w.sc, target, storage.NoTs, anon); err != nil {
					t.Fatal(err)
				}
			}
			if n, err := e.ops.ResumeJournals(ctx, w.sc); n != 0 || err != nil {
				t.Fatalf("second resume: %d %v", n, err)
			}
			if rows := journalRows(t, e.store, w.sc); rows != 0 {
				t.Fatalf("%d journal rows left", rows)
			}
			sameContents(t, ref.store, e.store)
		})
	}
}
