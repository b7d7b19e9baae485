package app

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/telha/telha-cascade/internal/testnats"
	"github.com/telha/telha-cascade/queue"
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
	w := startWorker(t, ns, t.TempDir(), Options{})
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
