package main

import (
	"fmt"
	"io"
	"math"
	"os"
	"runtime"
	"strings"
	"text/tabwriter"
	"time"
)

// Report is the JSON object --json prints.
type Report struct {
	Quick bool         `json:"quick"`
	Small *SmallReport `json:"small,omitempty"`
	// SmallChangelog is the small phase again with --changelog jetstream
	// (R1 on the bench's NATS server): issue 21's cost, side by side.
	SmallChangelog *SmallReport `json:"small_changelog,omitempty"`
	// SmallChangelogR3 is the small phase with the changelog on an R3
	// stream of a 3-server cluster in this process (small_changelog_r3).
	SmallChangelogR3        *SmallReport `json:"small_changelog_r3,omitempty"`
	SmallChangelogR3VsSmall *float64     `json:"small_changelog_r3_vs_small,omitempty"`
	// SmallR3 is the small phase on that same cluster with the changelog
	// off (local-only commits), run first: what R3 streams cost the queue
	// path alone; SmallChangelogR3VsSmallR3 is the changelog's own cost.
	SmallR3                   *SmallReport `json:"small_r3,omitempty"`
	SmallChangelogR3VsSmallR3 *float64     `json:"small_changelog_r3_vs_small_r3,omitempty"`
	// SmallChangelogVsSmall is its throughput over the small phase's, and
	// the light-load p99 ratio (issue 21 aims at >= 0.7 throughput).
	SmallChangelogVsSmall       *float64 `json:"small_changelog_vs_small,omitempty"`
	SmallChangelogLightP99Ratio *float64 `json:"small_changelog_light_p99_ratio,omitempty"`
	// ChangelogBytesPerRequest is the changelog stream's bytes over the
	// small_changelog phase's requests (warm-up, saturation, light).
	ChangelogBytesPerRequest *float64 `json:"changelog_bytes_per_request,omitempty"`
	// ChangelogSyncAlways: small_changelog ran against a server that fsyncs
	// every write (--changelog-sync-always).
	ChangelogSyncAlways bool         `json:"changelog_sync_always,omitempty"`
	Pipeline            *RateReport  `json:"pipeline,omitempty"`
	Naive               *RateReport  `json:"naive,omitempty"`
	Hub                 *HubReport   `json:"hub,omitempty"`
	Mixed               *MixedReport `json:"mixed,omitempty"`
	// MixedChangelog is the mixed phase with --changelog jetstream (R1 on a
	// NATS server of its own): issue 22 item 5, the changelog's cost beside
	// a super-node. MixedChangelogHubVsMixed is its cascade's time over the
	// mixed phase's, MixedChangelogP99Ratio its small requests' p99 over
	// the mixed phase's.
	MixedChangelog           *MixedReport `json:"mixed_changelog,omitempty"`
	MixedChangelogHubVsMixed *float64     `json:"mixed_changelog_hub_vs_mixed,omitempty"`
	MixedChangelogP99Ratio   *float64     `json:"mixed_changelog_p99_ratio,omitempty"`
	Scaling                  []ScalingRow `json:"scaling,omitempty"`
	Erase                    *EraseReport `json:"erase,omitempty"`
	// EraseChangelog and EraseChangelogR3 are the erase_changelog phases
	// (issue 29): erases beside another tenant's puts, changelog on.
	EraseChangelog   *ErasurePhase `json:"erase_changelog,omitempty"`
	EraseChangelogR3 *ErasurePhase `json:"erase_changelog_r3,omitempty"`
	SmallVsPipeline  *float64      `json:"small_vs_pipeline,omitempty"`
	SmallVsNaive     *float64      `json:"small_vs_naive,omitempty"`
	HubVsRaw         *float64      `json:"hub_vs_raw,omitempty"`
	Targets          []Target      `json:"targets"`
	Config           benchConfig   `json:"config"`
	Machine          machine       `json:"machine"`
	Revision         string        `json:"revision"`
	Modified         bool          `json:"revision_modified"`
	Date             string        `json:"date"`
	TotalSeconds     float64       `json:"total_seconds"`

	// SmallFeedOff is the small phase with --change-feed=false (the
	// small phase runs with the feed on, the default): issue 31's cost,
	// side by side; SmallVsSmallFeedOff its throughput ratio.
	SmallFeedOff        *SmallReport `json:"small_feed_off,omitempty"`
	SmallVsSmallFeedOff *float64     `json:"small_vs_small_feed_off,omitempty"`

	// ReadMember is the read_member phase (issue 30 item 8).
	ReadMember *ReadMemberReport `json:"read_member,omitempty"`
}

// RateReport is a throughput run.
type RateReport struct {
	PerSec   float64        `json:"per_sec"`
	P50ms    float64        `json:"p50_ms"`
	P90ms    float64        `json:"p90_ms"`
	P99ms    float64        `json:"p99_ms"`
	MaxMs    float64        `json:"max_ms"`
	Requests int            `json:"requests"`
	Seconds  float64        `json:"seconds"`
	Statuses map[string]int `json:"statuses"`
	Writes   writeStats     `json:"writes"`
	CPU      cpuUse         `json:"cpu"`
	Pebble   pebbleStats    `json:"pebble"`
}

func (r *RateReport) fromRun(st *runStats) {
	r.PerSec, r.P50ms, r.P90ms, r.P99ms, r.MaxMs = st.PerSec, st.P50ms, st.P90ms, st.P99ms, st.MaxMs
	r.Requests, r.Seconds, r.Statuses, r.CPU = st.Requests, st.Seconds, st.Statuses, st.CPU
}

// SmallReport is the worker's run: saturation figures, light-load latency.
type SmallReport struct {
	RateReport
	LightP50ms  float64        `json:"light_p50_ms"`
	LightP99ms  float64        `json:"light_p99_ms"`
	Light       *runStats      `json:"light"`
	LightWrites *writeStats    `json:"light_writes,omitempty"`
	LightPebble *pebbleStats   `json:"light_pebble,omitempty"`
	Consumer    *consumerState `json:"consumer_after,omitempty"`
	WorkerLog   workerLog      `json:"worker_log"`
}

type workerLog struct {
	Warnings int      `json:"warnings"`
	Errors   int      `json:"errors"`
	First    []string `json:"first,omitempty"`
}

// HubReport is the super-node cascade against raw Pebble.
type HubReport struct {
	Edges            int          `json:"edges"`
	Seconds          float64      `json:"seconds"`
	PeakRSSGrowthMB  float64      `json:"peak_rss_growth_mb"`
	RawPebbleSeconds float64      `json:"raw_pebble_seconds"`
	Cascade          *childResult `json:"cascade"`
	Raw              *childResult `json:"raw"`
}

// Target is one of the targets and whether this run met it.
type Target struct {
	Name  string  `json:"name"`
	Value float64 `json:"value"`
	Want  string  `json:"want"`
	Pass  bool    `json:"pass"`
	Note  string  `json:"note,omitempty"`
}

type benchConfig struct {
	Requests      int     `json:"requests"`
	NaiveRequests int     `json:"naive_requests"`
	Publishers    int     `json:"publishers"`
	Window        int     `json:"window_per_publisher"`
	Tenants       int     `json:"tenants"`
	LightRate     int     `json:"light_rate"`
	LightSeconds  float64 `json:"light_seconds"`
	HubEdges      int     `json:"hub_edges"`
	Mix           string  `json:"mix"`
	GroupMax      int     `json:"group_max"`
	MaxBatchOps   int     `json:"max_batch_ops"`
	ProfileDir    string  `json:"profile_dir,omitempty"`
}

type machine struct {
	CPUs      int `json:"cpus"`
	GOMAXPROC int `json:"gomaxprocs"`
	// GOMAXPROCSCascading is the worker's while a journaled cascade is
	// applied (app.SetProcs).
	GOMAXPROCSCascading int    `json:"gomaxprocs_cascading"`
	CPU                 string `json:"cpu"`
	MemMB               int64  `json:"mem_mb"`
	Kernel              string `json:"kernel"`
	Go                  string `json:"go"`
	OS                  string `json:"os"`
}

func newReport(o *options) *Report {
	rev, mod, gov := buildInfo()
	r := &Report{
		Quick: o.quick, Revision: rev, Modified: mod, Date: time.Now().UTC().Format(time.RFC3339),
		Config: benchConfig{
			Requests: o.requests, NaiveRequests: o.naiveRequests, Publishers: o.publishers, Window: o.window,
			Tenants: o.tenants, LightRate: o.lightRate, LightSeconds: o.lightDuration.Seconds(), HubEdges: o.hubEdges,
			Mix:      "50% tombstone_edge, 50% tombstone_node with 0..8 edges (4 on average)",
			GroupMax: 512, MaxBatchOps: 100_000, ProfileDir: o.profileDir,
		},
		Machine: machine{CPUs: runtime.NumCPU(), GOMAXPROC: procsBase, GOMAXPROCSCascading: procsCascading, CPU: cpuModel(), MemMB: memMB(), Kernel: kernel(), Go: gov, OS: runtime.GOOS + "/" + runtime.GOARCH},
	}
	if o.phases["small"] {
		r.Small = &SmallReport{}
	}
	if o.phases["small_changelog"] {
		r.SmallChangelog = &SmallReport{}
	}
	if o.phases["small_changelog_r3"] {
		r.SmallChangelogR3, r.SmallR3 = &SmallReport{}, &SmallReport{}
	}
	if o.phases["pipeline"] {
		r.Pipeline = &RateReport{}
	}
	if o.phases["small_feed_off"] {
		r.SmallFeedOff = &SmallReport{}
	}
	if o.phases["naive"] {
		r.Naive = &RateReport{}
	}
	return r
}

func (r *Report) finish(total time.Duration) {
	r.TotalSeconds = round3(total.Seconds())
	ratio := func(a, b float64) *float64 {
		if a <= 0 || b <= 0 {
			return nil
		}
		v := math.Round(a/b*1000) / 1000
		return &v
	}
	r.Targets = nil
	add := func(name string, v *float64, atMost bool, limit float64, note string) {
		if v == nil {
			return
		}
		t := Target{Name: name, Value: *v, Note: note}
		if atMost {
			t.Want, t.Pass = fmt.Sprintf("<= %g", limit), *v <= limit
		} else {
			t.Want, t.Pass = fmt.Sprintf(">= %g", limit), *v >= limit
		}
		r.Targets = append(r.Targets, t)
	}
	if r.Small != nil && r.Pipeline != nil {
		r.SmallVsPipeline = ratio(r.Small.PerSec, r.Pipeline.PerSec)
	}
	if r.Small != nil && r.Naive != nil {
		r.SmallVsNaive = ratio(r.Small.PerSec, r.Naive.PerSec)
	}
	if r.Small != nil && r.SmallChangelog != nil {
		r.SmallChangelogVsSmall = ratio(r.SmallChangelog.PerSec, r.Small.PerSec)
		r.SmallChangelogLightP99Ratio = ratio(r.SmallChangelog.LightP99ms, r.Small.LightP99ms)
		add("small_changelog_vs_small", r.SmallChangelogVsSmall, false, 0.7, "issue 21: the changelog (R1) against the local-only commit path")
	}
	if r.Small != nil && r.SmallChangelogR3 != nil {
		r.SmallChangelogR3VsSmall = ratio(r.SmallChangelogR3.PerSec, r.Small.PerSec)
		add("small_changelog_r3_vs_small", r.SmallChangelogR3VsSmall, false, 0.7, "issue 21: the changelog (R3, 3 servers here) against the local-only commit path")
	}
	if r.SmallR3 != nil && r.SmallChangelogR3 != nil {
		r.SmallChangelogR3VsSmallR3 = ratio(r.SmallChangelogR3.PerSec, r.SmallR3.PerSec)
		add("small_changelog_r3_vs_small_r3", r.SmallChangelogR3VsSmallR3, false, 0.7, "issue 21: the changelog's own cost on R3 (both on the same 3-server cluster)")
	}
	if r.Small != nil && r.SmallFeedOff != nil {
		r.SmallVsSmallFeedOff = ratio(r.Small.PerSec, r.SmallFeedOff.PerSec)
		add("small_vs_small_feed_off", r.SmallVsSmallFeedOff, false, 0.8, "issue 31: the change feed on (the default) against off")
		if r.SmallFeedOff.Light != nil && r.Small.Light != nil {
			add("small.light_p99_ms / small_feed_off.light_p99_ms", ratio(r.Small.LightP99ms, r.SmallFeedOff.LightP99ms), true, 1.25, "issue 31")
		}
	}
	if r.Hub != nil {
		r.HubVsRaw = ratio(r.Hub.Seconds, r.Hub.RawPebbleSeconds)
	}
	add("small_vs_pipeline", r.SmallVsPipeline, false, 0.7, "")
	add("small_vs_naive", r.SmallVsNaive, false, 7, "")
	if r.Small != nil && r.Small.Light != nil {
		v := r.Small.LightP99ms
		add("small.light_p99_ms", &v, true, 10, "")
	}
	add("hub_vs_raw", r.HubVsRaw, true, 1.5, "")
	for _, row := range r.Scaling {
		g, v := row.PeakRSSGrowthMB, row.VsRaw
		add(fmt.Sprintf("scaling %d edges: peak RSS growth MB", row.Edges), &g, true, 256, "")
		add(fmt.Sprintf("scaling %d edges: seconds / raw Pebble", row.Edges), &v, true, 1.5, "")
	}
	if r.Mixed != nil {
		v := r.Mixed.P99ms
		add("mixed.p99_ms", &v, true, 50, fmt.Sprintf("%d requests during a %d-edge cascade", r.Mixed.Requests, r.Mixed.HubEdges))
		if r.Hub != nil && r.Hub.Edges == r.Mixed.HubEdges {
			add("mixed.hub_seconds / hub.raw_pebble_seconds", ratio(r.Mixed.HubSeconds, r.Hub.RawPebbleSeconds), true, 1.5, "")
		}
	}
	if m := r.MixedChangelog; m != nil {
		v := m.P99ms
		add("mixed_changelog.p99_ms", &v, true, 50, fmt.Sprintf("issue 22 item 5: the mixed phase with the changelog (R1); %d requests during a %d-edge cascade", m.Requests, m.HubEdges))
		if r.Hub != nil && r.Hub.Edges == m.HubEdges {
			add("mixed_changelog.hub_seconds / hub.raw_pebble_seconds", ratio(m.HubSeconds, r.Hub.RawPebbleSeconds), true, 1.5, "issue 22 item 5")
		}
		if r.Mixed != nil {
			r.MixedChangelogHubVsMixed = ratio(m.HubSeconds, r.Mixed.HubSeconds)
			r.MixedChangelogP99Ratio = ratio(m.P99ms, r.Mixed.P99ms)
		}
	}
	if m := r.ReadMember; m != nil && m.Static != nil {
		add("read_member.any_vs_static", &m.AnyVsStatic, false, 0.9, fmt.Sprintf("issue 30: reads/s through member %s of %d against a static replica", m.AnyMember, m.Members))
		add("read_member.owner_vs_static", &m.OwnerVsStatic, false, 0.9, "issue 30: reads/s at each tenant's owner against a static replica")
		if m.Reader != nil {
			add("read_member.reader_vs_static", &m.ReaderVsStatic, false, 0.9, fmt.Sprintf("issue 30: reads/s through client.Reader given member %s, against a static replica", m.AnyMember))
		}
		c := float64(m.MaxConnsPerMember)
		add("read_member.nats_connections_per_member", &c, true, 2, fmt.Sprintf("issue 30: %d slots", m.Slots))
	}
	if r.Hub != nil {
		v := r.Hub.PeakRSSGrowthMB
		note := ""
		if r.Hub.Edges != 1_000_000 {
			note = fmt.Sprintf("target is for 1M edges; this run has %d", r.Hub.Edges)
		}
		add("hub.peak_rss_growth_mb", &v, true, 256, note)
	}
}

func printTable(w io.Writer, r *Report) {
	mode := "full"
	if r.Quick {
		mode = "quick"
	}
	mod := ""
	if r.Modified {
		mod = " (modified)"
	}
	fmt.Fprintf(w, "telha-cascade bench (%s) — revision %s%s, %s\n", mode, r.Revision, mod, r.Date)
	fmt.Fprintf(w, "%s, %d CPUs (GOMAXPROCS %d, %d while a journal is applied), %d MB, %s, %s\n\n", r.Machine.CPU, r.Machine.CPUs, r.Machine.GOMAXPROC, r.Machine.GOMAXPROCSCascading, r.Machine.MemMB, r.Machine.Go, r.Machine.Kernel)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "phase\treq/s\tp50 ms\tp99 ms\trequests\tmsgs/commit\tputs/msg\tbytes/put\tcommit ms\tin commit\tcpu cores (others)\tcompacted MB")
	row := func(name string, rr *RateReport) {
		if rr == nil || rr.Requests == 0 {
			return
		}
		fmt.Fprintf(tw, "%s\t%.0f\t%.2f\t%.2f\t%d\t%.1f\t%.2f\t%.1f\t%.2f\t%.0f%%\t%.2f (%.2f)\t%.0f\n", name, rr.PerSec, rr.P50ms, rr.P99ms, rr.Requests,
			rr.Writes.MsgsPerCommit, rr.Writes.PutsPerMsg, rr.Writes.BytesPerPut, rr.Writes.CommitMs, 100*rr.Writes.CommitBusy,
			rr.CPU.Process, rr.CPU.Others, rr.Pebble.CompactedMB)
	}
	if r.Small != nil {
		row("small (worker)", &r.Small.RateReport)
		if l := r.Small.Light; l != nil {
			lw, lp := writeStats{}, pebbleStats{}
			if r.Small.LightWrites != nil {
				lw = *r.Small.LightWrites
			}
			if r.Small.LightPebble != nil {
				lp = *r.Small.LightPebble
			}
			fmt.Fprintf(tw, "small light (%d/s)\t%.0f\t%.2f\t%.2f\t%d\t%.1f\t%.2f\t%.1f\t%.2f\t%.0f%%\t%.2f (%.2f)\t%.0f\n", r.Config.LightRate, l.PerSec, l.P50ms, l.P99ms, l.Requests,
				lw.MsgsPerCommit, lw.PutsPerMsg, lw.BytesPerPut, lw.CommitMs, 100*lw.CommitBusy, l.CPU.Process, l.CPU.Others, lp.CompactedMB)
		}
	}
	if r.SmallChangelog != nil {
		row("small, changelog R1", &r.SmallChangelog.RateReport)
		if l := r.SmallChangelog.Light; l != nil {
			fmt.Fprintf(tw, "small light, changelog (%d/s)\t%.0f\t%.2f\t%.2f\t%d\t\t\t\t\t\t%.2f (%.2f)\t\n", r.Config.LightRate, l.PerSec, l.P50ms, l.P99ms, l.Requests,
				l.CPU.Process, l.CPU.Others)
		}
	}
	if r.SmallR3 != nil {
		row("small, R3, no changelog", &r.SmallR3.RateReport)
	}
	if r.SmallChangelogR3 != nil {
		row("small, changelog R3", &r.SmallChangelogR3.RateReport)
		if l := r.SmallChangelogR3.Light; l != nil {
			fmt.Fprintf(tw, "small light, changelog R3 (%d/s)\t%.0f\t%.2f\t%.2f\t%d\t\t\t\t\t\t%.2f (%.2f)\t\n", r.Config.LightRate, l.PerSec, l.P50ms, l.P99ms, l.Requests,
				l.CPU.Process, l.CPU.Others)
		}
	}
	row("pipeline (raw limit)", r.Pipeline)
	row("naive (1 commit/msg)", r.Naive)
	mixedRow := func(name string, m *MixedReport) {
		if m == nil || m.Run == nil {
			return
		}
		fmt.Fprintf(tw, "%s (%d/s, during the hub)\t%.0f\t%.2f\t%.2f\t%d\t%.1f\t%.2f\t%.1f\t%.2f\t%.0f%%\t%.2f (%.2f)\t%.0f\n", name, r.Config.LightRate, m.Run.PerSec, m.P50ms, m.P99ms, m.Requests,
			m.Writes.MsgsPerCommit, m.Writes.PutsPerMsg, m.Writes.BytesPerPut, m.Writes.CommitMs, 100*m.Writes.CommitBusy, m.Run.CPU.Process, m.Run.CPU.Others, m.Pebble.CompactedMB)
	}
	mixedRow("mixed", r.Mixed)
	mixedRow("mixed, changelog R1", r.MixedChangelog)
	tw.Flush()
	mixedNote := func(name string, m *MixedReport) {
		if m == nil {
			return
		}
		fmt.Fprintf(w, "(%s: a %d-edge hub cascade in %.2fs on the same worker, chunks of %d puts; small requests max %.2f ms; their groups waited for the writer p99 %.2f ms, max %.2f ms)\n",
			name, m.HubEdges, m.HubSeconds, m.ChunkOps, m.MaxMs, m.WriterForegroundWaitP99ms, m.WriterForegroundWaitMaxms)
	}
	mixedNote("mixed", r.Mixed)
	mixedNote("mixed, changelog R1", r.MixedChangelog)
	if h := r.Hub; h != nil {
		fmt.Fprintln(w)
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "hub\tedges\tseconds\tpeak RSS growth MB\tputs\tsynced commits\tGo alloc MB\tcpu cores (others)\tcompacted MB")
		hrow := func(name string, c *childResult) {
			if c != nil {
				fmt.Fprintf(tw, "%s\t%d\t%.2f\t%.0f\t%d\t%d\t%.0f\t%.2f (%.2f)\t%.0f\n", name, h.Edges, c.Seconds, c.GrowthMB, c.Puts, c.Commits, c.HeapAllocMB,
					c.CPU.Process, c.CPU.Others, c.Pebble.CompactedMB)
			}
		}
		hrow("cascade (journaled)", h.Cascade)
		hrow("raw_pebble", h.Raw)
		tw.Flush()
		if c := h.Cascade; c != nil {
			fmt.Fprintf(w, "(hub build %.1fs, settle %.1fs, not measured)\n", c.BuildSeconds, c.SettleSeconds)
		}
	}
	if len(r.Scaling) > 0 {
		fmt.Fprintln(w)
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "scaling: hub edges\tseconds\traw Pebble seconds\tx raw\tpeak RSS growth MB\tpeak Go heap MB\tpeak memtables MB\tpeak block cache MB\tGo alloc MB\tsynced commits")
		for _, row := range r.Scaling {
			fmt.Fprintf(tw, "%d\t%.2f\t%.2f\t%.2f\t%.0f\t%.0f\t%.0f\t%.0f\t%.0f\t%d\n", row.Edges, row.Seconds, row.RawPebbleSeconds, row.VsRaw,
				row.PeakRSSGrowthMB, row.PeakGoHeapMB, row.PeakMemtablesMB, row.PeakBlockCacheMB, row.GoAllocMB, row.Commits)
		}
		tw.Flush()
	}
	printReadMember(w, r.ReadMember)
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "target\tvalue\twant\tresult")
	for _, t := range r.Targets {
		res := "PASS"
		if !t.Pass {
			res = "MISS"
		}
		if t.Note != "" {
			res += " (" + t.Note + ")"
		}
		fmt.Fprintf(tw, "%s\t%.3f\t%s\t%s\n", t.Name, t.Value, t.Want, res)
	}
	tw.Flush()
	if r.Small != nil {
		wl := r.Small.WorkerLog
		fmt.Fprintf(w, "\nworker log: %d warnings, %d errors", wl.Warnings, wl.Errors)
		if c := r.Small.Consumer; c != nil {
			fmt.Fprintf(w, "; consumer after the runs: %d pending, %d ack-pending, %d redelivered", c.Pending, c.AckPending, c.Redelivered)
		}
		fmt.Fprintln(w)
		for _, l := range wl.First {
			fmt.Fprintln(w, "  "+l)
		}
	}
	fmt.Fprintf(w, "total %.1fs\n", r.TotalSeconds)
}

func cpuModel() string {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return "unknown"
	}
	for _, l := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(l, ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return "unknown"
}

func memMB() int64 {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0
	}
	var kb int64
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "MemTotal:") {
			fmt.Sscanf(strings.TrimPrefix(l, "MemTotal:"), "%d", &kb)
		}
	}
	return kb / 1024
}

func kernel() string {
	b, err := os.ReadFile("/proc/sys/kernel/osrelease")
	if err != nil {
		return "unknown"
	}
	return "linux " + strings.TrimSpace(string(b))
}
