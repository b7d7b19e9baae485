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
		tx.BeginJournal(sc, a, 0, tx.NextTx(), Provenance{DecidedAt: NoTs}, Fingerprint{})
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

// TestJournalsReloadedOnOpen: a journal head is a fence across restarts,
// and removing it deletes the head and the edge-id pages an older build
// wrote beside it (here written by hand in that format).
func TestJournalsReloadedOnOpen(t *testing.T) {
	dir := t.TempDir()
	s := openTest(t, dir, nil)
	sc := MustScope("j")
	n := uuid.New()
	err := s.Update(context.Background(), func(tx *Txn) error {
		e := tx.BeginJournal(sc, n, 5, tx.NextTx(), Provenance{RequestID: "r1", DecidedAt: NoTs}, Fingerprint{1})
		// The older build's layout: the head counts its pages.
		j := e.J
		j.Edges, j.PageCount = JournalPageSize+3, 2
		_ = tx.b.Set(e.HeadKey, EncodeJournal(&j), nil)
		key, _ := DecodeKey(e.HeadKey)
		for p := uint32(0); p < 2; p++ {
			_ = tx.b.Set(JournalPageKey(sc, 0, key.CreatedAt, key.JobID, p), EncodeJournalPage([]uuid.UUID{uuid.New()}), nil)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	_ = s.Close()
	s2 := openTest(t, dir, nil)
	e := s2.Journals().Fenced(sc, n)
	if e == nil || s2.Journals().ByRequest(sc, "r1") != e || e.J.PageCount != 2 {
		t.Fatal("journal not reloaded as a fence")
	}
	rc := Receipt{Op: OpTombstoneNode, Status: StatusOK, ID: n, Tx: e.J.Tx, Journaled: true}
	if err := s2.Update(context.Background(), func(tx *Txn) error { return tx.RemoveJournal(e, &rc) }); err != nil {
		t.Fatal(err)
	}
	select {
	case <-e.Removed():
	default:
		t.Fatal("Removed not closed after the removal committed")
	}
	rows := 0
	for _, st := range []byte{CascadeJournalState, JournalPageState} {
		lo, hi := JobsInState(sc, st)
		_ = Scan(s2.Reader(), lo, hi, func(_, _ []byte) error { rows++; return nil })
	}
	if rows != 0 || s2.Journals().Fenced(sc, n) != nil {
		t.Fatalf("journal removal left %d rows", rows)
	}
	if got, ok, err := GetReceipt(s2.Reader(), sc, "r1"); err != nil || !ok || got != rc {
		t.Fatalf("receipt %+v %v %v, want %+v", got, ok, err, rc)
	}
	if out, _, err := s2.PendingOutbox(sc); err != nil || len(out) != 1 || out[0].RequestID != "r1" {
		t.Fatalf("outbox %+v %v", out, err)
	}
	// A second removal of the same entry finds it gone.
	err = s2.Update(context.Background(), func(tx *Txn) error { return tx.RemoveJournal(e, &rc) })
	if !errors.Is(err, ErrJournalGone) {
		t.Fatalf("second removal: %v, want ErrJournalGone", err)
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
