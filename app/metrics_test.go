package app

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"github.com/telha/telha-cascade/internal/testnats"
	"github.com/telha/telha-cascade/metrics"
	"github.com/telha/telha-cascade/queue"
	"github.com/telha/telha-cascade/reaper"
	"github.com/telha/telha-cascade/storage"
)

// Every family the dashboards and alerts rely on.
var families = []string{
	"telha_requests_total", "telha_request_duration_seconds", "telha_cascades_total",
	"telha_cascade_edges_tombstoned_total", "telha_journals_inflight", "telha_journal_oldest_age_seconds",
	"telha_journal_chunks_applied_total", "telha_journals_poison", "telha_reaper_runs_total",
	"telha_reaper_journals_resumed_total", "telha_reaper_last_success_timestamp_seconds",
	"telha_dead_letters_total", "telha_queue_pending_messages", "telha_queue_ack_pending_messages",
	"telha_queue_redelivered_messages", "telha_storage_commit_duration_seconds", "telha_build_info",
	"telha_pebble_compaction_debt_bytes", "telha_pebble_l0_files", "telha_pebble_l0_sublevels",
	"telha_pebble_disk_usage_bytes", "telha_pebble_write_stalls_total", "telha_pebble_write_stall_duration_seconds_total",
	"telha_storage_commit_failures_total", "telha_storage_disk_free_bytes", "telha_writer_wait_seconds", "telha_writer_task_seconds", "telha_dead_letter_failures_total",
	"telha_dead_letter_result_failures_total", "telha_request_queue_seconds", "telha_queue_oldest_pending_age_seconds",
	"telha_queue_info_timestamp_seconds", "telha_consumer_paused", "telha_results_parked", "telha_results_parked_events_total", "telha_api_denied_total",
	"go_goroutines", "process_resident_memory_bytes",
}

func scrape(t *testing.T, w *running) string {
	t.Helper()
	resp, err := http.Get(w.base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

func TestFreshWorkerExposesEveryFamily(t *testing.T) {
	ns := testnats.Start(t)
	// The startup pass runs in the background (issue 23 item 17): wait for
	// it before looking for its count.
	passed := make(chan struct{})
	var once sync.Once
	w := startWorker(t, ns, t.TempDir(), Options{ReaperHooks: reaper.Hooks{Run: func(reaper.RunResult) { once.Do(func() { close(passed) }) }}})
	select {
	case <-passed:
	case <-time.After(30 * time.Second):
		t.Fatal("the startup reaper pass did not run")
	}
	text := scrape(t, w)
	for _, f := range families {
		if !strings.Contains(text, "# TYPE "+f+" ") {
			t.Errorf("family %s missing before any traffic", f)
		}
	}
	// Every label set is there from the start, at zero, so rate() sees
	// zeros rather than gaps.
	for _, op := range []string{"put_node", "put_edge", "tombstone_node", "tombstone_edge"} {
		for _, st := range queue.Statuses() {
			if !strings.Contains(text, fmt.Sprintf("telha_requests_total{op=%q,status=%q} 0", op, st)) {
				t.Errorf("telha_requests_total{op=%q,status=%q} not initialised", op, st)
			}
		}
	}
	// A request whose op could not be read is answered invalid, nothing
	// else (issue 23 item 15: no impossible pairs such as unknown/ok).
	for _, st := range queue.Statuses() {
		line := fmt.Sprintf("telha_requests_total{op=\"unknown\",status=%q} 0", st)
		if want := slices.Contains(queue.UnknownOpStatuses(), st); strings.Contains(text, line) != want {
			t.Errorf("%s initialised: %v, want %v", line, !want, want)
		}
	}
	if !slices.Contains(queue.UnknownOpStatuses(), queue.StatusInvalid) {
		t.Errorf("queue.UnknownOpStatuses() = %v lacks invalid", queue.UnknownOpStatuses())
	}
	for _, reason := range queue.DeadLetterReasons() {
		if !strings.Contains(text, fmt.Sprintf("telha_dead_letters_total{reason=%q} 0", reason)) {
			t.Errorf("dead letter reason %s not initialised", reason)
		}
	}
	for _, p := range []string{"inline", "journaled"} {
		if !strings.Contains(text, fmt.Sprintf("telha_cascades_total{path=%q} 0", p)) {
			t.Errorf("cascade path %s not initialised", p)
		}
	}
	if !strings.Contains(text, `telha_reaper_runs_total{result="ok"} 1`) {
		t.Error("the startup reaper pass was not counted")
	}
	for _, bad := range []string{"tenant=", "node_id=", "request_id="} {
		if strings.Contains(text, bad) {
			t.Errorf("a metric carries an unbounded label %s", bad)
		}
	}
}

func TestMetricsAfterRealOperations(t *testing.T) {
	ns := testnats.Start(t)
	hold, opts := newChunkHold()
	w := startWorker(t, ns, t.TempDir(), opts, "--max-batch-ops", "20")
	b := newBus(t, ns)
	m := w.app.Metrics()

	hub, small := uuid.NewString(), uuid.NewString()
	mustOK(t, b.wait(b.send("m", node(hub))))
	mustOK(t, b.wait(b.send("m", node(small))))
	for i := 0; i < 5; i++ {
		mustOK(t, b.wait(b.send("m", edge(uuid.NewString(), hub, small))))
	}
	e := uuid.NewString()
	mustOK(t, b.wait(b.send("m", edge(e, small, small))))
	mustOK(t, b.wait(b.send("m", tombEdge(e))))
	if r := b.wait(b.send("m", tombEdge(e))); r.Status != queue.StatusAlreadyTombstoned {
		t.Fatalf("%+v", r)
	}
	b.sendRaw("telha.req.m", []byte("garbage"), "g1")
	b.sendRaw("telha.req.m", []byte(`{"request_id":"tm","op":"put_node","tenant":"x","id":"`+uuid.NewString()+`"}`), "g2")

	// A journaled cascade held between its commit point and first chunk.
	hold.arm() // the journal lands; its first chunk waits
	id := b.send("m", tombNode(hub))
	<-hold.held
	if got := metricValue(t, w, "telha_journals_inflight"); got != 1 {
		t.Fatalf("journals in flight during the cascade: %v, want 1", got)
	}
	close(hold.release)
	r := mustOK(t, b.wait(id))
	testnats.Eventually(t, 5*time.Second, "journal gauge back to 0", func() bool {
		return metricValue(t, w, "telha_journals_inflight") == 0
	})

	check := func(name string, got, want float64) {
		t.Helper()
		if got != want {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}
	check("put_node ok", testutil.ToFloat64(m.Requests.WithLabelValues("put_node", "ok")), 2)
	check("put_edge ok", testutil.ToFloat64(m.Requests.WithLabelValues("put_edge", "ok")), 6)
	check("tombstone_edge ok", testutil.ToFloat64(m.Requests.WithLabelValues("tombstone_edge", "ok")), 1)
	check("tombstone_edge already_tombstoned", testutil.ToFloat64(m.Requests.WithLabelValues("tombstone_edge", "already_tombstoned")), 1)
	// The journaled result is counted once the outbox publish returns,
	// which may be just after the subscriber saw it.
	testnats.Eventually(t, 5*time.Second, "tombstone_node ok counted", func() bool {
		return testutil.ToFloat64(m.Requests.WithLabelValues("tombstone_node", "ok")) == 1
	})
	check("journaled cascades", testutil.ToFloat64(m.Cascades.WithLabelValues("journaled")), 1)
	check("edges tombstoned", testutil.ToFloat64(m.EdgesTombstoned), float64(r.EdgesTombstoned))
	testnats.Eventually(t, 5*time.Second, "dead letters counted", func() bool {
		return testutil.ToFloat64(m.DeadLetters.WithLabelValues(queue.ReasonDecode)) == 1 &&
			testutil.ToFloat64(m.DeadLetters.WithLabelValues(queue.ReasonTenantMismatch)) == 1
	})
	// Every series of op "unknown" that traffic made was initialised at
	// start: the statuses of UnknownOpStatuses are all it can get.
	check("unknown invalid (garbage)", testutil.ToFloat64(m.Requests.WithLabelValues("unknown", "invalid")), 1)
	mfs, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "telha_requests_total" {
			continue
		}
		for _, s := range mf.GetMetric() {
			var op, st string
			for _, l := range s.GetLabel() {
				switch l.GetName() {
				case "op":
					op = l.GetValue()
				case "status":
					st = l.GetValue()
				}
			}
			if op == "unknown" && !slices.Contains(queue.UnknownOpStatuses(), st) {
				t.Errorf("telha_requests_total{op=unknown,status=%s} occurred, but it is not in queue.UnknownOpStatuses()", st)
			}
		}
	}
	if testutil.ToFloat64(m.ChunksApplied) < 2 {
		t.Errorf("chunks applied %v, want at least 2", testutil.ToFloat64(m.ChunksApplied))
	}
	if n := testutil.CollectAndCount(m.RequestDuration); n == 0 {
		t.Error("no request durations observed")
	}
}

// metricValue scrapes /metrics and returns the value of an unlabelled
// sample.
func metricValue(t *testing.T, w *running, name string) float64 {
	t.Helper()
	for _, line := range strings.Split(scrape(t, w), "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			var f float64
			if _, err := fmt.Sscan(v, &f); err != nil {
				t.Fatalf("%s: %v", line, err)
			}
			return f
		}
	}
	t.Fatalf("no sample %s", name)
	return 0
}

// TestMetricsQueueTimeAndOldestPending (issue 23 item 15): while the
// consumer is paused, telha_queue_oldest_pending_age_seconds is the age of
// the oldest waiting request's stream timestamp; once resumed, each of
// them is observed in telha_request_queue_seconds with at least the time
// it waited, and the oldest pending age goes back to 0.
func TestMetricsQueueTimeAndOldestPending(t *testing.T) {
	ns := testnats.Start(t)
	w := startWorker(t, ns, t.TempDir(), Options{})
	b := newBus(t, ns)
	m := w.app.Metrics()
	ctx := context.Background()
	mustOK(t, b.wait(b.send("q", node(uuid.NewString())))) // the consumer is live
	// underOne counts the observations of at most 1 s.
	underOne := func() uint64 {
		for _, bk := range histogramOf(t, m, "telha_request_queue_seconds").GetBucket() {
			if bk.GetUpperBound() == 1 {
				return bk.GetCumulativeCount()
			}
		}
		t.Fatal("no le=1 bucket")
		return 0
	}
	count0, under0 := histogramOf(t, m, "telha_request_queue_seconds").GetSampleCount(), underOne()
	if count0 < 1 {
		t.Fatalf("time in queue observed %d times after a request, want at least 1", count0)
	}

	cfg := w.app.Worker().Config()
	if _, err := b.js.PauseConsumer(ctx, cfg.ReqStream, cfg.ConsumerName(), time.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	var sent []string
	for i := 0; i < 3; i++ {
		sent = append(sent, b.send("q", node(uuid.NewString())))
	}
	s, err := b.js.Stream(ctx, cfg.ReqStream)
	if err != nil {
		t.Fatal(err)
	}
	// The first request's ack follows its result (CONTRACT §5): it may
	// still be on its way when the result has arrived.
	var info *jetstream.StreamInfo
	testnats.Eventually(t, 15*time.Second, "the 3 requests waiting, the first one acked", func() bool {
		if info, err = s.Info(ctx); err != nil {
			t.Fatal(err)
		}
		if info.State.Msgs > 4 || info.State.Msgs < 3 {
			t.Fatalf("request stream: %+v, want the 3 requests waiting (and the first, until its ack lands)", info.State)
		}
		return info.State.Msgs == 3
	})
	first := info.State.FirstTime // a work-queue stream: the oldest request not acked
	// Poll (no sleep) until the oldest has waited more than a second,
	// checking the gauge against its stream timestamp at every read.
	testnats.Eventually(t, 15*time.Second, "oldest pending age above 1s", func() bool {
		if err := w.app.Worker().RefreshStats(ctx); err != nil {
			t.Fatal(err)
		}
		lo := time.Since(first).Seconds()
		got := metricValue(t, w, "telha_queue_oldest_pending_age_seconds")
		hi := time.Since(first).Seconds()
		if got < lo-0.001 || got > hi+0.001 {
			t.Fatalf("oldest pending age %v, want between %v and %v (the first waiting request's age)", got, lo, hi)
		}
		if asOf := metricValue(t, w, "telha_queue_info_timestamp_seconds"); asOf < float64(first.Unix()) {
			t.Fatalf("queue info as of %v, before the request (%v)", asOf, first.Unix())
		}
		return got > 1
	})
	if got := metricValue(t, w, "telha_consumer_paused"); got != 1 {
		t.Errorf("telha_consumer_paused = %v while the consumer is paused, want 1", got)
	}
	// The last of the 3 too (published after the first two: a test
	// descheduled between the publishes would resume it too early).
	last := info.State.LastTime
	testnats.Eventually(t, 15*time.Second, "the last request waited over 1s", func() bool { return time.Since(last) > time.Second })
	if _, err := b.js.ResumeConsumer(ctx, cfg.ReqStream, cfg.ConsumerName()); err != nil {
		t.Fatal(err)
	}
	for _, id := range sent {
		mustOK(t, b.wait(id))
	}
	testnats.Eventually(t, 5*time.Second, "time in queue observed for the 3", func() bool {
		return histogramOf(t, m, "telha_request_queue_seconds").GetSampleCount() >= count0+3
	})
	if got := histogramOf(t, m, "telha_request_queue_seconds").GetSampleCount(); got != count0+3 {
		t.Errorf("time in queue observed %d times, want %d", got, count0+3)
	}
	if got := underOne(); got != under0 {
		t.Errorf("%d of the 3 waiting requests were observed at 1 s or less in queue; each waited longer", got-under0)
	}
	testnats.Eventually(t, 10*time.Second, "oldest pending age back to 0", func() bool {
		if err := w.app.Worker().RefreshStats(ctx); err != nil {
			t.Fatal(err)
		}
		return metricValue(t, w, "telha_queue_oldest_pending_age_seconds") == 0
	})
	if got := metricValue(t, w, "telha_consumer_paused"); got != 0 {
		t.Errorf("telha_consumer_paused = %v after the resume, want 0", got)
	}
}

// TestMetricsResultsParked: a journaled cascade's result that the results
// stream refuses is parked after 5 failed publishes, and shows in
// telha_results_parked (the reaper's summary) and
// telha_results_parked_events_total (its OutboxParked hook), through app's wiring.
func TestMetricsResultsParked(t *testing.T) {
	ns := testnats.Start(t)
	clock := storage.NewManualClock(time.Now())
	var nextParked []string
	var mu sync.Mutex
	w := startWorker(t, ns, t.TempDir(), Options{Clock: clock, ReaperHooks: reaper.Hooks{OutboxParked: func(tenant, id string, _ error) {
		mu.Lock()
		nextParked = append(nextParked, tenant+"/"+id)
		mu.Unlock()
	}}}, "--max-batch-ops", "5")
	b := newBus(t, ns)
	ctx := context.Background()
	hub := uuid.NewString()
	mustOK(t, b.wait(b.send("p", node(hub))))
	for i := 0; i < 8; i++ {
		leaf := uuid.NewString()
		mustOK(t, b.wait(b.send("p", node(leaf))))
		mustOK(t, b.wait(b.send("p", edge(uuid.NewString(), hub, leaf))))
	}
	if got := metricValue(t, w, "telha_results_parked"); got != 0 {
		t.Fatalf("telha_results_parked = %v before any failure", got)
	}
	// The results stream refuses every result (at once: too large).
	rs, err := b.js.Stream(ctx, "TELHA_RES")
	if err != nil {
		t.Fatal(err)
	}
	rcfg := rs.CachedInfo().Config
	rcfg.MaxMsgSize = 16
	if _, err := b.js.UpdateStream(ctx, rcfg); err != nil {
		t.Fatal(err)
	}
	id := b.send("p", tombNode(hub))
	testnats.Eventually(t, 60*time.Second, "the journaled result parked", func() bool {
		clock.Advance(11 * time.Minute) // past every backoff
		_, err := w.app.Reaper().PublishOutbox(ctx)
		if err == nil {
			return false // the cascade's result is not in the outbox yet
		}
		return w.app.Reaper().Summarize().OutboxParked == 1
	})
	if got := metricValue(t, w, "telha_results_parked"); got != 1 {
		t.Errorf("telha_results_parked = %v, want 1", got)
	}
	if got := metricValue(t, w, "telha_results_parked_events_total"); got != 1 {
		t.Errorf("telha_results_parked_events_total = %v, want 1", got)
	}
	mu.Lock()
	if len(nextParked) != 1 || nextParked[0] != "p/"+id {
		t.Errorf("Options.ReaperHooks.OutboxParked saw %v, want [p/%s]", nextParked, id)
	}
	mu.Unlock()
}

func histogramOf(t *testing.T, m *metrics.Metrics, name string) *dto.Histogram {
	t.Helper()
	mfs, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetHistogram()
		}
	}
	t.Fatalf("no histogram %s", name)
	return nil
}
