package app

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/url"
	"sort"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/telha/telha-cascade/api"
	"github.com/telha/telha-cascade/internal/testnats"
	"github.com/telha/telha-cascade/queue"
	"github.com/telha/telha-cascade/storage"
)

// TestConcurrentStressThroughTheWorker is the one-writer issue's stress,
// black-box through NATS and the read API of a real worker: several
// journaled hubs finish while requests that touch them stream in (put_edge
// to and from a hub, put_node of a hub, more tombstone_node of a hub,
// tombstone_edge of a hub's edges, cascades of the hubs' neighbours) mixed
// with unrelated writes. Then the audit: every request has exactly one
// result; exactly one tombstone_node accepted per node and one tombstone in
// its history; no write accepted against a node at a tx after its
// tombstone; no live edge on a dead node at any tx from its cascade's tx on
// (at the cascade's coordinate, just after it, at every later accepted tx
// and now); no journal left. Several rounds, each with its own seed.
func TestConcurrentStressThroughTheWorker(t *testing.T) {
	seeds := []uint64{11, 45, 76}
	if testing.Short() {
		seeds = seeds[:1]
	}
	for _, seed := range seeds {
		t.Run(fmt.Sprint("seed_", seed), func(t *testing.T) { stressRound(t, seed, false) })
	}
}

// TestConcurrentStressWithErasures is the same race with erase_node and
// erase_edge among the requests (half the hubs erased instead of
// tombstoned, some edge tombstones and neighbour cascades erases): the same
// checks (one tombstone per dead node, no write after its death, no ghost),
// and every version of an erased node, and of every hub edge of an erased
// hub, reads erased.
func TestConcurrentStressWithErasures(t *testing.T) {
	seeds := []uint64{5, 29}
	if testing.Short() {
		seeds = seeds[:1]
	}
	for _, seed := range seeds {
		t.Run(fmt.Sprint("seed_", seed), func(t *testing.T) { stressRound(t, seed, true) })
	}
}

func eraseOf(body map[string]any) map[string]any {
	op := "erase_node"
	if body["op"] == "tombstone_edge" {
		op = "erase_edge"
	}
	return map[string]any{"op": op, "id": body["id"], "provenance": map[string]any{"actor": "dpo", "reason": "art. 17"}}
}

type stressReq struct {
	id   string
	body map[string]any
}

func stressRound(t *testing.T, seed uint64, erase bool) {
	const (
		tenant  = "stress"
		hubs    = 6
		perHub  = 150 // 150*5+3 puts, over --max-batch-ops 300: journaled
		others  = 50
		touches = 1500
	)
	r := rand.New(rand.NewPCG(seed, 1))
	ns := testnats.Start(t)
	w := startWorker(t, ns, t.TempDir(), Options{}, "--max-batch-ops", "300", "--journal-chunk-ops", "100")
	b := newBus(t, ns)
	uid := func() string { return uuid.NewString() }

	var hubIDs, otherIDs []string
	var build []stressReq
	add := func(list *[]stressReq, body map[string]any) string {
		id := uid()
		body["request_id"], body["tenant"] = id, tenant
		*list = append(*list, stressReq{id, body})
		return id
	}
	for i := 0; i < hubs; i++ {
		hubIDs = append(hubIDs, uid())
		add(&build, node(hubIDs[i]))
	}
	for i := 0; i < others; i++ {
		otherIDs = append(otherIDs, uid())
		add(&build, node(otherIDs[i]))
	}
	hubEdges := map[string][]string{}
	for _, h := range hubIDs {
		for i := 0; i < perHub; i++ {
			e, o := uid(), otherIDs[r.IntN(others)]
			if r.IntN(2) == 0 {
				add(&build, edge(e, h, o))
			} else {
				add(&build, edge(e, o, h))
			}
			hubEdges[h] = append(hubEdges[h], e)
		}
	}
	publishAll(t, b, tenant, build[:hubs+others])
	waitAll(t, b, build[:hubs+others])
	publishAll(t, b, tenant, build[hubs+others:])
	for _, q := range waitAll(t, b, build) {
		mustOK(t, q)
	}

	// The hubs' cascades first, then the stream that races them.
	var race []stressReq
	maybeErase := func(body map[string]any) map[string]any {
		if erase && r.IntN(2) == 0 {
			return eraseOf(body)
		}
		return body
	}
	for _, h := range hubIDs {
		add(&race, maybeErase(tombNode(h)))
	}
	for i := 0; i < touches; i++ {
		h := hubIDs[r.IntN(hubs)]
		o := otherIDs[r.IntN(others)]
		switch k := r.IntN(20); {
		case k < 6:
			add(&race, edge(uid(), o, h))
		case k < 10:
			add(&race, edge(uid(), h, o))
		case k < 12:
			add(&race, node(h))
		case k < 13:
			add(&race, maybeErase(tombNode(h)))
		case k < 15:
			add(&race, maybeErase(tombEdge(hubEdges[h][r.IntN(perHub)])))
		case k < 16:
			add(&race, maybeErase(tombNode(o))) // a neighbour's cascade, sharing edges with hubs
		case k < 18:
			add(&race, edge(uid(), o, otherIDs[r.IntN(others)])) // unrelated
		default:
			add(&race, node(uid()))
		}
	}
	publishAll(t, b, tenant, race)
	res := waitAll(t, b, race)

	// Every request exactly one result, seen once and stored once.
	b.mu.Lock()
	for _, q := range race {
		if n := len(b.results[q.id]); n != 1 {
			t.Errorf("request %s: %d results", q.id, n)
		}
	}
	b.mu.Unlock()

	// Exactly one accepted tombstone_node per node, one tombstone in its
	// history; its tx.
	dead := map[string]storage.Ts{}
	erasedNodes := map[string]bool{}
	journaled := 0
	for _, q := range race {
		rs := res[q.id]
		if q.body["op"] != "tombstone_node" || rs.Status != queue.StatusOK {
			continue
		}
		id := q.body["id"].(string)
		if _, dup := dead[id]; dup {
			t.Errorf("node %s: a second tombstone_node accepted (%s)", id, q.id)
		}
		dead[id] = parseTx(t, rs.TxTime)
		if rs.Journaled {
			journaled++
		}
	}
	// An erase_node is ok on a dead node too; its tx_time is the node's
	// tombstone when it wrote it, else later: the node died at the
	// earliest.
	for _, q := range race {
		rs := res[q.id]
		if q.body["op"] != "erase_node" || rs.Status != queue.StatusOK {
			continue
		}
		id := q.body["id"].(string)
		erasedNodes[id] = true
		if tx := parseTx(t, rs.TxTime); dead[id] == 0 || tx < dead[id] {
			dead[id] = tx
		}
		if rs.EdgesTombstoned > 0 {
			journaled++ // the erase's own cascade (hubs: over --max-batch-ops)
		}
	}
	for _, h := range hubIDs {
		if _, ok := dead[h]; !ok {
			t.Fatalf("hub %s: no tombstone_node accepted", h)
		}
	}
	if journaled < hubs {
		t.Fatalf("%d journaled cascades, want at least %d", journaled, hubs)
	}
	for id, tx := range dead {
		var h struct{ Versions []api.Version }
		w.get("/v1/tenants/"+tenant+"/nodes/"+id+"/history", &h)
		tombs := 0
		for _, v := range h.Versions {
			if v.Tombstone {
				tombs++
				if v.TxFrom == nil || parseTx(t, *v.TxFrom) != tx {
					t.Errorf("node %s: tombstone at %v, its result said %s", id, v.TxFrom, tx)
				}
			}
		}
		if tombs != 1 {
			t.Errorf("node %s: %d tombstones in its history", id, tombs)
		}
	}

	// No write accepted against a node at a tx after its tombstone.
	var oks []storage.Ts
	for _, q := range race {
		rs := res[q.id]
		if rs.Status != queue.StatusOK {
			continue
		}
		tx := parseTx(t, rs.TxTime)
		oks = append(oks, tx)
		var touched []string
		switch q.body["op"] {
		case "put_node":
			touched = []string{q.body["id"].(string)}
		case "put_edge":
			touched = []string{q.body["src"].(string), q.body["dst"].(string)}
		}
		for _, n := range touched {
			if d, ok := dead[n]; ok && tx > d {
				t.Errorf("%s %s accepted at tx %s, after node %s died at %s", q.body["op"], q.id, tx, n, d)
			}
		}
	}
	sort.Slice(oks, func(i, j int) bool { return oks[i] < oks[j] })

	// No live edge on a dead node at any tx from its cascade's on.
	now := storage.TsFromTime(time.Now().Add(time.Hour))
	for id, d := range dead {
		coords := []storage.Ts{d, d + 1, now}
		for _, tx := range oks {
			if tx > d && r.IntN(40) == 0 {
				coords = append(coords, tx)
			}
		}
		for _, tx := range coords {
			for _, v := range []storage.Ts{d, now} {
				var es struct{ Edges []api.Version }
				q := fmt.Sprintf("/v1/tenants/%s/nodes/%s/edges?dir=both&tx=%s&valid=%s", tenant, id,
					url.QueryEscape(tx.Time().Format(storage.TimeLayout)), url.QueryEscape(v.Time().Format(storage.TimeLayout)))
				if code := w.get(q, &es); code != 200 {
					t.Fatalf("GET %s: %d", q, code)
				}
				for _, e := range es.Edges {
					t.Errorf("ghost: edge %s reads live at (valid %s, tx %s) beside node %s, dead since tx %s", e.ID, v, tx, id, d)
				}
			}
		}
	}
	// Erased: every version of an erased node and of its hub edges.
	for id := range erasedNodes {
		paths := []string{"/nodes/" + id}
		for _, e := range hubEdges[id] {
			paths = append(paths, "/edges/"+e)
		}
		for _, p := range paths {
			var h struct{ Versions []api.Version }
			if code := w.get("/v1/tenants/"+tenant+p+"/history", &h); code != 200 {
				t.Fatalf("history of %s: %d", p, code)
			}
			for _, v := range h.Versions {
				if !v.Erased || string(v.Props) != "null" {
					t.Errorf("%s (of erased node %s): version at %v not erased", p, id, *v.TxFrom)
				}
			}
		}
	}
	if erase && len(erasedNodes) == 0 {
		t.Fatal("no erase_node accepted: the round raced no erasure")
	}
	var js struct{ Journals []api.Journal }
	w.get("/v1/journals", &js)
	if len(js.Journals) != 0 {
		t.Fatalf("journals left: %+v", js.Journals)
	}
	byStatus := map[string]int{}
	for _, q := range race {
		byStatus[q.body["op"].(string)+":"+res[q.id].Status]++
	}
	t.Logf("seed %d: %d racing requests, %d cascades accepted (%d journaled); %v", seed, len(race), len(dead), journaled, byStatus)
}

func publishAll(t *testing.T, b *bus, tenant string, reqs []stressReq) {
	t.Helper()
	for _, q := range reqs {
		raw, _ := json.Marshal(q.body)
		if _, err := b.client.PublishAsync(tenant, q.id, raw); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case <-b.client.JetStream().PublishAsyncComplete():
	case <-time.After(30 * time.Second):
		t.Fatal("publishes not acknowledged within 30s")
	}
}

// waitAll waits for the first result of every request (60 s at most).
func waitAll(t *testing.T, b *bus, reqs []stressReq) map[string]queue.Result {
	t.Helper()
	out := map[string]queue.Result{}
	deadline := time.After(60 * time.Second)
	for {
		b.mu.Lock()
		for _, q := range reqs {
			if rs := b.results[q.id]; len(rs) > 0 {
				out[q.id] = rs[0]
			}
		}
		ch := b.changed
		b.mu.Unlock()
		if len(out) == len(reqs) {
			return out
		}
		select {
		case <-ch:
		case <-deadline:
			t.Fatalf("%d of %d results within 60s", len(out), len(reqs))
		}
	}
}

func parseTx(t *testing.T, s string) storage.Ts {
	t.Helper()
	ts, err := storage.ParseTs(s)
	if err != nil {
		t.Fatalf("tx %q: %v", s, err)
	}
	return ts
}
