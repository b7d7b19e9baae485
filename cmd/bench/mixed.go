package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"runtime/trace"
	"slices"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/telha/telha-cascade/app"
	"github.com/telha/telha-cascade/slot"
	"github.com/telha/telha-cascade/storage"
)

// MixedReport is the mixed phase: small requests at --light-rate while a
// super-node cascade runs on the same worker.
type MixedReport struct {
	HubEdges   int     `json:"hub_edges"`
	HubSeconds float64 `json:"hub_seconds"` // hub publish to its result
	// Requests published while the hub cascade ran (between its publish
	// and its result), and their latency.
	Requests int     `json:"requests"`
	P50ms    float64 `json:"p50_ms"`
	P99ms    float64 `json:"p99_ms"`
	MaxMs    float64 `json:"max_ms"`
	// The whole open-loop run, before, during and after the cascade.
	// The store's writer during the cascade: how long requests' groups
	// (foreground) and the cascade's chunks (background) waited for it.
	WriterForegroundWaitP99ms float64     `json:"writer_foreground_wait_p99_ms"`
	WriterForegroundWaitMaxms float64     `json:"writer_foreground_wait_max_ms"`
	WriterBackgroundRunP99ms  float64     `json:"writer_background_run_p99_ms"`
	Run                       *runStats   `json:"run"`
	ChunkOps                  int         `json:"chunk_ops"`
	Writes                    writeStats  `json:"writes"`
	Pebble                    pebbleStats `json:"pebble"`
	WorkerLog                 workerLog   `json:"worker_log"`
	// ChangelogMB: the changelog stream's size after the run
	// (mixed_changelog only).
	ChangelogMB *float64 `json:"changelog_mb,omitempty"`
}

// runMixed builds a graph of small targets and a hub straight into a fresh
// store, starts the real worker on it (default flags, TELHA_* variables
// apply), runs small requests open loop at --light-rate, and one second in
// publishes the hub's tombstone_node; the requests published while the
// cascade runs are the measured ones.
func runMixed(ctx context.Context, o *options, pg progress, ns *natsServer, dir string, specs []spec, rep *Report) error {
	var err error
	rep.Mixed, err = runMixedWith(ctx, o, pg, ns, dir, specs, "mixed", nil)
	return err
}

// runMixedChangelog is the mixed phase with --changelog jetstream (R1 on
// ns): every group of small requests and every chunk of the hub's cascade
// is appended to the changelog before its local commit. ns must hold no
// changelog yet (a worker on a fresh store would refuse another store's
// log), so the caller gives it a server of its own.
func runMixedChangelog(ctx context.Context, o *options, pg progress, ns *natsServer, dir string, specs []spec, rep *Report) error {
	m, err := runMixedWith(ctx, o, pg, ns, dir, specs, "mixed_changelog",
		[]string{"--changelog", "jetstream", "--checkpoint-schedule", "@every 1h"})
	rep.MixedChangelog = m
	if err != nil {
		return err
	}
	st, err := changelogState(ctx, ns.url)
	if err != nil {
		return err
	}
	mb := math.Round(float64(st.Bytes)/(1<<20)*10) / 10
	m.ChangelogMB = &mb
	pg.printf("mixed_changelog: changelog %d messages, %.1f MB", st.Msgs, mb)
	return nil
}

// runMixedWith is the mixed phase with extra worker flags; name labels its
// progress lines, its profiles and its trace. The report it returns is
// filled as far as the run got.
func runMixedWith(ctx context.Context, o *options, pg progress, ns *natsServer, dir string, specs []spec, name string, extra []string) (m *MixedReport, err error) {
	t0 := time.Now()
	hub := uuid.New()
	g, err := newGraphWriter(filepath.Join(dir, "pebble"))
	if err != nil {
		return m, err
	}
	err = g.node("hub", hub)
	for i := 0; i < o.hubEdges && err == nil; i++ {
		m := uuid.New()
		if err = g.node("hub", m); err == nil {
			err = g.edge("hub", uuid.New(), hub, m)
		}
	}
	if cerr := g.close(); err == nil {
		err = cerr
	}
	if err != nil {
		return m, fmt.Errorf("building the hub: %w", err)
	}
	if err := buildGraph(filepath.Join(dir, "pebble"), specs); err != nil {
		return m, fmt.Errorf("building the graph: %w", err)
	}
	pg.printf("%s: hub of %d edges and %d small targets built in %s", name, o.hubEdges, len(specs), time.Since(t0).Round(10*time.Millisecond))

	counter := &commitCounter{}
	logs := &logCounter{}
	cfg, err := app.ParseFlags(append([]string{"--data-dir", dir, "--http-addr", "127.0.0.1:0", "--nats-url", ns.url}, extra...), os.Getenv, io.Discard)
	if err != nil {
		return m, err
	}
	ready := make(chan *slot.Slot, 1)
	wctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	type wtask struct {
		at        time.Time
		lane      storage.Lane
		wait, run time.Duration
	}
	var (
		wmu    sync.Mutex
		wtasks []wtask
	)
	go func() {
		done <- app.Run(wctx, cfg, logs.logger(o.workerLog), app.Options{
			OnReady:    func(a *slot.Slot) { ready <- a },
			WrapEngine: func(e storage.Engine) storage.Engine { return countingEngine{Engine: e, c: counter} },
			OnWriterTask: func(l storage.Lane, wait, run time.Duration) {
				wmu.Lock()
				wtasks = append(wtasks, wtask{time.Now(), l, wait, run})
				wmu.Unlock()
			},
		})
	}()
	var a *slot.Slot
	select {
	case a = <-ready:
	case err := <-done:
		return m, fmt.Errorf("worker exited before ready: %v", err)
	case <-time.After(3 * time.Minute):
		// With the changelog on, the start seeds it with a checkpoint of
		// the whole store (the hub's million edges) first.
		return m, fmt.Errorf("worker not ready within 3m")
	}
	defer func() {
		cancel()
		<-done
	}()
	m = &MixedReport{HubEdges: o.hubEdges, ChunkOps: a.Ops().ChunkOps()}

	d, err := newDriver(ns.url, "telha")
	if err != nil {
		return m, err
	}
	defer d.close()
	// The hub's result, on its own subscription.
	hubGot := make(chan time.Time, 1)
	hubRID := "mixed-hub-" + uuid.NewString()
	sub, err := d.resNC.Subscribe("telha.res.hub", func(m *nats.Msg) {
		var r struct {
			RequestID string `json:"request_id"`
			Status    string `json:"status"`
			Edges     int    `json:"edges_tombstoned"`
		}
		if json.Unmarshal(m.Data, &r) == nil && r.RequestID == hubRID {
			if r.Status != "ok" || r.Edges != o.hubEdges {
				pg.printf("%s: hub result %+v, want ok with %d edges", name, r, o.hubEdges)
			}
			select {
			case hubGot <- time.Now():
			default:
			}
		}
	})
	if err != nil {
		return m, err
	}
	defer sub.Unsubscribe()
	if err := d.resNC.Flush(); err != nil {
		return m, err
	}
	waitCompactions(a.Store().Engine(), time.Minute)
	waitIdle(o.waitIdle, runtime.NumCPU(), pg)
	runtime.GC()

	counter.reset()
	prof, err := startProfile(o.profileDir, name)
	if err != nil {
		return m, err
	}
	pm0, sm0 := a.Store().Engine().Metrics(), markStalls(a.Store())
	hubSent := make(chan time.Time, 1)
	go func() {
		select {
		case <-time.After(time.Second):
		case <-ctx.Done():
			return
		}
		body := fmt.Sprintf(`{"request_id":%q,"op":"tombstone_node","tenant":"hub","id":%q}`, hubRID, hub)
		at := time.Now()
		if _, err := d.js.PublishMsg(ctx, d.client.RequestMsg("hub", hubRID, []byte(body))); err != nil {
			pg.printf("%s: publishing the hub's cascade: %v", name, err)
			return
		}
		hubSent <- at
		if o.profileDir == "" {
			return
		}
		// A runtime trace of 3 s in the cascade's middle: where a small
		// request's time goes (scheduling, the writer, NATS).
		select {
		case <-time.After(4 * time.Second):
		case <-ctx.Done():
			return
		}
		f, err := os.Create(filepath.Join(o.profileDir, name+".trace"))
		if err != nil {
			pg.printf("%s: trace: %v", name, err)
			return
		}
		defer f.Close()
		if err := trace.Start(f); err != nil {
			pg.printf("%s: trace: %v", name, err)
			return
		}
		select {
		case <-time.After(3 * time.Second):
		case <-ctx.Done():
		}
		trace.Stop()
	}()
	run, err := d.run(ctx, name, specs, load{rate: o.lightRate}, 120*time.Second)
	if perr := prof.stop(); perr != nil && err == nil {
		err = perr
	}
	if err != nil {
		return m, fmt.Errorf("small requests: %w", err)
	}
	var sent, got time.Time
	select {
	case sent = <-hubSent:
	case <-time.After(10 * time.Second):
		return m, fmt.Errorf("the hub's cascade was not published")
	}
	select {
	case got = <-hubGot:
	case <-time.After(10 * time.Minute):
		return m, fmt.Errorf("no result for the hub's cascade within 10 minutes")
	}
	m.Writes = counter.stats(run.Requests, run.Seconds)
	m.Pebble = pebbleDelta(pm0, a.Store().Engine().Metrics()).withStalls(a.Store(), sm0)
	m.Run = run
	m.HubSeconds = round3(got.Sub(sent).Seconds())
	if got.After(run.base.Add(time.Duration(run.sent[len(run.sent)-1]))) {
		pg.printf("%s: the cascade outlasted the small requests; raise --mixed-duration", name)
	}
	var lat []float64
	for i := range run.sent {
		at := run.base.Add(time.Duration(run.sent[i]))
		if at.Before(sent) || at.After(got) {
			continue
		}
		lat = append(lat, float64(run.got[i]-run.sent[i])/1e6)
	}
	if len(lat) == 0 {
		return m, fmt.Errorf("no small request was published while the cascade ran")
	}
	pct := func(xs []float64, p float64) float64 {
		if len(xs) == 0 {
			return 0
		}
		slices.Sort(xs)
		return round3(xs[int(math.Ceil(p*float64(len(xs))))-1])
	}
	m.Requests, m.P50ms, m.P99ms, m.MaxMs = len(lat), pct(lat, 0.5), pct(lat, 0.99), pct(lat, 1)
	var fgWait, bgRun []float64
	wmu.Lock()
	for _, w := range wtasks {
		if w.at.Before(sent) || w.at.After(got) {
			continue
		}
		if w.lane == storage.Foreground {
			fgWait = append(fgWait, float64(w.wait)/1e6)
		} else {
			bgRun = append(bgRun, float64(w.run)/1e6)
		}
	}
	wmu.Unlock()
	m.WriterForegroundWaitP99ms, m.WriterForegroundWaitMaxms = pct(fgWait, 0.99), pct(fgWait, 1)
	m.WriterBackgroundRunP99ms = pct(bgRun, 0.99)
	logs.mu.Lock()
	m.WorkerLog = workerLog{Warnings: logs.warn, Errors: logs.errs, First: logs.first}
	logs.mu.Unlock()
	pg.printf("%s: hub of %d edges in %.2fs; %d small requests during it: p50 %.2f ms, p99 %.2f ms, max %.2f ms; their groups waited for the writer p99 %.2f ms, max %.2f ms; chunks ran p99 %.2f ms",
		name, o.hubEdges, m.HubSeconds, len(lat), m.P50ms, m.P99ms, m.MaxMs,
		m.WriterForegroundWaitP99ms, m.WriterForegroundWaitMaxms, m.WriterBackgroundRunP99ms)
	return m, nil
}
