package storage

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

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

// TestErasesOfOneGroupListInTheirOrder: erases begun in one transaction
// (one group) at the same microsecond list in the order they were begun,
// whatever their head keys' order and with another entity's erase between
// them, and again after the store is opened anew; an erase begun after a
// reopen whose clock is an hour behind lists after them. The eraser
// applies them in that order, so the first request of two erasing one
// node is the one that erases its versions (a black-box probe found the
// second first in about half the pairs: the heads were ordered by key, a
// hash of the request id).
func TestErasesOfOneGroupListInTheirOrder(t *testing.T) {
	dir := t.TempDir()
	clock := NewManualClock(t0)
	s := openTest(t, dir, clock)
	sc := MustScope("t17")
	n, m := uuid.New(), uuid.New()
	mustNode(t, s, sc, n)
	mustNode(t, s, sc, m)
	// Request ids whose head keys sort against the order they are begun in.
	var first, second string
	for i := 0; first == ""; i++ {
		a, b := fmt.Sprintf("first-%d", i), fmt.Sprintf("second-%d", i)
		if bytes.Compare(EraseJobKey(sc, 1, a), EraseJobKey(sc, 1, b)) > 0 {
			first, second = a, b
		}
	}
	err := s.Update(context.Background(), func(t *Txn) error {
		tx, other := t.NextTx(), t.NextTx()
		t.BeginErase(sc, EraseJob{Op: OpEraseNode, ID: n, Tx: tx, Prov: Provenance{RequestID: first}})
		t.BeginErase(sc, EraseJob{Op: OpEraseNode, ID: m, Tx: other, Prov: Provenance{RequestID: "other"}})
		t.BeginErase(sc, EraseJob{Op: OpEraseNode, ID: n, Tx: tx, Prov: Provenance{RequestID: second}})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	order := func(s *Store) []string {
		var ids []string
		for _, e := range s.Erases().List() {
			ids = append(ids, e.Job.Prov.RequestID)
		}
		return ids
	}
	want := []string{first, "other", second}
	if got := order(s); !slices.Equal(got, want) {
		t.Fatalf("listed %v, want %v", got, want)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	clock.Set(t0.Add(-time.Hour)) // a failover to a member whose clock is behind
	s = openTest(t, dir, clock)
	if got := order(s); !slices.Equal(got, want) {
		t.Fatalf("after a new open, listed %v, want %v", got, want)
	}
	err = s.Update(context.Background(), func(t *Txn) error {
		t.BeginErase(sc, EraseJob{Op: OpEraseNode, ID: n, Tx: t.NextTx(), Prov: Provenance{RequestID: "third"}})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := order(s), append(want, "third"); !slices.Equal(got, want) {
		t.Fatalf("listed %v, want %v", got, want)
	}
}
