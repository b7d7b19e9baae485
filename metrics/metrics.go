package metrics

import (
	"net/http"
	"runtime"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
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
//
// No label value comes from input unless it is one of a fixed set: the
// vocabularies of Labels. A value outside its set is counted under
// "unknown" (op, status) or "other" (reasons), so no caller can grow a
// family (issue 20: a rejected request's raw op became a label).
type Metrics struct {
	Registry *prometheus.Registry

	ops, statuses, dlReasons, deniedReasons map[string]bool

	Requests          *prometheus.CounterVec
	RequestDuration   *prometheus.HistogramVec
	QueueWait         prometheus.Histogram
	Cascades          *prometheus.CounterVec
	EdgesTombstoned   prometheus.Counter
	ChunksApplied     prometheus.Counter
	ReaperRuns        *prometheus.CounterVec
	ReaperResumed     prometheus.Counter
	ReaperLastSuccess prometheus.Gauge
	DeadLetters       *prometheus.CounterVec
	DeadLetterFails   *prometheus.CounterVec
	DeadLetterResFail *prometheus.CounterVec
	CommitDuration    prometheus.Histogram
	CommitFailures    prometheus.Counter
	WriterWait        *prometheus.HistogramVec
	WriterRun         *prometheus.HistogramVec
	BuildInfo         *prometheus.GaugeVec
	APIDenied         *prometheus.CounterVec
	ResultsParked     prometheus.Counter
	// The scrub of the copies after erases (--changelog jetstream, issue
	// 29): its duration, how long it held the writer, the bytes it
	// uploaded and deleted, and its failures (each retried).
	ScrubDuration   prometheus.Histogram
	ScrubWriterHeld prometheus.Histogram
	ScrubBytes      *prometheus.CounterVec
	ScrubFailures   prometheus.Counter
	// The change feed (queue.FeedHooks).
	Changes, ChangeFeedFails, ChangeFeedReorders prometheus.Counter
	ChangeFeedLag                                prometheus.Gauge
}

// Labels are the label values initialised at start, so rate() sees zeros
// rather than gaps. The product's packages own these vocabularies; the
// wiring (package app) passes them in.
type Labels struct {
	Ops      []string // op of telha_requests_total and the duration histogram ("unknown" is added)
	Statuses []string // status of telha_requests_total with a real op
	// UnknownOpStatuses: the statuses a request whose op could not be read
	// (op "unknown") can be answered with; only these pairs are
	// initialised for it (issue 23: no op="unknown",status="ok").
	UnknownOpStatuses []string
	Paths             []string // path of telha_cascades_total
	DeadLetterReasons []string // reason of telha_dead_letters_total
	DeniedReasons     []string // reason of telha_api_denied_total
}

// New creates the registry with every family and label set initialised.
func New(b Build, l Labels) *Metrics {
	r := prometheus.NewRegistry()
	m := &Metrics{
		Registry:      r,
		ops:           setOf(l.Ops),
		statuses:      setOf(l.Statuses),
		dlReasons:     setOf(l.DeadLetterReasons),
		deniedReasons: setOf(l.DeniedReasons),
		Requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "telha_requests_total", Help: "Requests answered, by op and result status.",
		}, []string{"op", "status"}),
		RequestDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "telha_request_duration_seconds", Help: "From the worker receiving a request message to its ack (or term).",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
		}, []string{"op"}),
		QueueWait: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "telha_request_queue_seconds", Help: "Time in queue: from the request stream's timestamp of a message (its publish) to the start of its handling by the worker; a redelivery counts from the original publish.",
			Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600},
		}),
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
		DeadLetterFails: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "telha_dead_letter_failures_total", Help: "Messages terminated WITHOUT their copy in the dead-letter stream (the copy kept failing until their last delivery), by reason.",
		}, []string{"reason"}),
		DeadLetterResFail: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "telha_dead_letter_result_failures_total", Help: "Dead-lettered messages terminated WITHOUT their result in the results stream (publishing it kept failing until their last delivery), by reason.",
		}, []string{"reason"}),
		CommitDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "telha_storage_commit_duration_seconds", Help: "Durable (fsynced) Pebble batch commits.",
			Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1},
		}),
		CommitFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "telha_storage_commit_failures_total", Help: "Durable commits that failed (I/O errors, the disk-space reserve, injected faults).",
		}),
		WriterWait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "telha_writer_wait_seconds", Help: "How long a task waited for the store's one writer, by lane (foreground: requests and journal bookkeeping; background: journal chunks).",
			Buckets: []float64{.0001, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1},
		}, []string{"lane"}),
		WriterRun: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "telha_writer_task_seconds", Help: "How long a task held the store's one writer (its reads, writes and durable commit), by lane.",
			Buckets: []float64{.0001, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1},
		}, []string{"lane"}),
		ResultsParked: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "telha_results_parked_events_total", Help: "Results of journaled cascades and erases parked after failing to publish 5 times in a row (each still retried, at most every 10 minutes).",
		}),
		BuildInfo: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "telha_build_info", Help: "Build of the running worker (value 1).",
		}, []string{"version", "revision", "goversion"}),
		APIDenied: newAPIDenied(),
		ScrubDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "telha_erase_scrub_seconds", Help: "Scrubs of the copies after erases (a checkpoint, the changelog's purge, the replaced tables deleted), each covering every erase prepared before it; an erase's result waits for its scrub.",
			Buckets: []float64{.1, .25, .5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300},
		}),
		ScrubWriterHeld: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "telha_erase_scrub_writer_held_seconds", Help: "How long a scrub of the copies held the store's one writer (its last save and the purge): every tenant of the slot waits this long.",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5},
		}),
		ScrubBytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "telha_erase_scrub_bytes_total", Help: "Bytes of tables the scrubs of the copies uploaded to the checkpoint bucket and deleted from it, by kind (uploaded, deleted).",
		}, []string{"kind"}),
		ScrubFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "telha_erase_scrub_failures_total", Help: "Scrubs of the copies that failed (NATS unreachable, a bound passed); each is retried, and the erases' results wait.",
		}),
		Changes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "telha_changes_published_total", Help: "Changes the change feed stored in TELHA_CHG (their cursors saved); a change published again after a crash or a move counts again.",
		}),
		ChangeFeedFails: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "telha_change_feed_failures_total", Help: "Rounds of the change feed that failed (NATS unreachable, the stream missing); each is published again from the saved cursors after a backoff.",
		}),
		ChangeFeedLag: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "telha_change_feed_lag_seconds", Help: "Age of the oldest committed change the change feed has not stored yet (0: caught up), after its last round.",
		}),
		ChangeFeedReorders: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "telha_change_feed_reordered_total", Help: "Changes lost by the server while a later change of the same round was stored: published again, after it (out of order). Alert on any.",
		}),
	}
	r.MustRegister(m.Requests, m.RequestDuration, m.Cascades, m.EdgesTombstoned, m.ChunksApplied,
		m.ReaperRuns, m.ReaperResumed, m.ReaperLastSuccess, m.DeadLetters, m.CommitDuration, m.CommitFailures, m.BuildInfo,
		m.WriterWait, m.WriterRun, m.DeadLetterFails, m.DeadLetterResFail, m.APIDenied, m.QueueWait, m.ResultsParked,
		m.ScrubDuration, m.ScrubWriterHeld, m.ScrubBytes, m.ScrubFailures, m.Changes, m.ChangeFeedFails, m.ChangeFeedReorders, m.ChangeFeedLag,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	// Only the pairs that can occur: a real op with any status, and op
	// "unknown" with the statuses of a request that could not be read.
	for _, op := range l.Ops {
		m.RequestDuration.WithLabelValues(op)
		for _, st := range l.Statuses {
			m.Requests.WithLabelValues(op, st)
		}
	}
	m.RequestDuration.WithLabelValues(Unknown)
	for _, st := range l.UnknownOpStatuses {
		m.Requests.WithLabelValues(Unknown, known(m.statuses, st, Unknown))
	}
	for _, p := range l.Paths {
		m.Cascades.WithLabelValues(p)
	}
	for _, res := range []string{ReaperOK, ReaperError, ReaperSkipped} {
		m.ReaperRuns.WithLabelValues(res)
	}
	for _, lane := range []string{"foreground", "background"} {
		m.WriterWait.WithLabelValues(lane)
		m.WriterRun.WithLabelValues(lane)
	}
	for _, reason := range l.DeadLetterReasons {
		m.DeadLetters.WithLabelValues(reason)
		m.DeadLetterFails.WithLabelValues(reason)
		m.DeadLetterResFail.WithLabelValues(reason)
	}
	for _, reason := range l.DeniedReasons {
		m.APIDenied.WithLabelValues(reason)
	}
	for _, kind := range []string{ScrubUploaded, ScrubDeleted} {
		m.ScrubBytes.WithLabelValues(kind)
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

func setOf(vs []string) map[string]bool {
	out := make(map[string]bool, len(vs))
	for _, v := range vs {
		out[v] = true
	}
	return out
}

// Label values outside their fixed sets.
const (
	Unknown = "unknown" // op, status
	Other   = "other"   // reason
)

// known returns v when it is in set, else alt.
func known(set map[string]bool, v, alt string) string {
	if set[v] {
		return v
	}
	return alt
}

// newAPIDenied is telha_api_denied_total: one family, whether a store's
// registry or a member's holds it (the same help, so /metrics merges them).
func newAPIDenied() *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "telha_api_denied_total", Help: "Read-API requests refused by access control, by reason (unauthenticated, forbidden_tenant, forbidden_role, loopback_only).",
	}, []string{"reason"})
}

// Kinds of telha_erase_scrub_bytes_total.
const (
	ScrubUploaded = "uploaded"
	ScrubDeleted  = "deleted"
)

// Scrubbed records a finished scrub of the copies.
func (m *Metrics) Scrubbed(took, writerHeld time.Duration, uploaded, deleted uint64) {
	m.ScrubDuration.Observe(took.Seconds())
	m.ScrubWriterHeld.Observe(writerHeld.Seconds())
	m.ScrubBytes.WithLabelValues(ScrubUploaded).Add(float64(uploaded))
	m.ScrubBytes.WithLabelValues(ScrubDeleted).Add(float64(deleted))
}

// ScrubFailed counts a scrub of the copies that failed.
func (m *Metrics) ScrubFailed() { m.ScrubFailures.Inc() }

// ChangesPublished counts n changes stored by the change feed.
func (m *Metrics) ChangesPublished(n int) { m.Changes.Add(float64(n)) }

// ChangeFeedFailed counts a failed round of the change feed.
func (m *Metrics) ChangeFeedFailed(error) { m.ChangeFeedFails.Inc() }

// ChangeFeedLagged sets the change feed's lag.
func (m *Metrics) ChangeFeedLagged(d time.Duration) { m.ChangeFeedLag.Set(d.Seconds()) }

// ChangeFeedReordered counts a change published out of order.
func (m *Metrics) ChangeFeedReordered(string) { m.ChangeFeedReorders.Inc() }

// Denied counts a read-API request refused by access control.
func (m *Metrics) Denied(reason string) {
	m.APIDenied.WithLabelValues(known(m.deniedReasons, reason, Other)).Inc()
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

// WriterTask records one task of the store's writer.
func (m *Metrics) WriterTask(lane string, wait, run time.Duration) {
	m.WriterWait.WithLabelValues(lane).Observe(wait.Seconds())
	m.WriterRun.WithLabelValues(lane).Observe(run.Seconds())
}

// Request records a result published (op "unknown" when the request could
// not be read).
func (m *Metrics) Request(op, status string) {
	m.Requests.WithLabelValues(known(m.ops, op, Unknown), known(m.statuses, status, Unknown)).Inc()
}

// Acked records a request message acked or terminated, with the time since
// the worker received it.
func (m *Metrics) Acked(op string, took time.Duration) {
	m.RequestDuration.WithLabelValues(known(m.ops, op, Unknown)).Observe(took.Seconds())
}

// Queued records a request message's time in queue: from its stream
// timestamp to the start of its handling (a negative duration, the
// server's clock ahead of the worker's, counts as zero).
func (m *Metrics) Queued(d time.Duration) {
	m.QueueWait.Observe(max(d, 0).Seconds())
}

// ResultParked records a result parked after failing to publish
// repeatedly (reaper.Hooks.OutboxParked).
func (m *Metrics) ResultParked() { m.ResultsParked.Inc() }

// DeadLetter records one dead letter.
func (m *Metrics) DeadLetter(reason string) {
	m.DeadLetters.WithLabelValues(known(m.dlReasons, reason, Other)).Inc()
}

// DeadLetterFailed records a message terminated without its dead letter.
func (m *Metrics) DeadLetterFailed(reason string) {
	m.DeadLetterFails.WithLabelValues(known(m.dlReasons, reason, Other)).Inc()
}

// DeadLetterResultFailed records a dead-lettered message terminated
// without its result.
func (m *Metrics) DeadLetterResultFailed(reason string) {
	m.DeadLetterResFail.WithLabelValues(known(m.dlReasons, reason, Other)).Inc()
}

// Cascade records a cascade whose node tombstone landed.
func (m *Metrics) Cascade(path string, edges uint64) {
	m.Cascades.WithLabelValues(path).Inc()
	m.EdgesTombstoned.Add(float64(edges))
}

// Chunk records one durable chunk of a journaled cascade.
func (m *Metrics) Chunk() { m.ChunksApplied.Inc() }

// ReaperRun records one reaper pass: result is ReaperOK, ReaperError or
// ReaperSkipped; resumed, the journals it applied to completion.
func (m *Metrics) ReaperRun(result string, resumed int) {
	m.ReaperRuns.WithLabelValues(result).Inc()
	if result == ReaperOK {
		m.ReaperLastSuccess.SetToCurrentTime()
	}
	m.ReaperResumed.Add(float64(resumed))
}

// JournalSummary is what the journal gauges show.
type JournalSummary struct {
	InFlight int
	Oldest   time.Duration
	Poison   int
	// OutboxParked: results that failed to publish repeatedly and are
	// still in the outbox (reaper.Summary.OutboxParked).
	OutboxParked int
}

// QueueStats is the consumer's backlog as last read (ok false: not read
// yet).
type QueueStats struct {
	Pending, AckPending, Redelivered uint64
	OK                               bool
	// At is when the consumer was read (the figures' "as of").
	At time.Time
	// Oldest is the stream timestamp of the oldest request not yet acked
	// (zero when none, or not known).
	Oldest time.Time
	// Paused: this replica's consumer is paused (JetStream's consumer
	// pause), as of At.
	Paused bool
}

// PebbleStats are Pebble's health figures.
type PebbleStats struct {
	CompactionDebt uint64
	L0Files        int64
	L0Sublevels    int32
	DiskBytes      uint64
	Stalls         uint64
	StallTime      time.Duration
}

// State is what the scrape-time gauges read. Every field is required; each
// must answer from memory (a scrape never waits on NATS or disk I/O).
type State struct {
	Journals func() JournalSummary
	Queue    func() QueueStats
	DiskFree func() (uint64, error)
	Pebble   func() PebbleStats
}

// AttachState registers the scrape-time gauges.
func (m *Metrics) AttachState(st State) {
	queue := func(f func(QueueStats) uint64) func() float64 {
		return func() float64 {
			q := st.Queue()
			if !q.OK {
				return 0
			}
			return float64(f(q))
		}
	}
	m.Registry.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "telha_journals_inflight", Help: "Cascade journals not yet finished."},
			func() float64 { return float64(st.Journals().InFlight) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "telha_journal_oldest_age_seconds", Help: "Age of the oldest unfinished cascade journal (0 when none)."},
			func() float64 { return st.Journals().Oldest.Seconds() }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "telha_journals_poison", Help: "Journals that cannot be decoded or keep failing."},
			func() float64 { return float64(st.Journals().Poison) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "telha_queue_pending_messages", Help: "Requests waiting in this replica's consumer (cached consumer info)."},
			queue(func(q QueueStats) uint64 { return q.Pending })),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "telha_queue_ack_pending_messages", Help: "Requests delivered and not yet acked (cached consumer info)."},
			queue(func(q QueueStats) uint64 { return q.AckPending })),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "telha_queue_redelivered_messages", Help: "Requests redelivered and not yet acked (cached consumer info)."},
			queue(func(q QueueStats) uint64 { return q.Redelivered })),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "telha_queue_oldest_pending_age_seconds", Help: "Age of the oldest request of this replica's consumer not yet acked (waiting or being handled), from its stream timestamp to the scrape; 0 when none. Which request is oldest is as of telha_queue_info_timestamp_seconds."},
			func() float64 {
				q := st.Queue()
				if !q.OK || q.Oldest.IsZero() {
					return 0
				}
				return max(time.Since(q.Oldest), 0).Seconds()
			}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "telha_consumer_paused", Help: "1 while this replica's request consumer is paused (enqueue pause, the status page, nats consumer pause), as of telha_queue_info_timestamp_seconds."},
			func() float64 {
				if q := st.Queue(); q.OK && q.Paused {
					return 1
				}
				return 0
			}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "telha_queue_info_timestamp_seconds", Help: "Unix time of the last read of the consumer's info, which the telha_queue_* gauges show (0: not read yet)."},
			func() float64 {
				q := st.Queue()
				if !q.OK || q.At.IsZero() {
					return 0
				}
				return float64(q.At.UnixNano()) / 1e9
			}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "telha_results_parked", Help: "Results of journaled cascades and erases that failed to publish 5 times in a row and are still in the outbox (retried at most every 10 minutes; the request lookup answers them)."},
			func() float64 { return float64(st.Journals().OutboxParked) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "telha_storage_disk_free_bytes", Help: "Free bytes on the store's filesystem (-1 when the disk-space guard is off)."},
			func() float64 {
				free, err := st.DiskFree()
				if err != nil {
					return -1
				}
				return float64(free)
			}),
		&pebbleCollector{stats: st.Pebble},
	)
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
type pebbleCollector struct{ stats func() PebbleStats }

func (c *pebbleCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descDebt, descL0Files, descL0Sub, descDisk, descStalls, descStallSecs} {
		ch <- d
	}
}

func (c *pebbleCollector) Collect(ch chan<- prometheus.Metric) {
	p := c.stats()
	ch <- prometheus.MustNewConstMetric(descDebt, prometheus.GaugeValue, float64(p.CompactionDebt))
	ch <- prometheus.MustNewConstMetric(descL0Files, prometheus.GaugeValue, float64(p.L0Files))
	ch <- prometheus.MustNewConstMetric(descL0Sub, prometheus.GaugeValue, float64(p.L0Sublevels))
	ch <- prometheus.MustNewConstMetric(descDisk, prometheus.GaugeValue, float64(p.DiskBytes))
	ch <- prometheus.MustNewConstMetric(descStalls, prometheus.CounterValue, float64(p.Stalls))
	ch <- prometheus.MustNewConstMetric(descStallSecs, prometheus.CounterValue, p.StallTime.Seconds())
}
