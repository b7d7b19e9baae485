package reaper

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/google/uuid"
	"github.com/telha/telha-cascade/cascade"
	"github.com/telha/telha-cascade/internal/testnats"
	"github.com/telha/telha-cascade/storage"
)

var (
	ctx   = context.Background()
	noLog = slog.New(slog.NewTextHandler(io.Discard, nil))
	prov  = storage.Provenance{Actor: "test", DecidedAt: storage.NoTs}
	sc    = storage.MustScope("reap")
)

// world is a store, the journal service and a cascade engine handing its
// journals to the service, over a directory, reopenable (a process
// restart), with a fault-injecting engine.
type world struct {
	t     *testing.T
	dir   string
	clock *storage.ManualClock
	fault *storage.FaultEngine
	store *storage.Store
	ops   *cascade.Ops // hands journals to svc
	solo  *cascade.Ops // applies its journals itself (to leave orphans)
	svc   *Service
	pub   *fakePublisher
	cfg   Config
	hooks cascade.Hooks
}

func newWorld(t *testing.T, cfg Config) *world {
	w := &world{t: t, dir: t.TempDir(), clock: storage.NewManualClock(time.Date(2026, 5, 1, 0, 0, 0, 0, time.UTC)), pub: &fakePublisher{}, cfg: cfg}
	w.open()
	t.Cleanup(w.close)
	return w
}

func (w *world) open() {
	s, err := storage.OpenStore(w.dir, storage.Options{Clock: w.clock, Logger: noLog, WrapEngine: func(e storage.Engine) storage.Engine {
		w.fault = storage.NewFaultEngine(e)
		return w.fault
	}})
	if err != nil {
		w.t.Fatal(err)
	}
	w.store = s
	copts := cascade.Options{MaxBatchOps: 20, Logger: noLog, Hooks: w.hooks}
	cfg := w.cfg
	cfg.Applier, cfg.Publisher, cfg.Logger, cfg.Clock = cascade.NewApplier(s, copts), w.pub, noLog, w.clock
	svc, err := New(s, cfg)
	if err != nil {
		w.t.Fatal(err)
	}
	w.svc = svc
	w.solo = cascade.New(s, copts)
	copts.Journals = svc
	w.ops = cascade.New(s, copts)
}

func (w *world) close() {
	if w.store != nil {
		w.svc.Stop()
		_ = w.store.Close()
		w.store = nil
	}
}

func (w *world) restart() { w.close(); w.open() }

// hub writes a node with n edges (journaled at max_batch_ops 20 when n > 3).
func (w *world) hub(n int) uuid.UUID {
	w.t.Helper()
	h := uuid.New()
	if _, err := w.ops.PutNode(ctx, sc, storage.NodeWrite{ID: h, ValidFrom: storage.NoTs, ValidTo: storage.NoTs}); err != nil {
		w.t.Fatal(err)
	}
	for i := 0; i < n; i++ {
		m := uuid.New()
		if _, err := w.ops.PutNode(ctx, sc, storage.NodeWrite{ID: m, ValidFrom: storage.NoTs, ValidTo: storage.NoTs}); err != nil {
			w.t.Fatal(err)
		}
		if _, err := w.ops.PutEdge(ctx, sc, storage.EdgeWrite{ID: uuid.New(), Src: h, Dst: m, ValidFrom: storage.NoTs, ValidTo: storage.NoTs}); err != nil {
			w.t.Fatal(err)
		}
	}
	return h
}

// tombstone publishes a tombstone_node with a request id through the engine
// that hands journals to the service, and returns the journal.
func (w *world) tombstone(node uuid.UUID, requestID string) *storage.JournalEntry {
	w.t.Helper()
	out, _, err := w.ops.Apply(ctx, []cascade.Request{{Scope: sc, Op: storage.OpTombstoneNode, ID: node, RequestID: requestID,
		ValidFrom: storage.NoTs, ValidTo: storage.NoTs, ValidEnd: storage.NoTs, Prov: prov}})
	if err != nil || out[0].Kind != cascade.Journaled {
		w.t.Fatalf("tombstone_node: %+v %v, want journaled", out[0], err)
	}
	return out[0].Journal
}

// orphan leaves a journal for a fresh hub behind: the journal commits, the
// first chunk fails, and the process "restarts".
func (w *world) orphan(edges int) uuid.UUID {
	w.t.Helper()
	h := w.hub(edges)
	w.fault.CrashAfter(w.fault.Calls() + 1)
	if _, err := w.solo.TombstoneNode(ctx, sc, h, storage.NoTs, prov); !errors.Is(err, storage.ErrInjected) {
		w.t.Fatalf("cascade: %v, want the injected crash", err)
	}
	w.restart()
	return h
}

func (w *world) dead(node uuid.UUID) bool {
	v, ok, err := w.store.Latest(sc, storage.KindNode, node)
	if err != nil {
		w.t.Fatal(err)
	}
	return ok && v.Tombstone
}

// fakePublisher records the results it is given (the results stream is
// the queue's; its tests use a real NATS server).
type fakePublisher struct {
	mu   sync.Mutex
	got  map[string]storage.Receipt
	fail error
}

func (p *fakePublisher) PublishResult(_ context.Context, tenant, requestID string, rc storage.Receipt) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.fail != nil {
		return p.fail
	}
	if p.got == nil {
		p.got = map[string]storage.Receipt{}
	}
	p.got[tenant+"/"+requestID] = rc
	return nil
}

func (p *fakePublisher) result(requestID string) (storage.Receipt, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	rc, ok := p.got[sc.Tenant()+"/"+requestID]
	return rc, ok
}

func TestStartupPassResumesOrphans(t *testing.T) {
	w := newWorld(t, Config{})
	a, b := w.orphan(6), w.orphan(9)
	if w.store.Journals().Len() != 2 {
		t.Fatalf("%d journals after the crashes, want 2", w.store.Journals().Len())
	}
	if st := w.svc.Journals(); len(st) != 2 || st[0].State != StatePending || st[1].State != StatePending {
		t.Fatalf("journals before the startup pass: %+v, want two pending", st)
	}
	res := w.svc.RunOnce(ctx)
	if res.Err != nil || res.Resumed != 2 || res.Journals != 2 {
		t.Fatalf("startup pass %+v, want 2 resumed", res)
	}
	if !w.dead(a) || !w.dead(b) || w.store.Journals().Len() != 0 || len(w.svc.Journals()) != 0 {
		t.Fatal("orphans not completed")
	}
	if res := w.svc.RunOnce(ctx); res.Resumed != 0 || res.Journals != 0 {
		t.Fatalf("second pass %+v, want nothing to do", res)
	}
}

// TestHandOffAppliesAndPublishes: a journal handed over by the cascade is
// applied at once, its receipt stored, and its result published from the
// outbox, which is then empty.
func TestHandOffAppliesAndPublishes(t *testing.T) {
	w := newWorld(t, Config{})
	w.svc.Start()
	h := w.hub(7)
	e := w.tombstone(h, "del-1")
	select {
	case <-e.Removed():
	case <-time.After(20 * time.Second):
		t.Fatal("the handed-over journal was not applied")
	}
	testnats.Eventually(t, 20*time.Second, "the result", func() bool { _, ok := w.pub.result("del-1"); return ok })
	rc, _ := w.pub.result("del-1")
	if rc.Status != storage.StatusOK || rc.EdgesTombstoned != 7 || !rc.Journaled || rc.Tx != e.J.Tx {
		t.Fatalf("published receipt %+v", rc)
	}
	testnats.Eventually(t, 20*time.Second, "an empty outbox", func() bool {
		rows, _, err := w.store.PendingOutbox(sc)
		return err == nil && len(rows) == 0
	})
	if stored, ok, _ := storage.GetReceipt(w.store.Reader(), sc, "del-1"); !ok || stored != rc {
		t.Fatalf("stored receipt %+v, published %+v", stored, rc)
	}
	if !w.dead(h) {
		t.Fatal("hub alive")
	}
}

// TestFailedJournalIsRetriedByTheScheduledPass: an applier that fails
// leaves its journal (failing, with the error); a scheduled pass after the
// backoff applies it.
func TestFailedJournalIsRetriedByTheScheduledPass(t *testing.T) {
	runs := make(chan RunResult, 64)
	finished := make(chan error, 8)
	var applying, attempts atomic.Int64 // attempts applying now, and started
	w := newWorld(t, Config{Schedule: "@every 1s", RetryBackoff: time.Minute,
		Hooks: Hooks{Run: func(res RunResult) { runs <- res }, Finished: func(_ *storage.JournalEntry, _ storage.Receipt, err error) { finished <- err },
			Applying: func(_ *storage.JournalEntry, on bool) {
				if on {
					attempts.Add(1)
					applying.Add(1)
				} else if applying.Add(-1) < 0 {
					t.Error("Applying(false) without Applying(true)")
				}
			}}})
	w.svc.Start()
	h := w.hub(5)
	w.fault.CrashAfter(w.fault.Calls() + 1) // the journal lands, its first chunk fails
	e := w.tombstone(h, "del-2")
	if err := <-finished; !errors.Is(err, storage.ErrInjected) {
		t.Fatalf("first attempt: %v, want the injected failure", err)
	}
	st := w.svc.Journals()
	if len(st) != 1 || st[0].State != StateFailing || st[0].Failures != 1 || st[0].LastError == "" || st[0].EdgesTotal != 5 {
		t.Fatalf("journal after the failure: %+v", st)
	}
	w.fault.SetInject(nil) // the disk recovers
	w.clock.Advance(time.Hour)
	deadline := time.After(20 * time.Second)
	for {
		select {
		case res := <-runs:
			if res.Resumed == 1 {
				if !w.dead(h) || w.store.Journals().Registered(e) {
					t.Fatal("resumed but not finished")
				}
				testnats.Eventually(t, 20*time.Second, "the result", func() bool { _, ok := w.pub.result("del-2"); return ok })
				// Both attempts, the failed one too, said when they began
				// and ended applying.
				testnats.Eventually(t, 20*time.Second, "no attempt applying", func() bool { return applying.Load() == 0 })
				if n := attempts.Load(); n != 2 {
					t.Fatalf("%d attempts began applying, want 2", n)
				}
				return
			}
		case <-deadline:
			t.Fatal("no scheduled pass resumed the journal within 20s")
		}
	}
}

// TestLiveApplierIsHeldAndPassesDoNotStack: a journal whose applier is on
// it (held between two chunks) is left alone by a pass; a pass that would
// overlap a running one is skipped.
func TestLiveApplierIsHeldAndPassesDoNotStack(t *testing.T) {
	hold, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	w := &world{t: t, dir: t.TempDir(), clock: storage.NewManualClock(time.Date(2026, 5, 1, 0, 0, 0, 0, time.UTC)), pub: &fakePublisher{}}
	w.hooks.JournalStep = func(_ *storage.JournalEntry, n int) {
		if n == 2 {
			once.Do(func() { close(hold); <-release })
		}
	}
	w.open()
	t.Cleanup(w.close)
	w.svc.Start()
	h := w.hub(6)
	w.tombstone(h, "del-3")
	<-hold
	if st := w.svc.Journals(); len(st) != 1 || st[0].State != StateApplying || st[0].EdgesTotal != 6 || st[0].EdgesDone == 0 {
		t.Fatalf("journal held after its first chunk: %+v", st)
	}
	if res := w.svc.RunOnce(ctx); res.Held != 1 || res.Resumed != 0 || res.Err != nil {
		t.Fatalf("pass %+v: a journal with a live applier must be held, not resumed", res)
	}
	close(release)
	w.svc.Wait()
	if !w.dead(h) {
		t.Fatal("hub alive")
	}
	h = w.orphan(6)
	release = make(chan struct{})
	hold2 := make(chan struct{})
	var once2 sync.Once
	w.hooks.JournalStep = func(_ *storage.JournalEntry, n int) { once2.Do(func() { close(hold2); <-release }) }
	w.restart()
	first := make(chan RunResult, 1)
	go func() { first <- w.svc.RunOnce(ctx) }()
	<-hold2 // the first pass waits for an applier it started
	if res := w.svc.RunOnce(ctx); !res.Skipped {
		t.Fatalf("overlapping pass %+v, want skipped", res)
	}
	close(release)
	if res := <-first; res.Resumed != 1 || res.Err != nil {
		t.Fatalf("first pass %+v, want the orphan resumed", res)
	}
	if !w.dead(h) {
		t.Fatal("hub alive")
	}
}

// TestStalledApplierIsAbandonedAndRetried: an applier that makes no
// progress for StallTimeout (held between two chunks while the clock moves
// on) is abandoned: the attempt fails with the reason, the journal reads
// failing, and a pass after the backoff applies it.
func TestStalledApplierIsAbandonedAndRetried(t *testing.T) {
	hold, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	stalled := make(chan struct{}, 1)
	finished := make(chan error, 4)
	w := &world{t: t, dir: t.TempDir(), clock: storage.NewManualClock(time.Date(2026, 5, 1, 0, 0, 0, 0, time.UTC)), pub: &fakePublisher{},
		cfg: Config{StallTimeout: 40 * time.Millisecond, RetryBackoff: time.Minute, Hooks: Hooks{
			Stalled:  func(*storage.JournalEntry) { stalled <- struct{}{} },
			Finished: func(_ *storage.JournalEntry, _ storage.Receipt, err error) { finished <- err },
		}}}
	w.hooks.JournalStep = func(_ *storage.JournalEntry, n int) {
		if n == 2 {
			once.Do(func() { close(hold); <-release })
		}
	}
	w.open()
	t.Cleanup(w.close)
	w.svc.Start()
	h := w.hub(6)
	w.tombstone(h, "del-stall")
	<-hold
	w.clock.Advance(time.Second) // no chunk lands for longer than StallTimeout
	select {
	case <-stalled:
	case <-time.After(20 * time.Second):
		t.Fatal("the watchdog did not fire")
	}
	close(release)
	if err := <-finished; err == nil || !strings.Contains(err.Error(), "stalled") {
		t.Fatalf("stalled attempt ended with %v, want the stall", err)
	}
	if st := w.svc.Journals(); len(st) != 1 || st[0].State != StateFailing || !strings.Contains(st[0].LastError, "stalled") {
		t.Fatalf("journal after the stall: %+v", st)
	}
	w.clock.Advance(2 * time.Minute)
	if res := w.svc.RunOnce(ctx); res.Resumed != 1 || res.Err != nil {
		t.Fatalf("pass after the backoff: %+v", res)
	}
	if !w.dead(h) {
		t.Fatal("hub alive")
	}
}

// TestAppliersAreBounded: with MaxAppliers 2 and five journals handed over
// at once, two are applied and three wait (pending); when the two are
// released every journal finishes. Then two journals that share an edge,
// with one applier: the later one, if it goes first, gives its slot up
// while it waits for the earlier one, so neither waits for ever.
func TestAppliersAreBounded(t *testing.T) {
	var mu sync.Mutex
	held := map[uuid.UUID]bool{}
	release := make(chan struct{})
	var releaseOnce sync.Once
	free := func() { releaseOnce.Do(func() { close(release) }) }
	w := &world{t: t, dir: t.TempDir(), clock: storage.NewManualClock(time.Date(2026, 5, 1, 0, 0, 0, 0, time.UTC)), pub: &fakePublisher{},
		cfg: Config{MaxAppliers: 2}}
	w.hooks.JournalStep = func(e *storage.JournalEntry, n int) {
		if n != 1 {
			return
		}
		mu.Lock()
		held[e.J.NodeID] = true
		mu.Unlock()
		<-release
	}
	w.open()
	t.Cleanup(w.close)
	t.Cleanup(free) // runs first: a failing test must not leave appliers held
	w.svc.Start()
	var hubs []uuid.UUID
	for i := 0; i < 5; i++ {
		hubs = append(hubs, w.hub(5))
	}
	for i, h := range hubs {
		w.tombstone(h, fmt.Sprint("del-", i))
	}
	testnats.Eventually(t, 20*time.Second, "two appliers at work", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(held) == 2
	})
	states := map[State]int{}
	for _, st := range w.svc.Journals() {
		states[st.State]++
	}
	if states[StateApplying] != 2 || states[StatePending] != 3 {
		t.Fatalf("states %v, want 2 applying and 3 pending", states)
	}
	mu.Lock()
	if len(held) != 2 {
		t.Fatalf("%d appliers at work, want 2", len(held))
	}
	mu.Unlock()
	free()
	w.svc.Wait()
	for _, h := range hubs {
		if !w.dead(h) {
			t.Fatal("a hub is alive")
		}
	}
	testnats.Eventually(t, 20*time.Second, "every result", func() bool {
		for i := range hubs {
			if _, ok := w.pub.result(fmt.Sprint("del-", i)); !ok {
				return false
			}
		}
		return true
	})

	// Overlapping journals, one applier.
	w.close()
	w.cfg.MaxAppliers = 1
	w.hooks.JournalStep = nil
	w.open()
	w.svc.Start()
	a, b := w.hub(5), w.hub(5)
	shared := uuid.New()
	if _, err := w.ops.PutEdge(ctx, sc, storage.EdgeWrite{ID: shared, Src: a, Dst: b, ValidFrom: storage.NoTs, ValidTo: storage.NoTs}); err != nil {
		t.Fatal(err)
	}
	out, _, err := w.ops.Apply(ctx, []cascade.Request{
		{Scope: sc, Op: storage.OpTombstoneNode, ID: a, RequestID: "del-a", ValidFrom: storage.NoTs, ValidTo: storage.NoTs, ValidEnd: storage.NoTs, Prov: prov},
		{Scope: sc, Op: storage.OpTombstoneNode, ID: b, RequestID: "del-b", ValidFrom: storage.NoTs, ValidTo: storage.NoTs, ValidEnd: storage.NoTs, Prov: prov},
	})
	if err != nil || out[0].Kind != cascade.Journaled || out[1].Kind != cascade.Journaled {
		t.Fatalf("%+v %v", out, err)
	}
	for _, oc := range out {
		select {
		case <-oc.Journal.Removed():
		case <-time.After(20 * time.Second):
			t.Fatal("overlapping journals with one applier did not finish")
		}
	}
	w.svc.Wait()
	ra, _, _ := storage.GetReceipt(w.store.Reader(), sc, "del-a")
	rb, _, _ := storage.GetReceipt(w.store.Reader(), sc, "del-b")
	if ra.EdgesTombstoned != 6 || rb.EdgesTombstoned != 5 {
		t.Fatalf("receipts %+v %+v: the earlier journal takes the shared edge (6), the later does not (5)", ra, rb)
	}
}

// TestPoisonJournalDoesNotStopTheOthers: an undecodable journal head and a
// journal that keeps failing are counted and reported; a healthy orphan in
// the same pass is still resumed.
func TestPoisonJournalDoesNotStopTheOthers(t *testing.T) {
	w := newWorld(t, Config{PoisonAfter: 2, RetryBackoff: time.Minute})
	healthy := w.orphan(5)
	// A head that cannot be decoded, written straight through the engine.
	b := w.store.NewBatch()
	badKey := storage.JobKey(sc, storage.CascadeJournalState, 0, 1, uuid.New())
	_ = b.Set(badKey, []byte("not a journal"), pebble.Sync)
	if err := w.store.CommitBatch(ctx, b, nil); err != nil {
		t.Fatal(err)
	}
	b.Close()
	// A journal whose frozen neighbourhood was written over behind its
	// fence (a version newer than the journal): it fails every time.
	failing := w.orphan(7)
	e := w.store.Journals().Fenced(sc, failing)
	if e == nil {
		t.Fatal("no journal for the failing hub")
	}
	var edge storage.Version
	if err := storage.ScanAdjLatest(w.store.Reader(), sc, true, failing, func(a storage.AdjEdge) error {
		edge = storage.Version{Kind: storage.KindEdge, ID: a.ID, Src: failing, Dst: a.Row.Other, Valid: a.Row.Valid,
			Tx: storage.Open(e.J.Tx + 1000), Props: []byte("{}"), Prov: prov}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	b = w.store.NewBatch()
	storage.AppendVersion(b, sc, &edge)
	if err := w.store.CommitBatch(ctx, b, nil); err != nil {
		t.Fatal(err)
	}
	b.Close()
	w.restart() // the undecodable head is found at open

	res := w.svc.RunOnce(ctx)
	if res.Resumed != 1 || res.Failed != 1 || res.Poison != 1 || res.Err == nil {
		t.Fatalf("pass %+v: want the healthy one resumed, one failure, one undecodable", res)
	}
	if !w.dead(healthy) {
		t.Fatal("the healthy orphan was not resumed")
	}
	// Backoff: the failing journal is not retried before its delay.
	if res := w.svc.RunOnce(ctx); res.Deferred != 1 || res.Failed != 0 {
		t.Fatalf("pass inside the backoff %+v, want deferred", res)
	}
	w.clock.Advance(2 * time.Minute)
	if res := w.svc.RunOnce(ctx); res.Failed != 1 || res.Poison != 2 {
		t.Fatalf("pass after the backoff %+v: retried, and now reported as poison (2 failures)", res)
	}
	st := w.svc.Journals()
	if len(st) != 2 || st[0].State != StateFailing || st[0].Failures != 2 || !strings.Contains(st[0].LastError, "neighbourhood changed") ||
		st[1].State != StatePoison || st[1].Key == "" {
		t.Fatalf("journals %+v", st)
	}
	if sum := w.svc.Summarize(); sum.InFlight != 1 || sum.Poison != 2 {
		t.Fatalf("summary %+v", sum)
	}
}

// TestPhantomJournal: a pass that read the registry just before an applier
// removed a journal must not bring it back. The stale entry is handed to an
// attempt after its removal committed: the attempt finds it gone, nothing
// is registered or fenced again, and the journal is not reported.
func TestPhantomJournal(t *testing.T) {
	w := newWorld(t, Config{})
	h := w.orphan(5)
	stale := w.store.Journals().List()
	if len(stale) != 1 {
		t.Fatalf("%d journals", len(stale))
	}
	if _, err := w.solo.ApplyJournal(ctx, stale[0], cascade.JournalObserver{}); err != nil {
		t.Fatal(err)
	}
	// What the pass would do next with what it read.
	done, started := w.svc.startAttempt(w.svc.record(stale[0]))
	if !started {
		t.Fatal("no attempt started")
	}
	<-done
	if w.store.Journals().Len() != 0 || w.store.Journals().Fenced(sc, h) != nil || len(w.svc.Journals()) != 0 {
		t.Fatalf("phantom: %d journals registered, fence %v, reported %+v", w.store.Journals().Len(), w.store.Journals().Fenced(sc, h), w.svc.Journals())
	}
	if res := w.svc.RunOnce(ctx); res.Journals != 0 || res.Failed != 0 || res.Err != nil {
		t.Fatalf("pass after: %+v", res)
	}
	// The node reads dead and nothing refuses a write near it.
	n := uuid.New()
	if _, err := w.ops.PutNode(ctx, sc, storage.NodeWrite{ID: n, ValidFrom: storage.NoTs, ValidTo: storage.NoTs}); err != nil {
		t.Fatal(err)
	}
	if !w.dead(h) {
		t.Fatal("hub alive")
	}
}

func TestBadScheduleIsRejected(t *testing.T) {
	w := newWorld(t, Config{})
	if _, err := New(w.store, Config{Applier: cascade.NewApplier(w.store, cascade.Options{}), Schedule: "every now and then"}); err == nil {
		t.Fatal("a bad cron spec was accepted")
	}
	if _, err := New(w.store, Config{}); err == nil {
		t.Fatal("a service without an applier was accepted")
	}
	for _, ok := range []string{"@every 30s", "*/5 * * * *", "@hourly"} {
		if _, err := ParseSchedule(ok); err != nil {
			t.Errorf("%q rejected: %v", ok, err)
		}
	}
}
