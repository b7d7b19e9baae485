package cascade

import (
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/telha/telha-cascade/storage"
)

// Issue 20: the audit under concurrency, cascade side.

// star writes a node with n edges to fresh neighbours and returns it.
func (e *env) star(sc storage.Scope, n int) uuid.UUID {
	e.t.Helper()
	h := uuid.New()
	e.node(sc, h, storage.NoTs, storage.NoTs)
	for i := 0; i < n; i++ {
		m := uuid.New()
		e.node(sc, m, storage.NoTs, storage.NoTs)
		e.edge(sc, uuid.New(), h, m, storage.NoTs, storage.NoTs)
	}
	return h
}

// TestEraseOfDeadNodeTombstonesNoEdges (issue 20 item 13): erase_node
// reports the edges its own cascade tombstoned: those of a live node's
// cascade (inline or journaled), and none for a node already dead, whose
// earlier cascade tombstoned its edges (that request's receipt says so).
func TestEraseOfDeadNodeTombstonesNoEdges(t *testing.T) {
	sc := storage.MustScope("t13")
	for _, tc := range []struct {
		name      string
		maxBatch  int
		edges     int
		deadFirst bool
		want      uint64
	}{
		{"live-inline", 1000, 4, false, 4},
		{"live-journaled", 20, 6, false, 6},
		{"dead-inline", 1000, 4, true, 0},
		{"dead-journaled", 20, 6, true, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := openEnv(t, "", Options{MaxBatchOps: tc.maxBatch})
			h := e.star(sc, tc.edges)
			if tc.deadFirst {
				rc, err := e.ops.TombstoneNode(ctx, sc, h, storage.NoTs, anon)
				if err != nil || rc.EdgesTombstoned != uint64(tc.edges) {
					t.Fatalf("tombstone_node: %+v %v", rc, err)
				}
			}
			rc := e.erase(sc, storage.OpEraseNode, h, "erase-"+tc.name)
			if rc.Status != storage.StatusOK || rc.EdgesTombstoned != tc.want {
				t.Fatalf("erase_node: status %s, edges_tombstoned %d, want ok and %d", rc.Status, rc.EdgesTombstoned, tc.want)
			}
		})
	}
}

// TestEraseChunkWithinMaxBatchOps (issue 20 item 19): no durable batch of
// an erase holds more than max_batch_ops puts (its chunk's versions plus
// the head that records the progress).
func TestEraseChunkWithinMaxBatchOps(t *testing.T) {
	const maxOps = 10
	dir := t.TempDir()
	var erasing atomic.Bool
	var biggest atomic.Int64
	st, err := storage.OpenStore(dir, storage.Options{Logger: noLog, OnCommit: func(_ time.Duration, ops int, _ error) {
		if erasing.Load() && int64(ops) > biggest.Load() {
			biggest.Store(int64(ops))
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ops := New(st, Options{MaxBatchOps: maxOps, ChunkOps: maxOps, Logger: noLog})
	sc := storage.MustScope("t19")
	x := uuid.New()
	for i := 0; i < 25; i++ { // 25 versions of one node
		if _, err := ops.PutNode(ctx, sc, storage.NodeWrite{ID: x, ValidFrom: year(2000 + i), ValidTo: year(2001 + i), Props: []byte(fmt.Sprintf(`{"i":%d}`, i)), Prov: anon}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := ops.TombstoneNode(ctx, sc, x, storage.NoTs, anon); err != nil {
		t.Fatal(err)
	}
	out, _, err := ops.Apply(ctx, []Request{{Scope: sc, Op: storage.OpEraseNode, ID: x, RequestID: "erase-x", ValidEnd: storage.NoTs, Prov: why}})
	if err != nil || out[0].Kind != Erasing {
		t.Fatalf("erase_node: %+v %v", out[0], err)
	}
	erasing.Store(true)
	rc, err := ops.ApplyErase(ctx, out[0].Erase, EraseObserver{})
	erasing.Store(false)
	if err != nil || rc.VersionsErased != 26 {
		t.Fatalf("erase: %+v %v, want 26 versions erased", rc, err)
	}
	if b := biggest.Load(); b > maxOps {
		t.Fatalf("an erase batch held %d puts, over max_batch_ops %d", b, maxOps)
	}
}

// TestEraseCutIsConsistent (issue 20 item 15): the versions an erase
// rewrites are exactly those committed up to one point of the commit
// order, journals included: a neighbour's journaled cascade that commits
// while the erase starts either lands before the erase reads (and is
// erased) or lands wholly after it, never half. Here, while the erase is
// held right after its check of journals in flight, neighbour N's cascade
// commits its journal (not applied yet) and then neighbour M's inline
// cascade commits; both narrow an edge of the erased node X. Whatever the
// erase read, no version of X's edges it left unerased may be older than
// one it erased.
func TestEraseCutIsConsistent(t *testing.T) {
	sc := storage.MustScope("t15")
	var hold atomic.Pointer[func()]
	e := openEnv(t, "", Options{MaxBatchOps: 20, Hooks: Hooks{EraseChecked: func(*storage.EraseEntry) {
		if fn := hold.Swap(nil); fn != nil {
			(*fn)()
		}
	}}})
	x, n, m := uuid.New(), uuid.New(), uuid.New()
	for _, id := range []uuid.UUID{x, n, m} {
		e.node(sc, id, storage.NoTs, storage.NoTs)
	}
	xn, xm := uuid.New(), uuid.New()
	e.edge(sc, xn, x, n, storage.NoTs, storage.NoTs)
	e.edge(sc, xm, m, x, storage.NoTs, storage.NoTs)
	for i := 0; i < 5; i++ { // N's cascade is journaled (6 edges at max_batch_ops 20)
		o := uuid.New()
		e.node(sc, o, storage.NoTs, storage.NoTs)
		e.edge(sc, uuid.New(), n, o, storage.NoTs, storage.NoTs)
	}
	if rc, err := e.ops.TombstoneNode(ctx, sc, x, storage.NoTs, anon); err != nil || rc.Journaled || rc.EdgesTombstoned != 2 {
		t.Fatalf("tombstone_node x: %+v %v", rc, err)
	}
	out, _, err := e.ops.Apply(ctx, []Request{{Scope: sc, Op: storage.OpEraseNode, ID: x, RequestID: "erase-x", ValidEnd: storage.NoTs, Prov: why}})
	if err != nil || out[0].Kind != Erasing {
		t.Fatalf("erase_node x: %+v %v", out[0], err)
	}
	var nj *storage.JournalEntry
	fn := func() {
		// Both narrow X's edges: valid_end before X's tombstone.
		o, _, err := e.ops.Apply(ctx, []Request{{Scope: sc, Op: storage.OpTombstoneNode, ID: n, ValidEnd: year(2000), Prov: anon}})
		if err != nil || o[0].Kind != Journaled {
			t.Errorf("tombstone_node n: %+v %v, want journaled", o[0], err)
			return
		}
		nj = o[0].Journal
		if rc, err := e.ops.TombstoneNode(ctx, sc, m, year(2000), anon); err != nil || rc.Journaled {
			t.Errorf("tombstone_node m: %+v %v, want inline", rc, err)
		}
	}
	hold.Store(&fn)
	if _, err := e.ops.ApplyErase(ctx, out[0].Erase, EraseObserver{}); err != nil {
		t.Fatalf("erase: %v", err)
	}
	if nj == nil {
		t.Fatal("the erase was never held")
	}
	if _, err := e.ops.ApplyJournal(ctx, nj, JournalObserver{}); err != nil && !errors.Is(err, storage.ErrJournalGone) {
		t.Fatalf("n's journal: %v", err)
	}
	var erasedMax storage.Ts
	type ver struct {
		id uuid.UUID
		tx storage.Ts
	}
	var unerased []ver
	for _, id := range []uuid.UUID{xn, xm} {
		hs, err := storage.History(e.store.Reader(), sc, storage.KindEdge, id)
		if err != nil {
			t.Fatal(err)
		}
		for _, v := range hs {
			if v.Erased {
				erasedMax = max(erasedMax, v.Tx.Start)
			} else {
				unerased = append(unerased, ver{id, v.Tx.Start})
			}
		}
	}
	for _, u := range unerased {
		if u.tx < erasedMax {
			t.Errorf("edge %s: a version at tx %s is unerased, though the erase erased one at tx %s: the erase's cut is not one point of the commit order", u.id, u.tx, erasedMax)
		}
	}
}
