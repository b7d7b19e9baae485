package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"runtime/pprof"
	"strconv"
	"strings"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/google/uuid"
	"github.com/telha/telha-cascade/app"
	"github.com/telha/telha-cascade/cascade"
	"github.com/telha/telha-cascade/storage"
)

// childResult is what a hub or raw child prints (one JSON object).
type childResult struct {
	Edges         int     `json:"edges"`
	BuildSeconds  float64 `json:"build_seconds,omitempty"`
	SettleSeconds float64 `json:"settle_seconds,omitempty"`
	Seconds       float64 `json:"seconds"`
	RSSBeforeMB   float64 `json:"rss_before_mb"`
	PeakRSSMB     float64 `json:"peak_rss_mb"`
	GrowthMB      float64 `json:"peak_rss_growth_mb"`
	Commits       int64   `json:"commits"`
	Puts          int64   `json:"puts"`
	BatchBytes    int64   `json:"batch_bytes"`
	Journaled     bool    `json:"journaled,omitempty"`
	// The erase child: the versions its erase_node rewrote, and the props
	// bytes the puts among them held (the payload erased).
	VersionsErased uint64  `json:"versions_erased,omitempty"`
	ErasedMB       float64 `json:"erased_mb,omitempty"`
	CascadeSeconds float64 `json:"cascade_seconds,omitempty"`
	hub            uuid.UUID
	Tombstoned     uint64      `json:"edges_tombstoned,omitempty"`
	HeapAllocMB    float64     `json:"go_total_alloc_mb"`
	GCCycles       uint32      `json:"gc_cycles"`
	CPU            cpuUse      `json:"cpu"`
	OthersBefore   float64     `json:"other_cores_before,omitempty"`
	Pebble         pebbleStats `json:"pebble"`
	// Sampled every 20 ms during the measured phase: the Go heap's objects
	// (live or not yet collected) and Pebble's memtables and flushable
	// batches (allocated outside the Go heap).
	PeakGoHeapMB    float64 `json:"peak_go_heap_mb"`
	PeakMemtablesMB float64 `json:"peak_pebble_memtables_mb"`
	// PeakBlockCacheMB is the block cache's size (allocated outside the Go
	// heap, like the memtables), sampled with them.
	PeakBlockCacheMB float64 `json:"peak_pebble_block_cache_mb"`
}

// procStatus reads VmRSS and VmHWM (bytes) from /proc/self/status.
func procStatus() (rss, hwm int64, err error) {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0, 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		fs := strings.Fields(v)
		if len(fs) < 1 {
			continue
		}
		n, _ := strconv.ParseInt(fs[0], 10, 64)
		switch k {
		case "VmRSS":
			rss = n * 1024
		case "VmHWM":
			hwm = n * 1024
		}
	}
	return rss, hwm, sc.Err()
}

// resetPeak resets VmHWM to the current RSS.
func resetPeak() error { return os.WriteFile("/proc/self/clear_refs", []byte("5"), 0) }

const mb = 1 << 20

func mbOf(b int64) float64 { return round3(float64(b) / mb) }

// settle flushes the memtable and waits for compactions to finish, so the
// measured phase does not pay for the build's compaction debt.
func settle(db *pebble.DB) error {
	if err := db.Flush(); err != nil {
		return err
	}
	waitCompactions(db, 2*time.Minute)
	return nil
}

// waitCompactions waits (up to limit) until no flush or compaction has
// been running for three samples in a row, 100 ms apart.
func waitCompactions(db pebbleMetrics, limit time.Duration) {
	deadline := time.Now().Add(limit)
	quiet := 0
	for time.Now().Before(deadline) && quiet < 3 {
		m := db.Metrics()
		if m.Compact.NumInProgress == 0 && m.Flush.NumInProgress == 0 {
			quiet++
		} else {
			quiet = 0
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// peakSampler records, every 20 ms, the Go heap (live and dead objects not
// yet swept, runtime/metrics) and Pebble's memtables (and flushable
// batches, which live outside the Go heap), to tell where the RSS peak is.
type peakSampler struct {
	stop   chan struct{}
	done   chan struct{}
	heap   uint64
	memtab uint64
	cache  int64
}

// startPeakSampler starts sampling; with heapFile set it also writes the
// heap profile (in-use as of the last GC) each time the heap grows 10% past
// the last written one, so the file shows the composition near the peak.
func startPeakSampler(db pebbleMetrics, heapFile string) *peakSampler {
	p := &peakSampler{stop: make(chan struct{}), done: make(chan struct{})}
	sample := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	go func() {
		defer close(p.done)
		t := time.NewTicker(20 * time.Millisecond)
		defer t.Stop()
		for i := 0; ; i++ {
			metrics.Read(sample)
			if sample[0].Value.Kind() == metrics.KindUint64 {
				h := sample[0].Value.Uint64()
				if heapFile != "" && h > p.heap+p.heap/10 {
					if f, err := os.Create(heapFile); err == nil {
						_ = pprof.Lookup("heap").WriteTo(f, 0)
						f.Close()
					}
				}
				p.heap = max(p.heap, h)
			}
			if db != nil && i%5 == 0 {
				m := db.Metrics()
				p.memtab = max(p.memtab, m.MemTable.Size+m.MemTable.ZombieSize)
				p.cache = max(p.cache, m.BlockCache.Size)
			}
			select {
			case <-p.stop:
				return
			case <-t.C:
			}
		}
	}()
	return p
}

func (p *peakSampler) finish() (heapMB, memtableMB, cacheMB float64) {
	close(p.stop)
	<-p.done
	return mbOf(int64(p.heap)), mbOf(int64(p.memtab)), mbOf(p.cache)
}

type pebbleMetrics interface{ Metrics() *pebble.Metrics }

// measure runs fn between a GC and peak reset and the VmHWM read.
func measure(res *childResult, prof *profiler, db pebbleMetrics, fn func() error) error {
	runtime.GC()
	debug.FreeOSMemory()
	if err := resetPeak(); err != nil {
		return fmt.Errorf("reset peak RSS: %w", err)
	}
	before, _, err := procStatus()
	if err != nil {
		return err
	}
	var ms0, ms1 runtime.MemStats
	runtime.ReadMemStats(&ms0)
	if err := prof.start(); err != nil {
		return err
	}
	cpu0 := sampleCPU()
	heapFile := ""
	if prof.dir != "" {
		heapFile = filepath.Join(prof.dir, prof.name+".heap-peak.pprof")
	}
	ps := startPeakSampler(db, heapFile)
	t0 := time.Now()
	err = fn()
	res.Seconds = round3(time.Since(t0).Seconds())
	res.PeakGoHeapMB, res.PeakMemtablesMB, res.PeakBlockCacheMB = ps.finish()
	res.CPU = cpuSince(cpu0, runtime.NumCPU())
	if perr := prof.stop(); perr != nil && err == nil {
		err = perr
	}
	_, hwm, serr := procStatus()
	if serr != nil && err == nil {
		err = serr
	}
	runtime.ReadMemStats(&ms1)
	res.RSSBeforeMB, res.PeakRSSMB, res.GrowthMB = mbOf(before), mbOf(hwm), mbOf(hwm-before)
	res.HeapAllocMB = mbOf(int64(ms1.TotalAlloc - ms0.TotalAlloc))
	res.GCCycles = ms1.NumGC - ms0.NumGC
	return err
}

// runChild is the --hub-child process: "hub" or "raw" in o.dir.
func runChild(ctx context.Context, o *options, stdout io.Writer) error {
	var res *childResult
	var err error
	switch o.hubChild {
	case "hub":
		res, err = hubChild(ctx, o)
	case "raw":
		res, err = rawChild(o)
	case "erase":
		res, err = eraseChild(ctx, o)
	default:
		return fmt.Errorf("unknown child %q", o.hubChild)
	}
	if err != nil {
		return err
	}
	return json.NewEncoder(stdout).Encode(res)
}

var hubProv = storage.Provenance{Actor: benchActor, Reason: "super-node delete", Source: benchSource, DecidedAt: storage.NoTs}

func hubChild(ctx context.Context, o *options) (*childResult, error) {
	res, _, _, err := hubChildWith(ctx, o, nil)
	return res, err
}

// eraseProps is a person's record, about 90 bytes: what an erase removes.
var eraseProps = []byte(`{"name":"Ada Lovelace","email":"ada@example.org","phone":"+44 20 7946 0958","city":"London"}`)

// eraseChild builds the hub with a payload on every version, deletes it
// (the hub child's journaled cascade, not measured here) and measures the
// erase_node that follows: rewriting every version of the hub and its
// edges (N+1 puts and N+1 tombstones: 2N+2 versions) and scrubbing the
// disk (flush, compaction of the tenant's version keyspaces, obsolete
// files deleted). Pebble's counters over the erase give the write
// amplification: bytes written (WAL, flushes, compactions) per byte
// erased.
func eraseChild(ctx context.Context, o *options) (*childResult, error) {
	res, st, pe, err := hubChildWith(ctx, o, eraseProps)
	if err != nil {
		return res, err
	}
	defer st.Close()
	res.CascadeSeconds, res.Seconds = res.Seconds, 0
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	ops := cascade.New(st, cascade.Options{Logger: quiet})
	sc := storage.MustScope("hub")
	var erased int64
	pm0 := pe.Metrics()
	err = measure(res, &profiler{dir: o.profileDir, name: "erase"}, pe, func() error {
		out, _, err := ops.Apply(ctx, []cascade.Request{{Scope: sc, Op: storage.OpEraseNode, ID: res.hub, RequestID: "erase-hub",
			ValidEnd: storage.NoTs, Prov: storage.Provenance{Actor: "dpo", Reason: "GDPR art. 17", DecidedAt: storage.NoTs}}})
		if err != nil {
			return err
		}
		if out[0].Kind != cascade.Erasing {
			return fmt.Errorf("erase_node: outcome %+v", out[0])
		}
		rc, err := ops.ApplyErase(ctx, out[0].Erase, cascade.EraseObserver{})
		res.VersionsErased = rc.VersionsErased
		return err
	})
	res.Pebble = pebbleDelta(pm0, pe.Metrics())
	if err != nil {
		return res, err
	}
	erased = int64(o.hubEdges+1) * int64(len(eraseProps)) // the puts' props (tombstones hold "{}")
	res.ErasedMB = mbOf(erased)
	if want := uint64(2*o.hubEdges + 2); res.VersionsErased != want {
		return res, fmt.Errorf("erase rewrote %d versions, want %d", res.VersionsErased, want)
	}
	return res, nil
}

// hubChildWith is the hub child; with props it leaves the store open and
// returns it (the erase child goes on).
func hubChildWith(ctx context.Context, o *options, props []byte) (*childResult, *storage.Store, *storage.PebbleEngine, error) {
	res := &childResult{Edges: o.hubEdges}
	// Build: the hub and N out-edges to N fresh neighbours, written straight
	// into the store (see graphWriter), then flushed and compacted.
	t0 := time.Now()
	hub := uuid.New()
	g, err := newGraphWriter(o.dir)
	if err != nil {
		return nil, nil, nil, err
	}
	g.props = props
	res.hub = hub
	err = g.node("hub", hub)
	for i := 0; i < o.hubEdges && err == nil; i++ {
		m := uuid.New()
		err = errors.Join(g.node("hub", m), g.edge("hub", uuid.New(), hub, m))
	}
	if cerr := g.close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, nil, nil, err
	}
	res.BuildSeconds = round3(time.Since(t0).Seconds())

	counter := &commitCounter{}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	t1 := time.Now()
	st, err := storage.OpenStore(o.dir, storage.Options{Logger: quiet,
		WrapEngine: func(e storage.Engine) storage.Engine { return countingEngine{Engine: e, c: counter} }})
	if err != nil {
		return nil, nil, nil, err
	}
	keep := false
	defer func() {
		if !keep {
			st.Close()
		}
	}()
	ops := cascade.New(st, cascade.Options{Logger: quiet}) // default max_batch_ops
	sc := storage.MustScope("hub")
	pe, ok := st.Engine().(countingEngine).Engine.(*storage.PebbleEngine)
	if !ok {
		return nil, nil, nil, errors.New("unexpected engine type")
	}
	if err := settle(pe.DB); err != nil { // the reopen replayed nothing, but be sure
		return nil, nil, nil, err
	}
	res.SettleSeconds = round3(time.Since(t1).Seconds())
	res.OthersBefore = waitIdle(o.waitIdle, runtime.NumCPU(), progress{os.Stderr})

	counter.reset()
	prof := &profiler{dir: o.profileDir, name: "hub"}
	var rc cascade.CascadeReceipt
	pm0, sm0 := pe.Metrics(), markStalls(st)
	err = measure(res, prof, pe, func() error {
		// The worker's runtime while a journal is applied (its reaper
		// says so; here the journal is applied in this goroutine).
		app.Applying(true)
		defer app.Applying(false)
		var err error
		rc, err = ops.TombstoneNode(ctx, sc, hub, storage.NoTs, hubProv)
		return err
	})
	res.Pebble = pebbleDelta(pm0, pe.Metrics()).withStalls(st, sm0)
	if err != nil {
		return nil, nil, nil, err
	}
	res.Journaled, res.Tombstoned = rc.Journaled, rc.EdgesTombstoned
	res.Commits, res.Puts, res.BatchBytes = counter.commits.Load(), counter.puts.Load(), counter.bytes.Load()
	if rc.EdgesTombstoned != uint64(o.hubEdges) || !rc.Journaled {
		return res, nil, nil, fmt.Errorf("cascade tombstoned %d edges (journaled %v), want %d journaled", rc.EdgesTombstoned, rc.Journaled, o.hubEdges)
	}
	if props == nil {
		return res, nil, nil, nil
	}
	keep = true
	return res, st, pe, nil
}

// rawChild writes the hub cascade's versions (N edge tombstones from one
// src, then the node tombstone: 5N+3 puts) into a fresh store in synced
// batches of at most 100k puts, whole versions only, as the journaled
// cascade chunks them.
func rawChild(o *options) (*childResult, error) {
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	st, err := storage.OpenStore(o.dir, storage.Options{Logger: quiet})
	if err != nil {
		return nil, err
	}
	defer st.Close()
	pe := st.Engine()
	sc := storage.MustScope("hub")
	res := &childResult{Edges: o.hubEdges}
	res.OthersBefore = waitIdle(o.waitIdle, runtime.NumCPU(), progress{os.Stderr})
	counter := &commitCounter{}
	rng := rand.New(rand.NewPCG(3, 4))
	hub := randUUID(rng)
	tx := storage.TsFromTime(time.Now())
	prov := hubProv
	prof := &profiler{dir: o.profileDir, name: "raw"}
	pm0, sm0 := pe.Metrics(), markStalls(st)
	defer func() { res.Pebble = pebbleDelta(pm0, pe.Metrics()).withStalls(st, sm0) }()
	err = measure(res, prof, pe, func() error {
		b := pe.NewBatch()
		ops := 0
		flush := func() error {
			counter.add(b)
			err := pe.Commit(b) // pebble.Sync
			b.Close()
			b = pe.NewBatch()
			ops = 0
			return err
		}
		for range o.hubEdges {
			if ops+storage.OpsPerEdgeVersion > cascade.DefaultMaxBatchOps {
				if err := flush(); err != nil {
					return err
				}
			}
			v := storage.Version{Kind: storage.KindEdge, ID: randUUID(rng), Src: hub, Dst: randUUID(rng), Label: benchLabel,
				Valid: storage.Open(tx), Tx: storage.Open(tx), Tombstone: true, Props: []byte("{}"), Prov: prov}
			storage.AppendVersion(b, sc, &v)
			ops += storage.OpsPerEdgeVersion
		}
		if ops+storage.OpsPerNodeVersion > cascade.DefaultMaxBatchOps {
			if err := flush(); err != nil {
				return err
			}
		}
		v := storage.Version{Kind: storage.KindNode, ID: hub, Valid: storage.Open(tx), Tx: storage.Open(tx), Tombstone: true, Props: []byte("{}"), Prov: prov}
		storage.AppendVersion(b, sc, &v)
		err := flush()
		b.Close()
		return err
	})
	res.Commits, res.Puts, res.BatchBytes = counter.commits.Load(), counter.puts.Load(), counter.bytes.Load()
	return res, err
}

// startChild re-executes this binary as a hub or raw child in dir.
func startChild(ctx context.Context, o *options, kind, dir string, edges int) (*childResult, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	args := []string{"--hub-child", kind, "--hub-edges", strconv.Itoa(edges), "--dir", dir}
	if o.profileDir != "" {
		args = append(args, "--profile-dir", o.profileDir)
	}
	if o.waitIdle > 0 {
		args = append(args, "--wait-idle", o.waitIdle.String())
	}
	cmd := exec.CommandContext(ctx, exe, args...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, io.MultiWriter(&errb, os.Stderr)
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("%s child: %v: %s", kind, err, strings.TrimSpace(errb.String()))
	}
	var res childResult
	if err := json.Unmarshal(out.Bytes(), &res); err != nil {
		return nil, fmt.Errorf("%s child output %q: %v", kind, out.String(), err)
	}
	return &res, nil
}

func runHub(ctx context.Context, o *options, pg progress, root string, rep *Report) error {
	pg.printf("hub: building a %d-edge hub in a child process ...", o.hubEdges)
	hubDir := filepath.Join(root, "hub")
	h, err := startChild(ctx, o, "hub", hubDir, o.hubEdges)
	_ = os.RemoveAll(hubDir)
	if err != nil {
		return err
	}
	pg.printf("hub: built in %.1fs (settled %.1fs); cascade of %d edges %.2fs, peak RSS growth %.0f MB, %d commits",
		h.BuildSeconds, h.SettleSeconds, h.Tombstoned, h.Seconds, h.GrowthMB, h.Commits)
	rawDir := filepath.Join(root, "raw")
	r, err := startChild(ctx, o, "raw", rawDir, o.hubEdges)
	_ = os.RemoveAll(rawDir)
	if err != nil {
		return err
	}
	pg.printf("hub: raw Pebble %d puts in %.2fs (%d synced batches)", r.Puts, r.Seconds, r.Commits)
	rep.Hub = &HubReport{
		Edges: o.hubEdges, Seconds: h.Seconds, PeakRSSGrowthMB: h.GrowthMB, RawPebbleSeconds: r.Seconds,
		Cascade: h, Raw: r,
	}
	return nil
}

// ScalingRow is one hub size of the scaling phase.
type ScalingRow struct {
	Edges            int     `json:"edges"`
	Seconds          float64 `json:"seconds"`
	RawPebbleSeconds float64 `json:"raw_pebble_seconds"`
	VsRaw            float64 `json:"vs_raw"`
	PeakRSSGrowthMB  float64 `json:"peak_rss_growth_mb"`
	PeakGoHeapMB     float64 `json:"peak_go_heap_mb"`
	GoAllocMB        float64 `json:"go_total_alloc_mb"`
	Commits          int64   `json:"commits"`
	// Pebble's memory outside the Go heap, sampled every 100 ms: what of
	// the RSS growth is bounded by --pebble-memtable-mb and
	// --pebble-cache-mb.
	PeakMemtablesMB  float64 `json:"peak_pebble_memtables_mb"`
	PeakBlockCacheMB float64 `json:"peak_pebble_block_cache_mb"`
}

// runScaling runs the hub and raw children once for each size.
func runScaling(ctx context.Context, o *options, pg progress, root string, rep *Report) error {
	for _, n := range o.scalingEdges {
		pg.printf("scaling: a %d-edge hub ...", n)
		dir := filepath.Join(root, fmt.Sprintf("scale-%d", n))
		h, err := startChild(ctx, o, "hub", dir, n)
		_ = os.RemoveAll(dir)
		if err != nil {
			return err
		}
		r, err := startChild(ctx, o, "raw", dir, n)
		_ = os.RemoveAll(dir)
		if err != nil {
			return err
		}
		row := ScalingRow{Edges: n, Seconds: h.Seconds, RawPebbleSeconds: r.Seconds, PeakRSSGrowthMB: h.GrowthMB,
			PeakGoHeapMB: h.PeakGoHeapMB, GoAllocMB: h.HeapAllocMB, Commits: h.Commits,
			PeakMemtablesMB: h.PeakMemtablesMB, PeakBlockCacheMB: h.PeakBlockCacheMB}
		if r.Seconds > 0 {
			row.VsRaw = round3(h.Seconds / r.Seconds)
		}
		rep.Scaling = append(rep.Scaling, row)
		pg.printf("scaling: %d edges: %.2fs (raw Pebble %.2fs, %.2fx), peak RSS growth %.0f MB, peak Go heap %.0f MB, peak memtables %.0f MB, peak block cache %.0f MB",
			n, row.Seconds, row.RawPebbleSeconds, row.VsRaw, row.PeakRSSGrowthMB, row.PeakGoHeapMB, row.PeakMemtablesMB, row.PeakBlockCacheMB)
	}
	return nil
}

// EraseReport is the erase phase: erase_node of a deleted hub.
type EraseReport struct {
	Edges          int     `json:"edges"`
	VersionsErased uint64  `json:"versions_erased"`
	Seconds        float64 `json:"seconds"`
	CascadeSeconds float64 `json:"cascade_seconds"`
	ErasedMB       float64 `json:"erased_payload_mb"`
	StoreMB        float64 `json:"store_mb_before"`
	WrittenMB      float64 `json:"written_mb"` // WAL + flushed + compacted
	// WriteAmp is WrittenMB / ErasedMB: bytes written per byte of payload
	// erased. The compaction rewrites the tenant's whole version keyspaces,
	// so it grows with the tenant, not with the erase.
	WriteAmp float64      `json:"write_amplification"`
	Child    *childResult `json:"child"`
}

func runErase(ctx context.Context, o *options, pg progress, root string, rep *Report) error {
	pg.printf("erase: building and deleting a %d-edge hub with a payload on every version, then erasing it ...", o.hubEdges)
	dir := filepath.Join(root, "erase")
	c, err := startChild(ctx, o, "erase", dir, o.hubEdges)
	_ = os.RemoveAll(dir)
	if err != nil {
		return err
	}
	written := c.Pebble.WALWrittenMB + c.Pebble.FlushedMB + c.Pebble.CompactedMB
	r := &EraseReport{Edges: o.hubEdges, VersionsErased: c.VersionsErased, Seconds: c.Seconds, CascadeSeconds: c.CascadeSeconds,
		ErasedMB: c.ErasedMB, StoreMB: c.Pebble.StoreMBBefore, WrittenMB: round3(written), Child: c}
	if c.ErasedMB > 0 {
		r.WriteAmp = round3(written / c.ErasedMB)
	}
	pg.printf("erase: %d versions erased in %.2fs (the cascade before it: %.2fs); %.1f MB of payload erased, %.1f MB written (WAL %.1f, flushed %.1f, compacted %.1f) on a %.0f MB store: write amplification %.1f",
		r.VersionsErased, r.Seconds, r.CascadeSeconds, r.ErasedMB, written, c.Pebble.WALWrittenMB, c.Pebble.FlushedMB, c.Pebble.CompactedMB, r.StoreMB, r.WriteAmp)
	rep.Erase = r
	return nil
}
