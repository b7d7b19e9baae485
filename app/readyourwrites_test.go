package app

import (
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/google/uuid"
	"github.com/telha/telha-cascade/internal/testnats"
	"github.com/telha/telha-cascade/queue"
)

// TestReadYourWrites (CONTRACT §6): a mixed workload (puts, edge and node
// tombstones, hubs big enough to be journaled) is published from many
// goroutines at once; the moment each ok result arrives its sender reads
// the entity at ?tx=<tx_time> and must see its write: a put answers 200
// with that version (tx_from = tx_time) at as_of_tx = tx_time, a
// tombstone answers 404 at as_of_tx = tx_time. The one exception the
// contract allows is a read whose answer says a cascade is in flight on
// it (cascade_in_flight, and as_of_tx below the tx_time); those are
// counted and must carry the flag.
func TestReadYourWrites(t *testing.T) {
	ns := testnats.Start(t)
	w := startWorker(t, ns, t.TempDir(), Options{}, "--max-batch-ops", "60", "--journal-chunk-ops", "20", "--group-max", "64")
	b := newBus(t, ns)
	const tenant = "ryw"

	// A shared graph: hubs with more edges than --max-batch-ops (their
	// deletes are journaled, and race the edges published onto them) and
	// plain nodes. Tombstoned nodes stay dead (ids are not reused), so the
	// workload keeps adding nodes.
	hubs, pool := ids(6), ids(40)
	for _, id := range append(append([]string{}, hubs...), pool...) {
		mustOK(t, b.wait(b.send(tenant, node(id))))
	}
	var pre []string
	for _, h := range hubs {
		for i := 0; i < 80; i++ {
			pre = append(pre, b.send(tenant, edge(uuid.NewString(), h, pool[i%len(pool)])))
		}
	}
	for _, id := range pre {
		mustOK(t, b.wait(id))
	}

	var (
		mu       sync.Mutex
		edges    []string // edges put so far (candidates for tombstone_edge)
		checked  atomic.Int64
		inFlight atomic.Int64
		statuses sync.Map // results that were not ok, by status
		failures = make(chan string, 64)
	)
	fail := func(format string, args ...any) {
		select {
		case failures <- fmt.Sprintf(format, args...):
		default:
		}
	}
	// readAt reads path at tx and checks the answer against the write.
	readAt := func(kind, path, tx string, wantLive bool) {
		var body map[string]any
		code := w.get(path+"?tx="+url.QueryEscape(tx), &body)
		asOf, _ := body["as_of_tx"].(string)
		if body["cascade_in_flight"] != nil {
			if asOf >= tx {
				fail("%s %s at tx %s: cascade_in_flight but answered at %s, not below the write", kind, path, tx, asOf)
			}
			inFlight.Add(1)
			return
		}
		switch {
		case asOf != tx:
			fail("%s %s at tx %s: answered at as_of_tx %q", kind, path, tx, asOf)
		case wantLive && (code != http.StatusOK || body["tx_from"] != tx):
			fail("%s %s at tx %s: %d tx_from %v, want 200 with the write's version", kind, path, tx, code, body["tx_from"])
		case !wantLive && code != http.StatusNotFound:
			fail("%s %s at tx %s: %d, want 404 (tombstoned)", kind, path, tx, code)
		}
		checked.Add(1)
	}

	const senders, perSender = 8, 60
	var wg sync.WaitGroup
	for s := 0; s < senders; s++ {
		wg.Add(1)
		go func(seed uint64) {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(seed, 99))
			for i := 0; i < perSender; i++ {
				var body map[string]any
				var kind, path string
				live := true
				pick := func() string { // a node of the pool
					mu.Lock()
					defer mu.Unlock()
					return pool[rng.IntN(len(pool))]
				}
				switch k := rng.IntN(20); {
				case k < 11: // an edge, onto a hub half the time
					src, dst := pick(), pick()
					if k%2 == 0 {
						src = hubs[rng.IntN(len(hubs))]
					}
					id := uuid.NewString()
					body, kind, path = edge(id, src, dst), "put_edge", "/v1/tenants/"+tenant+"/edges/"+id
				case k < 15:
					id := uuid.NewString()
					body, kind, path = node(id), "put_node", "/v1/tenants/"+tenant+"/nodes/"+id
				case k < 18:
					mu.Lock()
					if len(edges) == 0 {
						mu.Unlock()
						continue
					}
					id := edges[rng.IntN(len(edges))]
					mu.Unlock()
					body, kind, path, live = tombEdge(id), "tombstone_edge", "/v1/tenants/"+tenant+"/edges/"+id, false
				case k < 19: // delete a plain node (inline: few edges)
					id := pick()
					body, kind, path, live = tombNode(id), "tombstone_node", "/v1/tenants/"+tenant+"/nodes/"+id, false
				default: // a hub (journaled while it has more than 60 edges)
					id := hubs[rng.IntN(len(hubs))]
					body, kind, path, live = tombNode(id), "tombstone_node", "/v1/tenants/"+tenant+"/nodes/"+id, false
				}
				r := b.wait(b.send(tenant, body))
				if r.Status != queue.StatusOK {
					c, _ := statuses.LoadOrStore(kind+" "+string(r.Status), new(atomic.Int64))
					c.(*atomic.Int64).Add(1)
					continue
				}
				readAt(kind, path, r.TxTime, live)
				mu.Lock()
				switch kind {
				case "put_edge":
					edges = append(edges, body["id"].(string))
				case "put_node":
					pool = append(pool, body["id"].(string))
				}
				mu.Unlock()
			}
		}(uint64(s))
	}
	wg.Wait()
	close(failures)
	n := 0
	for f := range failures {
		if n++; n <= 10 {
			t.Error(f)
		}
	}
	notOK := map[string]int64{}
	statuses.Range(func(k, v any) bool { notOK[k.(string)] = v.(*atomic.Int64).Load(); return true })
	t.Logf("%d ok writes read back at their tx_time, %d answered below it with cascade_in_flight; not ok: %v", checked.Load(), inFlight.Load(), notOK)
	if checked.Load() < senders*perSender/4 {
		t.Fatalf("only %d writes checked", checked.Load())
	}
	if m := metricValue(t, w, "telha_journal_chunks_applied_total"); m == 0 {
		t.Fatal("no cascade was journaled: the workload did not race reads against journals")
	}
}
