package app

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"testing"

	"github.com/google/uuid"
	"github.com/telha/telha-cascade/api"
	"github.com/telha/telha-cascade/internal/testnats"
	"github.com/telha/telha-cascade/queue"
)

// Tenant isolation (CONTRACT §1: every key and operation is scoped to one
// tenant; nothing may read or write across tenants), checked end to end
// through the queue and the HTTP read API with tenants whose names are
// prefixes of each other and that share node and edge ids.

var isoTenants = []string{"a", "ab", "a-b", "a_b"}

type isoGraph struct {
	n1, n2, n3, onlyA string
	e12, e23, e31     string
	hub               string
	spokes            []string // node ids
	spokeEdges        []string // hub -> spoke
}

func newIsoGraph() isoGraph {
	g := isoGraph{n1: uuid.NewString(), n2: uuid.NewString(), n3: uuid.NewString(), onlyA: uuid.NewString(),
		e12: uuid.NewString(), e23: uuid.NewString(), e31: uuid.NewString(), hub: uuid.NewString()}
	for i := 0; i < 5; i++ {
		g.spokes = append(g.spokes, uuid.NewString())
		g.spokeEdges = append(g.spokeEdges, uuid.NewString())
	}
	return g
}

func withProps(body map[string]any, tenant string) map[string]any {
	body["props"] = map[string]any{"tenant": tenant}
	if body["op"] == "put_edge" {
		body["label"] = "in-" + tenant
	}
	return body
}

func TestTenantIsolation(t *testing.T) {
	ns := testnats.Start(t)
	// max-batch-ops 20: the hub's cascade (5 edges = 28 puts) is journaled.
	w := startWorker(t, ns, t.TempDir(), Options{}, "--max-batch-ops", "20")
	b := newBus(t, ns)
	g := newIsoGraph()
	reqsOf := map[string]map[string]bool{} // tenant -> its request ids
	send := func(tn string, body map[string]any) queue.Result {
		t.Helper()
		id := b.send(tn, body)
		if reqsOf[tn] == nil {
			reqsOf[tn] = map[string]bool{}
		}
		reqsOf[tn][id] = true
		r := b.wait(id)
		if r.Tenant != tn {
			t.Fatalf("result of a %s request carries tenant %q: %+v", tn, r.Tenant, r)
		}
		return r
	}
	ok := func(tn string, body map[string]any) queue.Result {
		t.Helper()
		return mustOK(t, send(tn, body))
	}

	// The same ids in every tenant, with different props.
	for _, tn := range isoTenants {
		for _, n := range append([]string{g.n1, g.n2, g.n3, g.hub}, g.spokes...) {
			ok(tn, withProps(node(n), tn))
		}
		ok(tn, withProps(edge(g.e12, g.n1, g.n2), tn))
		ok(tn, withProps(edge(g.e23, g.n2, g.n3), tn))
		ok(tn, withProps(edge(g.e31, g.n3, g.n1), tn))
		for i, s := range g.spokes {
			ok(tn, withProps(edge(g.spokeEdges[i], g.hub, s), tn))
		}
	}
	ok("a", withProps(node(g.onlyA), "a"))
	onlyAEdge := uuid.NewString()
	ok("a", withProps(edge(onlyAEdge, g.n1, g.onlyA), "a"))

	// A node or edge that exists only in "a" does not exist for the others.
	for _, tn := range []string{"ab", "a-b", "a_b"} {
		for _, body := range []map[string]any{
			edge(uuid.NewString(), g.n1, g.onlyA),
			edge(uuid.NewString(), g.onlyA, g.n1),
			edge(uuid.NewString(), g.onlyA, g.onlyA),
			tombNode(g.onlyA),
			tombEdge(onlyAEdge),
		} {
			if r := send(tn, body); r.Status != queue.StatusNotFound || r.TxTime != "" {
				t.Errorf("%s in %s onto an id that exists only in a: %+v, want not_found", body["op"], tn, r)
			}
		}
	}
	// A body naming another tenant than its subject is refused, applied
	// nowhere.
	stray := uuid.NewString()
	for _, pair := range [][2]string{{"a", "ab"}, {"ab", "a"}, {"a-b", "a_b"}} {
		rid := uuid.NewString()
		raw := fmt.Sprintf(`{"request_id":%q,"op":"put_node","tenant":%q,"id":%q}`, rid, pair[1], stray)
		b.sendRaw("telha.req."+pair[0], []byte(raw), rid)
		if r := b.wait(rid); r.Status != queue.StatusInvalid || r.Tenant != pair[0] {
			t.Errorf("body tenant %s on subject %s: %+v", pair[1], pair[0], r)
		}
	}

	// Deletes, each in one tenant.
	if r := ok("a", tombNode(g.n2)); r.EdgesTombstoned != 2 {
		t.Errorf("cascade of n2 in a: %+v, want 2 edges", r)
	}
	ok("a-b", tombEdge(g.e31))
	if r := ok("a_b", tombNode(g.n1)); r.EdgesTombstoned != 2 {
		t.Errorf("cascade of n1 in a_b: %+v, want 2 edges", r)
	}
	if r := ok("ab", tombNode(g.hub)); !r.Journaled || r.EdgesTombstoned != 5 {
		t.Errorf("cascade of the hub in ab: %+v, want journaled with 5 edges", r)
	}
	// Deleting in one tenant what another already deleted still works.
	ok("a", tombNode(g.n1)) // a's n1 is alive (its e12 died with n2; e31 and onlyAEdge go now)

	// The expected state, per tenant.
	type state struct {
		deadNodes, deadEdges map[string]bool
		nodeVersions         map[string]int
		edgeVersions         map[string]int
	}
	set := func(ids ...string) map[string]bool {
		m := map[string]bool{}
		for _, id := range ids {
			m[id] = true
		}
		return m
	}
	want := map[string]state{
		"a":   {set(g.n2, g.n1), set(g.e12, g.e23, g.e31, onlyAEdge), map[string]int{g.n1: 2, g.n2: 2}, map[string]int{g.e12: 2, g.e23: 2, g.e31: 2, onlyAEdge: 2}},
		"ab":  {set(g.hub), set(g.spokeEdges...), map[string]int{g.hub: 2}, map[string]int{}},
		"a-b": {set(), set(g.e31), nil, map[string]int{g.e31: 2}},
		"a_b": {set(g.n1), set(g.e12, g.e31), map[string]int{g.n1: 2}, map[string]int{g.e12: 2, g.e31: 2}},
	}
	for _, e := range g.spokeEdges {
		want["ab"].edgeVersions[e] = 2
	}
	type edgeDef struct{ id, src, dst string }
	edgesOf := func(tn string) []edgeDef {
		es := []edgeDef{{g.e12, g.n1, g.n2}, {g.e23, g.n2, g.n3}, {g.e31, g.n3, g.n1}}
		for i, s := range g.spokes {
			es = append(es, edgeDef{g.spokeEdges[i], g.hub, s})
		}
		if tn == "a" {
			es = append(es, edgeDef{onlyAEdge, g.n1, g.onlyA})
		}
		return es
	}
	nodesOf := func(tn string) []string {
		ns := append([]string{g.n1, g.n2, g.n3, g.hub}, g.spokes...)
		if tn == "a" {
			ns = append(ns, g.onlyA)
		}
		return ns
	}

	for _, tn := range isoTenants {
		st := want[tn]
		base := "/v1/tenants/" + tn
		// Point reads: live ones carry this tenant's props.
		for _, n := range nodesOf(tn) {
			var v api.Version
			code := w.get(base+"/nodes/"+n, &v)
			switch {
			case st.deadNodes[n] && code != 404:
				t.Errorf("%s: deleted node %s reads %d", tn, n, code)
			case !st.deadNodes[n] && (code != 200 || string(v.Props) != `{"tenant":"`+tn+`"}`):
				t.Errorf("%s: node %s reads %d %s", tn, n, code, v.Props)
			}
		}
		for _, e := range edgesOf(tn) {
			var v api.Version
			code := w.get(base+"/edges/"+e.id, &v)
			switch {
			case st.deadEdges[e.id] && code != 404:
				t.Errorf("%s: deleted edge %s reads %d", tn, e.id, code)
			case !st.deadEdges[e.id] && (code != 200 || *v.Label != "in-"+tn || *v.Src != e.src || *v.Dst != e.dst):
				t.Errorf("%s: edge %s reads %d %+v", tn, e.id, code, v)
			}
		}
		if tn != "a" {
			if code := w.get(base+"/nodes/"+g.onlyA, nil); code != 404 {
				t.Errorf("%s: a's node reads %d", tn, code)
			}
			if code := w.get(base+"/edges/"+onlyAEdge, nil); code != 404 {
				t.Errorf("%s: a's edge reads %d", tn, code)
			}
		}
		// Adjacency, each direction: exactly this tenant's live edges.
		for _, n := range nodesOf(tn) {
			for _, dir := range []string{"out", "in", "both"} {
				var wantIDs []string
				for _, e := range edgesOf(tn) {
					if st.deadEdges[e.id] {
						continue
					}
					if (dir != "in" && e.src == n) || (dir != "out" && e.dst == n) {
						wantIDs = append(wantIDs, e.id)
					}
				}
				var es struct{ Edges []api.Version }
				if code := w.get(base+"/nodes/"+n+"/edges?dir="+dir, &es); code != 200 {
					t.Fatalf("%s: edges of %s: %d", tn, n, code)
				}
				var got []string
				for _, v := range es.Edges {
					got = append(got, v.ID)
					if *v.Label != "in-"+tn {
						t.Errorf("%s: edges of %s list %s with label %q", tn, n, v.ID, *v.Label)
					}
				}
				sort.Strings(got)
				sort.Strings(wantIDs)
				if !slices.Equal(got, wantIDs) {
					t.Errorf("%s: %s edges of %s = %v, want %v", tn, dir, n, got, wantIDs)
				}
			}
		}
		// Histories: this tenant's versions only, written by its requests.
		check := func(kind, id string, n int) {
			t.Helper()
			if n == 0 {
				n = 1
			}
			var h struct{ Versions []api.Version }
			w.get(base+"/"+kind+"/"+id+"/history", &h)
			if len(h.Versions) != n {
				t.Errorf("%s: history of %s %s has %d versions, want %d", tn, kind, id, len(h.Versions), n)
			}
			for _, v := range h.Versions {
				if !reqsOf[tn][v.Provenance.RequestID] {
					t.Errorf("%s: %s %s has a version written by request %q of another tenant", tn, kind, id, v.Provenance.RequestID)
				}
				if !v.Tombstone && string(v.Props) != `{"tenant":"`+tn+`"}` {
					t.Errorf("%s: %s %s has a version with props %s", tn, kind, id, v.Props)
				}
			}
		}
		for _, n := range nodesOf(tn) {
			check("nodes", n, st.nodeVersions[n])
		}
		for _, e := range edgesOf(tn) {
			check("edges", e.id, st.edgeVersions[e.id])
		}
	}
	// The stray request (wrong tenant in the body) wrote nothing anywhere.
	for _, tn := range isoTenants {
		var h struct{ Versions []api.Version }
		w.get("/v1/tenants/"+tn+"/nodes/"+stray+"/history", &h)
		if len(h.Versions) != 0 {
			t.Errorf("%s: the refused cross-tenant request wrote %+v", tn, h.Versions)
		}
	}
	// The store's tenant registry holds exactly the four.
	var names []string
	for _, sc := range w.app.Store().Tenants() {
		names = append(names, sc.Tenant())
	}
	sort.Strings(names)
	if wantNames := slices.Sorted(slices.Values(isoTenants)); !slices.Equal(names, wantNames) {
		t.Errorf("tenants %v, want %v", names, wantNames)
	}
}

// TestTenantIsolationJournalFence: while a journaled cascade of node H in
// tenant "a" is held between its commit point and its first chunk, edge
// writes onto H in "a" are cascade_in_flight, but onto the same id H in
// "ab" (another tenant's node) they apply; the held cascade then tombstones
// only "a"'s edges.
func TestTenantIsolationJournalFence(t *testing.T) {
	ns := testnats.Start(t)
	hold, opts := newChunkHold()
	w := startWorker(t, ns, t.TempDir(), opts, "--max-batch-ops", "20")
	b := newBus(t, ns)
	hub, other := uuid.NewString(), uuid.NewString()
	var hubEdges []string
	for _, tn := range []string{"a", "ab"} {
		mustOK(t, b.wait(b.send(tn, node(hub))))
		mustOK(t, b.wait(b.send(tn, node(other))))
	}
	for i := 0; i < 5; i++ {
		e := uuid.NewString()
		hubEdges = append(hubEdges, e)
		for _, tn := range []string{"a", "ab"} {
			mustOK(t, b.wait(b.send(tn, edge(e, hub, other))))
		}
	}
	hold.arm() // the journal lands; its first chunk waits
	id := b.send("a", tombNode(hub))
	<-hold.held
	var js struct{ Journals []api.Journal }
	w.get("/v1/journals", &js)
	if len(js.Journals) != 1 || js.Journals[0].Tenant != "a" || js.Journals[0].NodeID != hub {
		t.Fatalf("journals while held: %+v", js.Journals)
	}
	if r := b.wait(b.send("a", edge(uuid.NewString(), other, hub))); r.Status != queue.StatusCascadeInFlight {
		t.Errorf("edge onto the fenced node in a: %+v", r)
	}
	lateAB := uuid.NewString()
	mustOK(t, b.wait(b.send("ab", edge(lateAB, other, hub))))
	mustOK(t, b.wait(b.send("ab", node(hub)))) // a new version of ab's hub
	close(hold.release)
	if r := mustOK(t, b.wait(id)); !r.Journaled || r.EdgesTombstoned != 5 {
		t.Fatalf("held cascade: %+v", r)
	}
	var es struct{ Edges []api.Version }
	w.get("/v1/tenants/a/nodes/"+hub+"/edges", &es)
	if len(es.Edges) != 0 {
		t.Errorf("a's hub keeps %d live edges", len(es.Edges))
	}
	w.get("/v1/tenants/ab/nodes/"+hub+"/edges", &es)
	if len(es.Edges) != 6 {
		t.Errorf("ab's hub has %d live edges, want 6 (untouched by a's cascade)", len(es.Edges))
	}
	if code := w.get("/v1/tenants/ab/nodes/"+hub, nil); code != 200 {
		t.Errorf("ab's hub reads %d", code)
	}
}

// TestTenantIsolationSameRequestID: request ids are scoped to their tenant
// (receipts are keyed by tenant): the same request_id used by two tenants
// applies in both, each with its own result.
func TestTenantIsolationSameRequestID(t *testing.T) {
	ns := testnats.Start(t)
	w := startWorker(t, ns, t.TempDir(), Options{})
	b := newBus(t, ns)
	n := uuid.NewString()
	const rid = "shared-request-1"
	// Distinct Nats-Msg-Ids, so that the stream does not drop the second
	// (see TestTenantIsolationPublisherDedup).
	for _, tn := range []string{"a", "ab"} {
		raw, _ := json.Marshal(map[string]any{"request_id": rid, "op": "put_node", "tenant": tn, "id": n, "props": map[string]any{"t": tn}})
		b.sendRaw("telha.req."+tn, raw, tn+"/"+rid)
	}
	rs := b.waitN(rid, 2)
	byTenant := map[string]queue.Result{}
	for _, r := range rs {
		byTenant[r.Tenant] = r
	}
	ra, rab := byTenant["a"], byTenant["ab"]
	mustOK(t, ra)
	mustOK(t, rab)
	if ra.TxTime == rab.TxTime {
		t.Fatalf("the second tenant got the first one's receipt: %+v %+v", ra, rab)
	}
	for _, tn := range []string{"a", "ab"} {
		var v api.Version
		if code := w.get("/v1/tenants/"+tn+"/nodes/"+n, &v); code != 200 || string(v.Props) != `{"t":"`+tn+`"}` || v.Provenance.RequestID != rid {
			t.Errorf("%s: node %d %+v", tn, code, v)
		}
	}
	// Both results are kept by TELHA_RES, where Client.Wait/Results look.
	if got := b.storedResultsN(rid, 2); len(got) != 2 {
		t.Fatalf("TELHA_RES kept %d results of request %s used in two tenants, want 2: %+v", len(got), rid, got)
	}
}

// TestTenantIsolationPublisherDedup: the request stream's duplicate window
// spans tenants, so the project's client publishes with Nats-Msg-Id
// <tenant>.<request_id>: tenant "ab" publishing a request_id that tenant
// "a" used within the window is not dropped, and both apply.
func TestTenantIsolationPublisherDedup(t *testing.T) {
	ns := testnats.Start(t)
	w := startWorker(t, ns, t.TempDir(), Options{})
	b := newBus(t, ns)
	n := uuid.NewString()
	const rid = "order-1001"
	var dup []bool
	for _, tn := range []string{"a", "ab"} {
		raw, _ := json.Marshal(map[string]any{"request_id": rid, "op": "put_node", "tenant": tn, "id": n})
		ack, err := b.client.Publish(context.Background(), tn, rid, raw)
		if err != nil {
			t.Fatal(err)
		}
		dup = append(dup, ack.Duplicate)
	}
	if dup[1] {
		t.Fatal("the second tenant's publish was dropped as a duplicate of the first's")
	}
	rs := b.waitN(rid, 2)
	for _, tn := range []string{"a", "ab"} {
		if code := w.get("/v1/tenants/"+tn+"/nodes/"+n, nil); code != 200 {
			t.Errorf("%s: node %d (results %+v)", tn, code, rs)
		}
	}
}
