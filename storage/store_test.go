package storage

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"
)

func TestTxClockStepsBackAndSurvivesReopen(t *testing.T) {
	dir := t.TempDir()
	clock := NewManualClock(t0)
	s := openTest(t, dir, clock)
	sc := MustScope("clk")
	var last Ts
	for i := 0; i < 50; i++ {
		if i%5 == 0 {
			clock.Advance(-time.Hour) // the wall clock steps back
		}
		v := mustNode(t, s, sc, uuid.New())
		if v.Tx.Start <= last {
			t.Fatalf("tx %d not after %d", v.Tx.Start, last)
		}
		last = v.Tx.Start
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	clock.Set(t0.Add(-24 * time.Hour)) // restart with a clock a day behind
	s2 := openTest(t, dir, clock)
	v := mustNode(t, s2, sc, uuid.New())
	if v.Tx.Start <= last {
		t.Fatalf("after reopen tx %d reuses or reorders (last durable %d)", v.Tx.Start, last)
	}
	if got := len(s2.Tenants()); got != 1 {
		t.Fatalf("tenant registry after reopen: %d tenants, want 1", got)
	}
}

func TestTxClockFollowsWallClock(t *testing.T) {
	clock := NewManualClock(t0)
	c := NewTxClock(clock, NoTs)
	a := c.Next()
	if a != TsFromTime(t0) {
		t.Fatalf("first tx %d, want now %d", a, TsFromTime(t0))
	}
	if b := c.Next(); b != a+1 {
		t.Fatalf("same wall time: tx %d, want last+1 = %d", b, a+1)
	}
	clock.Advance(time.Second)
	if b := c.Next(); b != TsFromTime(t0.Add(time.Second)) {
		t.Fatalf("tx %d did not follow the wall clock", b)
	}
}

func TestWriteRefusals(t *testing.T) {
	ctx := context.Background()
	s := openTest(t, "", nil)
	sc := MustScope("w")
	a, b, ghost := uuid.New(), uuid.New(), uuid.New()
	mustNode(t, s, sc, a)
	mustNode(t, s, sc, b)
	e := uuid.New()
	mustEdge(t, s, sc, e, a, b)

	check := func(name string, err, want error) {
		t.Helper()
		if !errors.Is(err, want) {
			t.Errorf("%s: err %v, want %v", name, err, want)
		}
	}
	_, err := s.PutEdge(ctx, sc, EdgeWrite{ID: uuid.New(), Src: a, Dst: ghost, ValidFrom: NoTs, ValidTo: NoTs})
	check("missing endpoint", err, ErrNotFound)
	_, err = s.PutEdge(ctx, sc, EdgeWrite{ID: e, Src: b, Dst: a, ValidFrom: NoTs, ValidTo: NoTs})
	check("changed endpoints", err, ErrInvalid)
	_, err = s.PutNode(ctx, sc, NodeWrite{ID: a, ValidFrom: 10, ValidTo: 10})
	check("empty interval", err, ErrInvalid)
	_, err = s.PutNode(ctx, Scope{}, NodeWrite{ID: a, ValidFrom: NoTs, ValidTo: NoTs})
	check("no tenant", err, ErrInvalid)

	tombstone(t, s, sc, KindNode, b, 0)
	_, err = s.PutEdge(ctx, sc, EdgeWrite{ID: uuid.New(), Src: a, Dst: b, ValidFrom: NoTs, ValidTo: NoTs})
	check("dead endpoint", err, ErrEndpointDead)
	_, err = s.PutNode(ctx, sc, NodeWrite{ID: b, ValidFrom: NoTs, ValidTo: NoTs})
	check("resurrect node", err, ErrAlreadyTombstoned)
	tombstone(t, s, sc, KindEdge, e, 0)
	_, err = s.PutEdge(ctx, sc, EdgeWrite{ID: e, Src: a, Dst: b, ValidFrom: NoTs, ValidTo: NoTs})
	check("resurrect edge", err, ErrAlreadyTombstoned)

	// A journal fences its node: edge writes touching it are refused.
	c := uuid.New()
	mustNode(t, s, sc, c)
	err = s.Update(ctx, func(tx *Txn) error {
		w := tx.BeginJournal(sc, a, 0, tx.NextTx(), Provenance{DecidedAt: NoTs})
		w.Add(uuid.New())
		w.Finish(NewLeaseToken())
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	_, err = s.PutEdge(ctx, sc, EdgeWrite{ID: uuid.New(), Src: c, Dst: a, ValidFrom: NoTs, ValidTo: NoTs})
	check("fenced endpoint", err, ErrCascadeInFlight)
	_, err = s.PutNode(ctx, sc, NodeWrite{ID: a, ValidFrom: NoTs, ValidTo: NoTs})
	check("fenced node", err, ErrCascadeInFlight)
	if !IsRetryable(err) {
		t.Error("cascade in flight must be retryable")
	}
	if _, err := s.PutEdge(ctx, sc, EdgeWrite{ID: uuid.New(), Src: c, Dst: c, ValidFrom: NoTs, ValidTo: NoTs}); err != nil {
		t.Errorf("self-loop on a live node: %v", err)
	}
}

func TestJournalsReloadedOnOpen(t *testing.T) {
	dir := t.TempDir()
	s := openTest(t, dir, nil)
	sc := MustScope("j")
	n := uuid.New()
	ids := make([]uuid.UUID, JournalPageSize+3)
	for i := range ids {
		ids[i] = uuid.New()
	}
	err := s.Update(context.Background(), func(tx *Txn) error {
		w := tx.BeginJournal(sc, n, 5, tx.NextTx(), Provenance{RequestID: "r1", DecidedAt: NoTs})
		for _, id := range ids {
			w.Add(id)
		}
		w.Finish(NewLeaseToken())
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	_ = s.Close()
	s2 := openTest(t, dir, nil)
	e := s2.Journals().Fenced(sc, n)
	if e == nil || s2.Journals().ByRequest(sc, "r1") != e {
		t.Fatal("journal not reloaded as a fence")
	}
	if owner, _ := e.Lease(); owner != 0 {
		t.Fatal("a reloaded journal must be unowned (an orphan)")
	}
	var got []uuid.UUID
	if err := JournalPages(s2.Reader(), e, func(p []uuid.UUID) error { got = append(got, p...); return nil }); err != nil {
		t.Fatal(err)
	}
	if len(got) != len(ids) || got[0] != ids[0] || got[len(got)-1] != ids[len(ids)-1] {
		t.Fatalf("pages: %d ids back, want %d in order", len(got), len(ids))
	}
	if err := s2.RemoveJournal(e, nil); err != nil {
		t.Fatal(err)
	}
	lo, hi := TenantRange(ksJobs, sc)
	rows := 0
	_ = Scan(s2.Reader(), lo, hi, func(_, _ []byte) error { rows++; return nil })
	if rows != 0 || s2.Journals().Fenced(sc, n) != nil {
		t.Fatalf("journal removal left %d rows", rows)
	}
}

func TestTenantIsolationStore(t *testing.T) {
	s := openTest(t, "", nil)
	a, ab := MustScope("a"), MustScope("ab")
	id := uuid.New()
	mustNode(t, s, a, id)
	if _, ok, _ := s.NodeAsOf(ab, id, OpenEnd-1, OpenEnd-1); ok {
		t.Fatal("tenant ab sees a's node")
	}
	if _, err := s.PutEdge(context.Background(), ab, EdgeWrite{ID: uuid.New(), Src: id, Dst: id, ValidFrom: NoTs, ValidTo: NoTs}); !errors.Is(err, ErrNotFound) {
		t.Fatalf("edge in ab onto a's node: %v", err)
	}
	if h, _ := s.History(ab, KindNode, id); len(h) != 0 {
		t.Fatal("history crosses tenants")
	}
}
