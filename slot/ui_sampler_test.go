package slot

import (
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/telha/telha-cascade/storage"
	"github.com/telha/telha-cascade/ui"
)

// TestOverviewRatesOverTheLastMinute (issue 23 item 7): the overview's
// rates come from a ring the worker samples every 5 s whether or not the
// page is loaded: over the newest sample at least a minute old, since
// start while the worker is younger; the ring stays bounded.
func TestOverviewRatesOverTheLastMinute(t *testing.T) {
	var w rateWindow
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	w.add(t0, map[string]float64{}) // the start: every counter at 0
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	for d := 5 * time.Second; d <= 30*time.Second; d += 5 * time.Second {
		w.add(at(d), map[string]float64{"ok": float64(d / time.Second)})
	}
	// A first page load 30 s after start: over the 30 s since start.
	if base, when := w.base(at(30 * time.Second)); base["ok"] != 0 || !when.Equal(t0) {
		t.Fatalf("after 30 s: base %v at %s, want the start's (0 at %s)", base, when, t0)
	}
	for d := 35 * time.Second; d <= 10*time.Minute; d += 5 * time.Second {
		w.add(at(d), map[string]float64{"ok": float64(d / time.Second)})
		if len(w.samples) > 26 {
			t.Fatalf("at %s the ring holds %d samples, want at most 26 (two minutes every 5 s)", d, len(w.samples))
		}
	}
	now := at(10*time.Minute + 2*time.Second)
	base, when := w.base(now)
	if want := at(9 * time.Minute); base["ok"] != 540 || !when.Equal(want) {
		t.Fatalf("after 10 min: base %v at %s, want 540 at %s (the newest sample a minute old)", base, when, want)
	}
}

// TestJournalHistoryRecordsAtFinish (issue 30): the reaper's hook records
// a journal at its finish, with its receipt and its attempts (the failed
// ones it saw, or the failures a look saw), whether or not a look of the
// sampler ever saw it; a journal the hook and a look both see finish is
// listed once, whichever comes first.
func TestJournalHistoryRecordsAtFinish(t *testing.T) {
	a := &Slot{} // no reaper: every look lists no journal
	var h journalHistory
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	entry := func() *storage.JournalEntry {
		return &storage.JournalEntry{Scope: storage.MustScope("acme"),
			J: storage.Journal{NodeID: uuid.New(), Tx: storage.TsFromTime(t0), CreatedAt: storage.TsFromTime(t0)}}
	}
	ok := storage.Receipt{Status: storage.StatusOK, EdgesTombstoned: 20_001, Journaled: true}

	// Between two looks: never seen in flight, recorded by the hook.
	e1 := entry()
	h.observe(a, t0)
	h.finished(e1, ok, nil, t0.Add(100*time.Millisecond))
	h.observe(a, t0.Add(time.Second))
	l := h.list()
	if len(l) != 1 || l[0].NodeID != e1.J.NodeID.String() || l[0].Outcome != "ok" || l[0].EdgesTombstoned != 20_001 ||
		l[0].Took != 100*time.Millisecond || l[0].Attempts != 1 {
		t.Fatalf("a journal finished between two looks: %+v", l)
	}

	// Two failed attempts, then done: 3 attempts.
	e2 := entry()
	h.finished(e2, storage.Receipt{}, errors.New("boom"), t0.Add(2*time.Second))
	h.finished(e2, storage.Receipt{}, errors.New("boom"), t0.Add(3*time.Second))
	h.finished(e2, ok, nil, t0.Add(4*time.Second))
	if l := h.list(); len(l) != 2 || l[0].NodeID != e2.J.NodeID.String() || l[0].Attempts != 3 {
		t.Fatalf("after two failed attempts: %+v", l)
	}

	// Seen in flight by a look, then finished: the hook records it, the
	// next look does not again.
	e3 := entry()
	j3 := entryJournal(e3)
	j3.Failures = 1
	h.mu.Lock()
	h.live = map[string]seenJournal{ui.JournalKey(j3): {j: j3, started: t0}}
	h.mu.Unlock()
	h.finished(e3, ok, nil, t0.Add(5*time.Second))
	h.observe(a, t0.Add(6*time.Second))
	if l := h.list(); len(l) != 3 || l[0].NodeID != e3.J.NodeID.String() || l[0].Attempts != 2 {
		t.Fatalf("seen, then finished: %+v", l)
	}

	// Seen, gone at the next look (recorded there), then the hook: once.
	e4 := entry()
	j4 := entryJournal(e4)
	h.mu.Lock()
	h.live = map[string]seenJournal{ui.JournalKey(j4): {j: j4, started: t0}}
	h.mu.Unlock()
	h.observe(a, t0.Add(7*time.Second))
	h.finished(e4, ok, nil, t0.Add(7*time.Second+time.Millisecond))
	if l := h.list(); len(l) != 4 || l[0].NodeID != e4.J.NodeID.String() || l[1].NodeID != e3.J.NodeID.String() {
		t.Fatalf("a look, then the hook: %d rows, want 4 (%+v)", len(l), l)
	}

	// Bounded: the newest finishedKept.
	for i := 0; i < finishedKept+10; i++ {
		h.finished(entry(), ok, nil, t0.Add(time.Minute))
	}
	if l := h.list(); len(l) != finishedKept {
		t.Fatalf("%d kept, want %d", len(l), finishedKept)
	}
}
