package slot

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/nats-io/nats.go"
	"github.com/telha/telha-cascade/api"
	"github.com/telha/telha-cascade/cascade"
	"github.com/telha/telha-cascade/metrics"
	"github.com/telha/telha-cascade/queue"
	"github.com/telha/telha-cascade/reaper"
	"github.com/telha/telha-cascade/storage"
	"github.com/telha/telha-cascade/ui"
	"go.opentelemetry.io/otel/trace"
)

// Options are what the process hosting a slot gives it (a static worker,
// or a member), and the test seams; production leaves the seams zero.
type Options struct {
	// Build names the binary (metrics, the status page).
	Build metrics.Build
	// Conn is the process's NATS connection (a member's: one per process,
	// whatever its slots). The slot uses it, flushes it when it stops and
	// never closes it. Nil: Dial gives it.
	Conn *nats.Conn
	// Dial, when Conn is nil (a static worker), connects the process when
	// the slot first needs NATS (before its store opens with the
	// changelog on, after it without), and returns the settled
	// --stream-replicas. CloseConn then drains it before the store closes.
	Dial      func(ctx context.Context) (*nats.Conn, int, error)
	CloseConn func()
	// FeedConn is the process's change-feed connection (a member's: one
	// per process, shared by its slots' feeds; queue.FeedConn says why it
	// is not Conn). Nil: the slot's feed makes its own from Conn.
	FeedConn *queue.FeedConn
	// Auth is the process's access control (a member's: one tokens file
	// read and watched per process). Nil: the slot builds one from
	// AuthConfig, counting refusals in its metrics.
	Auth       *api.Auth
	AuthConfig api.AuthConfig
	// Tracer receives the spans (nil: none).
	Tracer trace.TracerProvider
	// Applying is told when a journal applier starts and stops (the
	// process's runtime tuning while cascading).
	Applying func(on bool)

	// Clock replaces the wall clock of the store and reaper.
	Clock storage.Clock
	// OnReady is called once the slot is ready (consuming; journals a
	// previous process left may still be resuming in the background).
	OnReady func(*Slot)
	// WrapEngine wraps the storage engine (fault injection).
	WrapEngine func(storage.Engine) storage.Engine
	// FS is the filesystem the slot's Pebble opens on (nil: the OS's);
	// tests inject disk faults with it (pebble/vfs/errorfs).
	FS vfs.FS
	// StopWait bounds how long a slot whose store stopped waits for its
	// worker and its reaper (0: 10 s); tests shorten it.
	StopWait time.Duration
	// DiskFree replaces the statfs of the disk-space guard.
	DiskFree func() (uint64, error)
	// CascadeHooks, when set, are called after the slot's own (tests:
	// cascade.Hooks.JournalStep holds a journal between two durable steps).
	CascadeHooks cascade.Hooks
	// ReaperHooks, when set, are called after the slot's own (tests).
	ReaperHooks reaper.Hooks
	// OnWriterTask, when set, also sees every task of the store's writer
	// (cmd/bench).
	OnWriterTask func(lane storage.Lane, wait, run time.Duration)
	// CopyScrubStep, when set, is called at each step of an erase's scrub
	// of the copies that runs beside the writer ("checkpointed": after step
	// 1; "purged": after step 3), on the scrub's goroutine (tests hold it
	// there).
	CopyScrubStep func(step string)
	// CopyScrubbed, when set, receives the cost of every finished scrub of
	// the copies (cmd/bench).
	CopyScrubbed func(ScrubStatus)

	// SlotView, set by a member, lists every slot of the group for the
	// status page's overview.
	SlotView func() []ui.SlotRow
	// StandbyApplied, set by a member, returns the applied changelog
	// sequences of the slot's standbys that are tailing: a scheduled
	// checkpoint purges the changelog only below what they still need
	// (they would otherwise restore a checkpoint again).
	StandbyApplied func() []uint64
	// OnStartPhase, set by a member, is told what the start is doing
	// until the slot is ready, and what it retries and why (the member's
	// /readyz names a slot still starting).
	OnStartPhase func(phase string)
	// Host, set by a member, gives the status page the member's figures
	// and the group.
	Host *Host
	// Copy, set by a member promoting its standby in place, is the slot's
	// Pebble the standby had open (caught up to where its tail stopped):
	// the slot takes it (catches it up, claims, and opens its store on
	// it), and closes it if it stops first. With --changelog off it is
	// closed unused.
	Copy *storage.PebbleEngine
	// OnCopyFatal, set by a member, receives a Pebble fatal error of the
	// slot's copy met before its store opens (the changelog's restore and
	// catch-up: a failed MANIFEST or WAL write), wrapped in
	// storage.ErrFatal and storage.ErrEngine. Like Pebble's Fatalf it
	// must not return: the goroutine that met it is inside Pebble, and
	// the copy stays locked until the process exits. Nil: the error
	// panics the process (a static worker: its supervisor restarts it).
	// Once the store opens, its fatal errors end Run instead.
	OnCopyFatal func(err error)
}

// DeniedReasons are the reasons of telha_api_denied_total.
var DeniedReasons = []string{"unauthenticated", "forbidden_tenant", "forbidden_role", "loopback_only"}

// Host is what a member gives its slots' status page (Options.Host): the
// figures of the member, whichever of its slots serves the page.
type Host struct {
	Started time.Time
	// RequestCounts is telha_requests_total by status, summed over the
	// member's slots (a slot that moves away takes its counts with it).
	RequestCounts func() (map[string]float64, error)
	// StoreBytes is the size of every copy on the member's disk.
	StoreBytes func() uint64
	// Group is the group as the status page served by slot page shows it.
	Group func(page int) *ui.Group
	// Cards fills the overview's queue, reaper and journal cards with the
	// figures of every slot the member owns (a slot's page fills its own
	// without it).
	Cards func(o *ui.Overview, now time.Time)
	// Pause pauses and resumes the consumers of every slot the member
	// owns (the overview's consumer card).
	Pause ui.Pauser
}

// Slot is one slot's state and service on this process: its Pebble, its
// changelog and checkpoints, its consumer, its cascade engine, its reaper
// and its read API and status page. New builds it; Run runs it until its
// context ends (the one way to stop it), then drains and closes it.
type Slot struct {
	cfg     Config
	opts    Options
	log     *slog.Logger
	store   *storage.Store
	auth    *api.Auth
	uiH     atomic.Pointer[http.Handler]
	lastRun atomic.Pointer[reaperRun]
	tracer  trace.TracerProvider
	ops     *cascade.Ops
	metrics *metrics.Metrics
	// nc is the process's connection (Options.Conn, or Options.Dial's);
	// the slot never closes it.
	nc *nats.Conn
	// host: Options.Host (nil for a static worker).
	host   *Host
	worker *queue.Worker
	reaper *reaper.Service
	// changelog is nil with --changelog off (changelog.go).
	changelog *Changelog
	// slotView, standbyApplied: Options.SlotView, Options.StandbyApplied
	// (nil in the static layout).
	slotView       func() []ui.SlotRow
	standbyApplied func() []uint64
	// startPhase says what startup is doing while the store is not open
	// (readiness); onPhase is Options.OnStartPhase.
	startPhase atomic.Pointer[string]
	onPhase    func(string)

	httpLn, apiLn net.Listener
	servers       []*http.Server
	// hosted is a member's slot's whole HTTP (it binds no port; nil
	// otherwise): the member's server calls it (ServeHosted).
	hosted http.Handler
	// httpCtx is the base context of every HTTP request: close cancels it
	// first, so reads waiting (?wait=, a journal) answer at once, and
	// inflight counts the handlers still running, so the store closes
	// only once none is.
	httpCtx     context.Context
	httpStop    context.CancelFunc
	inflight    inflight
	onStoreOpen []func()
	storeOpen   atomic.Bool
	startupDone atomic.Bool
	// resuming: the startup pass still resumes, in the background, journals
	// a previous process left (a note on /readyz, not a reason).
	resuming atomic.Bool
	// workerLeft: Run returned on the store's own stop with the worker
	// still running past the stop wait; workerDone says when it stops
	// (close closes the store then, not before).
	workerLeft atomic.Bool
	workerDone <-chan error
	// drainLate: the drain outlasted --shutdown-grace; close waits on NATS
	// for nothing more.
	drainLate atomic.Bool
}

// HTTPAddr is the bound address of the HTTP server (useful with :0); ""
// for a member's slot, which binds none.
func (a *Slot) HTTPAddr() string {
	if a.httpLn == nil {
		return ""
	}
	return a.httpLn.Addr().String()
}

// ServeHosted answers r with a member's slot, in process: the member's
// HTTP server found the slot. It returns false, having written nothing,
// when the slot is stopping (its handlers drained): the member routes the
// request again. The request also ends when the slot closes (a read
// waiting for safe time or a journal answers then, as on a port of its
// own).
func (a *Slot) ServeHosted(w http.ResponseWriter, r *http.Request) bool {
	if a.hosted == nil || !a.inflight.enter() {
		return false
	}
	defer a.inflight.leave()
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	defer context.AfterFunc(a.httpCtx, cancel)()
	a.hosted.ServeHTTP(w, r.WithContext(ctx))
	return true
}

// APIAddr is the bound address of the separate read-API server, if any.
func (a *Slot) APIAddr() string {
	if a.apiLn == nil {
		return ""
	}
	return a.apiLn.Addr().String()
}

// NATSURL is the URL the worker is connected to.
func (a *Slot) NATSURL() string { return a.nc.ConnectedUrl() }

// Store returns the store (tests).
func (a *Slot) Store() *storage.Store { return a.store }

// Ops returns the cascade engine (tests).
func (a *Slot) Ops() *cascade.Ops { return a.ops }

// Metrics returns the metrics (tests).
func (a *Slot) Metrics() *metrics.Metrics { return a.metrics }

// Reaper returns the journal, erase and outbox service (tests).
func (a *Slot) Reaper() *reaper.Service { return a.reaper }

// Worker returns the queue worker (tests).
func (a *Slot) Worker() *queue.Worker { return a.worker }

// Ready reports readiness: Pebble open, NATS connected, consumer started;
// a paused consumer and a startup resume still running in the background
// are notes, not reasons (ready all the same: only the fenced nodes wait).
func (a *Slot) Ready() (bool, []string) {
	var why []string
	if !a.storeOpen.Load() {
		why = append(why, "store: not open")
		if p := a.startPhase.Load(); p != nil {
			why = append(why, *p)
		}
	}
	if a.nc == nil || !a.nc.IsConnected() {
		why = append(why, "nats: not connected")
	}
	if !a.startupDone.Load() {
		why = append(why, "startup: not consuming yet")
	}
	if a.storeOpen.Load() {
		if free, err := a.store.DiskFree(); err == nil && a.cfg.MinFreeDiskMB > 0 && free < uint64(a.cfg.MinFreeDiskMB)<<20 {
			why = append(why, fmt.Sprintf("storage: disk full (%d bytes free, reserve %d MiB)", free, a.cfg.MinFreeDiskMB))
		}
	}
	ok := len(why) == 0
	// A paused consumer is healthy: still ready, and /readyz says so.
	if a.startupDone.Load() { // a.worker is set before (and read after) this store
		if p := a.worker.PauseState(); p.Paused {
			why = append(why, fmt.Sprintf("consumer %s: %s (enqueue resume, or the status page, resumes it)", p.Consumer, p))
		}
		if n := a.store.Journals().Len(); n > 0 && a.resuming.Load() {
			why = append(why, fmt.Sprintf("startup: resuming %d journals in the background (requests touching their nodes wait)", n))
		}
	}
	return ok, why
}

// New builds slot cfg.Owner.Index: its metrics and access control, and
// its HTTP handler, which answers the probes (and 503 on /v1/...) until
// Run has opened the store. Nothing runs until Run or Start.
func New(cfg Config, log *slog.Logger, opts Options) (*Slot, error) {
	a := &Slot{cfg: cfg, opts: opts, log: log, slotView: opts.SlotView, standbyApplied: opts.StandbyApplied, onPhase: opts.OnStartPhase,
		host: opts.Host, nc: opts.Conn, tracer: opts.Tracer}
	a.metrics = metrics.New(opts.Build, metrics.Labels{
		Ops: opNames(), Statuses: queue.Statuses(), UnknownOpStatuses: queue.UnknownOpStatuses(), DeadLetterReasons: queue.DeadLetterReasons(),
		DeniedReasons: DeniedReasons,
		Paths:         []string{string(cascade.PathInline), string(cascade.PathJournaled)},
	})
	a.auth = opts.Auth // a member's, checked and counted once for all its slots
	if a.auth == nil {
		ac := opts.AuthConfig
		ac.Denied = a.metrics.Denied
		if ac.Logger == nil {
			ac.Logger = log
		}
		auth, err := api.NewAuth(ac)
		if err != nil {
			return nil, fmt.Errorf("%w: %v", ErrUsage, err)
		}
		a.auth = auth
	}
	a.httpCtx, a.httpStop = context.WithCancel(context.Background())
	if cfg.Hosted {
		// A member's slot binds no port: the member's HTTP server calls
		// it in process (ServeHosted).
		a.hosted = a.Handler(true, true)
	}
	return a, nil
}

// connect gets the process's connection from Options.Dial (a static
// worker: it dials when the slot first needs NATS) and the settled
// --stream-replicas with it.
func (a *Slot) connect(ctx context.Context) error {
	if a.opts.Dial == nil {
		return errors.New("slot: no NATS connection (Options.Conn or Options.Dial)")
	}
	nc, replicas, err := a.opts.Dial(ctx)
	if err != nil {
		return err
	}
	a.nc, a.cfg.StreamReplicas = nc, replicas
	return nil
}

// Config is the slot's configuration.
func (a *Slot) Config() Config { return a.cfg }

// InFlight is the number of HTTP handlers of the slot running.
func (a *Slot) InFlight() int { return a.inflight.count() }

// Run runs the slot until ctx is done, then shuts down in order: stop
// fetching and finish what is held (ack); stop HTTP (stop accepting,
// cancel the reads still waiting, wait for every handler); stop the
// reaper, pausing journal appliers between chunks (journals stay durable);
// flush or drain NATS; close Pebble. It returns nil after a clean
// shutdown.
//
// Start: with --changelog jetstream, restore and replay the changelog
// (the store is rebuilt from it) and claim it; open the store; create the
// consumer; resume the journals a previous process left, in the
// background; consume.
func (a *Slot) Run(ctx context.Context) (err error) {
	cfg, log, opts := a.cfg, a.log, a.opts
	defer func() {
		if cerr := a.close(); cerr != nil && err == nil {
			err = cerr
		}
	}()

	// kept: a standby's copy handed over open (Options.Copy), until the
	// catch-up takes it; open: the Pebble the catch-up leaves for the store.
	kept, open := opts.Copy, (*storage.PebbleEngine)(nil)
	defer func() {
		if kept != nil {
			_ = kept.Close()
		}
	}()
	sizes := storage.Sizes{CacheBytes: int64(cfg.CacheMB) << 20, MemTableBytes: uint64(cfg.MemTableMB) << 20}
	var durable storage.Durable
	var copies storage.CopyScrubber
	if cfg.Changelog == ChangelogJetStream {
		// The changelog needs NATS before the store opens: the store is
		// rebuilt from it (restore, replay) and then commits through it.
		if a.nc == nil {
			if err := a.connect(ctx); err != nil {
				if ctx.Err() != nil {
					return fatalOrNil(ctx)
				}
				return err
			}
			cfg.StreamReplicas = a.cfg.StreamReplicas
		}
		a.setPhase("changelog: opening its stream and the checkpoint bucket")
		cl, err := a.openChangelog(ctx)
		if err != nil || cl == nil {
			return err // nil: ctx ended first
		}
		a.setPhase("changelog: restoring and replaying before serving")
		pe, err := cl.prepare(ctx, filepath.Join(cfg.DataDir, "pebble"), sizes, kept)
		kept = nil // prepare's now: closed on its error, else open for the store
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		open = pe
		cl.scrubStep, cl.scrubFailed = opts.CopyScrubStep, a.metrics.ScrubFailed
		cl.scrubbedHook = func(s ScrubStatus) {
			a.metrics.Scrubbed(s.Took, s.WriterHeld, s.BytesUploaded, s.BytesCollected)
			if opts.CopyScrubbed != nil {
				opts.CopyScrubbed(s)
			}
		}
		a.changelog, durable, copies = cl, cl.cl, cl
	}
	so := storage.Options{
		Clock: opts.Clock, Logger: log, OnCommit: a.metrics.OnCommit, WrapEngine: opts.WrapEngine, FS: opts.FS,
		OnWriterTask: func(l storage.Lane, wait, run time.Duration) {
			a.metrics.WriterTask(l.String(), wait, run)
			if opts.OnWriterTask != nil {
				opts.OnWriterTask(l, wait, run)
			}
		},
		MinFreeBytes: uint64(cfg.MinFreeDiskMB) << 20, DiskFree: opts.DiskFree,
		Sizes: sizes, Durable: durable, Copies: copies,
	}
	var st *storage.Store
	if open != nil {
		// The Pebble the catch-up left open: no close and reopen (its
		// memtable and block cache stay warm).
		st, err = storage.OpenStoreOn(open, filepath.Join(cfg.DataDir, "pebble"), so)
	} else {
		st, err = storage.OpenStore(filepath.Join(cfg.DataDir, "pebble"), so)
	}
	if err != nil {
		return err
	}
	a.store = st
	a.storeOpen.Store(true)
	// A fatal storage error ends Run with storage.ErrFatal at once: Pebble
	// can commit nothing more, so there is nothing to drain.
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	go func() {
		select {
		case <-st.Fatal():
			cancel(st.FatalErr())
		case <-ctx.Done():
		}
	}()
	for _, fn := range a.onStoreOpen {
		fn()
	}
	if a.changelog != nil {
		if st.DB() == nil {
			return errors.New("changelog: the store has no Pebble database to checkpoint")
		}
		if err := a.changelog.start(st.DB()); err != nil {
			return fmt.Errorf("%w: %v", ErrUsage, err)
		}
	}

	if a.nc == nil {
		if err := a.connect(ctx); err != nil {
			if ctx.Err() != nil { // SIGTERM while the embedded server started
				return fatalOrNil(ctx)
			}
			return err
		}
		cfg.StreamReplicas = a.cfg.StreamReplicas
	}
	qcfg := cfg.QueueConfig()
	qcfg.TracerProvider = a.tracer
	// A member created the streams before its slots started
	// (provisionShared): a slot creates its consumer only.
	qcfg.StreamsProvisioned = cfg.Hosted
	pub, err := queue.NewPublisher(a.nc, qcfg)
	if err != nil {
		return err
	}
	copts := cascade.Options{MaxBatchOps: cfg.MaxBatchOps, ChunkOps: cfg.ChunkOps, Logger: log, Hooks: a.wiredCascadeHooks(opts.CascadeHooks)}
	rp, err := reaper.New(st, reaper.Config{
		Applier: cascade.NewApplier(st, copts), Publisher: pub, WaitFeed: true, Schedule: cfg.ReaperSchedule, StallTimeout: cfg.LeaseTTL,
		Clock: opts.Clock, Logger: log, Hooks: a.wiredReaperHooks(opts.ReaperHooks), TracerProvider: a.tracer,
	})
	if err != nil {
		return fmt.Errorf("%w: %v", ErrUsage, err)
	}
	a.reaper = rp
	copts.Journals, copts.Erases = rp, rp
	a.ops = cascade.New(st, copts)
	log.Info("store open", "dir", filepath.Join(cfg.DataDir, "pebble"), "tenants", len(st.Tenants()), "journals", st.Journals().Len(),
		"max_batch_ops", a.ops.MaxBatchOps(), "chunk_ops", a.ops.ChunkOps())

	w, err := queue.New(a.nc, a.ops, qcfg, queue.Hooks{Result: a.metrics.Request, Acked: a.metrics.Acked, DeadLetter: a.metrics.DeadLetter, DeadLetterFailed: a.metrics.DeadLetterFailed,
		DeadLetterResultFailed: a.metrics.DeadLetterResultFailed, Queued: a.metrics.Queued}, log)
	if err != nil {
		return err
	}
	a.worker = w
	uh := a.uiHandler()
	a.uiH.Store(&uh)
	a.metrics.AttachState(a.metricsState())

	a.setPhase("queue: provisioning the streams and the consumer")
	if err := a.provision(ctx); err != nil {
		return err
	}
	if ctx.Err() != nil { // SIGTERM (or a fatal error) while provisioning
		return fatalOrNil(ctx)
	}

	// Startup pass, in the background: every journal a previous process
	// left is resumed by the reaper's appliers (bounded as any) while the
	// worker consumes, and the results of finished ones published. Their
	// fences were loaded with the store, so only requests touching their
	// nodes wait (writes: cascade_in_flight; reads: below the journal, or a
	// wait). SIGTERM pauses the appliers between chunks (the reaper's Stop).
	rp.Start()
	if n := st.Journals().Len(); n > 0 {
		log.Info("startup resume: resuming journals in the background", "journals", n)
	}
	a.resuming.Store(true)
	if !rp.StartResume(func(res reaper.RunResult) {
		a.resuming.Store(false)
		if errors.Is(res.Err, context.Canceled) { // the reaper stopped mid-pass
			log.Info("startup resume paused by shutdown; the next start resumes the rest", "resumed", res.Resumed, "took", res.Took)
			return
		}
		log.Info("startup resume finished", "resumed", res.Resumed, "poison", res.Poison, "failed", res.Failed, "published", res.Published, "took", res.Took)
	}) {
		a.resuming.Store(false)
	}

	var bg sync.WaitGroup
	bgCtx, stopBG := context.WithCancel(context.Background())
	bg.Add(1)
	go func() { defer bg.Done(); a.refreshStats(bgCtx) }()
	defer func() {
		stopBG()
		// Pebble failed (parked): its fatal handler parked a goroutine
		// holding Pebble's mutex, and the feed's read or the stats'
		// refresh may wait on it for good, as the worker may. They are
		// left to the process's exit with the store (close); waiting here
		// kept the slot's run from ending, so the member never gave the
		// slot up (CI: TestABrokenSlotMovesToAnotherMember hung in the
		// feed's NewSnapshot).
		if !st.Parked() {
			bg.Wait()
		}
	}()
	{
		// With --change-feed=false too: it publishes nothing then, but
		// an erase still deletes from TELHA_CHG the puts published
		// while the feed was on (queue FeedPublisher.scrubOnly).
		hooks := queue.FeedHooks{Published: a.metrics.ChangesPublished, Failed: a.metrics.ChangeFeedFailed, Reordered: a.metrics.ChangeFeedReordered, Erased: rp.KickOutbox, Lag: a.metrics.ChangeFeedLagged}
		if a.changelog != nil {
			hooks.Owned = a.changelog.feedOwned(st)
		}
		feed, err := queue.NewFeedPublisher(opts.FeedConn, a.nc, st, qcfg, log, hooks)
		if err != nil {
			return err
		}
		bg.Add(1)
		go func() { defer bg.Done(); _ = feed.Run(bgCtx) }()
	}

	a.startupDone.Store(true)
	if cfg.Hosted {
		// A hosted slot binds no port: the member's "joining" line names
		// the member's.
		log.Info("ready", "partitions", cfg.Partitions, "owner", cfg.Owner.String(), "owned", cfg.Owner.Partitions(cfg.Partitions))
	} else {
		log.Info("ready", "partitions", cfg.Partitions, "owner", cfg.Owner.String(), "owned", cfg.Owner.Partitions(cfg.Partitions), "http", a.HTTPAddr())
	}
	if opts.OnReady != nil {
		opts.OnReady(a)
	}
	done := make(chan error, 1)
	// The drain applies what it holds with work: SIGTERM (ctx) does not
	// cancel it; any return from here (the grace ran out, a fatal storage
	// error) does, before the store closes.
	work, stopWork := context.WithCancel(context.WithoutCancel(ctx))
	defer stopWork()
	go func() { done <- w.RunUntil(ctx, work) }()
	var grace <-chan time.Time
	stopping := ctx.Done()
	for {
		select {
		case err := <-done:
			if err != nil {
				return err
			}
			log.Info("stopped consuming; shutting down")
			return nil
		case <-st.Fatal():
			if st.Parked() {
				// Pebble failed: the worker may be parked on the writer
				// for good. Do not wait; close leaves the store open.
				return st.FatalErr()
			}
			// The store stopped on its own decision (fenced, an append
			// unconfirmed): every commit is refused at once, so the
			// worker's drain ends soon. Wait for it, bounded, so that
			// close can release the store and the slot can run again in
			// this process (a member's next round).
			stopWork()
			select {
			case <-done:
			case <-time.After(a.stopWait()):
				a.workerDone = done
				a.workerLeft.Store(true)
				log.Error("the worker did not stop after the store did; the store is closed once it does", "waited", a.stopWait())
			}
			return st.FatalErr()
		case <-stopping:
			log.Info("draining: finishing the requests held, then stopping", "grace", cfg.ShutdownGrace)
			grace = time.After(cfg.ShutdownGrace)
			stopping = nil // from now on: done, grace or fatal
		case <-grace:
			// Whatever is still held is unacked and comes back to the next
			// worker; journals stay durable.
			log.Error("drain outlasted --shutdown-grace; exiting with work in flight (it will be redelivered)", "grace", cfg.ShutdownGrace)
			a.drainLate.Store(true)
			return nil
		}
	}
}

// fatalOrNil returns the fatal storage error that ended ctx, if that is
// what ended it.
func fatalOrNil(ctx context.Context) error {
	if err := context.Cause(ctx); errors.Is(err, storage.ErrFatal) {
		return err
	}
	return nil
}

func opNames() []string {
	var out []string
	for _, o := range storage.Ops() {
		out = append(out, o.String())
	}
	return out
}

func (a *Slot) cascadeHooks(next cascade.Hooks) cascade.Hooks {
	return cascade.Hooks{
		CascadeFinished: func(p cascade.Path, edges uint64, took time.Duration) {
			a.metrics.Cascade(string(p), edges)
			if next.CascadeFinished != nil {
				next.CascadeFinished(p, edges, took)
			}
		},
		ChunkApplied: func(ops int) {
			a.metrics.Chunk()
			if next.ChunkApplied != nil {
				next.ChunkApplied(ops)
			}
		},
		JournalStep: next.JournalStep,
	}
}

func (a *Slot) reaperHooks(next reaper.Hooks) reaper.Hooks {
	return reaper.Hooks{
		Run: func(res reaper.RunResult) {
			a.lastRun.Store(&reaperRun{at: time.Now(), res: res})
			switch {
			case res.Skipped:
				a.metrics.ReaperRun(metrics.ReaperSkipped, 0)
			case res.Err != nil:
				a.metrics.ReaperRun(metrics.ReaperError, res.Resumed)
			default:
				a.metrics.ReaperRun(metrics.ReaperOK, res.Resumed)
			}
			if next.Run != nil {
				next.Run(res)
			}
		},
		Finished: func(e *storage.JournalEntry, rc storage.Receipt, err error) {
			a.uiJournalFinished(e, rc, err) // the status page's recently finished journals
			if next.Finished != nil {
				next.Finished(e, rc, err)
			}
		},
		Applying: func(e *storage.JournalEntry, applying bool) {
			if a.opts.Applying != nil {
				a.opts.Applying(applying)
			}
			if next.Applying != nil {
				next.Applying(e, applying)
			}
		},
		OutboxParked: func(tenant, requestID string, err error) {
			a.metrics.ResultParked()
			if next.OutboxParked != nil {
				next.OutboxParked(tenant, requestID, err)
			}
		},
		Published: func(tenant string, rc storage.Receipt) {
			a.metrics.Request(rc.Op.String(), rc.Status.String())
			if next.Published != nil {
				next.Published(tenant, rc)
			}
		},
	}
}

// metricsState gives the scrape-time gauges their sources.
func (a *Slot) metricsState() metrics.State {
	return metrics.State{
		Journals: func() metrics.JournalSummary {
			s := a.reaper.Summarize()
			return metrics.JournalSummary{InFlight: s.InFlight, Oldest: s.Oldest, Poison: s.Poison, OutboxParked: s.OutboxParked}
		},
		Queue: func() metrics.QueueStats {
			s := a.worker.Stats()
			if s == nil {
				return metrics.QueueStats{}
			}
			return metrics.QueueStats{Pending: s.Pending, AckPending: s.AckPending, Redelivered: s.Redelivered, OK: true, At: s.At, Oldest: s.Oldest,
				Paused: a.worker.PauseState().Paused}
		},
		DiskFree: a.store.DiskFree,
		Pebble: func() metrics.PebbleStats {
			if a.store.Parked() {
				// Pebble failed holding its mutex: Metrics would wait for
				// good, and with it every scrape of the member.
				return metrics.PebbleStats{}
			}
			pm := a.store.Engine().Metrics()
			n, d := a.store.WriteStalls()
			return metrics.PebbleStats{CompactionDebt: pm.Compact.EstimatedDebt, L0Files: pm.Levels[0].TablesCount,
				L0Sublevels: pm.Levels[0].Sublevels, DiskBytes: pm.DiskSpaceUsage(), Stalls: n, StallTime: d}
		},
	}
}

// journals is /v1/journals, from the journals' owner.
func (a *Slot) Journals() []api.Journal {
	out := []api.Journal{}
	if a.reaper == nil {
		return out
	}
	for _, st := range a.reaper.Journals() {
		j := api.Journal{Tenant: st.Scope.Tenant(), RequestID: st.RequestID, EdgesDone: st.EdgesDone, AgeSeconds: st.Age.Seconds(),
			State: string(st.State), Failures: st.Failures, LastError: st.LastError, Key: st.Key}
		if st.State != reaper.StatePoison {
			tx, ve := st.Tx.Time().Format(storage.TimeLayout), st.ValidEnd.Time().Format(storage.TimeLayout)
			j.NodeID, j.TxTime, j.ValidEnd = st.NodeID.String(), &tx, &ve
		}
		if st.EdgesTotal > 0 {
			j.EdgesTotal = uint64(st.EdgesTotal)
		}
		if st.State == reaper.StateWaiting {
			j.WaitingFor = st.WaitingFor.String()
		}
		out = append(out, j)
	}
	return out
}

func (a *Slot) refreshStats(ctx context.Context) {
	t := time.NewTicker(5 * time.Second)
	defer t.Stop()
	for {
		c, cancel := context.WithTimeout(ctx, 2*time.Second)
		_ = a.worker.RefreshStats(c)
		cancel()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// handler is what an HTTP server of the worker serves: health (the
// probes and /metrics) and the read API with the status page, as asked.
// The store opens after the listener (so the probes answer during a long
// startup); until then only health and metrics answer, and /v1/... gets
// 503. The body is bounded.
func (a *Slot) Handler(health, readAPI bool) http.Handler {
	early := api.Handler(nil, api.Options{Ready: a.Ready, Metrics: a.metrics.Handler(), Health: health})
	var full atomic.Pointer[http.Handler]
	a.onStoreOpen = append(a.onStoreOpen, func() {
		h := api.Handler(a.store, api.Options{Ready: a.Ready, Metrics: a.metrics.Handler(), Health: health, ReadAPI: readAPI, Logger: a.log, Journals: a.Journals,
			Auth: a.auth,
			Partitions: func() api.Partitions {
				return api.Partitions{Partitions: a.cfg.Partitions, Replica: a.cfg.Owner.Index, Replicas: a.cfg.Owner.Count,
					Owned: a.cfg.Owner.Partitions(a.cfg.Partitions),
					Rule:  "a tenant's partition is fnv1a32(tenant) % partitions; replica i of N owns the partitions p with p % N == i"}
			}})
		full.Store(&h)
	})
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if h := full.Load(); h != nil {
			(*h).ServeHTTP(w, r)
			return
		}
		if readAPI && strings.HasPrefix(r.URL.Path, "/v1/") {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = io.WriteString(w, `{"error":"starting: the store is not open yet"}`+"\n")
			return
		}
		early.ServeHTTP(w, r)
	})
	var served http.Handler = handler
	if readAPI {
		served = withUI(handler, func() http.Handler {
			if h := a.uiH.Load(); h != nil {
				return *h
			}
			return nil
		})
	}
	return http.MaxBytesHandler(served, 1<<20)
}

// Serve serves the slot on ln, a static worker's listener: health (the
// probes and /metrics) and the read API with the status page, as asked.
// The slot's shutdown stops the server first; its requests count in
// inflight and their contexts end when the slot closes (httpCtx).
func (a *Slot) Serve(ln net.Listener, health, readAPI bool) {
	if health {
		a.httpLn = ln
	} else {
		a.apiLn = ln
	}
	h := a.Handler(health, readAPI)
	srv := &http.Server{
		Handler:           a.inflight.wrap(h),
		BaseContext:       func(net.Listener) context.Context { return a.httpCtx },
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      60 * time.Second,
		IdleTimeout:       120 * time.Second,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          slog.NewLogLogger(a.log.Handler(), slog.LevelWarn),
	}
	a.servers = append(a.servers, srv)
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			a.log.Error("http server", "addr", ln.Addr().String(), "err", err)
		}
	}()
}

// ProvisionMu serialises the provisioning of a member's slots
// and of the streams they share (memberRun.provisionShared).
var ProvisionMu sync.Mutex

// provision creates the streams and consumer, retrying while NATS is
// unreachable (an external cluster may start after the worker).
func (a *Slot) provision(ctx context.Context) error {
	delay := 500 * time.Millisecond
	for {
		var err error
		if a.nc.IsConnected() {
			pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			if a.cfg.Hosted {
				// A member's slots create their consumers one at a time,
				// and never while a member of this process provisions the
				// streams: nats-server v2.15 races (go test -race,
				// embedded) between a stream's config update and a
				// consumer's creation on it.
				ProvisionMu.Lock()
			}
			err = a.worker.Provision(pctx)
			if a.cfg.Hosted {
				ProvisionMu.Unlock()
			}
			cancel()
			if err == nil {
				return nil
			}
		} else {
			// Not connected (yet): a JetStream call would only wait for its
			// timeout; the connection attempts log their own causes.
			err = errors.New("nats: not connected")
		}
		if errors.Is(err, queue.ErrPartitionsChanged) {
			return fmt.Errorf("%w: %w", ErrUsage, err)
		}
		if ctx.Err() != nil {
			return nil
		}
		a.log.Warn("provisioning streams failed; retrying", "err", err, "in", delay)
		a.setPhase(fmt.Sprintf("queue: provisioning the streams failed, retrying in %s: %v", delay, err))
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(delay):
		}
		delay = min(2*delay, 10*time.Second)
	}
}

// setPhase records what the start is doing, or what it retries and why
// (readiness; Options.OnStartPhase).
func (a *Slot) setPhase(p string) {
	a.startPhase.Store(&p)
	if a.onPhase != nil {
		a.onPhase(p)
	}
}

// Close releases a slot New built and Run never ran (its listeners).
func (a *Slot) Close() error { return a.close() }

// fatalStopWait bounds how long a slot whose store stopped (not parked)
// waits for its worker, and then for its reaper (Options.StopWait);
// past it Run and Close return, and the store is closed once they are out
// (closeLate).
const fatalStopWait = 10 * time.Second

func (a *Slot) stopWait() time.Duration {
	if a.opts.StopWait > 0 {
		return a.opts.StopWait
	}
	return fatalStopWait
}

func (a *Slot) close() error {
	var errs []error
	fatal := a.store != nil && a.store.FatalErr() != nil
	// parked: Pebble itself failed; nothing may touch the engine again.
	parked := fatal && a.store.Parked()
	// Leaving cut off from NATS, or past the drain's grace with work in
	// flight: the exit waits on NATS for nothing more (--shutdown-grace
	// bounds it). The changelog appends in flight end unconfirmed (a
	// restart replays the changelog), and the outbox's results wait for
	// the next start; unacked requests are redelivered.
	cutOff := a.nc != nil && !a.nc.IsConnected()
	abandon := cutOff || a.drainLate.Load()
	if abandon && a.store != nil && !fatal {
		a.log.Warn("leaving without waiting on NATS: changelog appends in flight end unconfirmed, results in the outbox wait for the next start",
			"connected", !cutOff, "drain_outlasted_grace", a.drainLate.Load())
		a.store.AbortAppends()
	}
	// HTTP first: stop accepting, and cancel the readers' contexts so a
	// read waiting for safe time or a journal (up to 30 s) answers now
	// instead of holding the shutdown, or running on after the store
	// closed. Then wait for every handler (bounded).
	handlersDone := true
	var handlersOut <-chan struct{}
	if a.httpStop != nil {
		a.httpStop()
		for _, srv := range a.servers {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			if err := srv.Shutdown(ctx); err != nil {
				_ = srv.Close()
			}
			cancel()
		}
		handlersOut = a.inflight.drain()
		select {
		case <-handlersOut:
		case <-time.After(5 * time.Second):
			handlersDone = false
			a.log.Error("HTTP handlers still running past the shutdown bound; the store is closed once they are out", "handlers", a.inflight.count())
		}
	}
	if a.changelog != nil {
		// Before the store closes: a checkpoint running reads it.
		a.changelog.stopCheckpoints(!parked)
	}
	reaperStopped := true
	var reaperOut <-chan struct{}
	switch {
	case a.reaper == nil:
	case parked:
		reaperStopped = false
	case fatal:
		// The store refuses every commit: the appliers end at their next
		// one. No last publish (the next run's reaper publishes the
		// outbox). Bounded: the store is closed only once they are out.
		halted := make(chan struct{})
		go func() { a.reaper.Halt(); close(halted) }()
		select {
		case <-halted:
		case <-time.After(a.stopWait()):
			reaperStopped, reaperOut = false, halted
			a.log.Error("the reaper did not stop after the store did; the store is closed once it does", "waited", a.stopWait())
		}
	case abandon:
		a.reaper.Halt()
	default:
		// Appliers stop between chunks; their journals stay durable. The
		// outbox is published one last time.
		a.reaper.Stop()
	}
	if a.opts.CloseConn != nil {
		// The process's own connection (a static worker): drained here,
		// before the store closes, so what was published is sent.
		a.opts.CloseConn()
	} else if cutOff {
		// A flush would only wait out its bound: what this slot published
		// and NATS never acked is not acked to the worker either, so its
		// requests are redelivered.
	} else if a.nc != nil {
		// The member's connection: send what this slot published (acks,
		// results) and leave it open for the member's other slots.
		if err := a.nc.FlushTimeout(5 * time.Second); err != nil {
			a.log.Warn("flushing the member's NATS connection", "err", err)
		}
	}
	// A store that stopped on its own decision (fenced) is closed like any
	// other once its worker and reaper are out, releasing its directory:
	// before, a member whose slot was fenced held the slot's Pebble lock
	// until it exited, and could neither own nor tail that slot again.
	// When one of them outlasted its bound (a NATS call of the worker's
	// drain, cut off), the store is closed as soon as it is out: before, it
	// stayed open until the process exited, and the member's later runs
	// of that slot failed "lock held" for good (a black-box probe cut a
	// member off from NATS for 30 s under load).
	switch {
	case a.store == nil || parked:
	case handlersDone && reaperStopped && !a.workerLeft.Load():
		if err := a.store.Close(); err != nil && !fatal {
			errs = append(errs, err)
		}
	default:
		if handlersDone {
			handlersOut = nil
		}
		go a.closeLate(handlersOut, reaperOut, a.workerDone)
	}
	return errors.Join(errs...)
}

// closeLate closes the store once the HTTP handlers, the reaper and the
// worker (each nil: already out) are out, however long that takes: they
// end when their calls to NATS do. Until then the slot's directory stays
// locked, and a member's next run of the slot fails and is retried.
func (a *Slot) closeLate(handlers, reaper <-chan struct{}, worker <-chan error) {
	t0 := time.Now()
	if handlers != nil {
		<-handlers
	}
	if reaper != nil {
		<-reaper
	}
	if worker != nil {
		<-worker
	}
	err := a.store.Close()
	a.log.Warn("the slot's store closed after what outlasted its stop (the worker, the reaper or HTTP handlers) was out; its directory is released",
		"waited", time.Since(t0), "err", err)
}

// inflight counts the HTTP handlers running; once drained it refuses new
// ones (503), so its count only falls.
type inflight struct {
	mu     sync.Mutex
	n      int
	closed bool
	zero   chan struct{} // closed when n reaches 0 after drain
}

func (f *inflight) wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !f.enter() {
			w.Header().Set("Connection", "close")
			http.Error(w, "shutting down", http.StatusServiceUnavailable)
			return
		}
		defer f.leave()
		h.ServeHTTP(w, r)
	})
}

func (f *inflight) enter() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return false
	}
	f.n++
	return true
}

func (f *inflight) leave() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.n--
	if f.n == 0 && f.zero != nil {
		close(f.zero)
		f.zero = nil
	}
}

// drain refuses new handlers and returns a channel closed once none runs.
func (f *inflight) drain() <-chan struct{} {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.closed = true
	ch := make(chan struct{})
	if f.n == 0 {
		close(ch)
	} else {
		f.zero = ch
	}
	return ch
}

func (f *inflight) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.n
}

// wiredCascadeHooks are the cascade hooks the worker runs with: its own,
// each calling next's after it, and every other hook of next as it is
// (Options: the caller's hooks are all called).
func (a *Slot) wiredCascadeHooks(next cascade.Hooks) cascade.Hooks {
	return withNextHooks(a.cascadeHooks(next), next)
}

// wiredReaperHooks: wiredCascadeHooks for the reaper.
func (a *Slot) wiredReaperHooks(next reaper.Hooks) reaper.Hooks {
	return withNextHooks(a.reaperHooks(next), next)
}

// withNextHooks returns own with each of its nil func fields taken from
// next: a hook the worker does not observe is the caller's alone. own's
// hooks call next's themselves. (Reflection, so that a hook added to
// cascade.Hooks or reaper.Hooks later is passed on without anyone
// remembering to: TestOptionsHooksAreAllCalled.)
func withNextHooks[H any](own, next H) H {
	ov, nv := reflect.ValueOf(&own).Elem(), reflect.ValueOf(next)
	for i := 0; i < ov.NumField(); i++ {
		if f := ov.Field(i); f.Kind() == reflect.Func && f.IsNil() {
			f.Set(nv.Field(i))
		}
	}
	return own
}
