package storage

import (
	"context"
	"errors"
	"testing"

	"github.com/google/uuid"
)

// TestFencesUpToSeesAJournalBeforeItIsMarkedCommitted: FencesUpTo copies a
// tenant's fences with tx <= t from the registry, including a journal
// whose head has committed and moved Committed to its tx but which the
// writer has not yet marked committed (List does not show it yet): a
// reader at Committed must see that fence. Another tenant's journals, a
// journal above t, and one whose transaction rolled back are not
// returned.
func TestFencesUpToSeesAJournalBeforeItIsMarkedCommitted(t *testing.T) {
	s := openTest(t, "", nil)
	ctx := context.Background()
	sc, other := MustScope("a"), MustScope("b")
	n, m := uuid.New(), uuid.New()
	if err := s.Update(ctx, func(tx *Txn) error {
		tx.BeginJournal(other, m, 0, tx.NextTx(), Provenance{DecidedAt: NoTs}, Fingerprint{})
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	var e *JournalEntry
	var inWindow map[uuid.UUID]*JournalEntry
	var listed int
	var committedThen Ts
	err := s.Update(ctx, func(tx *Txn) error {
		// Registered before BeginJournal's: runs after the commit, before
		// the entry is marked committed.
		tx.AfterCommit(func() {
			committedThen = s.Committed()
			inWindow = s.Journals().FencesUpTo(sc, committedThen)
			for _, x := range s.Journals().List() {
				if x == e {
					listed++
				}
			}
		})
		e = tx.BeginJournal(sc, n, 0, tx.NextTx(), Provenance{DecidedAt: NoTs}, Fingerprint{})
		if got := s.Journals().FencesUpTo(sc, e.J.Tx-1); got[n] != nil {
			t.Errorf("a journal at tx %d returned for t = %d", e.J.Tx, e.J.Tx-1)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if committedThen < e.J.Tx {
		t.Fatalf("committed %d below the journal's tx %d after its commit", committedThen, e.J.Tx)
	}
	if listed != 0 {
		t.Fatal("List showed the journal before it was marked committed: this test no longer probes that window")
	}
	if len(inWindow) != 1 || inWindow[n] != e {
		t.Fatalf("FencesUpTo at the committed tx, before the mark: %v, want only N's journal", inWindow)
	}
	if got := s.Journals().FencesUpTo(sc, s.Committed()); len(got) != 1 || got[n] != e {
		t.Fatalf("FencesUpTo after the mark: %v", got)
	}
	// A journal whose transaction rolls back is gone with it.
	k := uuid.New()
	boom := errors.New("boom")
	if err := s.Update(ctx, func(tx *Txn) error {
		tx.BeginJournal(sc, k, 0, tx.NextTx(), Provenance{DecidedAt: NoTs}, Fingerprint{})
		return boom
	}); !errors.Is(err, boom) {
		t.Fatal(err)
	}
	if got := s.Journals().FencesUpTo(sc, OpenEnd); got[k] != nil || got[n] != e || len(got) != 1 {
		t.Fatalf("after a rollback: %v", got)
	}
}
