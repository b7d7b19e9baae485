package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"runtime/trace"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/telha/telha-cascade/app"
	"github.com/telha/telha-cascade/slot"
	"github.com/telha/telha-cascade/storage"
)

// countingEngine counts the durable commits of the worker's store: how many,
// how many puts and how many batch bytes (measured, not assumed).
type countingEngine struct {
	storage.Engine
	c *commitCounter
}

func (e countingEngine) Commit(b *pebble.Batch) error {
	e.c.add(b)
	t0 := time.Now()
	err := e.Engine.Commit(b)
	e.c.took(time.Since(t0))
	return err
}

// CommitNoSync is the commit of a store with a changelog (no fsync: the
// changelog holds the batch); counted the same way.
func (e countingEngine) CommitNoSync(b *pebble.Batch) error {
	e.c.add(b)
	t0 := time.Now()
	err := e.Engine.CommitNoSync(b)
	e.c.took(time.Since(t0))
	return err
}

type commitCounter struct {
	commits, puts, bytes atomic.Int64
	nanos, maxNanos      atomic.Int64
}

func (c *commitCounter) took(d time.Duration) {
	c.nanos.Add(int64(d))
	for {
		m := c.maxNanos.Load()
		if int64(d) <= m || c.maxNanos.CompareAndSwap(m, int64(d)) {
			return
		}
	}
}

func (c *commitCounter) add(b *pebble.Batch) {
	c.commits.Add(1)
	c.puts.Add(int64(b.Count()))
	c.bytes.Add(int64(b.Len()))
}

func (c *commitCounter) reset() {
	c.commits.Store(0)
	c.puts.Store(0)
	c.bytes.Store(0)
	c.nanos.Store(0)
	c.maxNanos.Store(0)
}

// writeStats describes what the measured requests wrote.
type writeStats struct {
	Commits       int64   `json:"commits"`
	PutsPerMsg    float64 `json:"puts_per_msg"`
	BytesPerPut   float64 `json:"batch_bytes_per_put"`
	MsgsPerCommit float64 `json:"msgs_per_commit"`
	// CommitMs is the mean duration of a synced commit; CommitBusy the
	// share of the run's wall time spent in commits.
	CommitMs    float64 `json:"commit_ms"`
	CommitMaxMs float64 `json:"commit_max_ms"`
	CommitBusy  float64 `json:"commit_busy"`
}

func (c *commitCounter) stats(msgs int, wall float64) writeStats {
	n, p, b := c.commits.Load(), c.puts.Load(), c.bytes.Load()
	ws := writeStats{Commits: n, CommitMaxMs: round3(float64(c.maxNanos.Load()) / 1e6)}
	if n > 0 {
		ws.CommitMs = round3(float64(c.nanos.Load()) / 1e6 / float64(n))
	}
	if wall > 0 {
		ws.CommitBusy = round3(float64(c.nanos.Load()) / 1e9 / wall)
	}
	if msgs > 0 {
		ws.PutsPerMsg = round3(float64(p) / float64(msgs))
	}
	if p > 0 {
		ws.BytesPerPut = round3(float64(b-12*n) / float64(p)) // 12: batch header
	}
	if n > 0 {
		ws.MsgsPerCommit = round3(float64(msgs) / float64(n))
	}
	return ws
}

// logCounter is the worker's log sink: it counts warnings and errors and
// keeps the first few, optionally echoing everything to stderr.
type logCounter struct {
	mu    sync.Mutex
	warn  int
	errs  int
	first []string
}

type logHandler struct {
	c     *logCounter
	attrs []slog.Attr
	echo  slog.Handler
}

func (h logHandler) Enabled(_ context.Context, l slog.Level) bool {
	return l >= slog.LevelWarn || (h.echo != nil && l >= slog.LevelInfo)
}

func (h logHandler) Handle(ctx context.Context, r slog.Record) error {
	if h.echo != nil {
		_ = h.echo.Handle(ctx, r)
	}
	if r.Level < slog.LevelWarn {
		return nil
	}
	var sb strings.Builder
	sb.WriteString(r.Level.String() + " " + r.Message)
	for _, a := range h.attrs {
		sb.WriteString(" " + a.String())
	}
	r.Attrs(func(a slog.Attr) bool { sb.WriteString(" " + a.String()); return true })
	h.c.mu.Lock()
	defer h.c.mu.Unlock()
	if r.Level >= slog.LevelError {
		h.c.errs++
	} else {
		h.c.warn++
	}
	if len(h.c.first) < 10 {
		h.c.first = append(h.c.first, sb.String())
	}
	return nil
}

func (h logHandler) WithAttrs(as []slog.Attr) slog.Handler {
	h.attrs = append(append([]slog.Attr(nil), h.attrs...), as...)
	if h.echo != nil {
		h.echo = h.echo.WithAttrs(as)
	}
	return h
}

func (h logHandler) WithGroup(name string) slog.Handler {
	if h.echo != nil {
		h.echo = h.echo.WithGroup(name)
	}
	return h
}

func (c *logCounter) logger(echo bool) *slog.Logger {
	h := logHandler{c: c}
	if echo {
		h.echo = slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo})
	}
	return slog.New(h)
}

// buildGraph writes every target of specs straight into a store at dir
// (much faster than through the queue): standalone edges for tombstone_edge
// targets, nodes with their edges (out and in, alternating) for
// tombstone_node targets.
func buildGraph(dir string, specs []spec) error {
	g, err := newGraphWriter(dir)
	if err != nil {
		return err
	}
	for i := range specs {
		sp := &specs[i]
		if sp.edges < 0 {
			err = errors.Join(g.node(sp.tenant, sp.src), g.node(sp.tenant, sp.dst), g.edge(sp.tenant, sp.id, sp.src, sp.dst))
		} else {
			err = g.node(sp.tenant, sp.id)
			for k, nb := range sp.nbrs {
				src, dst := sp.id, nb
				if k%2 == 1 {
					src, dst = nb, sp.id
				}
				err = errors.Join(err, g.node(sp.tenant, nb), g.edge(sp.tenant, sp.eids[k], src, dst))
			}
		}
		if err != nil {
			_ = g.close()
			return err
		}
	}
	return g.close()
}

// profiler writes CPU and allocs profiles of one phase into dir (no-op when
// dir is empty). The allocs profile is written before (".base") and after,
// so `go tool pprof -base` shows the phase alone.
type profiler struct {
	dir, name string
	cpu       *os.File
}

func startProfile(dir, name string) (*profiler, error) {
	p := &profiler{dir: dir, name: name}
	return p, p.start()
}

func (p *profiler) start() error {
	if p.dir == "" {
		return nil
	}
	if err := p.writeAllocs(p.name + ".allocs.base.pprof"); err != nil {
		return err
	}
	f, err := os.Create(filepath.Join(p.dir, p.name+".cpu.pprof"))
	if err != nil {
		return err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return err
	}
	p.cpu = f
	return nil
}

func (p *profiler) writeAllocs(file string) error {
	f, err := os.Create(filepath.Join(p.dir, file))
	if err != nil {
		return err
	}
	defer f.Close()
	return pprof.Lookup("allocs").WriteTo(f, 0)
}

func (p *profiler) stop() error {
	if p.dir == "" || p.cpu == nil {
		return nil
	}
	pprof.StopCPUProfile()
	err := p.cpu.Close()
	p.cpu = nil
	if err != nil {
		return err
	}
	return p.writeAllocs(p.name + ".allocs.pprof")
}

// runSmall builds the graph, starts the worker, and measures warm-up (not
// reported), saturation and light load.
func runSmall(ctx context.Context, o *options, pg progress, ns *natsServer, dir string, specs *specSet, rep *Report) error {
	return runSmallWith(ctx, o, pg, ns, dir, specs, rep.Small, "small", nil)
}

// runSmallWith is runSmall into out, under a progress label, with extra
// worker flags (the small_changelog phase: --changelog jetstream).
func runSmallWith(ctx context.Context, o *options, pg progress, ns *natsServer, dir string, specs *specSet, out *SmallReport, label string, extra []string) error {
	t0 := time.Now()
	if err := buildGraph(filepath.Join(dir, "pebble"), specs.all); err != nil {
		return fmt.Errorf("building the graph: %w", err)
	}
	pg.printf(label+": graph of %d targets built in %s", len(specs.all), time.Since(t0).Round(10*time.Millisecond))

	counter := &commitCounter{}
	logs := &logCounter{}
	cfg, err := app.ParseFlags(append([]string{"--data-dir", dir, "--http-addr", "127.0.0.1:0", "--nats-url", ns.url}, extra...),
		os.Getenv, io.Discard) // TELHA_* variables tune the worker under test
	if err != nil {
		return err
	}
	ready := make(chan *slot.Slot, 1)
	wctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go pprof.Do(wctx, pprof.Labels("side", "worker"), func(c context.Context) {
		done <- app.Run(c, cfg, logs.logger(o.workerLog), app.Options{
			OnReady:    func(a *slot.Slot) { ready <- a },
			WrapEngine: func(e storage.Engine) storage.Engine { return countingEngine{Engine: e, c: counter} },
		})
	})
	var a *slot.Slot
	select {
	case a = <-ready:
	case err := <-done:
		return fmt.Errorf("worker exited before ready: %v", err)
	case <-time.After(60 * time.Second):
		return fmt.Errorf("worker not ready within 60s")
	}
	stopWorker := func() error {
		cancel()
		select {
		case err := <-done:
			return err
		case <-time.After(90 * time.Second):
			return fmt.Errorf("worker did not stop within 90s")
		}
	}
	stopped := false
	defer func() {
		if !stopped {
			_ = stopWorker()
		}
	}()
	pg.printf(label+": worker ready (http %s)", a.HTTPAddr())

	d, err := newDriver(ns.url, "telha")
	if err != nil {
		return err
	}
	defer d.close()
	closed := load{publishers: o.publishers, window: o.window}
	if _, err := d.run(ctx, "warm", specs.warm, closed, 60*time.Second); err != nil {
		return fmt.Errorf("warm-up: %w", err)
	}

	// The graph's feed cursors say it was published (graphWriter.close);
	// the warm-up's changes are let out before the runs.
	if !cfg.ChangeFeedOff {
		if err := waitFeed(ctx, a.Store(), 5*time.Minute); err != nil {
			return err
		}
	}
	runtime.GC()
	waitIdle(o.waitIdle, runtime.NumCPU(), pg)
	counter.reset()
	prof, err := startProfile(o.profileDir, label)
	if err != nil {
		return err
	}
	var traceOut *os.File
	if o.traceFile != "" {
		if traceOut, err = os.Create(o.traceFile); err != nil {
			return err
		}
		if err := trace.Start(traceOut); err != nil {
			return err
		}
	}
	pm0, sm0 := a.Store().Engine().Metrics(), markStalls(a.Store())
	sat, err := d.run(ctx, "small", specs.sat, closed, 60*time.Second)
	pm1 := a.Store().Engine().Metrics()
	if traceOut != nil {
		trace.Stop()
		traceOut.Close()
	}
	if perr := prof.stop(); perr != nil && err == nil {
		err = perr
	}
	if err != nil {
		return fmt.Errorf("saturation run: %w", err)
	}
	out.fromRun(sat)
	out.Writes = counter.stats(sat.Requests, sat.Seconds)
	out.Pebble = pebbleDelta(pm0, pm1).withStalls(a.Store(), sm0)
	pg.printf(label+": %d requests, %.0f/s, p50 %.1f ms, p99 %.1f ms, %.1f msgs/commit, %.1f puts/msg",
		sat.Requests, sat.PerSec, sat.P50ms, sat.P99ms, out.Writes.MsgsPerCommit, out.Writes.PutsPerMsg)

	// Light load is measured on a quiet store: the saturation run's flushes
	// and compactions (seconds of CPU on 2 cores) are let finish first. The
	// light run's own flushes and compactions are part of the figure.
	waitCompactions(a.Store().Engine(), time.Minute)
	if !cfg.ChangeFeedOff { // and the saturation's changes published (the feed is paced)
		if err := waitFeed(ctx, a.Store(), 5*time.Minute); err != nil {
			return err
		}
	}
	waitIdle(o.waitIdle, runtime.NumCPU(), pg)
	counter.reset()
	lprof, err := startProfile(o.profileDir, label+"_light")
	if err != nil {
		return err
	}
	lm0, lsm0 := a.Store().Engine().Metrics(), markStalls(a.Store())
	light, err := d.run(ctx, "light", specs.light, load{rate: o.lightRate}, 60*time.Second)
	lm1 := a.Store().Engine().Metrics()
	if perr := lprof.stop(); perr != nil && err == nil {
		err = perr
	}
	if err != nil {
		return fmt.Errorf("light-load run: %w", err)
	}
	out.Light = light
	out.LightP50ms, out.LightP99ms = light.P50ms, light.P99ms
	lw := counter.stats(light.Requests, light.Seconds)
	out.LightWrites = &lw
	lp := pebbleDelta(lm0, lm1).withStalls(a.Store(), lsm0)
	out.LightPebble = &lp
	pg.printf(label+": light load %d/s for %s: p50 %.2f ms, p99 %.2f ms, max %.2f ms",
		o.lightRate, o.lightDuration, light.P50ms, light.P99ms, light.MaxMs)

	// Consumer state and worker health after the runs.
	if info, err := consumerInfo(ctx, d.js, "TELHA_REQ", "telha-worker-0"); err == nil {
		out.Consumer = info
	}
	stopped = true
	if err := stopWorker(); err != nil {
		return fmt.Errorf("worker stopped with an error: %w", err)
	}
	logs.mu.Lock()
	out.WorkerLog = workerLog{Warnings: logs.warn, Errors: logs.errs, First: logs.first}
	logs.mu.Unlock()
	return nil
}

// waitFeed waits until every tenant's change feed has caught up (the
// feed must be on: nothing moves the cursors of one that is off).
func waitFeed(ctx context.Context, st *storage.Store, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		behind := false
		for _, sc := range st.Tenants() {
			b, err := st.FeedBehind(ctx, sc)
			if err != nil {
				return err
			}
			if b {
				behind = true
				break
			}
		}
		if !behind {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	return fmt.Errorf("the change feed did not catch up within %s", limit)
}

// consumerState is a consumer's counters after a run (all zero when every
// request was acked exactly once in time).
type consumerState struct {
	Pending     uint64 `json:"pending"`
	AckPending  int    `json:"ack_pending"`
	Redelivered int    `json:"redelivered"`
	Delivered   uint64 `json:"delivered"`
}

func consumerInfo(ctx context.Context, js jetstream.JetStream, stream, name string) (*consumerState, error) {
	c, err := js.Consumer(ctx, stream, name)
	if err != nil {
		return nil, err
	}
	// Acks are fire-and-forget: give the last ones a moment to land.
	var info *jetstream.ConsumerInfo
	for range 20 {
		if info, err = c.Info(ctx); err != nil {
			return nil, err
		}
		if info.NumAckPending == 0 && info.NumPending == 0 {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	return &consumerState{Pending: info.NumPending, AckPending: info.NumAckPending, Redelivered: info.NumRedelivered, Delivered: info.Delivered.Consumer}, nil
}

// runSmallChangelog is the small phase with --changelog jetstream (R1, on
// the bench's NATS server), into its own data directory: the same graph,
// the same load, so small and small_changelog compare side by side. The
// graph is written before the worker starts, so the worker seeds the
// changelog with a checkpoint at sequence 0 (outside the measurement).
func runSmallChangelog(ctx context.Context, o *options, pg progress, ns *natsServer, dir string, specs *specSet, rep *Report) error {
	rep.ChangelogSyncAlways = o.changelogSyncAlways
	err := runSmallWith(ctx, o, pg, ns, dir, specs, rep.SmallChangelog, "small_changelog",
		[]string{"--changelog", "jetstream", "--checkpoint-schedule", "@every 1h"})
	if err != nil {
		return err
	}
	info, err := changelogState(ctx, ns.url)
	if err != nil {
		return err
	}
	if n := len(specs.warm) + len(specs.sat) + len(specs.light); n > 0 {
		v := math.Round(float64(info.Bytes)/float64(n)*10) / 10
		rep.ChangelogBytesPerRequest = &v
		pg.printf("small_changelog: changelog %d messages, %d bytes, %.1f bytes/request", info.Msgs, info.Bytes, v)
	}
	return nil
}

// changelogState reads the state of the changelog a static single-replica
// worker with --changelog jetstream writes (TELHA_LOG_STATIC1_0).
func changelogState(ctx context.Context, url string) (jetstream.StreamState, error) {
	nc, err := nats.Connect(url)
	if err != nil {
		return jetstream.StreamState{}, err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return jetstream.StreamState{}, err
	}
	s, err := js.Stream(ctx, "TELHA_LOG_STATIC1_0")
	if err != nil {
		return jetstream.StreamState{}, err
	}
	info, err := s.Info(ctx)
	if err != nil {
		return jetstream.StreamState{}, err
	}
	return info.State, nil
}
