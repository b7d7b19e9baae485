package reaper

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/robfig/cron/v3"
	"github.com/telha/telha-cascade/cascade"
	"github.com/telha/telha-cascade/storage"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// Publisher publishes the result of a finished journaled request (the
// queue's results stream). It must be idempotent per (tenant, request id):
// a crash between publishing and deleting the outbox row publishes again.
type Publisher interface {
	PublishResult(ctx context.Context, tenant, requestID string, rc storage.Receipt) error
}

// Config configures the service. Zero fields take the defaults below.
type Config struct {
	// Applier applies one journal (cascade semantics and chunking).
	// Required.
	Applier *cascade.Applier
	// Publisher publishes finished journals' results from the outbox. Nil:
	// outbox rows wait (tests of the store alone).
	Publisher Publisher
	// WaitFeed: a feed publisher runs (the change feed on, or off and
	// only scrubbing); an erase's result waits until it has deleted the
	// erased puts from the feed (queue.FeedPublisher).
	WaitFeed bool
	// Schedule is the cron spec of passes (5-field, or a descriptor such as
	// "@every 30s"). Default "@every 30s": a journal whose applier failed is
	// tried again at the first pass after its backoff.
	Schedule string
	// StepTimeout bounds one attempt at one journal; a super-node journal
	// of ten million edges takes about a minute, so the default is generous:
	// 30 minutes.
	StepTimeout time.Duration
	// MaxAppliers bounds the journals applied at once; the others wait
	// (state pending). Each applier holds a Pebble snapshot and two chunk
	// buffers and takes about a core, so a burst of super-node deletes, or a
	// restart with many journals, must not start them all. An applier that
	// waits for an earlier journal gives its slot up meanwhile, so waits
	// never hold every slot. Default 4.
	MaxAppliers int
	// StallTimeout: an attempt whose applier makes no progress (no chunk
	// lands, and its scan of the neighbourhood reads no rows) for this
	// long while applying (not while it waits for an
	// earlier journal) is abandoned and retried like a failure. Default 1
	// minute: a chunk of 100k puts takes well under a second.
	StallTimeout time.Duration
	// PoisonAfter: a journal that failed this many times is reported as
	// poison (it is still retried, with backoff). Default 5.
	PoisonAfter int
	// RetryBackoff is the base of the backoff between attempts on a failing
	// journal: base * 2^(failures-1), capped at 10 minutes. Default 30s.
	RetryBackoff time.Duration
	// OutboxInterval: how often the outbox is checked besides the kicks of
	// finished journals and passes (a publish that failed is retried then).
	// Default 5s.
	OutboxInterval time.Duration
	// PublishTimeout bounds one result's publish. Default 10s.
	PublishTimeout time.Duration
	// Clock is the wall clock (default the system clock); tests inject one.
	Clock  storage.Clock
	Hooks  Hooks
	Logger *slog.Logger
	// TracerProvider receives the journals' spans, children of their
	// request's traceparent (nil: tracing off).
	TracerProvider trace.TracerProvider
}

// Hooks observe the service: metrics, and test signals in place of sleeps.
// Every field is optional; none may block for long.
type Hooks struct {
	// Run receives every pass's result.
	Run func(RunResult)
	// Finished fires when an attempt at a journal ends: err nil (the
	// journal is removed and its receipt rc stored), or why it stopped.
	Finished func(e *storage.JournalEntry, rc storage.Receipt, err error)
	// Applying fires with true when an attempt has an applier slot and
	// starts applying journal e, and with false when that attempt ends
	// (the worker runs spare Go processors while a cascade is applied).
	Applying func(e *storage.JournalEntry, applying bool)
	// Published fires once per result published from the outbox.
	Published func(tenant string, rc storage.Receipt)
	// Stalled fires when the watchdog abandons an attempt that made no
	// progress for StallTimeout.
	Stalled func(e *storage.JournalEntry)
	// OutboxParked fires when a result has failed to publish PoisonAfter
	// times in a row: it is parked (retried at most every 10 minutes) and
	// the rows after it go on (metrics: a counter; the summary counts the
	// parked rows).
	OutboxParked func(tenant, requestID string, err error)
	// EraseFinished fires when an attempt at an erase ends (err nil: done,
	// its receipt rc stored and its result in the outbox; an error wrapping
	// storage.ErrJournalGone: it was no longer in flight, nothing to do).
	EraseFinished func(e *storage.EraseEntry, rc storage.Receipt, err error)
}

func (c Config) withDefaults() Config {
	if c.Schedule == "" {
		c.Schedule = "@every 30s"
	}
	if c.StepTimeout <= 0 {
		c.StepTimeout = 30 * time.Minute
	}
	if c.StallTimeout <= 0 {
		c.StallTimeout = time.Minute
	}
	if c.MaxAppliers <= 0 {
		c.MaxAppliers = 4
	}
	if c.PoisonAfter <= 0 {
		c.PoisonAfter = 5
	}
	if c.RetryBackoff <= 0 {
		c.RetryBackoff = 30 * time.Second
	}
	if c.OutboxInterval <= 0 {
		c.OutboxInterval = 5 * time.Second
	}
	if c.PublishTimeout <= 0 {
		c.PublishTimeout = 10 * time.Second
	}
	if c.Clock == nil {
		c.Clock = storage.SystemClock{}
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// RunResult is what one pass did.
type RunResult struct {
	Skipped   bool // the previous pass was still running
	Journals  int  // journals registered when the pass began
	Resumed   int  // journals this pass applied to completion
	Held      int  // left alone: an applier is already on them
	Deferred  int  // failing journals whose backoff has not elapsed
	Failed    int  // attempts that failed this pass
	Poison    int  // undecodable heads, plus journals failing PoisonAfter times or more
	Published int  // results published from the outbox
	Err       error
	Took      time.Duration
}

// ParseSchedule validates a cron spec the way the service reads it.
func ParseSchedule(spec string) (cron.Schedule, error) {
	return cron.NewParser(cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor).Parse(spec)
}

// State is where a journal is in its life.
type State string

const (
	StateApplying State = "applying" // an applier is on it
	StateWaiting  State = "waiting"  // its applier waits for an earlier journal sharing an edge
	StatePending  State = "pending"  // not being applied: left by a restart (the next pass takes it), or waiting for a free applier
	StateFailing  State = "failing"  // its last attempt failed; retried after a backoff
	StatePoison   State = "poison"   // its head cannot be decoded
)

// Status is one journal as /v1/journals and the gauges show it.
type Status struct {
	Scope      storage.Scope
	NodeID     uuid.UUID
	RequestID  string
	Tx         storage.Ts
	ValidEnd   storage.Ts
	EdgesTotal int64 // -1 until its applier has counted them
	EdgesDone  int64
	Age        time.Duration // since the journal was written
	State      State
	WaitingFor uuid.UUID // StateWaiting: the earlier journal's node
	Failures   int
	LastError  string
	Key        string // StatePoison: the head's key, hex
}

// journal is the service's record of one journal: who applies it (the
// lease: at most one applier at a time), its progress and its failures.
type journal struct {
	e *storage.JournalEntry

	mu         sync.Mutex
	active     bool          // an attempt holds the journal (the lease)
	queued     bool          // the attempt waits for an applier slot
	done       chan struct{} // closed when the active attempt ends
	total      int64
	applied    int64
	waitingFor *storage.JournalEntry
	progress   time.Time // last progress of the active attempt
	failures   int
	lastErr    string
	failedAt   time.Time
}

// Service owns every cascade journal's life after its commit point: the
// hand-off from the cascade (Begin), applying it (one applier per journal),
// the startup pass and the cron passes that take up journals left by a
// restart or a failure, backoff and poison, publishing the result from the
// outbox, and the progress /v1/journals and the metrics show.
type Service struct {
	cfg   Config
	store *storage.Store

	mu       sync.Mutex
	journals map[string]*journal // by head key
	started  bool
	stopping bool
	ctx      context.Context
	cancel   context.CancelFunc
	wg       sync.WaitGroup

	slots   chan struct{} // MaxAppliers
	running atomic.Bool
	cron    *cron.Cron
	kick    chan struct{}
	pubMu   sync.Mutex

	traceMu sync.Mutex
	traces  map[string]string // tenant \x00 request id -> traceparent of a finished journal, until its result is published

	outboxFails map[string]eraseFailure // by outbox row key; under pubMu
	parked      atomic.Int64            // rows of outboxFails parked (failures >= PoisonAfter)

	eraseKick  chan struct{}
	eraseMu    sync.Mutex
	eraseFails map[*storage.EraseEntry]eraseFailure
}

type eraseFailure struct {
	n    int
	at   time.Time
	last string
}

// New returns the service; it fails on a bad schedule or a missing Applier.
// Journals handed over before Start wait for it (or for RunOnce).
func New(store *storage.Store, cfg Config) (*Service, error) {
	cfg = cfg.withDefaults()
	if cfg.Applier == nil {
		return nil, errors.New("reaper: Config.Applier is required")
	}
	sched, err := ParseSchedule(cfg.Schedule)
	if err != nil {
		return nil, fmt.Errorf("reaper schedule %q: %w", cfg.Schedule, err)
	}
	s := &Service{cfg: cfg, store: store, journals: map[string]*journal{}, kick: make(chan struct{}, 1),
		eraseKick: make(chan struct{}, 1), eraseFails: map[*storage.EraseEntry]eraseFailure{}, traces: map[string]string{}, outboxFails: map[string]eraseFailure{}, slots: make(chan struct{}, cfg.MaxAppliers)}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	s.cron = cron.New(cron.WithLocation(time.UTC))
	s.cron.Schedule(sched, cron.FuncJob(func() { s.RunOnce(s.ctx) }))
	return s, nil
}

// Start starts the cron passes and the outbox publisher, and takes up the
// journals handed over so far. The caller runs the startup pass: StartResume
// (in the background, while the worker consumes) or RunOnce.
func (s *Service) Start() {
	s.mu.Lock()
	if s.started || s.stopping {
		s.mu.Unlock()
		return
	}
	s.started = true
	s.mu.Unlock()
	s.cron.Start()
	s.wg.Add(1)
	go func() { defer s.wg.Done(); s.publishLoop() }()
	s.wg.Add(1)
	go func() { defer s.wg.Done(); s.eraseLoop() }()
}

// StartResume runs the startup pass in the background: every journal a
// previous process left is resumed by the usual appliers (MaxAppliers at
// once) while the worker consumes. Their fences were loaded with the store,
// so only requests touching a fenced node wait (writes: cascade_in_flight;
// reads: below the journal, or a wait). The pass runs under the service's
// WaitGroup on its context: Stop pauses its appliers between chunks and
// waits for it. done, when set, receives the pass's result. It returns
// false (and runs nothing) once Stop has begun.
func (s *Service) StartResume(done func(RunResult)) bool {
	s.mu.Lock()
	if s.stopping {
		s.mu.Unlock()
		return false
	}
	s.wg.Add(1)
	s.mu.Unlock()
	go func() {
		defer s.wg.Done()
		res := s.RunOnce(s.ctx)
		if done != nil {
			done(res)
		}
	}()
	return true
}

// BeginErase takes an erase whose head just committed (cascade.EraseSink).
// It runs on the writer, so it only wakes the eraser.
func (s *Service) BeginErase(*storage.EraseEntry) { s.kickErase() }

func (s *Service) kickErase() {
	select {
	case s.eraseKick <- struct{}{}:
	default:
	}
}

// maxEraseBatch and maxEraseRewrite bound a round's rewrites: its first
// erase's answer waits for the rewrites of those after it (each may wait
// for a journal touching its entity), so a round stops rewriting more
// once it holds 32 or has rewritten for 5 s; the rest go in the next.
const (
	maxEraseBatch   = 32
	maxEraseRewrite = 5 * time.Second
)

// eraseLoop applies erases oldest first: the ones handed over, those a
// previous process left (its first round, at Start), and failed ones
// again after their backoff (checked every OutboxInterval). A round
// rewrites each erase listed (its versions; one at a time), scrubs the
// disk once for all of them, then finishes each (the copies and the
// answer): the first finish scrubs the copies for every erase of the
// round, and the others find them scrubbed (issue 29, batched scrubs:
// erases that arrive while a round runs share the next round's flush,
// compaction and scrub of the copies).
func (s *Service) eraseLoop() {
	t := time.NewTicker(s.cfg.OutboxInterval)
	defer t.Stop()
	s.kickErase()
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-s.eraseKick:
		case <-t.C:
		}
		s.eraseRound()
	}
}

// eraseAttempt is one erase of a round, between its prepare and finish.
type eraseAttempt struct {
	e    *storage.EraseEntry
	p    *cascade.PreparedErase
	span trace.Span
}

func (s *Service) eraseRound() {
	var prepared []eraseAttempt
	start := time.Now()
	for _, e := range s.store.Erases().List() {
		if s.ctx.Err() != nil {
			break
		}
		if len(prepared) == maxEraseBatch || (len(prepared) > 0 && time.Since(start) > maxEraseRewrite) {
			s.kickErase() // the rest: the next round, at once (not at the next tick)
			break
		}
		s.eraseMu.Lock()
		f := s.eraseFails[e]
		s.eraseMu.Unlock()
		if f.n > 0 && s.cfg.Clock.Now().Sub(f.at) < backoff(s.cfg.RetryBackoff, f.n) {
			continue
		}
		tctx, span := s.tracer().Start(traceContext(e.Traceparent()), "telha.erase", trace.WithAttributes(
			attribute.String("telha.tenant", e.Scope.Tenant()), attribute.String("telha.request_id", e.Job.Prov.RequestID),
			attribute.String("telha.op", e.Job.Op.String()), attribute.String("telha.id", e.Job.ID.String())))
		s.traceResult(e.Scope, e.Job.Prov.RequestID, tctx)
		p, err := s.rewriteErase(e)
		if err != nil {
			s.eraseDone(eraseAttempt{e: e, span: span}, storage.Receipt{}, err)
			continue
		}
		prepared = append(prepared, eraseAttempt{e: e, p: p, span: span})
	}
	var scrubErr error
	if err := s.scrubErases(prepared); err != nil {
		// Each is retried after its backoff, from its rewrite (nothing of
		// it needs undoing).
		scrubErr = err
	}
	for _, a := range prepared {
		if s.ctx.Err() != nil {
			// Not finished: applied again from the start by the next process.
			a.span.End()
			continue
		}
		if scrubErr != nil {
			// The round's scrub of the disk failed, or the copies could
			// not be scrubbed for the erase before: each other would try
			// the same scrub again (up to its bound) in turn. They fail
			// with it, and are retried after their backoff.
			s.eraseDone(a, storage.Receipt{}, scrubErr)
			continue
		}
		rc, err := s.finishErase(a.p)
		if errors.Is(err, storage.ErrScrub) {
			scrubErr = err
		}
		s.eraseDone(a, rc, err)
	}
}

// eraseDone records how an attempt ended.
func (s *Service) eraseDone(a eraseAttempt, rc storage.Receipt, err error) {
	e := a.e
	if err != nil {
		a.span.SetStatus(codes.Error, err.Error())
	} else {
		a.span.SetAttributes(attribute.Int64("telha.versions_erased", int64(rc.VersionsErased)))
	}
	a.span.End()
	// Gone: no longer registered (finished by an earlier attempt whose
	// answer was lost, or never committed). Not a failure, and not this
	// attempt's finish either: it has no receipt to report.
	gone := errors.Is(err, storage.ErrJournalGone)
	s.eraseMu.Lock()
	if err != nil && !gone && s.ctx.Err() == nil {
		f := s.eraseFails[e]
		f.n, f.at, f.last = f.n+1, s.cfg.Clock.Now(), err.Error()
		s.eraseFails[e] = f
		s.cfg.Logger.Warn("erase failed; retried after a backoff", "tenant", e.Scope.Tenant(), "op", e.Job.Op.String(), "id", e.Job.ID,
			"request_id", e.Job.Prov.RequestID, "failures", f.n, "err", err)
	} else {
		delete(s.eraseFails, e)
	}
	s.eraseMu.Unlock()
	if s.cfg.Hooks.EraseFinished != nil {
		s.cfg.Hooks.EraseFinished(e, rc, err)
	}
	if gone {
		s.cfg.Logger.Debug("erase no longer in flight", "tenant", e.Scope.Tenant(), "op", e.Job.Op.String(), "id", e.Job.ID,
			"request_id", e.Job.Prov.RequestID)
	}
	if err == nil {
		s.cfg.Logger.Info("erase finished", "tenant", e.Scope.Tenant(), "op", e.Job.Op.String(), "id", e.Job.ID,
			"request_id", e.Job.Prov.RequestID, "versions_erased", rc.VersionsErased)
		s.kickPublish()
	}
}

// rewriteErase, scrubErases and finishErase run one step of an erase; a
// panic (a bug) fails this attempt like any error, so one bad erase
// neither ends the process nor stops the others.
func (s *Service) rewriteErase(e *storage.EraseEntry) (p *cascade.PreparedErase, err error) {
	defer func() {
		if r := recover(); r != nil {
			p, err = nil, fmt.Errorf("panic applying erase: %v", r)
		}
	}()
	return s.cfg.Applier.RewriteErase(s.ctx, e, cascade.EraseObserver{})
}

func (s *Service) scrubErases(as []eraseAttempt) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("panic scrubbing the disk after erases: %v", r)
		}
	}()
	ps := make([]*cascade.PreparedErase, 0, len(as))
	for _, a := range as {
		ps = append(ps, a.p)
	}
	return s.cfg.Applier.ScrubErases(s.ctx, ps)
}

func (s *Service) finishErase(p *cascade.PreparedErase) (rc storage.Receipt, err error) {
	defer func() {
		if r := recover(); r != nil {
			rc, err = storage.Receipt{}, fmt.Errorf("panic applying erase: %v", r)
		}
	}()
	return s.cfg.Applier.FinishErase(s.ctx, p)
}

// EraseFailure reports an erase's failed attempts and last error (for the
// erasure lookup of a request in flight).
func (s *Service) EraseFailure(e *storage.EraseEntry) (int, string) {
	s.eraseMu.Lock()
	defer s.eraseMu.Unlock()
	f := s.eraseFails[e]
	return f.n, f.last
}

// Stop stops the passes, stops appliers between chunks (their journals stay
// durable; the next process resumes them), publishes what the outbox holds
// one last time, and waits.
func (s *Service) Stop() { s.stop(true) }

// Halt is Stop without the outbox's last publish, for a process leaving
// while NATS cannot answer (each result's publish would wait out
// PublishTimeout): the rows stay for the next start, which publishes them.
func (s *Service) Halt() { s.stop(false) }

func (s *Service) stop(publish bool) {
	s.mu.Lock()
	if s.stopping {
		s.mu.Unlock()
		return
	}
	s.stopping = true
	started := s.started
	s.mu.Unlock()
	s.cancel() // a pass in progress waits for attempts that stop on it
	if started {
		<-s.cron.Stop().Done()
	}
	s.wg.Wait()
	if !publish {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.PublishTimeout)
	defer cancel()
	if _, err := s.PublishOutbox(ctx); err != nil {
		s.cfg.Logger.Warn("results of finished cascades left in the outbox for the next start", "err", err)
	}
}

// Begin takes a journal whose head just committed (cascade.JournalSink). It
// runs on the writer, so it only starts the applier.
func (s *Service) Begin(e *storage.JournalEntry) {
	j := s.record(e)
	s.mu.Lock()
	ok := s.started && !s.stopping
	s.mu.Unlock()
	if ok {
		s.startAttempt(j)
	}
}

func (s *Service) record(e *storage.JournalEntry) *journal {
	s.mu.Lock()
	defer s.mu.Unlock()
	j := s.journals[string(e.HeadKey)]
	if j == nil || j.e != e {
		j = &journal{e: e, total: -1}
		s.journals[string(e.HeadKey)] = j
	}
	return j
}

// startAttempt starts an applier on j unless one is on it (the lease) or
// the service is stopping. It returns the channel closed when the attempt
// ends (nil when stopping), and whether it started one.
//
// The check of stopping and the WaitGroup's Add happen under s.mu, where
// Stop sets stopping before it waits: no applier starts once Stop has
// begun (an Add after Wait would be a WaitGroup misuse, and the applier
// would run on a store its owner is closing).
func (s *Service) startAttempt(j *journal) (<-chan struct{}, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopping {
		return nil, false
	}
	j.mu.Lock()
	if j.active {
		done := j.done
		j.mu.Unlock()
		return done, false
	}
	j.active, j.queued, j.done, j.waitingFor = true, true, make(chan struct{}), nil // pending until it has a slot
	done := j.done
	j.mu.Unlock()
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		s.attempt(j)
	}()
	return done, true
}

// attempt applies j once, to completion or to its first failure.
func (s *Service) attempt(j *journal) {
	e := j.e
	var (
		rc  storage.Receipt
		err error
	)
	defer func() {
		j.mu.Lock()
		j.active, j.waitingFor = false, nil
		close(j.done)
		j.mu.Unlock()
		if s.cfg.Hooks.Finished != nil {
			s.cfg.Hooks.Finished(e, rc, err)
		}
	}()
	ctx, cancel := context.WithTimeoutCause(s.ctx, s.cfg.StepTimeout, fmt.Errorf("attempt exceeded the step timeout of %s", s.cfg.StepTimeout))
	defer cancel()
	ctx, stall := context.WithCancelCause(ctx)
	defer stall(nil)
	now := s.cfg.Clock.Now
	j.mu.Lock()
	j.progress = now()
	j.mu.Unlock()
	held := false // this attempt holds an applier slot
	acquire := func(ctx context.Context) error {
		if err := s.acquire(ctx, j); err != nil {
			return err
		}
		held = true
		return nil
	}
	release := func() {
		if held {
			held = false
			s.release()
		}
	}
	defer release()
	obs := cascade.JournalObserver{
		// A scan reading rows is progress: a hub whose scan outlasts
		// StallTimeout is not a stalled applier.
		Scanned: func(int64) { j.mu.Lock(); j.progress = now(); j.mu.Unlock() },
		Counted: func(n int64) { j.mu.Lock(); j.total, j.progress = n, now(); j.mu.Unlock() },
		Applied: func(n int64) { j.mu.Lock(); j.applied, j.waitingFor, j.progress = n, nil, now(); j.mu.Unlock() },
		Waiting: func(on *storage.JournalEntry) { j.mu.Lock(); j.waitingFor = on; j.mu.Unlock() },
		// Waiting for an earlier journal gives the slot up, so waiters
		// never hold every slot (the earlier one may be waiting for one).
		Wait: func(ctx context.Context, on *storage.JournalEntry) error {
			release()
			select {
			case <-on.Removed():
			case <-ctx.Done():
				return ctx.Err()
			}
			return acquire(ctx)
		},
	}
	watchdog := make(chan struct{})
	defer close(watchdog)
	go s.watch(j, stall, watchdog)
	if err = acquire(ctx); err != nil {
		err = fmt.Errorf("waiting for an applier: %w", err)
		return
	}
	if s.cfg.Hooks.Applying != nil {
		s.cfg.Hooks.Applying(e, true)
		defer s.cfg.Hooks.Applying(e, false)
	}
	began := time.Now()
	s.cfg.Logger.Info("cascade journal applying", "tenant", e.Scope.Tenant(), "request_id", e.J.Prov.RequestID, "node", e.J.NodeID, "tx", e.J.Tx.String())
	tctx, span := s.tracer().Start(traceContext(e.Traceparent()), "telha.journal", trace.WithAttributes(
		attribute.String("telha.tenant", e.Scope.Tenant()), attribute.String("telha.request_id", e.J.Prov.RequestID),
		attribute.String("telha.node", e.J.NodeID.String()), attribute.String("telha.tx", e.J.Tx.String())))
	if !e.J.Quiet {
		s.traceResult(e.Scope, e.J.Prov.RequestID, tctx)
	}
	defer func() {
		if err != nil {
			span.SetStatus(codes.Error, err.Error())
		}
		span.SetAttributes(attribute.Int64("telha.edges_tombstoned", int64(rc.EdgesTombstoned)))
		span.End()
	}()
	lastChunk, lastDone := time.Now(), int64(-1)
	applied := obs.Applied
	obs.Applied = func(n int64) {
		applied(n)
		if lastDone >= 0 && n > lastDone {
			_, cs := s.tracer().Start(tctx, "telha.journal.chunk", trace.WithTimestamp(lastChunk),
				trace.WithAttributes(attribute.Int64("telha.edges_done", n), attribute.Int64("telha.edges", n-lastDone)))
			cs.End()
		}
		lastChunk, lastDone = time.Now(), n
	}
	err = func() (err error) {
		defer func() {
			if p := recover(); p != nil {
				err = fmt.Errorf("panic applying journal: %v", p)
			}
		}()
		rc, err = s.cfg.Applier.ApplyJournal(ctx, e, obs)
		return err
	}()
	switch {
	case err == nil || errors.Is(err, storage.ErrJournalGone):
		if err == nil {
			s.cfg.Logger.Info("cascade journal finished", "tenant", e.Scope.Tenant(), "request_id", e.J.Prov.RequestID, "node", e.J.NodeID,
				"tx", e.J.Tx.String(), "edges", rc.EdgesTombstoned, "seconds", time.Since(began).Seconds())
		}
		err = nil
		s.forget(j)
		s.kickPublish()
	case s.ctx.Err() == nil && ctx.Err() != nil:
		err = fmt.Errorf("%w: %w", err, context.Cause(ctx))
		fallthrough
	default:
		j.mu.Lock()
		j.failures++
		j.lastErr, j.failedAt = err.Error(), s.cfg.Clock.Now()
		n := j.failures
		j.mu.Unlock()
		s.cfg.Logger.Error("cascade journal not finished; a later pass retries it", "tenant", e.Scope.Tenant(), "node", e.J.NodeID,
			"tx", e.J.Tx.String(), "journal", fmt.Sprintf("%x", e.HeadKey), "attempt", n, "err", err)
	case s.ctx.Err() != nil:
		s.cfg.Logger.Info("cascade journal paused by shutdown; the next start resumes it", "tenant", e.Scope.Tenant(), "node", e.J.NodeID, "tx", e.J.Tx.String())
	}
}

// acquire takes an applier slot for j's attempt (j reads pending while it
// waits); on ctx's end it returns ctx's error, holding no slot.
func (s *Service) acquire(ctx context.Context, j *journal) error {
	j.mu.Lock()
	j.queued = true
	j.mu.Unlock()
	defer func() {
		j.mu.Lock()
		j.queued = false
		j.progress = s.cfg.Clock.Now()
		j.mu.Unlock()
	}()
	select {
	case s.slots <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (s *Service) release() { <-s.slots }

// watch abandons j's attempt when it stalls: no progress (a chunk landed,
// a few hundred rows scanned) for StallTimeout while applying (waiting for
// an earlier journal or for an applier slot is not a stall).
func (s *Service) watch(j *journal, stall context.CancelCauseFunc, done <-chan struct{}) {
	t := time.NewTicker(max(s.cfg.StallTimeout/4, time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-done:
			return
		case <-t.C:
		}
		now := s.cfg.Clock.Now()
		j.mu.Lock()
		if j.waitingFor != nil || j.queued {
			j.progress = now // waiting is not stalling
		}
		idle := now.Sub(j.progress)
		j.mu.Unlock()
		if idle > s.cfg.StallTimeout {
			s.cfg.Logger.Warn("cascade journal applier stalled; abandoning the attempt", "tenant", j.e.Scope.Tenant(), "node", j.e.J.NodeID,
				"tx", j.e.J.Tx.String(), "idle", idle.Round(time.Millisecond))
			stall(fmt.Errorf("applier stalled: no progress for %s (StallTimeout %s)", idle.Round(time.Millisecond), s.cfg.StallTimeout))
			if s.cfg.Hooks.Stalled != nil {
				s.cfg.Hooks.Stalled(j.e)
			}
			return
		}
	}
}

func (s *Service) forget(j *journal) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.journals[string(j.e.HeadKey)] == j {
		delete(s.journals, string(j.e.HeadKey))
	}
}

// RunOnce runs one pass, unless one is already running (then it returns a
// Skipped result at once): it starts an applier on every registered journal
// that has none and whose backoff has elapsed, waits for those attempts to
// end, and publishes the outbox. At startup (StartResume) it resumes every
// journal a previous process left, in the background.
func (s *Service) RunOnce(ctx context.Context) RunResult {
	if !s.running.CompareAndSwap(false, true) {
		res := RunResult{Skipped: true}
		s.report(res)
		return res
	}
	defer s.running.Store(false)
	start := time.Now()
	res := s.pass(ctx)
	res.Took = time.Since(start)
	s.report(res)
	return res
}

func (s *Service) pass(ctx context.Context) RunResult {
	var res RunResult
	var errs []error
	entries := s.store.Journals().List()
	res.Journals = len(entries)
	res.Poison = len(s.store.Journals().Poison())
	type started struct {
		j    *journal
		done <-chan struct{}
	}
	var mine []started
	now := s.cfg.Clock.Now()
	for _, e := range entries {
		if err := ctx.Err(); err != nil {
			errs = append(errs, err)
			break
		}
		j := s.record(e)
		j.mu.Lock()
		fails, failedAt, active := j.failures, j.failedAt, j.active
		j.mu.Unlock()
		if active {
			res.Held++
			continue
		}
		if fails > 0 && now.Sub(failedAt) < backoff(s.cfg.RetryBackoff, fails) {
			res.Deferred++
			continue
		}
		if done, ok := s.startAttempt(j); ok {
			s.cfg.Logger.Info("resuming cascade journal", "tenant", e.Scope.Tenant(), "node", e.J.NodeID, "tx", e.J.Tx.String(),
				"request_id", e.J.Prov.RequestID, "failures", fails)
			mine = append(mine, started{j, done})
		} else if done != nil {
			res.Held++
		} else {
			errs = append(errs, fmt.Errorf("reaper stopping: %w", context.Canceled))
			break
		}
	}
	for _, m := range mine {
		select {
		case <-m.done:
		case <-ctx.Done():
			errs = append(errs, ctx.Err())
			res.Err = errors.Join(errs...)
			return res
		}
		m.j.mu.Lock()
		fails, last, active := m.j.failures, m.j.lastErr, m.j.active
		m.j.mu.Unlock()
		switch {
		case !s.store.Journals().Registered(m.j.e):
			res.Resumed++
		case active:
			res.Held++ // a hand-off started it again meanwhile
		default:
			res.Failed++
			errs = append(errs, fmt.Errorf("journal %x (tenant %s, node %s): %s", m.j.e.HeadKey, m.j.e.Scope.Tenant(), m.j.e.J.NodeID, last))
			if fails >= s.cfg.PoisonAfter {
				res.Poison++
			}
		}
	}
	n, err := s.PublishOutbox(ctx)
	res.Published = n
	if err != nil {
		errs = append(errs, err)
	}
	res.Err = errors.Join(errs...)
	return res
}

func backoff(base time.Duration, failures int) time.Duration {
	d := base << min(failures-1, 20)
	if d > 10*time.Minute || d <= 0 {
		d = 10 * time.Minute
	}
	return d
}

func (s *Service) report(res RunResult) {
	log := s.cfg.Logger
	switch {
	case res.Skipped:
		log.Info("reaper pass skipped: the previous pass is still running")
	case res.Err != nil:
		log.Warn("reaper pass finished with errors", "resumed", res.Resumed, "failed", res.Failed, "poison", res.Poison, "err", res.Err)
	case res.Resumed > 0 || res.Poison > 0 || res.Published > 0:
		log.Info("reaper pass", "journals", res.Journals, "resumed", res.Resumed, "held", res.Held, "poison", res.Poison, "published", res.Published, "took", res.Took)
	}
	if s.cfg.Hooks.Run != nil {
		s.cfg.Hooks.Run(res)
	}
}

// Wait blocks until no applier is running (tests).
func (s *Service) Wait() {
	for {
		var dones []chan struct{}
		s.mu.Lock()
		for _, j := range s.journals {
			j.mu.Lock()
			if j.active {
				dones = append(dones, j.done)
			}
			j.mu.Unlock()
		}
		s.mu.Unlock()
		if len(dones) == 0 {
			return
		}
		for _, d := range dones {
			<-d
		}
	}
}

// Journals reports every journal, oldest commit first, poison heads last.
func (s *Service) Journals() []Status {
	now := s.cfg.Clock.Now()
	var out []Status
	for _, e := range s.store.Journals().List() {
		st := Status{Scope: e.Scope, NodeID: e.J.NodeID, RequestID: e.J.Prov.RequestID, Tx: e.J.Tx, ValidEnd: e.J.ValidEnd,
			EdgesTotal: -1, Age: max(0, now.Sub(e.J.CreatedAt.Time())), State: StatePending}
		s.mu.Lock()
		j := s.journals[string(e.HeadKey)]
		s.mu.Unlock()
		if j != nil && j.e == e {
			j.mu.Lock()
			st.EdgesTotal, st.EdgesDone, st.Failures, st.LastError = j.total, j.applied, j.failures, j.lastErr
			switch {
			case j.active && j.waitingFor != nil:
				st.State, st.WaitingFor = StateWaiting, j.waitingFor.J.NodeID
			case j.active && j.queued:
				st.State = StatePending
			case j.active:
				st.State = StateApplying
			case j.failures > 0:
				st.State = StateFailing
			}
			j.mu.Unlock()
		}
		out = append(out, st)
	}
	for _, p := range s.store.Journals().Poison() {
		out = append(out, Status{Scope: p.Scope, State: StatePoison, LastError: p.Err, Key: fmt.Sprintf("%x", p.HeadKey),
			EdgesTotal: -1, Age: max(0, now.Sub(p.Seen))})
	}
	return out
}

// Summary is what the journal gauges show.
type Summary struct {
	InFlight int           // decodable journals not yet removed
	Oldest   time.Duration // age of the oldest of them
	Poison   int           // undecodable heads, plus journals failing PoisonAfter times or more
	// OutboxParked: results that failed to publish PoisonAfter times or
	// more and are still in the outbox.
	OutboxParked int
}

// Summarize reads the gauges' figures (at scrape time).
func (s *Service) Summarize() Summary {
	var sum Summary
	for _, st := range s.Journals() {
		if st.State == StatePoison {
			sum.Poison++
			continue
		}
		sum.InFlight++
		if st.Failures >= s.cfg.PoisonAfter {
			sum.Poison++
		}
		sum.Oldest = max(sum.Oldest, st.Age)
	}
	sum.OutboxParked = int(s.parked.Load())
	return sum
}

// KickOutbox makes the outbox publisher look at once (the change feed
// published erases whose results wait for it).
func (s *Service) KickOutbox() { s.kickPublish() }

func (s *Service) kickPublish() {
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

func (s *Service) publishLoop() {
	t := time.NewTicker(s.cfg.OutboxInterval)
	defer t.Stop()
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-s.kick:
		case <-t.C:
		}
		if _, err := s.PublishOutbox(s.ctx); err != nil && s.ctx.Err() == nil {
			s.cfg.Logger.Warn("result outbox", "err", err)
		}
	}
}

// PublishOutbox publishes the results of finished journaled cascades and
// deletes each outbox row (through the writer) once the publisher has it.
// A crash in between publishes again (the publisher is idempotent). It
// returns how many it published.
//
// One row's failure holds up no other row, of its tenant or another: a
// row that fails is retried after OutboxInterval * 2^(failures-1) (at most
// 10 minutes) and the pass goes on with the next row. After PoisonAfter
// failures in a row it is parked: logged as an error, reported
// (Hooks.OutboxParked, Summary.OutboxParked) and still retried at that
// backoff, so a publisher that recovers publishes it (the receipt is in
// the store all along: the request lookup answers it). When several rows
// in a row fail the publisher itself is taken to be down and the pass
// stops there, so an outage costs one pass a few PublishTimeouts, not one
// per row.
func (s *Service) PublishOutbox(ctx context.Context) (int, error) {
	if s.cfg.Publisher == nil {
		return 0, nil
	}
	s.pubMu.Lock()
	defer s.pubMu.Unlock()
	const downAfter = 3 // failures in a row that stop the pass
	n, failedInRow := 0, 0
	var errs []error
	now := s.cfg.Clock.Now()
	seen := map[string]bool{}
	complete := false // every tenant's rows were listed
	defer func() {
		if complete {
			// Rows no longer in the outbox (gone meanwhile) are forgotten.
			for k := range s.outboxFails {
				if !seen[k] {
					delete(s.outboxFails, k)
				}
			}
		}
		s.parked.Store(int64(s.outboxParkedLocked()))
	}()
	for _, sc := range s.store.Tenants() {
		rows, keys, err := s.store.PendingOutbox(sc)
		if err != nil {
			return n, errors.Join(append(errs, err)...)
		}
		for i, o := range rows {
			key := keys[i]
			seen[string(key)] = true
			f := s.outboxFails[string(key)]
			if f.n > 0 && now.Sub(f.at) < backoff(s.cfg.OutboxInterval, f.n) {
				continue
			}
			if err := ctx.Err(); err != nil {
				return n, errors.Join(append(errs, err)...)
			}
			if s.cfg.WaitFeed && (o.Receipt.Op == storage.OpEraseNode || o.Receipt.Op == storage.OpEraseEdge) {
				// The feed deletes the erased puts before it publishes the
				// erase: the result waits for that (KickOutbox).
				pending, err := s.store.FeedErasePending(sc, o.RequestID)
				if err != nil {
					return n, errors.Join(append(errs, err)...)
				}
				if pending {
					s.cfg.Logger.Debug("erase result waits for the change feed", "tenant", o.Tenant, "request_id", o.RequestID)
					continue
				}
			}
			pctx, cancel := context.WithTimeout(ctx, s.cfg.PublishTimeout)
			tk := o.Tenant + "\x00" + o.RequestID
			s.traceMu.Lock()
			tp := s.traces[tk]
			s.traceMu.Unlock()
			if tp != "" {
				pctx = propagation.TraceContext{}.Extract(pctx, propagation.MapCarrier{"traceparent": tp})
			}
			err := s.cfg.Publisher.PublishResult(pctx, o.Tenant, o.RequestID, o.Receipt)
			cancel()
			if err != nil {
				if ctx.Err() != nil {
					return n, errors.Join(append(errs, ctx.Err())...)
				}
				f.n, f.at, f.last = f.n+1, s.cfg.Clock.Now(), err.Error()
				s.outboxFails[string(key)] = f
				err = fmt.Errorf("publish result of %q (tenant %s, failure %d): %w", o.RequestID, o.Tenant, f.n, err)
				errs = append(errs, err)
				switch {
				case f.n == s.cfg.PoisonAfter:
					s.cfg.Logger.Error("result parked: publishing it failed repeatedly; the results after it go on, and it is retried every "+
						backoff(s.cfg.OutboxInterval, f.n).String()+" or less often (its receipt is stored: the request lookup answers it)",
						"tenant", o.Tenant, "request_id", o.RequestID, "failures", f.n, "err", err)
					if s.cfg.Hooks.OutboxParked != nil {
						s.cfg.Hooks.OutboxParked(o.Tenant, o.RequestID, err)
					}
				case f.n < s.cfg.PoisonAfter:
					s.cfg.Logger.Warn("result not published; retried after a backoff", "tenant", o.Tenant, "request_id", o.RequestID,
						"failures", f.n, "err", err)
				}
				if failedInRow++; failedInRow >= downAfter {
					return n, fmt.Errorf("%d results in a row failed to publish; the rest wait for the next pass: %w", failedInRow, errors.Join(errs...))
				}
				continue
			}
			failedInRow = 0
			s.traceMu.Lock()
			delete(s.traces, tk)
			s.traceMu.Unlock()
			if f.n >= s.cfg.PoisonAfter {
				s.cfg.Logger.Info("parked result published", "tenant", o.Tenant, "request_id", o.RequestID, "failures", f.n)
			}
			delete(s.outboxFails, string(key))
			if err := s.store.Update(ctx, func(t *storage.Txn) error { t.DeleteOutbox(key); return nil }); err != nil {
				return n, errors.Join(append(errs, err)...)
			}
			if s.cfg.Hooks.Published != nil {
				s.cfg.Hooks.Published(o.Tenant, o.Receipt)
			}
			n++
		}
	}
	complete = true
	return n, errors.Join(errs...)
}

func (s *Service) outboxParkedLocked() int {
	n := 0
	for _, f := range s.outboxFails {
		if f.n >= s.cfg.PoisonAfter {
			n++
		}
	}
	return n
}

// traceResult records the trace context the result of a request will be
// published under (its journal's or erase's span). It is recorded before
// the journal or erase can finish, so the outbox publisher, which may run
// the moment the finishing batch commits, always finds it.
func (s *Service) traceResult(sc storage.Scope, requestID string, ctx context.Context) {
	if requestID == "" || !trace.SpanContextFromContext(ctx).IsValid() {
		return
	}
	m := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(ctx, m)
	s.traceMu.Lock()
	s.traces[sc.Tenant()+"\x00"+requestID] = m["traceparent"]
	s.traceMu.Unlock()
}

func (s *Service) tracer() trace.Tracer {
	if s.cfg.TracerProvider == nil {
		return noop.NewTracerProvider().Tracer("")
	}
	return s.cfg.TracerProvider.Tracer("github.com/telha/telha-cascade/reaper")
}

// traceContext is a context whose remote parent is the W3C traceparent tp
// (none when tp is empty).
func traceContext(tp string) context.Context {
	if tp == "" {
		return context.Background()
	}
	return propagation.TraceContext{}.Extract(context.Background(), propagation.MapCarrier{"traceparent": tp})
}
