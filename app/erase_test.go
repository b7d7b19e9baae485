package app

import (
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/telha/telha-cascade/api"
	"github.com/telha/telha-cascade/cascade"
	"github.com/telha/telha-cascade/internal/diskscan"
	"github.com/telha/telha-cascade/internal/testnats"
	"github.com/telha/telha-cascade/queue"
	"github.com/telha/telha-cascade/storage"
)

func withMarker(body map[string]any, marker string) map[string]any {
	body["props"] = map[string]any{"name": marker, "email": marker + "@example.org"}
	body["provenance"] = map[string]any{"actor": marker + "-actor", "reason": "signup", "source": marker + "-crm"}
	return body
}

func eraseNode(id, reason string) map[string]any {
	return map[string]any{"op": "erase_node", "id": id, "provenance": map[string]any{"actor": "dpo", "reason": reason}}
}

func eraseEdge(id, reason string) map[string]any {
	return map[string]any{"op": "erase_edge", "id": id, "provenance": map[string]any{"actor": "dpo", "reason": reason}}
}

// filesWith lists the files under dir holding s, byte by byte.
func filesWith(t *testing.T, dir, s string) []string {
	t.Helper()
	hits, err := diskscan.FilesContaining(dir, s)
	if err != nil {
		t.Fatal(err)
	}
	return hits
}

// TestE2EErase: erase_node of a live hub (journaled: more edges than
// --max-batch-ops) and erase_edge of a live edge, through the queue: the
// results carry versions_erased; the entities read dead with every version
// erased (props null, actor/reason/source empty) and liveness otherwise as
// before; the erasure records answer; a second erase is ok with zero
// versions; an erase without a reason is invalid; and no file under the
// Pebble directory holds the erased data any more.
func TestE2EErase(t *testing.T) {
	ns := testnats.Start(t)
	dir := t.TempDir()
	w := startWorker(t, ns, dir, Options{}, "--max-batch-ops", "60", "--journal-chunk-ops", "20")
	b := newBus(t, ns)
	const tenant = "gdpr"
	hub, other, keep := uuid.NewString(), uuid.NewString(), uuid.NewString()
	hubMark, edgeMark, keepMark := diskscan.Marker("HUB"), diskscan.Marker("EDGE"), diskscan.Marker("KEEP")
	mustOK(t, b.wait(b.send(tenant, withMarker(node(hub), hubMark))))
	mustOK(t, b.wait(b.send(tenant, node(other))))
	mustOK(t, b.wait(b.send(tenant, withMarker(node(keep), keepMark))))
	var hubEdges []string
	for i := 0; i < 30; i++ {
		id := uuid.NewString()
		hubEdges = append(hubEdges, id)
		mustOK(t, b.wait(b.send(tenant, withMarker(edge(id, hub, other), hubMark))))
	}
	lone := uuid.NewString()
	mustOK(t, b.wait(b.send(tenant, withMarker(edge(lone, other, keep), edgeMark))))
	pebbleDir := filepath.Join(dir, "pebble")
	if len(filesWith(t, pebbleDir, hubMark)) == 0 {
		t.Fatal("the marker is on no file before the erase: the disk check would prove nothing")
	}

	// No reason: invalid, dead-lettered, nothing erased.
	if r := b.wait(b.send(tenant, map[string]any{"op": "erase_node", "id": hub})); r.Status != queue.StatusInvalid || !strings.Contains(r.Error, "provenance.reason") {
		t.Fatalf("erase_node without a reason: %+v", r)
	}

	rid := b.send(tenant, eraseNode(hub, "GDPR art. 17, ticket 4711"))
	r := mustOK(t, b.wait(rid))
	if r.VersionsErased == nil || *r.VersionsErased < 31 || r.Op != "erase_node" || r.EdgesTombstoned != 30 {
		t.Fatalf("erase_node result: %+v (versions_erased %v), want >= 31 versions and 30 edges tombstoned", r, r.VersionsErased)
	}
	re := mustOK(t, b.wait(b.send(tenant, eraseEdge(lone, "GDPR art. 17, ticket 4712"))))
	if re.VersionsErased == nil || *re.VersionsErased != 2 { // its put and the tombstone the erase wrote
		t.Fatalf("erase_edge result: %+v", re)
	}

	// Dead at the result's tx_time and now; every version erased.
	if code := w.get("/v1/tenants/"+tenant+"/nodes/"+hub+"?tx="+r.TxTime, nil); code != http.StatusNotFound {
		t.Fatalf("hub at its erase's tx_time: %d, want 404", code)
	}
	for _, path := range []string{"/nodes/" + hub, "/edges/" + hubEdges[0], "/edges/" + lone} {
		var h struct{ Versions []api.Version }
		if code := w.get("/v1/tenants/"+tenant+path+"/history", &h); code != http.StatusOK || len(h.Versions) < 2 {
			t.Fatalf("history of %s: %d %+v", path, code, h)
		}
		for _, v := range h.Versions {
			if !v.Erased || string(v.Props) != "null" || v.Provenance.Actor != "" || v.Provenance.Source != "" || v.Provenance.Reason != "" {
				t.Fatalf("%s: version at %v not erased: %+v", path, *v.TxFrom, v)
			}
		}
	}
	// Untouched: the node that was not erased keeps its data.
	var kv api.Version
	if code := w.get("/v1/tenants/"+tenant+"/nodes/"+keep, &kv); code != http.StatusOK || kv.Erased || !strings.Contains(string(kv.Props), keepMark) {
		t.Fatalf("node not erased: %d %+v", code, kv)
	}

	var rec api.Erasure
	if code := w.get("/v1/tenants/"+tenant+"/erasures/"+rid, &rec); code != http.StatusOK || rec.State != "done" ||
		rec.VersionsErased != *r.VersionsErased || rec.Reason != "GDPR art. 17, ticket 4711" || rec.Actor != "dpo" || !strings.HasPrefix(rec.Digest, "sha256:") {
		t.Fatalf("erasure record: %d %+v", code, rec)
	}
	var req api.Request
	if code := w.get("/v1/tenants/"+tenant+"/requests/"+rid, &req); code != http.StatusOK || req.VersionsErased == nil || *req.VersionsErased != *r.VersionsErased {
		t.Fatalf("request lookup: %d %+v", code, req)
	}
	if code := w.get("/v1/tenants/"+tenant+"/erasures/nope", nil); code != http.StatusNotFound {
		t.Fatalf("unknown erasure: %d", code)
	}

	// Idempotent: again, under another request id, erases nothing.
	again := mustOK(t, b.wait(b.send(tenant, eraseNode(hub, "again"))))
	if again.VersionsErased == nil || *again.VersionsErased != 0 {
		t.Fatalf("second erase_node: %+v", again)
	}
	if r := b.wait(b.send(tenant, eraseNode(uuid.NewString(), "who?"))); r.Status != queue.StatusNotFound {
		t.Fatalf("erase_node of an unknown node: %+v", r)
	}

	for _, m := range []string{hubMark, edgeMark} {
		if hits := filesWith(t, pebbleDir, m); len(hits) > 0 {
			t.Fatalf("erased data %s still on disk in %v", m, hits)
		}
	}
	if hits := filesWith(t, pebbleDir, keepMark); len(hits) == 0 {
		t.Fatal("data that was not erased left the disk too: the scan is wrong")
	}
}

// TestHandledRequestsLeaveTheStreamFiles: a put whose props carry a marker
// is handled; with --secure-delete-requests the worker overwrites the
// message in the request stream's files before acking it, so no file of
// the stream holds the marker; without it (the default) the ack only
// unlinks it and the bytes stay while their block holds another message.
func TestHandledRequestsLeaveTheStreamFiles(t *testing.T) {
	for _, secure := range []bool{true, false} {
		ns := testnats.Start(t)
		// Two partitions, this worker owns the one of "gdpr": a request of
		// a tenant in the other stays in the stream, so the block file
		// that holds the handled one is not dropped as empty.
		w := startWorker(t, ns, t.TempDir(), Options{}, "--partitions", "2", "--partition-owner", fmt.Sprintf("%d/2", queue.Partition("gdpr", 2)),
			fmt.Sprintf("--secure-delete-requests=%v", secure))
		b := newBus(t, ns)
		other := "t0"
		for i := 1; queue.Partition(other, 2) == queue.Partition("gdpr", 2); i++ {
			other = fmt.Sprintf("t%d", i)
		}
		b.send(other, node(uuid.NewString())) // never handled here
		mark := diskscan.Marker("NATS")
		mustOK(t, b.wait(b.send("gdpr", withMarker(node(uuid.NewString()), mark))))
		if err := w.stop(); err != nil { // the ack is on the wire before the stop returns
			t.Fatal(err)
		}
		hits := filesWith(t, filepath.Join(ns.Opts.StoreDir, "jetstream", "$G", "streams", "TELHA_REQ"), mark)
		if secure && len(hits) > 0 {
			t.Fatalf("secure delete on: the handled request is still in %v", hits)
		}
		if !secure && len(hits) == 0 {
			t.Fatal("secure delete off: the marker is in no file of the stream, so the test above proves nothing")
		}
	}
}

// TestTwoErasesOfANodeRunInTheirOrder: erases of one node sent back to
// back (most land in one group, one tx) are applied in the order they were
// sent: the first erases the node's versions and its record says so, the
// second erases none. Before, erases of one tx ran in the order of their
// heads' keys (a hash of the request id), and in about half of the pairs
// the request that really erased was recorded as erasing nothing.
func TestTwoErasesOfANodeRunInTheirOrder(t *testing.T) {
	ns := testnats.Start(t)
	w := startWorker(t, ns, t.TempDir(), Options{})
	b := newBus(t, ns)
	const tenant, pairs = "twice", 12
	type pair struct{ node, first, second string }
	var ps []pair
	for i := 0; i < pairs; i++ {
		n, o := uuid.NewString(), uuid.NewString()
		mustOK(t, b.wait(b.send(tenant, node(n))))
		mustOK(t, b.wait(b.send(tenant, node(o))))
		mustOK(t, b.wait(b.send(tenant, edge(uuid.NewString(), n, o))))
		ps = append(ps, pair{node: n})
	}
	for i := range ps {
		ps[i].first = b.send(tenant, eraseNode(ps[i].node, "first"))
		ps[i].second = b.send(tenant, eraseNode(ps[i].node, "second"))
	}
	for _, p := range ps {
		r1, r2 := mustOK(t, b.wait(p.first)), mustOK(t, b.wait(p.second))
		if r1.VersionsErased == nil || *r1.VersionsErased == 0 || r2.VersionsErased == nil || *r2.VersionsErased != 0 {
			t.Fatalf("node %s: the first erase %+v, the second %+v: want the first to erase its versions, the second none", p.node, r1, r2)
		}
		var rec api.Erasure
		if code := w.get("/v1/tenants/"+tenant+"/erasures/"+p.first, &rec); code != http.StatusOK || rec.VersionsErased != *r1.VersionsErased {
			t.Fatalf("the first erase's record: %d %+v", code, rec)
		}
	}
}

// TestEraseEdgeRevealsNoHalfCascade: while a journal runs, erase_edge of
// any edge the journal tombstones (or narrows: one dead only from after
// the journal's valid end) is refused with cascade_in_flight, whether the
// journal has reached it yet or not (as tombstone_edge is); an edge
// tombstoned before the journal began is erased. Before, an edge the
// journal had already tombstoned was erased (ok) and one it had not reached
// refused: the answers showed how far the cascade had got.
func TestEraseEdgeRevealsNoHalfCascade(t *testing.T) {
	ns := testnats.Start(t)
	opts, held, rel := holdTheFirstJournal()
	startWorker(t, ns, t.TempDir(), opts, "--max-batch-ops", "64", "--journal-chunk-ops", "32")
	t.Cleanup(rel) // before the worker stops (cleanups run last first)
	b := newBus(t, ns)
	const tenant, n = "halfway", 150
	hub := uuid.NewString()
	mustOK(t, b.wait(b.send(tenant, node(hub))))
	var edges, reqs []string
	for i := 0; i < n; i++ {
		x, e := uuid.NewString(), uuid.NewString()
		edges = append(edges, e)
		reqs = append(reqs, b.send(tenant, node(x)), b.send(tenant, edge(e, x, hub)))
	}
	for _, id := range reqs {
		mustOK(t, b.wait(id))
	}
	early := edges[0] // tombstoned before the journal: no part of it
	mustOK(t, b.wait(b.send(tenant, map[string]any{"op": "tombstone_edge", "id": early})))
	// Tombstoned from an hour ahead: the journal narrows it to its own
	// valid end, so it is part of the cascade like a live edge.
	ahead := time.Now().Add(time.Hour).UTC().Format(time.RFC3339Nano)
	mustOK(t, b.wait(b.send(tenant, map[string]any{"op": "tombstone_edge", "id": edges[1], "valid_end": ahead})))
	tomb := b.send(tenant, tombNode(hub))
	select {
	case <-held:
	case <-time.After(30 * time.Second):
		t.Fatal("the journal never reached its second chunk")
	}
	var erases []string
	for _, e := range edges {
		erases = append(erases, b.send(tenant, eraseEdge(e, "halfway")))
	}
	for i, id := range erases[1:] {
		if r := b.wait(id); r.Status != queue.StatusCascadeInFlight {
			t.Fatalf("erase_edge %d of %d while the journal is held after its first chunk: %+v, want cascade_in_flight", i+1, n, r)
		}
	}
	rel()
	// The early edge's erase was taken, and is answered once the journal
	// that touches its endpoint has finished.
	if r := b.wait(erases[0]); r.Status != queue.StatusOK || r.VersionsErased == nil {
		t.Fatalf("erase_edge of an edge tombstoned before the journal: %+v, want ok", r)
	}
	if r := mustOK(t, b.wait(tomb)); !r.Journaled || r.EdgesTombstoned != n-1 {
		t.Fatalf("the hub's tombstone: %+v, want journaled with %d edges", r, n-1)
	}
	// After the journal, the same erases are taken.
	if r := mustOK(t, b.wait(b.send(tenant, eraseEdge(edges[n-1], "after")))); r.VersionsErased == nil || *r.VersionsErased != 2 {
		t.Fatalf("erase_edge after the journal: %+v", r)
	}
}

// The request lookup of an erase_node whose node's cascade is journaled
// says, while it runs, that it is journaled, names its journal (the
// entry /v1/journals lists under its request id) and the versions erased
// so far; answered, it is journaled too. Before, it answered in_flight
// with journaled false and neither (a black-box probe, 3 of 3 hubs).
func TestTheLookupOfAJournaledEraseNamesItsJournal(t *testing.T) {
	ns := testnats.Start(t)
	opts, held, rel := holdTheFirstJournal()
	w := startWorker(t, ns, t.TempDir(), opts, "--max-batch-ops", "64", "--journal-chunk-ops", "32")
	t.Cleanup(rel) // before the worker stops (cleanups run last first)
	b := newBus(t, ns)
	const tenant, n = "lookup", 100
	hub := uuid.NewString()
	mustOK(t, b.wait(b.send(tenant, node(hub))))
	var reqs []string
	for i := 0; i < n; i++ {
		x := uuid.NewString()
		reqs = append(reqs, b.send(tenant, node(x)), b.send(tenant, edge(uuid.NewString(), hub, x)))
	}
	for _, id := range reqs {
		mustOK(t, b.wait(id))
	}
	rid := b.send(tenant, eraseNode(hub, "lookup"))
	select {
	case <-held:
	case <-time.After(30 * time.Second):
		t.Fatal("the erase's journal never reached its second chunk")
	}
	var r struct {
		State          string  `json:"state"`
		Op             string  `json:"op"`
		Journaled      bool    `json:"journaled"`
		VersionsErased *uint64 `json:"versions_erased"`
		Journal        *struct {
			RequestID string `json:"request_id"`
			NodeID    string `json:"node_id"`
		} `json:"journal"`
	}
	if code := w.get("/v1/tenants/"+tenant+"/requests/"+rid, &r); code != 200 {
		t.Fatalf("lookup of the erase in flight: %d", code)
	}
	if r.State != "in_flight" || r.Op != "erase_node" || !r.Journaled || r.Journal == nil || r.Journal.RequestID != rid || r.Journal.NodeID != hub || r.VersionsErased == nil {
		t.Fatalf("lookup of the erase while its journal is held: %+v (journal %+v), want in_flight, journaled, its journal and versions_erased", r, r.Journal)
	}
	rel()
	// Looked up while it finishes: in flight, then answered, never 404
	// (before, the receipt was read first: an erase finishing between the
	// two lookups was found in neither).
	for deadline := time.Now().Add(30 * time.Second); ; {
		var now struct {
			State string `json:"state"`
		}
		if code := w.get("/v1/tenants/"+tenant+"/requests/"+rid, &now); code != 200 {
			t.Fatalf("lookup of the erase as it finishes: %d, want 200", code)
		}
		if now.State == "answered" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the erase still %s after 30 s", now.State)
		}
	}
	if res := mustOK(t, b.wait(rid)); !res.Journaled {
		t.Fatalf("the erase's result: %+v, want journaled", res)
	}
	r.Journal, r.VersionsErased = nil, nil
	if code := w.get("/v1/tenants/"+tenant+"/requests/"+rid, &r); code != 200 || r.State != "answered" || !r.Journaled || r.VersionsErased == nil || *r.VersionsErased == 0 {
		t.Fatalf("lookup of the erase answered: %d %+v, want answered, journaled, with the versions erased", code, r)
	}
}

// holdTheFirstJournal returns worker options whose first cascade journal
// stops after its first durable chunk (held is closed then) until
// release is called (once or more).
func holdTheFirstJournal() (opts Options, held <-chan struct{}, release func()) {
	h, rel := make(chan struct{}), make(chan struct{})
	var once sync.Once
	opts = Options{CascadeHooks: cascade.Hooks{JournalStep: func(_ *storage.JournalEntry, n int) {
		if n == 2 { // the first chunk durable, the others not begun
			once.Do(func() {
				close(h)
				<-rel
			})
		}
	}}}
	return opts, h, sync.OnceFunc(func() { close(rel) })
}
