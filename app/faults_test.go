package app

import (
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/telha/telha-cascade/internal/testnats"
	"github.com/telha/telha-cascade/queue"
	"github.com/telha/telha-cascade/storage"
)

// TestE2ETransientStorageFailuresAreRetriedThenDeadLettered: while every
// durable commit fails, requests are redelivered with backoff and, on their
// final delivery, copied to the dead-letter stream and answered "failed";
// the worker neither crashes nor wedges: when the disk recovers, new
// requests apply.
func TestE2ETransientStorageFailuresAreRetriedThenDeadLettered(t *testing.T) {
	ns := testnats.Start(t)
	var broken atomic.Bool
	opts := Options{WrapEngine: func(e storage.Engine) storage.Engine {
		f := storage.NewFaultEngine(e)
		f.SetInject(func(n int) error {
			if broken.Load() {
				return fmt.Errorf("%w: I/O error on durable call %d", storage.ErrInjected, n)
			}
			return nil
		})
		return f
	}}
	w := startWorker(t, ns, t.TempDir(), opts, "--max-deliver", "3")
	b := newBus(t, ns)
	broken.Store(true)
	var ids []string
	for i := 0; i < 5; i++ {
		ids = append(ids, b.send("io", node(uuid.NewString())))
	}
	for _, id := range ids {
		r := b.wait(id)
		if r.Status != queue.StatusFailed || !strings.Contains(r.Error, "delivery 3 of 3") {
			t.Fatalf("result %+v, want failed on the final delivery", r)
		}
	}
	dl := b.deadLetters()
	if len(dl) != len(ids) {
		t.Fatalf("%d dead letters, want %d", len(dl), len(ids))
	}
	for _, d := range dl {
		if d.Header.Get("Telha-Reason") != queue.ReasonRetriesExhausted || d.Header.Get("Telha-Deliveries") != "3" {
			t.Fatalf("dead letter headers %v", d.Header)
		}
	}
	m := w.app.Metrics()
	if got := testutil.ToFloat64(m.DeadLetters.WithLabelValues(queue.ReasonRetriesExhausted)); got != float64(len(ids)) {
		t.Fatalf("retries_exhausted dead letters metric %v", got)
	}
	// Requests fail together: one failed group commit per delivery round.
	if testutil.ToFloat64(m.CommitFailures) < 3 {
		t.Fatalf("commit failures metric %v, want at least 3", testutil.ToFloat64(m.CommitFailures))
	}
	broken.Store(false)
	mustOK(t, b.wait(b.send("io", node(uuid.NewString()))))
}

// TestE2EDiskFullIsAClearErrorNotCorruption: under the disk-space reserve,
// writes are refused before they reach Pebble (retried, then dead-lettered
// with the reason), /readyz says why, and the free-space gauge shows it.
func TestE2EDiskFullIsAClearErrorNotCorruption(t *testing.T) {
	ns := testnats.Start(t)
	var free atomic.Uint64
	free.Store(1 << 40)
	w := startWorker(t, ns, t.TempDir(), Options{DiskFree: func() (uint64, error) { return free.Load(), nil }},
		"--max-deliver", "2", "--min-free-disk-mb", "100")
	b := newBus(t, ns)
	kept := uuid.NewString()
	mustOK(t, b.wait(b.send("full", node(kept))))
	free.Store(5 << 20)
	testnats.Eventually(t, 5*time.Second, "readyz reports the full disk", func() bool {
		var body struct{ Reasons []string }
		code := w.get("/readyz", &body)
		return code == 503 && len(body.Reasons) == 1 && strings.Contains(body.Reasons[0], "disk full")
	})
	if v := metricValue(t, w, "telha_storage_disk_free_bytes"); v != float64(5<<20) {
		t.Fatalf("disk free gauge %v", v)
	}
	r := b.wait(b.send("full", node(uuid.NewString())))
	if r.Status != queue.StatusFailed || !strings.Contains(r.Error, "disk full") {
		t.Fatalf("write on a full disk: %+v", r)
	}
	free.Store(1 << 40)
	mustOK(t, b.wait(b.send("full", node(uuid.NewString()))))
	if code := w.get("/v1/tenants/full/nodes/"+kept, nil); code != 200 {
		t.Fatalf("data written before the disk filled: %d", code)
	}
	if err := storage.Verify(w.app.Store().Reader()); err != nil {
		t.Fatal(err)
	}
}
