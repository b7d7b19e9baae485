package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/telha/telha-cascade/app"
	"github.com/telha/telha-cascade/queue/client"
	"github.com/telha/telha-cascade/slot"
)

// The erase_changelog and erase_changelog_r3 phases (issue 29 item 4):
// erases on a store of a given size with --changelog jetstream, beside
// another tenant's small puts, on a NATS server of their own (R1, fsync
// always like the embedded one) or a 3-server cluster in this process
// (R3). For each store size (--erasure-store-mb), a store of nodes with
// about 1 KB of random props each is built directly in Pebble, the worker
// starts on it (seeding the changelog with a checkpoint of the whole store),
// one erase warms it, and then:
//
//	every --erasure-interval, an erase_node of one of the big tenant's nodes
//	(--erasure-count of them), while the bystander tenant puts a node at
//	100/s on the same store, until every erase is answered
//
// Reported per size: each erase's answer time; what its scrub of the copies
// cost (the writer held, the bytes uploaded to the checkpoint bucket, the
// table objects deleted: slot.ChangelogStatus().LastScrub); the sustained
// erases per second; the bystander's p50, p99 and max. Then, between the
// largest and the smallest size, the ratios the issue asks to be flat: the
// writer held and the bytes sent to NATS per erase.

// ErasureReport is one store size of an erase_changelog phase.
type ErasureReport struct {
	StoreMB          float64   `json:"store_mb"`
	Nodes            int       `json:"nodes"`
	SeedSeconds      float64   `json:"seed_seconds"`
	Erases           int       `json:"erases"`
	EraseSeconds     []float64 `json:"erase_seconds"`
	EraseMaxSeconds  float64   `json:"erase_max_seconds"`
	ErasesPerSecond  float64   `json:"erases_per_second"`
	WriterHeldMaxMs  float64   `json:"writer_held_max_ms"`
	WriterHeldMeanMs float64   `json:"writer_held_mean_ms"`
	UploadedMBMean   float64   `json:"uploaded_mb_per_erase"`
	CollectedMBMean  float64   `json:"collected_mb_per_erase"`
	ScrubMeanSeconds float64   `json:"scrub_mean_seconds"`
	// TailWriteSetsMean: the write-sets the held step stored as a tail
	// checkpoint, per erase (0 for a scrub whose last save was whole).
	TailWriteSetsMean float64 `json:"tail_write_sets_per_erase"`
	Bystander         int     `json:"bystander_requests"`
	BystanderP50ms    float64 `json:"bystander_p50_ms"`
	BystanderP99ms    float64 `json:"bystander_p99_ms"`
	BystanderMaxms    float64 `json:"bystander_max_ms"`
	// The bystander's puts split by whether they were in flight while a
	// scrub of the copies ran: what the scrub costs the other tenants,
	// against what the machine costs them anyway.
	BystanderInScrub       int     `json:"bystander_in_scrub"`
	BystanderInScrubP99ms  float64 `json:"bystander_in_scrub_p99_ms"`
	BystanderInScrubMaxms  float64 `json:"bystander_in_scrub_max_ms"`
	BystanderOutScrubP99ms float64 `json:"bystander_out_scrub_p99_ms"`
	BystanderOutScrubMaxms float64 `json:"bystander_out_scrub_max_ms"`
	// BystanderSlowBySteps: the puts that took over 100 ms, by the step
	// of a scrub of the copies they were published in ("save": listing
	// and the first save with its upload; "held": the standbys' wait,
	// the held step and the purge; "collect": the older checkpoints'
	// deletes and the collection; "outside": no scrub), with the
	// slowest of each: where the other tenants' tail comes from.
	BystanderSlowBySteps map[string]SlowPuts `json:"bystander_slow_by_step"`
}

// SlowPuts counts the bystander's puts over 100 ms published in one step.
type SlowPuts struct {
	Count int     `json:"count"`
	MaxMs float64 `json:"max_ms"`
}

// slowPutMs is where a bystander's put counts as slow for
// ErasureReport.BystanderSlowBySteps.
const slowPutMs = 100

// ErasurePhase is one erase_changelog phase: a report per store size and
// the ratios of the largest to the smallest.
type ErasurePhase struct {
	Replicas        int              `json:"replicas"`
	Sizes           []*ErasureReport `json:"sizes"`
	WriterHeldRatio float64          `json:"writer_held_ratio,omitempty"`
	UploadedRatio   float64          `json:"uploaded_ratio,omitempty"`
}

func runEraseChangelog(ctx context.Context, o *options, pg progress, root string, r3 bool) (*ErasurePhase, error) {
	name := "erase_changelog"
	ph := &ErasurePhase{Replicas: 1}
	if r3 {
		name, ph.Replicas = "erase_changelog_r3", 3
	}
	for _, mb := range o.erasureStoreMB {
		dir := filepath.Join(root, fmt.Sprintf("%s-%dmb", name, mb))
		var ns *natsServer
		var err error
		if r3 {
			ns, err = startNATSCluster(filepath.Join(dir, "nats"), 3)
		} else {
			ns, err = startNATSWith(filepath.Join(dir, "nats"), true)
		}
		if err != nil {
			return ph, err
		}
		rep, err := runEraseSize(ctx, o, pg, ns, dir, name, mb, ph.Replicas)
		ns.stop()
		_ = os.RemoveAll(dir)
		if err != nil {
			return ph, fmt.Errorf("%d MB: %w", mb, err)
		}
		ph.Sizes = append(ph.Sizes, rep)
	}
	if n := len(ph.Sizes); n > 1 {
		lo, hi := ph.Sizes[0], ph.Sizes[n-1]
		if lo.WriterHeldMeanMs > 0 {
			ph.WriterHeldRatio = round3(hi.WriterHeldMeanMs / lo.WriterHeldMeanMs)
		}
		if lo.UploadedMBMean > 0 {
			ph.UploadedRatio = round3(hi.UploadedMBMean / lo.UploadedMBMean)
		}
		pg.printf("%s: from %.0f MB to %.0f MB: writer held x%.2f, bytes uploaded per erase x%.2f", name, lo.StoreMB, hi.StoreMB, ph.WriterHeldRatio, ph.UploadedRatio)
	}
	return ph, nil
}

// randomProps returns props of about n bytes that do not compress.
func randomProps(n int) []byte {
	b := make([]byte, n/2)
	_, _ = rand.Read(b)
	return []byte(`{"blob":"` + hex.EncodeToString(b) + `"}`)
}

func runEraseSize(ctx context.Context, o *options, pg progress, ns *natsServer, dir, name string, mb, replicas int) (*ErasureReport, error) {
	const propBytes = 1000
	t0 := time.Now()
	g, err := newGraphWriter(filepath.Join(dir, "pebble"))
	if err != nil {
		return nil, err
	}
	nodes := mb << 20 / (propBytes + 150)
	victims := make([]uuid.UUID, 0, o.erasureCount+1)
	for i := 0; i < nodes && err == nil; i++ {
		id := uuid.New()
		if len(victims) < cap(victims) {
			victims = append(victims, id)
		}
		g.props = randomProps(propBytes)
		err = g.node("big", id)
	}
	if cerr := g.close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, fmt.Errorf("building the store: %w", err)
	}
	size, _ := dirSize(filepath.Join(dir, "pebble"))
	rep := &ErasureReport{StoreMB: round3(float64(size) / (1 << 20)), Nodes: nodes}
	pg.printf("%s: a store of %d nodes (%.0f MB) built in %s", name, nodes, rep.StoreMB, time.Since(t0).Round(10*time.Millisecond))

	flags := []string{"--data-dir", dir, "--http-addr", "127.0.0.1:0", "--nats-url", ns.url, "--changelog", "jetstream",
		"--checkpoint-schedule", "@every 1h", "--reaper-schedule", "@every 1h", "--stream-replicas", fmt.Sprint(replicas)}
	cfg, err := app.ParseFlags(flags, os.Getenv, io.Discard)
	if err != nil {
		return nil, err
	}
	logs := &logCounter{}
	var (
		scrubMu sync.Mutex
		scrubs  []slot.ScrubStatus
		windows [][2]time.Time // each scrub's start and end
		steps   []scrubStep    // every step each scrub reached, in order
	)
	ready := make(chan *slot.Slot, 1)
	wctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	t1 := time.Now()
	go func() {
		done <- app.Run(wctx, cfg, logs.logger(o.workerLog), app.Options{OnReady: func(a *slot.Slot) { ready <- a },
			CopyScrubStep: func(step string) {
				scrubMu.Lock()
				steps = append(steps, scrubStep{step, time.Now()})
				scrubMu.Unlock()
			},
			CopyScrubbed: func(s slot.ScrubStatus) {
				scrubMu.Lock()
				scrubs = append(scrubs, s)
				now := time.Now()
				windows = append(windows, [2]time.Time{now.Add(-s.Took), now})
				scrubMu.Unlock()
			}})
	}()
	var a *slot.Slot
	select {
	case a = <-ready:
	case err := <-done:
		return nil, fmt.Errorf("worker exited before ready: %v", err)
	case <-time.After(15 * time.Minute):
		return nil, fmt.Errorf("worker not ready within 15m (seeding the changelog)")
	}
	defer func() {
		cancel()
		<-done
	}()
	rep.SeedSeconds = round3(time.Since(t1).Seconds())
	pg.printf("%s: worker ready in %.1fs (the seed checkpoint of the whole store)", name, rep.SeedSeconds)

	nc, err := nats.Connect(ns.url)
	if err != nil {
		return nil, err
	}
	defer nc.Close()
	cli, err := client.New(nc, client.Config{})
	if err != nil {
		return nil, err
	}
	var mu sync.Mutex
	answered := map[string]time.Time{}
	arrived := make(chan string, 4096)
	sub, err := nc.Subscribe("telha.res.>", func(m *nats.Msg) {
		var r struct {
			RequestID string `json:"request_id"`
			Status    string `json:"status"`
		}
		if json.Unmarshal(m.Data, &r) != nil {
			return
		}
		if r.Status != "ok" {
			pg.printf("%s: request %s answered %s: %s", name, r.RequestID, r.Status, strings.TrimSpace(string(m.Data)))
		}
		mu.Lock()
		if _, ok := answered[r.RequestID]; !ok {
			answered[r.RequestID] = time.Now()
		}
		mu.Unlock()
		select {
		case arrived <- r.RequestID:
		default:
		}
	})
	if err != nil {
		return nil, err
	}
	defer sub.Unsubscribe()
	if err := nc.Flush(); err != nil {
		return nil, err
	}
	wait := func(rid string, d time.Duration) (time.Time, error) {
		deadline := time.After(d)
		for {
			mu.Lock()
			at, ok := answered[rid]
			mu.Unlock()
			if ok {
				return at, nil
			}
			select {
			case <-arrived:
			case <-deadline:
				return time.Time{}, fmt.Errorf("no result for %s within %s", rid, d)
			case <-ctx.Done():
				return time.Time{}, ctx.Err()
			}
		}
	}
	erase := func(id uuid.UUID) (string, time.Time, error) {
		rid := "erase-" + uuid.NewString()
		body := fmt.Sprintf(`{"request_id":%q,"op":"erase_node","tenant":"big","id":%q,"provenance":{"actor":"bench","reason":"GDPR art. 17"}}`, rid, id)
		at := time.Now()
		_, err := cli.Publish(ctx, "big", rid, []byte(body))
		return rid, at, err
	}
	// The warm-up erase: the first scrub uploads nothing new but the
	// compaction's tables, and the seed checkpoint is the one it replaces.
	rid, _, err := erase(victims[0])
	if err != nil {
		return nil, err
	}
	if _, err := wait(rid, 5*time.Minute); err != nil {
		return nil, fmt.Errorf("warm-up erase: %w", err)
	}

	// The bystander: a put every 10 ms until the erases are answered.
	type sent struct {
		rid string
		at  time.Time
	}
	var bys []sent
	stopBys := make(chan struct{})
	bysDone := make(chan struct{})
	go func() {
		defer close(bysDone)
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stopBys:
				return
			case <-tick.C:
			}
			rid := "bys-" + uuid.NewString()
			body := fmt.Sprintf(`{"request_id":%q,"op":"put_node","tenant":"bystander","id":%q,"valid_from":"2026-01-01T00:00:00Z","props":{"n":1}}`, rid, uuid.New())
			at := time.Now()
			if _, err := cli.Publish(ctx, "bystander", rid, []byte(body)); err != nil {
				pg.printf("%s: bystander publish: %v", name, err)
				continue
			}
			bys = append(bys, sent{rid, at})
		}
	}()
	type erased struct {
		rid string
		at  time.Time
	}
	var es []erased
	start := time.Now()
	for i := 1; i < len(victims); i++ {
		rid, at, err := erase(victims[i])
		if err != nil {
			close(stopBys)
			return nil, err
		}
		es = append(es, erased{rid, at})
		if i < len(victims)-1 {
			select {
			case <-time.After(o.erasureInterval):
			case <-ctx.Done():
				close(stopBys)
				return nil, ctx.Err()
			}
		}
	}
	var last time.Time
	var held, uploaded, collected, scrub, tails []float64
	seenScrubs := a.ChangelogStatus().EraseScrubs
	for _, e := range es {
		got, err := wait(e.rid, 5*time.Minute)
		if err != nil {
			close(stopBys)
			return nil, err
		}
		rep.EraseSeconds = append(rep.EraseSeconds, round3(got.Sub(e.at).Seconds()))
		last = got
	}
	close(stopBys)
	<-bysDone
	st := a.ChangelogStatus()
	if st.EraseScrubs-seenScrubs < 1 {
		return nil, fmt.Errorf("the erases ran no scrub of the copies (%d)", st.EraseScrubs-seenScrubs)
	}
	scrubMu.Lock()
	for _, s := range scrubs[1:] { // not the warm-up's
		held = append(held, float64(s.WriterHeld)/1e6)
		uploaded = append(uploaded, float64(s.BytesUploaded)/(1<<20))
		collected = append(collected, float64(s.BytesCollected)/(1<<20))
		scrub = append(scrub, s.Took.Seconds())
		tails = append(tails, float64(s.TailWriteSets))
	}
	scrubMu.Unlock()
	if len(held) == 0 {
		return nil, fmt.Errorf("no scrub of the copies after the warm-up's")
	}
	rep.Erases = len(es)
	rep.EraseMaxSeconds = slices.Max(rep.EraseSeconds)
	rep.ErasesPerSecond = round3(float64(len(es)) / last.Sub(start).Seconds())
	rep.WriterHeldMaxMs, rep.WriterHeldMeanMs = round3(slices.Max(held)), round3(mean(held))
	rep.UploadedMBMean, rep.CollectedMBMean, rep.ScrubMeanSeconds = round3(mean(uploaded)), round3(mean(collected)), round3(mean(scrub))
	rep.TailWriteSetsMean = round3(mean(tails))
	var lat, in, out []float64
	scrubMu.Lock()
	ws := slices.Clone(windows)
	sts := slices.Clone(steps)
	scrubMu.Unlock()
	rep.BystanderSlowBySteps = map[string]SlowPuts{}
	for _, b := range bys {
		got, err := wait(b.rid, time.Minute)
		if err != nil {
			return nil, fmt.Errorf("bystander: %w", err)
		}
		ms := float64(got.Sub(b.at)) / 1e6
		lat = append(lat, ms)
		during := false
		for _, w := range ws {
			if b.at.Before(w[1]) && got.After(w[0]) {
				during = true
			}
		}
		if during {
			in = append(in, ms)
		} else {
			out = append(out, ms)
		}
		if ms > slowPutMs {
			st := stepAt(b.at, ws, sts)
			sp := rep.BystanderSlowBySteps[st]
			sp.Count++
			sp.MaxMs = max(sp.MaxMs, round3(ms))
			rep.BystanderSlowBySteps[st] = sp
		}
	}
	pct := func(xs []float64, p float64) float64 {
		if len(xs) == 0 {
			return 0
		}
		slices.Sort(xs)
		return round3(xs[max(0, int(math.Ceil(p*float64(len(xs))))-1)])
	}
	rep.Bystander, rep.BystanderP50ms, rep.BystanderP99ms, rep.BystanderMaxms = len(lat), pct(lat, 0.5), pct(lat, 0.99), pct(lat, 1)
	rep.BystanderInScrub, rep.BystanderInScrubP99ms, rep.BystanderInScrubMaxms = len(in), pct(in, 0.99), pct(in, 1)
	rep.BystanderOutScrubP99ms, rep.BystanderOutScrubMaxms = pct(out, 0.99), pct(out, 1)
	pg.printf("%s: %.0f MB: %d erases %s apart answered in %v s (max %.2f s, %.2f erases/s); scrub of the copies: writer held mean %.1f ms max %.1f ms (a tail of %.0f write-sets), %.2f MB uploaded and %.2f MB of tables deleted per erase, %.2f s each; bystander puts (%d): p50 %.1f ms, p99 %.1f ms, max %.1f ms; of them in flight during a scrub (%d): p99 %.1f ms, max %.1f ms; the others: p99 %.1f ms, max %.1f ms",
		name, rep.StoreMB, rep.Erases, o.erasureInterval, rep.EraseSeconds, rep.EraseMaxSeconds, rep.ErasesPerSecond,
		rep.WriterHeldMeanMs, rep.WriterHeldMaxMs, rep.TailWriteSetsMean, rep.UploadedMBMean, rep.CollectedMBMean, rep.ScrubMeanSeconds,
		rep.Bystander, rep.BystanderP50ms, rep.BystanderP99ms, rep.BystanderMaxms,
		rep.BystanderInScrub, rep.BystanderInScrubP99ms, rep.BystanderInScrubMaxms, rep.BystanderOutScrubP99ms, rep.BystanderOutScrubMaxms)
	pg.printf("%s: %.0f MB: bystander puts over %d ms by the scrub's step they were published in: %v", name, rep.StoreMB, slowPutMs, rep.BystanderSlowBySteps)
	logs.mu.Lock()
	if logs.warn+logs.errs > 0 {
		pg.printf("%s: the worker logged %d warnings and %d errors; the first: %s", name, logs.warn, logs.errs, strings.Join(logs.first, " | "))
	}
	logs.mu.Unlock()
	return rep, nil
}

func mean(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := 0.0
	for _, x := range xs {
		s += x
	}
	return s / float64(len(xs))
}

func dirSize(dir string) (int64, error) {
	var n int64
	err := filepath.Walk(dir, func(_ string, info os.FileInfo, err error) error {
		if err == nil && info.Mode().IsRegular() {
			n += info.Size()
		}
		return err
	})
	return n, err
}

// scrubStep is a step an erase's scrub of the copies reached, and when
// (app.Options.CopyScrubStep).
type scrubStep struct {
	name string
	at   time.Time
}

// stepAt names the step of a scrub of the copies that ran at t, by the
// scrubs' windows and the steps they reached (BystanderSlowBySteps).
func stepAt(t time.Time, windows [][2]time.Time, steps []scrubStep) string {
	for _, w := range windows {
		if t.Before(w[0]) || !t.Before(w[1]) {
			continue
		}
		step := "save"
		for _, s := range steps {
			if s.at.Before(w[0]) || s.at.After(w[1]) || s.at.After(t) {
				continue
			}
			switch s.name {
			case "checkpointed":
				step = "held"
			case "purged":
				step = "collect"
			}
		}
		return step
	}
	return "outside"
}
