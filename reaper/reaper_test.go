package reaper

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/google/uuid"
	"github.com/telha/telha-cascade/cascade"
	"github.com/telha/telha-cascade/storage"
)

var (
	ctx   = context.Background()
	noLog = slog.New(slog.NewTextHandler(io.Discard, nil))
	prov  = storage.Provenance{Actor: "test", DecidedAt: storage.NoTs}
	sc    = storage.MustScope("reap")
)

// world is a store + cascade engine over a directory, reopenable (a
// process restart), with a fault-injecting engine.
type world struct {
	t     *testing.T
	dir   string
	clock *storage.ManualClock
	fault *storage.FaultEngine
	store *storage.Store
	ops   *cascade.Ops
}

func newWorld(t *testing.T) *world {
	w := &world{t: t, dir: t.TempDir(), clock: storage.NewManualClock(time.Date(2026, 5, 1, 0, 0, 0, 0, time.UTC))}
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
	w.ops = cascade.New(s, cascade.Options{MaxBatchOps: 20, Logger: noLog, LeaseTTL: time.Minute})
}

func (w *world) close() {
	if w.ops != nil {
		w.ops.Close()
		_ = w.store.Close()
		w.ops, w.store = nil, nil
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

// orphan leaves a journal for a fresh hub behind: the journal commits, the
// first chunk fails, and the process "restarts".
func (w *world) orphan(edges int) uuid.UUID {
	w.t.Helper()
	h := w.hub(edges)
	w.fault.CrashAfter(w.fault.Calls() + 1)
	if _, err := w.ops.TombstoneNode(ctx, sc, h, storage.NoTs, prov); !errors.Is(err, storage.ErrInjected) {
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

func newReaper(t *testing.T, w *world, cfg Config) *Reaper {
	t.Helper()
	cfg.Logger, cfg.Clock = noLog, w.clock
	r, err := New(w.ops, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Stop)
	return r
}

func TestStartupPassResumesOrphans(t *testing.T) {
	w := newWorld(t)
	a, b := w.orphan(6), w.orphan(9)
	if w.store.Journals().Len() != 2 {
		t.Fatalf("%d journals after the crashes, want 2", w.store.Journals().Len())
	}
	r := newReaper(t, w, Config{BatchSize: 1}) // page size 1: the cursor must carry the pass
	res := r.RunOnce(ctx)
	if res.Err != nil || res.Resumed != 2 || res.Scanned != 2 {
		t.Fatalf("startup pass %+v, want 2 resumed", res)
	}
	if !w.dead(a) || !w.dead(b) || w.store.Journals().Len() != 0 {
		t.Fatal("orphans not completed")
	}
	if res := r.RunOnce(ctx); res.Resumed != 0 || res.Scanned != 0 {
		t.Fatalf("second pass %+v, want nothing to do", res)
	}
}

func TestScheduledPassResumesOrphans(t *testing.T) {
	w := newWorld(t)
	runs := make(chan RunResult, 16)
	r := newReaper(t, w, Config{Schedule: "@every 1s", OnRun: func(res RunResult) { runs <- res }})
	r.Start(ctx)
	h := w.hub(5) // written while the reaper runs
	// Leave an orphan without restarting the process: the applier fails and
	// releases its lease; the scheduled pass picks it up after the backoff.
	w.fault.CrashAfter(w.fault.Calls() + 1)
	if _, err := w.ops.TombstoneNode(ctx, sc, h, storage.NoTs, prov); err == nil {
		t.Fatal("cascade should have failed")
	}
	w.fault.SetInject(nil) // the disk recovers
	w.clock.Advance(time.Hour)
	deadline := time.After(20 * time.Second)
	for {
		select {
		case res := <-runs:
			if res.Resumed == 1 {
				if !w.dead(h) {
					t.Fatal("resumed but node alive")
				}
				return
			}
		case <-deadline:
			t.Fatal("no scheduled pass resumed the orphan within 20s")
		}
	}
}

// TestLiveApplierIsNotAnOrphan: a journal whose applier is alive (here:
// blocked in its first chunk) is left alone, and the pass does not stack.
func TestLiveApplierIsNotAnOrphan(t *testing.T) {
	w := newWorld(t)
	h := w.hub(6)
	hold, release := make(chan struct{}), make(chan struct{})
	at := w.fault.Calls() + 2
	w.fault.SetInject(func(n int) error {
		if n == at {
			close(hold)
			<-release
		}
		return nil
	})
	done := make(chan error, 1)
	go func() { _, err := w.ops.TombstoneNode(ctx, sc, h, storage.NoTs, prov); done <- err }()
	<-hold
	r := newReaper(t, w, Config{})
	res := r.RunOnce(ctx)
	if res.Held != 1 || res.Resumed != 0 || res.Err != nil {
		t.Fatalf("pass %+v: a journal with a live applier must be held, not resumed", res)
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if !w.dead(h) {
		t.Fatal("cascade did not finish")
	}
}

func TestOverlappingPassIsSkipped(t *testing.T) {
	w := newWorld(t)
	w.orphan(6)
	hold, release := make(chan struct{}), make(chan struct{})
	var once bool
	w.fault.SetInject(func(int) error {
		if !once {
			once = true
			close(hold)
			<-release
		}
		return nil
	})
	r := newReaper(t, w, Config{})
	first := make(chan RunResult, 1)
	go func() { first <- r.RunOnce(ctx) }()
	<-hold // the first pass is inside a chunk commit
	if res := r.RunOnce(ctx); !res.Skipped {
		t.Fatalf("overlapping pass %+v, want skipped", res)
	}
	close(release)
	if res := <-first; res.Resumed != 1 {
		t.Fatalf("first pass %+v", res)
	}
}

// TestPoisonJournalDoesNotStopTheOthers: an undecodable journal head and a
// journal that keeps failing are counted and reported; a healthy orphan in
// the same pass is still resumed.
func TestPoisonJournalDoesNotStopTheOthers(t *testing.T) {
	w := newWorld(t)
	healthy := w.orphan(5)
	// A head that cannot be decoded, written straight through the engine.
	b := w.store.NewBatch()
	badKey := storage.JobKey(sc, storage.CascadeJournalState, 0, 1, uuid.New())
	_ = b.Set(badKey, []byte("not a journal"), pebble.Sync)
	if err := w.store.CommitDurable(b); err != nil {
		t.Fatal(err)
	}
	b.Close()
	// A journal whose pages are missing: it fails every time.
	failing := w.orphan(7)
	e := w.store.Journals().Fenced(sc, failing)
	if e == nil {
		t.Fatal("no journal for the failing hub")
	}
	key, _ := storage.DecodeKey(e.HeadKey)
	b = w.store.NewBatch()
	_ = b.Delete(storage.JournalPageKey(sc, key.Priority, key.CreatedAt, key.JobID, 0), nil)
	if err := w.store.CommitDurable(b); err != nil {
		t.Fatal(err)
	}
	b.Close()

	r := newReaper(t, w, Config{PoisonAfter: 2, RetryBackoff: time.Minute})
	res := r.RunOnce(ctx)
	if res.Resumed != 1 || res.Failed != 1 || res.Poison != 1 || res.Err == nil {
		t.Fatalf("pass %+v: want the healthy one resumed, one failure, one undecodable", res)
	}
	if !w.dead(healthy) {
		t.Fatal("the healthy orphan was not resumed")
	}
	// Backoff: the failing journal is not retried before its delay.
	if res := r.RunOnce(ctx); res.Deferred != 1 || res.Failed != 0 {
		t.Fatalf("pass inside the backoff %+v, want deferred", res)
	}
	w.clock.Advance(2 * time.Minute)
	if res := r.RunOnce(ctx); res.Failed != 1 || res.Poison != 2 {
		t.Fatalf("pass after the backoff %+v: retried, and now reported as poison (2 failures)", res)
	}
	if got := len(w.store.Journals().Poison()); got != 1 {
		t.Fatalf("%d undecodable journals recorded, want 1", got)
	}
	if fails, last := e.Failures(); fails != 2 || last == "" {
		t.Fatalf("failing journal: %d failures, last error %q", fails, last)
	}
}

func TestBadScheduleIsRejected(t *testing.T) {
	w := newWorld(t)
	if _, err := New(w.ops, Config{Schedule: "every now and then"}); err == nil {
		t.Fatal("a bad cron spec was accepted")
	}
	for _, ok := range []string{"@every 30s", "*/5 * * * *", "@hourly"} {
		if _, err := ParseSchedule(ok); err != nil {
			t.Errorf("%q rejected: %v", ok, err)
		}
	}
}
