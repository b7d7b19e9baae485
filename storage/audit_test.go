package storage

import (
	"context"
	"errors"
	"testing"

	"github.com/google/uuid"
)

// Issue 20: the audit under concurrency, storage side.

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// TestRolledBackRegistrationsClose (issue 20 item 16): a journal or erase
// registered by a transaction that does not commit fences its node for
// the rest of that transaction only; it is never listed to the reaper or
// the eraser (which run beside the writer), and its Removed channel is
// closed when the transaction rolls back, so nothing that found it waits
// for a removal that will never commit.
func TestRolledBackRegistrationsClose(t *testing.T) {
	s := openTest(t, "", nil)
	sc := MustScope("t16")
	n := uuid.New()
	mustNode(t, s, sc, n)
	boom := errors.New("the group fails")
	var je *JournalEntry
	var ee *EraseEntry
	var listedJ, listedE int
	err := s.Update(context.Background(), func(t *Txn) error {
		tx := t.NextTx()
		je = t.BeginJournal(sc, n, tx, tx, Provenance{RequestID: "r1"}, Fingerprint{})
		ee = t.BeginErase(sc, EraseJob{Op: OpEraseNode, ID: n, Tx: tx, Prov: Provenance{RequestID: "r2"}})
		if t.Fenced(sc, n) != je || t.Store().Erases().ByRequest(sc, "r2") != ee {
			return errors.New("the transaction's own decisions do not see its registrations")
		}
		listedJ, listedE = len(s.Journals().List()), len(s.Erases().List())
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("update: %v", err)
	}
	if listedJ != 0 || listedE != 0 {
		t.Errorf("before its commit, %d journals and %d erases listed, want none", listedJ, listedE)
	}
	if !isClosed(je.Removed()) || !isClosed(ee.Removed()) {
		t.Errorf("rolled back: journal removed closed %v, erase removed closed %v, want both closed", isClosed(je.Removed()), isClosed(ee.Removed()))
	}
	if s.Journals().Fenced(sc, n) != nil || s.Erases().ByRequest(sc, "r2") != nil {
		t.Error("rolled-back registrations still registered")
	}

	// Committed: listed, and not removed.
	err = s.Update(context.Background(), func(t *Txn) error {
		tx := t.NextTx()
		je = t.BeginJournal(sc, n, tx, tx, Provenance{RequestID: "r1"}, Fingerprint{})
		ee = t.BeginErase(sc, EraseJob{Op: OpEraseNode, ID: n, Tx: tx, Prov: Provenance{RequestID: "r2"}})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Journals().List()) != 1 || len(s.Erases().List()) != 1 || isClosed(je.Removed()) || isClosed(ee.Removed()) {
		t.Fatalf("committed registrations: %d journals, %d erases listed, removed %v %v", len(s.Journals().List()), len(s.Erases().List()),
			isClosed(je.Removed()), isClosed(ee.Removed()))
	}
}
