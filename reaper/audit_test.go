package reaper

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/telha/telha-cascade/cascade"
	"github.com/telha/telha-cascade/storage"
)

// Issue 20: the audit under concurrency, reaper side.

// openWorld is newWorld with cascade hooks (they are fixed at open).
func openWorld(t *testing.T, cfg Config, hooks cascade.Hooks) *world {
	w := &world{t: t, dir: t.TempDir(), clock: storage.NewManualClock(time.Date(2026, 5, 1, 0, 0, 0, 0, time.UTC)), pub: &fakePublisher{}, cfg: cfg, hooks: hooks}
	w.open()
	t.Cleanup(w.close)
	return w
}

// shortEraseWait bounds an erase's waits for the test (a bug shows as a
// failure in seconds, not the 2-minute production bound).
func shortEraseWait(t *testing.T, d time.Duration) {
	old := cascade.EraseWaitLimit
	cascade.EraseWaitLimit = d
	t.Cleanup(func() { cascade.EraseWaitLimit = old })
}

// TestPanickingApplierLeaksNoSnapshot (issue 20 item 12): a journal applier
// that panics between two chunks (its Pebble snapshot open) is reported as
// a failed attempt, and closes its snapshot: an erase afterwards, which
// waits for zero open snapshots before its scrub, completes.
func TestPanickingApplierLeaksNoSnapshot(t *testing.T) {
	shortEraseWait(t, 3*time.Second)
	var armed atomic.Bool
	armed.Store(true)
	finished := make(chan error, 4)
	erased := make(chan error, 4)
	w := openWorld(t, Config{RetryBackoff: time.Hour, Hooks: Hooks{
		Finished:      func(_ *storage.JournalEntry, _ storage.Receipt, err error) { finished <- err },
		EraseFinished: func(_ *storage.EraseEntry, _ storage.Receipt, err error) { erased <- err },
	}}, cascade.Hooks{JournalStep: func(_ *storage.JournalEntry, n int) {
		if n == 1 && armed.CompareAndSwap(true, false) {
			panic("injected applier bug")
		}
	}})
	w.svc.Start()
	h := w.hub(6)
	w.tombstone(h, "del-panic")
	select {
	case err := <-finished:
		if err == nil || !strings.Contains(err.Error(), "panic") {
			t.Fatalf("attempt ended with %v, want the panic reported", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the attempt did not end")
	}
	if n := w.store.Engine().Metrics().Snapshots.Count; n != 0 {
		t.Errorf("%d Pebble snapshots open after the panicking applier ended, want 0", n)
	}
	// An erase of an unrelated node (no journal in its neighbourhood).
	x, y := uuid.New(), uuid.New()
	for _, n := range []uuid.UUID{x, y} {
		if _, err := w.ops.PutNode(ctx, sc, storage.NodeWrite{ID: n, ValidFrom: storage.NoTs, ValidTo: storage.NoTs}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := w.ops.PutEdge(ctx, sc, storage.EdgeWrite{ID: uuid.New(), Src: x, Dst: y, ValidFrom: storage.NoTs, ValidTo: storage.NoTs}); err != nil {
		t.Fatal(err)
	}
	out, _, err := w.ops.Apply(ctx, []cascade.Request{{Scope: sc, Op: storage.OpEraseNode, ID: x, RequestID: "erase-x", ValidEnd: storage.NoTs,
		Prov: storage.Provenance{Actor: "dpo", Reason: "art. 17", DecidedAt: storage.NoTs}}})
	if err != nil || out[0].Kind != cascade.Erasing {
		t.Fatalf("erase_node: %+v %v", out[0], err)
	}
	select {
	case err := <-erased:
		if err != nil {
			t.Fatalf("erase after the panicking applier: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the erase did not finish")
	}
}

// TestLongScanIsNotAStall (issue 20 item 17): an applier counting a hub
// whose scan outlasts StallTimeout, but which keeps reading rows, is not
// abandoned: the scan reports progress to the watchdog. The clock is the
// test's: it moves 3/4 of StallTimeout every few hundred rows of the scan,
// so a scan that reported nothing would be idle for several timeouts.
func TestLongScanIsNotAStall(t *testing.T) {
	const stallTimeout = 40 * time.Millisecond
	stalled := make(chan struct{}, 4)
	finished := make(chan error, 4)
	var w *world
	var ticks atomic.Int64
	var armed atomic.Bool
	w = openWorld(t, Config{StallTimeout: stallTimeout, RetryBackoff: time.Hour, Hooks: Hooks{
		Stalled:  func(*storage.JournalEntry) { stalled <- struct{}{} },
		Finished: func(_ *storage.JournalEntry, _ storage.Receipt, err error) { finished <- err },
	}}, cascade.Hooks{JournalScanned: func(*storage.JournalEntry, int) {
		if !armed.Load() {
			return
		}
		w.clock.Advance(stallTimeout * 3 / 4)
		if ticks.Add(1) == 3 {
			// Idle for 2.25 timeouts unless the scan reported progress: give
			// the watchdog (ticking every StallTimeout/4) ample time to act.
			select {
			case <-stalled:
				stalled <- struct{}{}
			case <-time.After(2 * time.Second):
			}
		}
	}})
	w.svc.Start()
	h := uuid.New()
	open := func(r cascade.Request) cascade.Request {
		r.Scope, r.Prov, r.ValidFrom, r.ValidTo, r.ValidEnd = sc, prov, storage.NoTs, storage.NoTs, storage.NoTs
		return r
	}
	reqs := []cascade.Request{open(cascade.Request{Op: storage.OpPutNode, ID: h})}
	for i := 0; i < 4*256; i++ {
		m := uuid.New()
		reqs = append(reqs, open(cascade.Request{Op: storage.OpPutNode, ID: m}),
			open(cascade.Request{Op: storage.OpPutEdge, ID: uuid.New(), Src: h, Dst: m}))
	}
	out, _, err := w.ops.Apply(ctx, reqs)
	if err != nil {
		t.Fatal(err)
	}
	for _, oc := range out {
		if oc.Err != nil {
			t.Fatal(oc.Err)
		}
	}
	armed.Store(true)
	w.tombstone(h, "del-long-scan")
	select {
	case err := <-finished:
		if err != nil {
			t.Fatalf("the attempt failed: %v", err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("the attempt did not end")
	}
	if ticks.Load() < 3 {
		t.Fatalf("the scan ticked %d times; the test wants at least 3", ticks.Load())
	}
	select {
	case <-stalled:
		t.Fatal("the watchdog abandoned an applier that was scanning")
	default:
	}
	if !w.dead(h) {
		t.Fatal("hub alive")
	}
}

// TestNoAttemptStartsOnceStopped (issue 20 item 18): once Stop has begun,
// nothing starts an applier (a pass, a hand-off): Stop's wait for the
// appliers cannot race an applier's start (a WaitGroup Add after its Wait),
// and no applier touches the store after Stop returned (the caller closes
// it then).
func TestNoAttemptStartsOnceStopped(t *testing.T) {
	var started atomic.Int64
	w := openWorld(t, Config{Hooks: Hooks{Finished: func(*storage.JournalEntry, storage.Receipt, error) { started.Add(1) }}}, cascade.Hooks{})
	h := w.orphan(6)
	w.svc.Start()
	w.svc.Stop()
	res := w.svc.RunOnce(ctx) // a pass that was due as Stop began
	for _, e := range w.store.Journals().List() {
		w.svc.Begin(e) // a hand-off from a group still committing
	}
	if n := started.Load(); n != 0 {
		t.Fatalf("%d attempts ran after Stop (pass %+v)", n, res)
	}
	if w.dead(h) || w.store.Journals().Len() != 1 {
		t.Fatal("the journal was applied after Stop")
	}
}

// pickyPublisher fails for good on some request ids.
type pickyPublisher struct {
	mu    sync.Mutex
	bad   map[string]bool
	got   map[string]bool
	tries map[string]int
}

func (p *pickyPublisher) PublishResult(_ context.Context, tenant, requestID string, _ storage.Receipt) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.tries[requestID]++
	if p.bad[requestID] {
		return fmt.Errorf("result of %s: refused by the stream", requestID)
	}
	p.got[tenant+"/"+requestID] = true
	return nil
}

func (p *pickyPublisher) has(key string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.got[key]
}

// TestFailingOutboxRowDoesNotBlockOthers (issue 20 item 19): a result
// that the publisher refuses for good neither blocks the rows after it
// nor other tenants' rows; it is retried with a backoff, and after
// PoisonAfter failures it is parked, loudly (a hook for the metric, and
// in the summary), and retried rarely.
func TestFailingOutboxRowDoesNotBlockOthers(t *testing.T) {
	w := openWorld(t, Config{}, cascade.Hooks{})
	// Finished journals of two tenants leave their results in the outbox.
	finish := func(tenant, rid string) {
		s := storage.MustScope(tenant)
		h := uuid.New()
		if _, err := w.solo.PutNode(ctx, s, storage.NodeWrite{ID: h, ValidFrom: storage.NoTs, ValidTo: storage.NoTs}); err != nil {
			t.Fatal(err)
		}
		for i := 0; i < 5; i++ {
			m := uuid.New()
			if _, err := w.solo.PutNode(ctx, s, storage.NodeWrite{ID: m, ValidFrom: storage.NoTs, ValidTo: storage.NoTs}); err != nil {
				t.Fatal(err)
			}
			if _, err := w.solo.PutEdge(ctx, s, storage.EdgeWrite{ID: uuid.New(), Src: h, Dst: m, ValidFrom: storage.NoTs, ValidTo: storage.NoTs}); err != nil {
				t.Fatal(err)
			}
		}
		out, _, err := w.solo.Apply(ctx, []cascade.Request{{Scope: s, Op: storage.OpTombstoneNode, ID: h, RequestID: rid,
			ValidFrom: storage.NoTs, ValidTo: storage.NoTs, ValidEnd: storage.NoTs, Prov: prov}})
		if err != nil || out[0].Kind != cascade.Journaled {
			t.Fatalf("tombstone_node: %+v %v", out[0], err)
		}
		if _, err := w.solo.ApplyJournal(ctx, out[0].Journal, cascade.JournalObserver{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, rid := range []string{"a-bad", "a-1", "a-2", "a-3"} {
		finish("a", rid)
	}
	for _, rid := range []string{"b-1", "b-2"} {
		finish("b", rid)
	}
	pub := &pickyPublisher{bad: map[string]bool{"a-bad": true}, got: map[string]bool{}, tries: map[string]int{}}
	var parked []string
	svc, err := New(w.store, Config{Applier: cascade.NewApplier(w.store, cascade.Options{MaxBatchOps: 20, Logger: noLog}), Publisher: pub,
		Clock: w.clock, Logger: noLog, PoisonAfter: 3, OutboxInterval: time.Second,
		Hooks: Hooks{OutboxParked: func(tenant, requestID string, _ error) { parked = append(parked, tenant+"/"+requestID) }}})
	if err != nil {
		t.Fatal(err)
	}
	defer svc.Stop()

	n, err := svc.PublishOutbox(ctx)
	if err == nil || !strings.Contains(err.Error(), "a-bad") {
		t.Errorf("first publish: error %v, want the refused row named", err)
	}
	for _, k := range []string{"a/a-1", "a/a-2", "a/a-3", "b/b-1", "b/b-2"} {
		if !pub.has(k) {
			t.Errorf("%s not published: the refused row blocked it (published %d)", k, n)
		}
	}
	// Retried after a backoff, not at every pass; parked at PoisonAfter.
	if _, err := svc.PublishOutbox(ctx); err != nil {
		t.Errorf("a pass within the row's backoff: %v, want nothing tried", err)
	}
	if pub.tries["a-bad"] != 1 {
		t.Fatalf("the refused row was tried %d times within its backoff, want 1", pub.tries["a-bad"])
	}
	for i := 0; i < 2; i++ {
		w.clock.Advance(11 * time.Minute)
		_, _ = svc.PublishOutbox(ctx)
	}
	if pub.tries["a-bad"] != 3 || len(parked) != 1 || parked[0] != "a/a-bad" {
		t.Fatalf("after 3 failures: tried %d times, parked %v; want 3 and a/a-bad parked once", pub.tries["a-bad"], parked)
	}
	if got := svc.Summarize().OutboxParked; got != 1 {
		t.Fatalf("summary: %d results parked, want 1", got)
	}
	rows, _, err := w.store.PendingOutbox(storage.MustScope("a"))
	if err != nil || len(rows) != 1 || rows[0].RequestID != "a-bad" {
		t.Fatalf("outbox of a: %+v %v, want the refused row kept", rows, err)
	}
	// Once the publisher takes it, it leaves the outbox and the summary.
	pub.mu.Lock()
	pub.bad = nil
	pub.mu.Unlock()
	w.clock.Advance(11 * time.Minute)
	if _, err := svc.PublishOutbox(ctx); err != nil || !pub.has("a/a-bad") || svc.Summarize().OutboxParked != 0 {
		t.Fatalf("after the publisher recovered: %v, published %v, parked %d", err, pub.has("a/a-bad"), svc.Summarize().OutboxParked)
	}
}
