package cascade

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/google/uuid"
	"github.com/telha/telha-cascade/storage"
)

// hub40 builds the seed's graph: a hub with 40 edges to 40 neighbours.
func hub40(e *env, sc storage.Scope) (hub uuid.UUID, edges []uuid.UUID) {
	r := rand.New(rand.NewPCG(40, 40))
	hub = detUUID(r)
	e.node(sc, hub, storage.NoTs, storage.NoTs)
	for i := 0; i < 40; i++ {
		n, id := detUUID(r), detUUID(r)
		e.node(sc, n, storage.NoTs, storage.NoTs)
		e.edge(sc, id, hub, n, storage.NoTs, storage.NoTs)
		edges = append(edges, id)
	}
	return hub, edges
}

// TestJournaledCascadeRecoversAfterCrashAtEveryChunkBoundary is the seed's
// test: a 40-edge hub at max_batch_ops = 50 is 203 ops in 7 durable calls
// (journal, 5 chunks, journal clear). A crash is injected at each call in
// turn; after a restart, ResumeJournals converges to the uninterrupted run's
// store byte for byte, and a second ResumeJournals resumes zero.
func TestJournaledCascadeRecoversAfterCrashAtEveryChunkBoundary(t *testing.T) {
	sc := storage.MustScope("seed")
	var ops int
	opts := Options{MaxBatchOps: 50, Hooks: Hooks{ChunkApplied: func(n int) { ops += n }}}

	ref := openEnv(t, "", opts)
	hub, _ := hub40(ref, sc)
	before := ref.fault.Calls()
	rc, err := ref.ops.TombstoneNode(ctx, sc, hub, storage.NoTs, anon)
	if err != nil {
		t.Fatal(err)
	}
	if calls := ref.fault.Calls() - before; calls != 7 {
		t.Fatalf("uninterrupted cascade made %d durable calls, want 7 (journal, 5 chunks, journal clear)", calls)
	}
	if ops != 203 {
		t.Fatalf("write-set of %d ops, want 203 (40 edges x 5 + node x 3)", ops)
	}
	if !rc.Journaled || rc.EdgesTombstoned != 40 {
		t.Fatalf("receipt %+v, want journaled with 40 edges", rc)
	}

	for crash := 1; crash <= 7; crash++ {
		t.Run(fmt.Sprint("crash_at_call_", crash), func(t *testing.T) {
			e := openEnv(t, "", Options{MaxBatchOps: 50})
			hub, _ := hub40(e, sc)
			e.fault.CrashAfter(e.fault.Calls() + crash - 1)
			if _, err := e.ops.TombstoneNode(ctx, sc, hub, storage.NoTs, anon); !errors.Is(err, storage.ErrInjected) {
				t.Fatalf("cascade with a crash at call %d: err %v", crash, err)
			}
			e.restart()
			n, err := e.ops.ResumeJournals(ctx, sc)
			if err != nil {
				t.Fatal(err)
			}
			wantResumed := 1
			if crash == 1 {
				wantResumed = 0 // the journal itself never landed
			}
			if n != wantResumed {
				t.Fatalf("resumed %d journals, want %d", n, wantResumed)
			}
			if crash == 1 {
				// Nothing happened: the node is fully alive, and the
				// redelivered request runs the cascade from scratch.
				if v, ok, _ := e.store.Latest(sc, storage.KindNode, hub); !ok || v.Tombstone {
					t.Fatal("node not alive after a crash before the commit point")
				}
				if _, err := e.ops.TombstoneNode(ctx, sc, hub, storage.NoTs, anon); err != nil {
					t.Fatal(err)
				}
			}
			if n, err := e.ops.ResumeJournals(ctx, sc); n != 0 || err != nil {
				t.Fatalf("second resume: %d, %v; want 0", n, err)
			}
			if rows := journalRows(t, e.store, sc); rows != 0 {
				t.Fatalf("%d journal rows left", rows)
			}
			sameContents(t, ref.store, e.store)
		})
	}
}

func TestStandaloneEdgeTombstoneKeepsEndpointsAlive(t *testing.T) {
	e := openEnv(t, "", Options{})
	sc := storage.MustScope("se")
	a, b, id := uuid.New(), uuid.New(), uuid.New()
	e.node(sc, a, storage.NoTs, storage.NoTs)
	e.node(sc, b, storage.NoTs, storage.NoTs)
	e.edge(sc, id, a, b, storage.NoTs, storage.NoTs)
	rc, err := e.ops.TombstoneEdge(ctx, sc, id, storage.NoTs, anon)
	if err != nil {
		t.Fatal(err)
	}
	far := storage.OpenEnd - 1
	for _, n := range []uuid.UUID{a, b} {
		if _, ok, _ := e.store.NodeAsOf(sc, n, far, far); !ok {
			t.Fatalf("endpoint %s died with its edge", n)
		}
	}
	if _, ok, _ := e.store.EdgeAsOf(sc, id, far, far); ok {
		t.Fatal("edge still live after its tombstone")
	}
	if _, ok, _ := e.store.EdgeAsOf(sc, id, rc.TxTime-1, rc.TxTime-1); !ok {
		t.Fatal("edge missing before its tombstone (backward ghost)")
	}
	if _, err := e.ops.TombstoneEdge(ctx, sc, id, storage.NoTs, anon); !errors.Is(err, ErrAlreadyTombstoned) {
		t.Fatalf("second tombstone_edge: %v, want AlreadyTombstoned", err)
	}
	if _, err := e.ops.TombstoneEdge(ctx, sc, uuid.New(), storage.NoTs, anon); !errors.Is(err, ErrNotFound) {
		t.Fatalf("tombstone_edge of unknown edge: %v, want NotFound", err)
	}
}

func TestSecondTombstoneNodeFails(t *testing.T) {
	for _, max := range []int{0, 7} { // inline, and journaled (a 2-edge node over 7 ops)
		e := openEnv(t, "", Options{MaxBatchOps: max})
		sc := storage.MustScope("twice")
		a, b, c := uuid.New(), uuid.New(), uuid.New()
		for _, n := range []uuid.UUID{a, b, c} {
			e.node(sc, n, storage.NoTs, storage.NoTs)
		}
		e.edge(sc, uuid.New(), a, b, storage.NoTs, storage.NoTs)
		e.edge(sc, uuid.New(), c, a, storage.NoTs, storage.NoTs)
		rc, err := e.ops.TombstoneNode(ctx, sc, a, storage.NoTs, anon)
		if err != nil || rc.EdgesTombstoned != 2 || rc.Journaled != (max == 7) {
			t.Fatalf("max %d: first cascade %+v, %v", max, rc, err)
		}
		if _, err := e.ops.TombstoneNode(ctx, sc, a, storage.NoTs, anon); !errors.Is(err, ErrAlreadyTombstoned) {
			t.Fatalf("max %d: second tombstone_node: %v", max, err)
		}
		if _, err := e.ops.TombstoneNode(ctx, sc, uuid.New(), storage.NoTs, anon); !errors.Is(err, ErrNotFound) {
			t.Fatalf("tombstone_node of unknown node: %v", err)
		}
	}
}

// TestEdgeTombstonedAfterValidEndIsNarrowed is CONTRACT §3's correction: an
// edge tombstoned standalone from 2028, then its node tombstoned from 2025.
func TestEdgeTombstonedAfterValidEndIsNarrowed(t *testing.T) {
	e := openEnv(t, "", Options{})
	sc := storage.MustScope("narrow")
	n, m, id := uuid.New(), uuid.New(), uuid.New()
	e.node(sc, n, year(2020), storage.NoTs)
	e.node(sc, m, year(2020), storage.NoTs)
	e.edge(sc, id, n, m, year(2020), storage.NoTs)
	if _, err := e.ops.TombstoneEdge(ctx, sc, id, year(2028), anon); err != nil {
		t.Fatal(err)
	}
	tBefore := e.store.Clock().Last()
	rc, err := e.ops.TombstoneNode(ctx, sc, n, year(2025), anon)
	if err != nil {
		t.Fatal(err)
	}
	if rc.EdgesTombstoned != 1 {
		t.Fatalf("edges tombstoned %d, want 1 (the edge dying in 2028 must be collected)", rc.EdgesTombstoned)
	}
	now := rc.TxTime
	for _, y := range []int{2025, 2026, 2027, 2028, 2100} {
		v := year(y)
		if _, ok, _ := e.store.EdgeAsOf(sc, id, v, now); ok {
			t.Errorf("edge reads live in %d beside its dead node", y)
		}
		if es, _ := e.store.EdgesOf(sc, m, storage.DirBoth, v, now); len(es) != 0 {
			t.Errorf("adjacency of the other endpoint still lists the edge in %d", y)
		}
	}
	for _, y := range []int{2020, 2023, 2024} {
		v := year(y)
		if _, ok, _ := e.store.EdgeAsOf(sc, id, v, now); !ok {
			t.Errorf("edge lost in %d (backward ghost)", y)
		}
		if _, ok, _ := e.store.NodeAsOf(sc, n, v, now); !ok {
			t.Errorf("node lost in %d", y)
		}
	}
	// As of before the cascade, the 2025-2028 window still reads live.
	if _, ok, _ := e.store.EdgeAsOf(sc, id, year(2026), tBefore); !ok {
		t.Error("history before the cascade changed")
	}
	// Its narrowing tombstone starts strictly before the earlier one.
	h, _ := e.store.History(sc, storage.KindEdge, id)
	if len(h) != 3 || !h[1].Tombstone || !h[2].Tombstone || h[2].Valid.Start >= h[1].Valid.Start {
		t.Fatalf("history %+v: want version, tombstone 2028, narrowing tombstone 2025", h)
	}
}

func TestEdgeTombstonedBeforeValidEndIsSkipped(t *testing.T) {
	e := openEnv(t, "", Options{})
	sc := storage.MustScope("skip")
	n, m, id := uuid.New(), uuid.New(), uuid.New()
	e.node(sc, n, year(2020), storage.NoTs)
	e.node(sc, m, year(2020), storage.NoTs)
	e.edge(sc, id, n, m, year(2020), storage.NoTs)
	if _, err := e.ops.TombstoneEdge(ctx, sc, id, year(2022), anon); err != nil {
		t.Fatal(err)
	}
	rc, err := e.ops.TombstoneNode(ctx, sc, n, year(2025), anon)
	if err != nil || rc.EdgesTombstoned != 0 {
		t.Fatalf("cascade %+v %v: an edge dead since 2022 needs no tombstone", rc, err)
	}
	if h, _ := e.store.History(sc, storage.KindEdge, id); len(h) != 2 {
		t.Fatalf("edge has %d versions, want 2 (no second tombstone)", len(h))
	}
}

func TestSelfLoopCountsOnce(t *testing.T) {
	for _, max := range []int{0, 7} {
		e := openEnv(t, "", Options{MaxBatchOps: max})
		sc := storage.MustScope("loop")
		n := uuid.New()
		e.node(sc, n, storage.NoTs, storage.NoTs)
		loop := uuid.New()
		e.edge(sc, loop, n, n, storage.NoTs, storage.NoTs)
		m := uuid.New()
		e.node(sc, m, storage.NoTs, storage.NoTs)
		e.edge(sc, uuid.New(), m, n, storage.NoTs, storage.NoTs)
		rc, err := e.ops.TombstoneNode(ctx, sc, n, storage.NoTs, anon)
		if err != nil || rc.EdgesTombstoned != 2 {
			t.Fatalf("max %d: %+v %v; want 2 edges (self-loop once)", max, rc, err)
		}
		if h, _ := e.store.History(sc, storage.KindEdge, loop); len(h) != 2 {
			t.Fatalf("self-loop has %d versions, want 2", len(h))
		}
	}
}
