package metrics

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestLabelsFromFixedSets (issue 20 item 2): a value outside a family's
// vocabulary is counted under unknown/other, never as a label of its own.
func TestLabelsFromFixedSets(t *testing.T) {
	m := New(Build{}, Labels{Ops: []string{"put_node"}, Statuses: []string{"ok", "invalid"},
		DeadLetterReasons: []string{"decode"}, DeniedReasons: []string{"unauthenticated"}})
	series := func() int {
		n, err := testutil.GatherAndCount(m.Registry, "telha_requests_total", "telha_request_duration_seconds",
			"telha_dead_letters_total", "telha_dead_letter_failures_total", "telha_api_denied_total")
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	before := series()
	for i := 0; i < 100; i++ {
		junk := strings.Repeat("x", i+1)
		m.Request(junk, junk)
		m.Request("put_node", junk)
		m.Acked(junk, time.Millisecond)
		m.DeadLetter(junk)
		m.DeadLetterFailed(junk)
		m.Denied(junk)
	}
	// unknown/unknown, put_node/unknown, other (x3): five new series at most.
	if after := series(); after > before+5 {
		t.Fatalf("%d series before, %d after 100 junk values", before, after)
	}
	if got := testutil.ToFloat64(m.Requests.WithLabelValues(Unknown, Unknown)); got != 100 {
		t.Fatalf("telha_requests_total{op=unknown,status=unknown} = %v, want 100", got)
	}
	if got := testutil.ToFloat64(m.DeadLetters.WithLabelValues(Other)); got != 100 {
		t.Fatalf("telha_dead_letters_total{reason=other} = %v, want 100", got)
	}
	m.Request("put_node", "ok")
	if got := testutil.ToFloat64(m.Requests.WithLabelValues("put_node", "ok")); got != 1 {
		t.Fatalf("a known op and status: %v", got)
	}
}
