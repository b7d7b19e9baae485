package storage

import (
	"context"
	"errors"
	"testing"

	"github.com/cockroachdb/pebble/v2"
	"github.com/google/uuid"
)

// TestRefreshFollowsACopy: a store opened over a copy that receives the
// owner's write-sets (as a standby's does) answers like the owner once
// refreshed: its committed tx follows, a journal committed on the owner
// fences its node on the copy, and the fence drops (Removed closes) when
// the owner removes the journal.
func TestRefreshFollowsACopy(t *testing.T) {
	ctx := context.Background()
	d := &logDurable{}
	owner, _ := openDurable(t, t.TempDir(), d)
	copyEng, err := OpenPebble(t.TempDir(), nil, quietLog, func(string) {}, nil, Sizes{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := OpenCopy(copyEng.DB, Options{Logger: quietLog}); !errors.Is(err, ErrEmptyCopy) {
		t.Fatalf("an empty copy opened: %v", err)
	}
	applied := 0
	apply := func() {
		t.Helper()
		d.mu.Lock()
		sets := d.sets[applied:]
		d.mu.Unlock()
		for _, ws := range sets {
			b := copyEng.NewBatch()
			if err := b.SetRepr(append([]byte(nil), ws...)); err != nil {
				t.Fatal(err)
			}
			if err := copyEng.Apply(b, pebble.NoSync); err != nil {
				t.Fatal(err)
			}
			applied++
		}
	}
	sc := MustScope("acme")
	n, hub := uuid.New(), uuid.New()
	mustNode(t, owner, sc, n)
	mustNode(t, owner, sc, hub)
	apply()
	before := dump(t, copyEng)
	cp, err := OpenCopy(copyEng.DB, Options{Clock: NewManualClock(t0), Logger: quietLog})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cp.Close(); _ = copyEng.Close() })
	if after := dump(t, copyEng); after != before {
		t.Fatal("opening a store over the copy wrote to it")
	}
	if got, want := cp.Committed(), owner.Committed(); got != want {
		t.Fatalf("copy committed %s at open, owner %s", got, want)
	}

	// A write and a journal on the owner: unseen until the copy applies
	// them and refreshes.
	mustNode(t, owner, sc, uuid.New())
	var e *JournalEntry
	if err := owner.Update(ctx, func(tx *Txn) error {
		at := tx.NextTx()
		e = tx.BeginJournal(sc, hub, at, at, Provenance{RequestID: "r-hub"}, Fingerprint{})
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := cp.Refresh(); err != nil {
		t.Fatal(err)
	}
	if cp.Committed() == owner.Committed() {
		t.Fatal("the copy's committed tx moved before it applied anything")
	}
	apply()
	if err := cp.Refresh(); err != nil {
		t.Fatal(err)
	}
	if got, want := cp.Committed(), owner.Committed(); got != want {
		t.Fatalf("copy committed %s after refresh, owner %s", got, want)
	}
	f := cp.Journals().Fenced(sc, hub)
	if f == nil || f.J.Tx != e.J.Tx {
		t.Fatalf("the hub is not fenced on the copy at the journal's tx: %+v", f)
	}
	if at, by := cp.SafeAt(sc, cp.Committed(), hub); by == nil || at != e.J.Tx-1 {
		t.Fatalf("a read of the hub on the copy answers at %s (by %v), want below the journal's tx %s", at, by, e.J.Tx)
	}
	if at, by := cp.SafeAt(sc, cp.Committed(), n); by != nil || at != cp.Committed() {
		t.Fatalf("a read of another node is held by %v at %s", by, at)
	}

	// The owner removes the journal: the copy's fence drops on refresh.
	rc := Receipt{Op: OpTombstoneNode, Status: StatusOK, ID: hub, Tx: e.J.Tx}
	if err := owner.Update(ctx, func(tx *Txn) error { return tx.RemoveJournal(e, &rc) }); err != nil {
		t.Fatal(err)
	}
	apply()
	if err := cp.Refresh(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-f.Removed():
	default:
		t.Fatal("the copy's journal entry was not removed when the owner's was")
	}
	if cp.Journals().Fenced(sc, hub) != nil {
		t.Fatal("the hub is still fenced on the copy")
	}
	if _, ok, err := AsOf(cp.Reader(), sc, KindNode, n, cp.Committed(), cp.Committed()); err != nil || !ok {
		t.Fatalf("node read on the copy: ok %v err %v", ok, err)
	}
}
