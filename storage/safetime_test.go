package storage

import (
	"context"
	"errors"
	"testing"

	"github.com/google/uuid"
)

// TestCommittedIsAlwaysADurableTx: the committed tx (the default and the
// ceiling of every read) advances only to txs a committed batch wrote
// under: not for a commit that failed, nor for a tx taken and never
// written (a refused request); after a restart, with the clock stepped
// back, it is where it was, and no new write lands at or below it. Before,
// it advanced to the clock's last tx after every task, so a read answered
// at an abandoned tx could change after a restart with a clock behind it.
func TestCommittedIsAlwaysADurableTx(t *testing.T) {
	dir := t.TempDir()
	clock := NewManualClock(t0)
	var fault *FaultEngine
	open := func() *Store {
		s, err := OpenStore(dir, Options{Clock: clock, Logger: quietLog, WrapEngine: func(e Engine) Engine {
			fault = NewFaultEngine(e)
			return fault
		}})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	s := open()
	sc := MustScope("acme")
	v := mustNode(t, s, sc, uuid.New())
	if c := s.Committed(); c != v.Tx.Start {
		t.Fatalf("committed %s after a write at %s", c, v.Tx.Start)
	}
	// A tx taken and not written (a refusal).
	if err := s.Update(context.Background(), func(tx *Txn) error { tx.NextTx(); return nil }); err != nil {
		t.Fatal(err)
	}
	// A write whose commit fails.
	boom := errors.New("disk gone")
	fault.SetInject(func(int) error { return boom })
	if _, err := s.PutNode(context.Background(), sc, NodeWrite{ID: uuid.New(), ValidFrom: NoTs, ValidTo: NoTs}); !errors.Is(err, boom) {
		t.Fatalf("put with a failing commit: %v", err)
	}
	fault.SetInject(nil)
	if c := s.Committed(); c != v.Tx.Start {
		t.Fatalf("committed %s after an abandoned tx and a failed commit; want the last durable tx %s", c, v.Tx.Start)
	}
	if s.Clock().Last() <= v.Tx.Start {
		t.Fatal("the clock handed out no tx after the write: the test proves nothing")
	}
	_ = s.Close()
	clock.Set(t0) // the wall clock is behind after the restart
	s = open()
	defer s.Close()
	if c := s.Committed(); c != v.Tx.Start {
		t.Fatalf("committed %s after the restart, want %s", c, v.Tx.Start)
	}
	if w := mustNode(t, s, sc, uuid.New()); w.Tx.Start <= v.Tx.Start {
		t.Fatalf("a write after the restart at tx %s, at or below the committed %s", w.Tx.Start, v.Tx.Start)
	}
}
