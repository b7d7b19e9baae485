package metrics

import (
	"net/http"
	"runtime"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/telha/telha-cascade/cascade"
	"github.com/telha/telha-cascade/queue"
	"github.com/telha/telha-cascade/storage"
)

// Build identifies the binary (telha_build_info).
type Build struct {
	Version, Revision string
}

// Reaper run results (telha_reaper_runs_total{result}).
const (
	ReaperOK      = "ok"
	ReaperError   = "error"
	ReaperSkipped = "skipped"
)

// Metrics is the registry and every telha_* family.
type Metrics struct {
	Registry *prometheus.Registry

	Requests          *prometheus.CounterVec
	RequestDuration   *prometheus.HistogramVec
	Cascades          *prometheus.CounterVec
	EdgesTombstoned   prometheus.Counter
	ChunksApplied     prometheus.Counter
	ReaperRuns        *prometheus.CounterVec
	ReaperResumed     prometheus.Counter
	ReaperLastSuccess prometheus.Gauge
	DeadLetters       *prometheus.CounterVec
	CommitDuration    prometheus.Histogram
	CommitFailures    prometheus.Counter
	BuildInfo         *prometheus.GaugeVec
}

// New creates the registry with every family and label set initialised.
func New(b Build) *Metrics {
	r := prometheus.NewRegistry()
	m := &Metrics{
		Registry: r,
		Requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "telha_requests_total", Help: "Requests answered, by op and result status.",
		}, []string{"op", "status"}),
		RequestDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "telha_request_duration_seconds", Help: "From the worker receiving a request message to its ack (or term).",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
		}, []string{"op"}),
		Cascades: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "telha_cascades_total", Help: "Node cascades whose node tombstone landed, by path.",
		}, []string{"path"}),
		EdgesTombstoned: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "telha_cascade_edges_tombstoned_total", Help: "Edges tombstoned by node cascades.",
		}),
		ChunksApplied: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "telha_journal_chunks_applied_total", Help: "Durable chunks applied by journaled cascades.",
		}),
		ReaperRuns: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "telha_reaper_runs_total", Help: "Reaper passes, by result (skipped: the previous pass was still running).",
		}, []string{"result"}),
		ReaperResumed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "telha_reaper_journals_resumed_total", Help: "Orphaned journals the reaper resumed to completion.",
		}),
		ReaperLastSuccess: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "telha_reaper_last_success_timestamp_seconds", Help: "Unix time of the last reaper pass that finished without error.",
		}),
		DeadLetters: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "telha_dead_letters_total", Help: "Messages copied to the dead-letter stream, by reason.",
		}, []string{"reason"}),
		CommitDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "telha_storage_commit_duration_seconds", Help: "Durable (fsynced) Pebble batch commits.",
			Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1},
		}),
		CommitFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "telha_storage_commit_failures_total", Help: "Durable commits that failed (I/O errors, the disk-space reserve, injected faults).",
		}),
		BuildInfo: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "telha_build_info", Help: "Build of the running worker (value 1).",
		}, []string{"version", "revision", "goversion"}),
	}
	r.MustRegister(m.Requests, m.RequestDuration, m.Cascades, m.EdgesTombstoned, m.ChunksApplied,
		m.ReaperRuns, m.ReaperResumed, m.ReaperLastSuccess, m.DeadLetters, m.CommitDuration, m.CommitFailures, m.BuildInfo,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	ops := append(opNames(), "unknown")
	for _, op := range ops {
		m.RequestDuration.WithLabelValues(op)
		for _, st := range queue.Statuses() {
			m.Requests.WithLabelValues(op, st)
		}
	}
	for _, p := range []cascade.Path{cascade.PathInline, cascade.PathJournaled} {
		m.Cascades.WithLabelValues(string(p))
	}
	for _, res := range []string{ReaperOK, ReaperError, ReaperSkipped} {
		m.ReaperRuns.WithLabelValues(res)
	}
	for _, reason := range queue.DeadLetterReasons() {
		m.DeadLetters.WithLabelValues(reason)
	}
	if b.Version == "" {
		b.Version = "dev"
	}
	if b.Revision == "" {
		b.Revision = "unknown"
	}
	m.BuildInfo.WithLabelValues(b.Version, b.Revision, runtime.Version()).Set(1)
	return m
}

func opNames() []string {
	var out []string
	for _, o := range storage.Ops() {
		out = append(out, o.String())
	}
	return out
}

// Handler serves the registry.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.Registry, promhttp.HandlerOpts{Registry: m.Registry})
}

// OnCommit observes durable commits (storage.Options.OnCommit).
func (m *Metrics) OnCommit(d time.Duration, _ int, err error) {
	if err != nil {
		m.CommitFailures.Inc()
		return
	}
	m.CommitDuration.Observe(d.Seconds())
}

// CascadeHooks returns hooks that record cascades; next, when set, is
// called after (for the queue's outbox kick).
func (m *Metrics) CascadeHooks(next cascade.Hooks) cascade.Hooks {
	return cascade.Hooks{
		CascadeStarted: next.CascadeStarted,
		CascadeFinished: func(p cascade.Path, edges uint64, took time.Duration) {
			m.Cascades.WithLabelValues(string(p)).Inc()
			m.EdgesTombstoned.Add(float64(edges))
			if next.CascadeFinished != nil {
				next.CascadeFinished(p, edges, took)
			}
		},
		ChunkApplied: func(ops int) {
			m.ChunksApplied.Inc()
			if next.ChunkApplied != nil {
				next.ChunkApplied(ops)
			}
		},
		JournalResumed: next.JournalResumed,
		JournalDone:    next.JournalDone,
		JournalFailed:  next.JournalFailed,
	}
}

// QueueHooks returns hooks that record requests and dead letters.
func (m *Metrics) QueueHooks() queue.Hooks {
	return queue.Hooks{
		Result: func(op, status string) { m.Requests.WithLabelValues(op, status).Inc() },
		Acked: func(op string, took time.Duration) {
			m.RequestDuration.WithLabelValues(op).Observe(took.Seconds())
		},
		DeadLetter: func(reason string) { m.DeadLetters.WithLabelValues(reason).Inc() },
	}
}

// JournalView is what the journal gauges read at scrape time.
type JournalView func() (inflight int, oldestAge time.Duration, poison int)

// AttachState registers the scrape-time gauges: journals (from journals),
// the consumer backlog (from the worker's cached consumer info; never a
// NATS round trip during a scrape) and Pebble's health.
func (m *Metrics) AttachState(store *storage.Store, journals JournalView, stats func() *queue.ConsumerStats) {
	m.Registry.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "telha_journals_inflight", Help: "Cascade journals not yet finished."},
			func() float64 { n, _, _ := journals(); return float64(n) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "telha_journal_oldest_age_seconds", Help: "Age of the oldest unfinished cascade journal (0 when none)."},
			func() float64 { _, a, _ := journals(); return a.Seconds() }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "telha_journals_poison", Help: "Journals that cannot be decoded or keep failing."},
			func() float64 { _, _, p := journals(); return float64(p) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "telha_queue_pending_messages", Help: "Requests waiting in this replica's consumer (cached consumer info)."},
			func() float64 { return statOf(stats, func(s *queue.ConsumerStats) uint64 { return s.Pending }) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "telha_queue_ack_pending_messages", Help: "Requests delivered and not yet acked (cached consumer info)."},
			func() float64 { return statOf(stats, func(s *queue.ConsumerStats) uint64 { return s.AckPending }) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "telha_queue_redelivered_messages", Help: "Requests redelivered and not yet acked (cached consumer info)."},
			func() float64 { return statOf(stats, func(s *queue.ConsumerStats) uint64 { return s.Redelivered }) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "telha_storage_disk_free_bytes", Help: "Free bytes on the store's filesystem (-1 when the disk-space guard is off)."},
			func() float64 {
				free, err := store.DiskFree()
				if err != nil {
					return -1
				}
				return float64(free)
			}),
		&pebbleCollector{store: store},
	)
}

func statOf(stats func() *queue.ConsumerStats, f func(*queue.ConsumerStats) uint64) float64 {
	if stats == nil {
		return 0
	}
	s := stats()
	if s == nil {
		return 0
	}
	return float64(f(s))
}

var (
	descDebt      = prometheus.NewDesc("telha_pebble_compaction_debt_bytes", "Pebble's estimated compaction debt.", nil, nil)
	descL0Files   = prometheus.NewDesc("telha_pebble_l0_files", "Sstables in Pebble's L0.", nil, nil)
	descL0Sub     = prometheus.NewDesc("telha_pebble_l0_sublevels", "Pebble's L0 sublevels (read amplification in L0).", nil, nil)
	descDisk      = prometheus.NewDesc("telha_pebble_disk_usage_bytes", "Bytes Pebble occupies on disk.", nil, nil)
	descStalls    = prometheus.NewDesc("telha_pebble_write_stalls_total", "Pebble write stalls.", nil, nil)
	descStallSecs = prometheus.NewDesc("telha_pebble_write_stall_duration_seconds_total", "Time writes spent stalled.", nil, nil)
)

// pebbleCollector reads Pebble's in-memory metrics at scrape time.
type pebbleCollector struct{ store *storage.Store }

func (c *pebbleCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descDebt, descL0Files, descL0Sub, descDisk, descStalls, descStallSecs} {
		ch <- d
	}
}

func (c *pebbleCollector) Collect(ch chan<- prometheus.Metric) {
	pm := c.store.Engine().Metrics()
	ch <- prometheus.MustNewConstMetric(descDebt, prometheus.GaugeValue, float64(pm.Compact.EstimatedDebt))
	ch <- prometheus.MustNewConstMetric(descL0Files, prometheus.GaugeValue, float64(pm.Levels[0].TablesCount))
	ch <- prometheus.MustNewConstMetric(descL0Sub, prometheus.GaugeValue, float64(pm.Levels[0].Sublevels))
	ch <- prometheus.MustNewConstMetric(descDisk, prometheus.GaugeValue, float64(pm.DiskSpaceUsage()))
	n, d := c.store.WriteStalls()
	ch <- prometheus.MustNewConstMetric(descStalls, prometheus.CounterValue, float64(n))
	ch <- prometheus.MustNewConstMetric(descStallSecs, prometheus.CounterValue, d.Seconds())
}
