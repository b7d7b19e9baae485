package app

import (
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/telha/telha-cascade/internal/testnats"
	"github.com/telha/telha-cascade/queue"
)

func readyReasons(w *running) (int, string) {
	var body struct{ Reasons []string }
	code := w.get("/readyz", &body)
	return code, strings.Join(body.Reasons, "; ")
}

// checkExactlyOnce asserts that every request has exactly one stored
// result, ok, and that each put_node wrote exactly one version.
func checkExactlyOnce(t *testing.T, w *running, b *bus, tenant string, reqs map[string]string) {
	t.Helper()
	for req := range reqs {
		b.wait(req)
	}
	// A subscriber sees a result as the server routes it, a moment before
	// the stream has stored it: wait until every result is stored.
	count := map[string]int{}
	testnats.Eventually(t, 10*time.Second, "every result stored in TELHA_RES", func() bool {
		count = map[string]int{}
		for _, r := range readStream[queue.Result](t, b.js, "TELHA_RES", func(r queue.Result) bool { return r.Tenant == tenant }) {
			count[r.RequestID]++
			if r.Status != queue.StatusOK {
				t.Fatalf("result %+v", r)
			}
		}
		for req := range reqs {
			if count[req] == 0 {
				return false
			}
		}
		return true
	})
	for req, n := range reqs {
		if count[req] != 1 {
			t.Fatalf("request %s has %d stored results, want 1", req, count[req])
		}
		var h struct{ Versions []struct{ ID string } }
		w.get("/v1/tenants/"+tenant+"/nodes/"+n+"/history", &h)
		if len(h.Versions) != 1 {
			t.Fatalf("node of request %s has %d versions, want 1 (lost or doubled)", req, len(h.Versions))
		}
	}
}

func publishBurst(t *testing.T, b *bus, tenant string, n int, into map[string]string) {
	t.Helper()
	for i := 0; i < n; i++ {
		node := uuid.NewString()
		req := b.send(tenant, map[string]any{"op": "put_node", "id": node})
		into[req] = node
	}
}

// TestBrokerRestartDuringLoad: the NATS server is restarted (same port and
// store) while requests flow; the worker reconnects, /readyz reflects the
// outage, and nothing is lost or doubled.
func TestBrokerRestartDuringLoad(t *testing.T) {
	ns := testnats.Start(t)
	// A request fetched as the server stopped, whose ack was lost, comes
	// back after AckWait: short here, so that it does within the wait
	// below even on a loaded machine (with the default 30 s, a run under
	// load saw one not answered within the 30 s wait).
	w := startWorker(t, ns, t.TempDir(), Options{}, "--ack-wait", "5s")
	b := newBus(t, ns)
	reqs := map[string]string{}
	publishBurst(t, b, "brk", 300, reqs)
	ns.Stop()
	testnats.Eventually(t, 10*time.Second, "readyz reports the broker outage", func() bool {
		code, why := readyReasons(w)
		return code == 503 && strings.Contains(why, "nats")
	})
	ns = ns.Restart(t)
	testnats.Eventually(t, 30*time.Second, "worker ready again", func() bool {
		code, _ := readyReasons(w)
		return code == 200
	})
	// The test's own connection reconnects too; publish another burst.
	testnats.Eventually(t, 30*time.Second, "client reconnected", b.nc.IsConnected)
	publishBurst(t, b, "brk", 300, reqs)
	checkExactlyOnce(t, w, b, "brk", reqs)
}

// TestBrokerUnreachableForAWhile: the worker's network path to NATS is cut
// (connections dropped, new ones refused) in the middle of a burst, then
// restored; the requests published meanwhile are applied afterwards.
func TestBrokerUnreachableForAWhile(t *testing.T) {
	ns := testnats.Start(t)
	px := testnats.StartProxy(t, ns.Addr().String())
	w := startWorker(t, ns, t.TempDir(), Options{}, "--nats-url", px.URL())
	b := newBus(t, ns)
	reqs := map[string]string{}
	publishBurst(t, b, "cut", 200, reqs)
	px.SetCut(true)
	testnats.Eventually(t, 10*time.Second, "readyz reports the outage", func() bool {
		code, why := readyReasons(w)
		return code == 503 && strings.Contains(why, "nats")
	})
	publishBurst(t, b, "cut", 200, reqs) // queued in the stream meanwhile
	px.SetCut(false)
	testnats.Eventually(t, 30*time.Second, "worker ready again", func() bool {
		code, _ := readyReasons(w)
		return code == 200
	})
	checkExactlyOnce(t, w, b, "cut", reqs)
}
