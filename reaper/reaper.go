package reaper

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/robfig/cron/v3"
	"github.com/telha/telha-cascade/cascade"
	"github.com/telha/telha-cascade/storage"
)

// Config configures the reaper. Zero fields take the defaults below.
type Config struct {
	// Schedule is the cron spec of passes (5-field, or a descriptor such as
	// "@every 30s"). Default "@every 30s": an orphan left by a crashed
	// applier waits at most that long plus the lease TTL.
	Schedule string
	// BatchSize is how many journal heads a pass reads per page, so a pass
	// over many journals holds little memory. Default 100.
	BatchSize int
	// StepTimeout bounds the resumption of one journal; a super-node
	// journal of a million edges takes seconds, so the default is generous:
	// 30 minutes.
	StepTimeout time.Duration
	// PoisonAfter: a journal that failed this many times is reported as
	// poison (it is still retried, with backoff). Default 5.
	PoisonAfter int
	// RetryBackoff is the base of the backoff between attempts on a failing
	// journal: base * 2^(failures-1), capped at 10 minutes. Default 30s.
	RetryBackoff time.Duration
	// Clock is the wall clock (default the system clock); tests inject one.
	Clock storage.Clock
	// OnRun, when set, receives every pass's result (metrics; test signal).
	OnRun  func(RunResult)
	Logger *slog.Logger
}

func (c Config) withDefaults() Config {
	if c.Schedule == "" {
		c.Schedule = "@every 30s"
	}
	if c.BatchSize <= 0 {
		c.BatchSize = 100
	}
	if c.StepTimeout <= 0 {
		c.StepTimeout = 30 * time.Minute
	}
	if c.PoisonAfter <= 0 {
		c.PoisonAfter = 5
	}
	if c.RetryBackoff <= 0 {
		c.RetryBackoff = 30 * time.Second
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
	Skipped  bool // the previous pass was still running
	Tenants  int
	Scanned  int // journal heads seen
	Resumed  int // orphans resumed to completion
	Held     int // left alone: a live applier holds them
	Deferred int // failing journals whose backoff has not elapsed
	Failed   int // attempts that failed this pass
	Poison   int // undecodable heads, plus journals failing PoisonAfter times or more
	Err      error
	Took     time.Duration
}

// ParseSchedule validates a cron spec the way the reaper reads it.
func ParseSchedule(spec string) (cron.Schedule, error) {
	return cron.NewParser(cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor).Parse(spec)
}

// Reaper resumes orphaned journals.
type Reaper struct {
	cfg   Config
	ops   *cascade.Ops
	store *storage.Store

	running atomic.Bool
	cron    *cron.Cron
	ctx     context.Context
	cancel  context.CancelFunc
	wg      sync.WaitGroup
	mu      sync.Mutex
	started bool
}

// New returns a reaper; it fails on a bad schedule.
func New(ops *cascade.Ops, cfg Config) (*Reaper, error) {
	cfg = cfg.withDefaults()
	sched, err := ParseSchedule(cfg.Schedule)
	if err != nil {
		return nil, fmt.Errorf("reaper schedule %q: %w", cfg.Schedule, err)
	}
	r := &Reaper{cfg: cfg, ops: ops, store: ops.Store()}
	r.cron = cron.New(cron.WithLocation(time.UTC))
	r.cron.Schedule(sched, cron.FuncJob(func() {
		r.wg.Add(1)
		defer r.wg.Done()
		r.RunOnce(r.ctx)
	}))
	return r, nil
}

// Start starts the schedule. The caller runs the startup pass (RunOnce)
// itself, before consuming messages.
func (r *Reaper) Start(ctx context.Context) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.started {
		return
	}
	r.ctx, r.cancel = context.WithCancel(ctx)
	r.started = true
	r.cron.Start()
}

// Stop stops the schedule, cancels a running pass between journals (a
// journal being resumed pauses between chunks; it stays durable) and waits
// for it.
func (r *Reaper) Stop() {
	r.mu.Lock()
	if !r.started {
		r.mu.Unlock()
		return
	}
	r.started = false
	r.mu.Unlock()
	<-r.cron.Stop().Done()
	r.cancel()
	r.wg.Wait()
}

// RunOnce runs one pass, unless one is already running (then it returns a
// Skipped result at once).
func (r *Reaper) RunOnce(ctx context.Context) RunResult {
	if !r.running.CompareAndSwap(false, true) {
		res := RunResult{Skipped: true}
		r.report(res)
		return res
	}
	defer r.running.Store(false)
	start := time.Now()
	res := r.pass(ctx)
	res.Took = time.Since(start)
	r.report(res)
	return res
}

func (r *Reaper) report(res RunResult) {
	log := r.cfg.Logger
	switch {
	case res.Skipped:
		log.Info("reaper pass skipped: the previous pass is still running")
	case res.Err != nil:
		log.Warn("reaper pass finished with errors", "resumed", res.Resumed, "failed", res.Failed, "poison", res.Poison, "err", res.Err)
	case res.Resumed > 0 || res.Poison > 0:
		log.Info("reaper pass", "scanned", res.Scanned, "resumed", res.Resumed, "held", res.Held, "poison", res.Poison, "took", res.Took)
	}
	if r.cfg.OnRun != nil {
		r.cfg.OnRun(res)
	}
}

func (r *Reaper) pass(ctx context.Context) RunResult {
	var res RunResult
	var errs []error
	for _, sc := range r.store.Tenants() {
		res.Tenants++
		var cursor []byte
		for {
			if err := ctx.Err(); err != nil {
				res.Err = errors.Join(append(errs, err)...)
				return res
			}
			page, poison, next, err := r.store.JournalHeads(sc, cursor, r.cfg.BatchSize)
			if err != nil {
				errs = append(errs, fmt.Errorf("tenant %s: list journals: %w", sc.Tenant(), err))
				break
			}
			res.Scanned += len(page) + len(poison)
			res.Poison += len(poison)
			for _, e := range page {
				r.step(ctx, e, &res, &errs)
			}
			if next == nil {
				break
			}
			cursor = next
		}
	}
	res.Err = errors.Join(errs...)
	return res
}

// step resumes one journal if it is an orphan whose backoff has elapsed.
// A panic while resuming is caught and counted like any failure.
func (r *Reaper) step(ctx context.Context, e *storage.JournalEntry, res *RunResult, errs *[]error) {
	defer func() {
		if fails, _ := e.Failures(); fails >= r.cfg.PoisonAfter {
			res.Poison++
		}
	}()
	fails, _ := e.Failures()
	if fails > 0 {
		backoff := r.cfg.RetryBackoff << min(fails-1, 20)
		if backoff > 10*time.Minute || backoff <= 0 {
			backoff = 10 * time.Minute
		}
		if r.cfg.Clock.Now().Sub(e.LastFailure()) < backoff {
			res.Deferred++
			return
		}
	}
	sctx, cancel := context.WithTimeout(ctx, r.cfg.StepTimeout)
	defer cancel()
	err := func() (err error) {
		defer func() {
			if p := recover(); p != nil {
				err = fmt.Errorf("panic resuming journal: %v", p)
				e.RecordFailure(err, r.cfg.Clock.Now())
			}
		}()
		return r.ops.Resume(sctx, e)
	}()
	switch {
	case err == nil:
		res.Resumed++
	case errors.Is(err, cascade.ErrLeaseHeld):
		res.Held++
	default:
		res.Failed++
		*errs = append(*errs, fmt.Errorf("journal %x (tenant %s, node %s): %w", e.HeadKey, e.Scope.Tenant(), e.J.NodeID, err))
	}
}
