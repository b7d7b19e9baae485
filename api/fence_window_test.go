package api_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/telha/telha-cascade/api"
	"github.com/telha/telha-cascade/cascade"
	"github.com/telha/telha-cascade/storage"
)

// TestEdgeWalkFencesAJournalJustCommitted: a journal's head has committed
// and the committed tx has moved to its tx, but the writer has not yet
// run the after-commit action that marks the entry committed. An edge walk
// of A at that moment reads at a t at or above the journal's tx; its view
// is taken before the journal's chunks land, then the journal lands whole
// and its fence drops before the walk checks N (a hook pauses it there).
// The walk must not answer A->N live at t (read again at the same
// coordinate, it is dead): it must be blocked by N's journal. The fences
// the walk took first skipped entries not marked committed, so it missed
// the journal and answered A->N live.
func TestEdgeWalkFencesAJournalJustCommitted(t *testing.T) {
	e := newEnv(t, cascade.MinMaxBatchOps)
	a, n := uuid.New(), uuid.New()
	e.apply(cascade.Request{Op: storage.OpPutNode, ID: a})
	e.apply(cascade.Request{Op: storage.OpPutNode, ID: n})
	e.apply(cascade.Request{Op: storage.OpPutEdge, ID: uuid.New(), Src: a, Dst: n, Label: "rel"})
	e.clock.Advance(time.Second)

	paused, resume := make(chan struct{}), make(chan struct{})
	var once sync.Once
	defer api.SetWalkHook(func(other uuid.UUID) {
		if other == n {
			once.Do(func() { close(paused); <-resume })
		}
	})()
	type walk struct {
		at      storage.Ts
		page    storage.EdgesPage
		blocked *storage.JournalEntry
		err     error
	}
	done := make(chan walk, 1)
	reached := false
	var j *storage.JournalEntry
	err := e.store.Update(context.Background(), func(tx *storage.Txn) error {
		// Registered before BeginJournal's own: runs once the batch is
		// durable and the committed tx has advanced, before the entry is
		// marked committed. The walk starts here and pauses at N.
		tx.AfterCommit(func() {
			go func() {
				at := e.store.Committed()
				page, blocked, err := api.SafeEdgesPage(e.store, e.sc, a, storage.DirBoth, at, at, nil, 100, 1000)
				done <- walk{at, page, blocked, err}
			}()
			select {
			case <-paused:
				reached = true
			case w := <-done:
				done <- w
			case <-time.After(30 * time.Second):
			}
		})
		at := tx.NextTx()
		j = tx.BeginJournal(e.sc, n, at, at, storage.Provenance{RequestID: "del-n", DecidedAt: storage.NoTs}, storage.Fingerprint{})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if !reached {
		close(resume)
		t.Fatalf("the walk never reached N: %+v", <-done)
	}
	// N's journal lands whole and its fence drops, the walk paused at N.
	if _, err := e.ops.ApplyJournal(context.Background(), j, cascade.JournalObserver{}); err != nil {
		close(resume)
		t.Fatal(err)
	}
	if e.store.Journals().Fenced(e.sc, n) != nil {
		close(resume)
		t.Fatal("N still fenced after its journal")
	}
	close(resume)
	w := <-done
	if w.err != nil {
		t.Fatal(w.err)
	}
	if w.at < j.J.Tx {
		t.Fatalf("the walk read at %d, below the journal's tx %d: the committed tx had not advanced", w.at, j.J.Tx)
	}
	if w.blocked != nil {
		if w.blocked != j {
			t.Fatalf("blocked by %+v, want N's journal", w.blocked.J)
		}
		return
	}
	again, err := storage.EdgesOfPage(e.store.Reader(), e.sc, a, storage.DirBoth, w.at, w.at, nil, 100, 1000, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Fatalf("the walk was not blocked by N's journal (tx %d): it answered %d edges of A at tx %d; read again there: %d",
		j.J.Tx, len(w.page.Edges), w.at, len(again.Edges))
}
