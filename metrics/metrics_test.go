package metrics

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
)

// requestPairs returns the op/status pairs of telha_requests_total present
// in the registry.
func requestPairs(t *testing.T, m *Metrics) map[string]bool {
	t.Helper()
	mfs, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, mf := range mfs {
		if mf.GetName() != "telha_requests_total" {
			continue
		}
		for _, s := range mf.GetMetric() {
			out[label(s, "op")+"/"+label(s, "status")] = true
		}
	}
	return out
}

func label(s *dto.Metric, name string) string {
	for _, l := range s.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// TestRequestPairsOnlyPossible (issue 23 item 15): telha_requests_total is
// initialised with every real op and every status, and op "unknown" (a
// request whose op could not be read) only with the statuses such a
// request can get: no op="unknown",status="ok".
func TestRequestPairsOnlyPossible(t *testing.T) {
	m := New(Build{}, Labels{Ops: []string{"put_node", "tombstone_node"}, Statuses: []string{"ok", "not_found", "invalid", "failed"},
		UnknownOpStatuses: []string{"invalid"}})
	got := requestPairs(t, m)
	for _, op := range []string{"put_node", "tombstone_node"} {
		for _, st := range []string{"ok", "not_found", "invalid", "failed"} {
			if !got[op+"/"+st] {
				t.Errorf("%s/%s not initialised", op, st)
			}
		}
	}
	if !got["unknown/invalid"] {
		t.Error("unknown/invalid not initialised")
	}
	for _, st := range []string{"ok", "not_found", "failed"} {
		if got["unknown/"+st] {
			t.Errorf("impossible pair unknown/%s initialised", st)
		}
	}
	if len(got) != 2*4+1 {
		t.Errorf("%d pairs initialised, want 9: %v", len(got), got)
	}
	// The duration histogram still has op "unknown" (such a request is
	// acked or terminated like any other).
	if n := testutil.CollectAndCount(m.RequestDuration); n != 3 {
		t.Errorf("telha_request_duration_seconds has %d series, want 3 (two ops and unknown)", n)
	}
}

// TestQueueWait: the time in queue is observed in seconds, and a negative
// duration (the server's clock ahead of the worker's) counts as zero.
func TestQueueWait(t *testing.T) {
	m := New(Build{}, Labels{})
	m.Queued(1500 * time.Millisecond)
	m.Queued(-time.Second)
	h := histogramOf(t, m, "telha_request_queue_seconds")
	if h.GetSampleCount() != 2 || h.GetSampleSum() != 1.5 {
		t.Fatalf("count %d sum %v, want 2 and 1.5", h.GetSampleCount(), h.GetSampleSum())
	}
}

func histogramOf(t *testing.T, m *Metrics, name string) *dto.Histogram {
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

func gaugeOf(t *testing.T, m *Metrics, name string) float64 {
	t.Helper()
	mfs, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("no gauge %s", name)
	return 0
}

func testState(q func() QueueStats, j func() JournalSummary) State {
	return State{Journals: j, Queue: q, DiskFree: func() (uint64, error) { return 1, nil }, Pebble: func() PebbleStats { return PebbleStats{} }}
}

// TestOldestPendingAge: the oldest pending request's age is the time
// since its stream timestamp, at scrape time; 0 when nothing is pending or
// the consumer was not read yet; the consumer read's own time is exported
// (its "as of").
func TestOldestPendingAge(t *testing.T) {
	m := New(Build{}, Labels{})
	var q QueueStats
	m.AttachState(testState(func() QueueStats { return q }, func() JournalSummary { return JournalSummary{} }))
	if got := gaugeOf(t, m, "telha_queue_oldest_pending_age_seconds"); got != 0 {
		t.Fatalf("before the first read: %v, want 0", got)
	}
	if got := gaugeOf(t, m, "telha_queue_info_timestamp_seconds"); got != 0 {
		t.Fatalf("as of before the first read: %v, want 0", got)
	}
	at := time.Now().Add(-2 * time.Second)
	q = QueueStats{OK: true, Pending: 3, At: at, Oldest: time.Now().Add(-90 * time.Second)}
	if got := gaugeOf(t, m, "telha_queue_oldest_pending_age_seconds"); got < 90 || got > 100 {
		t.Fatalf("oldest pending age %v, want about 90", got)
	}
	if got := gaugeOf(t, m, "telha_queue_info_timestamp_seconds"); got != float64(at.UnixNano())/1e9 {
		t.Fatalf("as of %v, want %v", got, float64(at.UnixNano())/1e9)
	}
	q = QueueStats{OK: true, At: time.Now()} // nothing pending
	if got := gaugeOf(t, m, "telha_queue_oldest_pending_age_seconds"); got != 0 {
		t.Fatalf("nothing pending: %v, want 0", got)
	}
	q = QueueStats{OK: true, At: time.Now(), Oldest: time.Now().Add(time.Minute)} // the server's clock ahead
	if got := gaugeOf(t, m, "telha_queue_oldest_pending_age_seconds"); got != 0 {
		t.Fatalf("a timestamp in the future: %v, want 0", got)
	}
}

// TestResultsParked: the gauge shows the summary's parked results, the
// counter counts the parkings.
func TestResultsParked(t *testing.T) {
	m := New(Build{}, Labels{})
	parked := 0
	m.AttachState(testState(func() QueueStats { return QueueStats{} }, func() JournalSummary { return JournalSummary{OutboxParked: parked} }))
	if got := gaugeOf(t, m, "telha_results_parked"); got != 0 {
		t.Fatalf("parked %v, want 0", got)
	}
	parked = 2
	if got := gaugeOf(t, m, "telha_results_parked"); got != 2 {
		t.Fatalf("parked %v, want 2", got)
	}
	if got := testutil.ToFloat64(m.ResultsParked); got != 0 {
		t.Fatalf("counter before any parking: %v", got)
	}
	m.ResultParked()
	m.ResultParked()
	if got := testutil.ToFloat64(m.ResultsParked); got != 2 {
		t.Fatalf("telha_results_parked_events_total = %v, want 2", got)
	}
}
