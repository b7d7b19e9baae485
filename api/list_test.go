package api_test

import (
	"net/url"
	"testing"

	"github.com/google/uuid"
	"github.com/telha/telha-cascade/api"
	"github.com/telha/telha-cascade/cascade"
	"github.com/telha/telha-cascade/storage"
)

type listPage struct {
	Nodes     []api.Version `json:"nodes"`
	Edges     []api.Version `json:"edges"`
	Next      *string       `json:"next"`
	AsOfValid string        `json:"as_of_valid"`
	AsOfTx    string        `json:"as_of_tx"`
}

// walkList reads every page of a listing and returns the ids seen (with
// their counts) and the coordinate of the first page.
func walkList(t *testing.T, e *apiEnv, path string) (map[string]int, string) {
	t.Helper()
	seen := map[string]int{}
	coord, next := "", ""
	for pages := 0; ; pages++ {
		p := path
		if next != "" {
			p += "&cursor=" + url.QueryEscape(next)
		}
		var pg listPage
		e.getJSON(p, 200, &pg)
		if got := pg.AsOfValid + " " + pg.AsOfTx; coord == "" {
			coord = got
		} else if got != coord {
			t.Fatalf("page %d answered at %s, the first at %s", pages, got, coord)
		}
		for _, v := range append(pg.Nodes, pg.Edges...) {
			seen[v.ID]++
		}
		if pg.Next == nil {
			return seen, coord
		}
		next = *pg.Next
	}
}

// TestListingLiveEntitiesAsOfTx: a tenant's live nodes and edges, paged,
// each once, at the coordinate asked (as_of_tx, or tx): a node tombstoned
// later is listed as of before its tombstone, not after; a bad cursor or
// both tx and as_of_tx is a 400.
func TestListingLiveEntitiesAsOfTx(t *testing.T) {
	e := newEnv(t, 100_000)
	var nodes []uuid.UUID
	var reqs []cascade.Request
	for i := 0; i < 250; i++ {
		id := uuid.New()
		nodes = append(nodes, id)
		reqs = append(reqs, cascade.Request{Op: storage.OpPutNode, ID: id})
	}
	for i := 1; i < len(nodes); i++ {
		reqs = append(reqs, cascade.Request{Op: storage.OpPutEdge, ID: uuid.New(), Src: nodes[0], Dst: nodes[i], Label: "l"})
	}
	applyAll(t, e, reqs)
	before := e.apply(cascade.Request{Op: storage.OpPutNode, ID: uuid.New()})
	dead := e.apply(cascade.Request{Op: storage.OpTombstoneNode, ID: nodes[0]})

	now, _ := walkList(t, e, "/v1/tenants/acme/nodes?limit=7")
	if len(now) != 250 || now[nodes[0].String()] != 0 {
		t.Fatalf("now: %d nodes listed (want 250, the hub dead)", len(now))
	}
	for id, n := range now {
		if n != 1 {
			t.Fatalf("node %s listed %d times", id, n)
		}
	}
	then, coord := walkList(t, e, "/v1/tenants/acme/nodes?limit=7&as_of_tx="+q(before))
	if len(then) != 251 || then[nodes[0].String()] != 1 {
		t.Fatalf("as of %s: %d nodes listed (want 251, the hub live)", fmtTs(before), len(then))
	}
	if want := " " + fmtTs(before); coord[len(coord)-len(want):] != want {
		t.Fatalf("listing as of %s answered at %s", fmtTs(before), coord)
	}
	edgesThen, _ := walkList(t, e, "/v1/tenants/acme/edges?limit=50&tx="+q(before))
	edgesNow, _ := walkList(t, e, "/v1/tenants/acme/edges?limit=50&tx="+q(dead))
	if len(edgesThen) != 249 || len(edgesNow) != 0 {
		t.Fatalf("edges: %d live before the hub's tombstone (want 249), %d after (want 0)", len(edgesThen), len(edgesNow))
	}
	for _, p := range []string{
		"/v1/tenants/acme/nodes?tx=" + q(before) + "&as_of_tx=" + q(before),
		"/v1/tenants/acme/nodes?cursor=xyz",
		"/v1/tenants/acme/nodes?limit=0",
		"/v1/tenants/acme/nodes?since=1",
	} {
		e.getJSON(p, 400, nil)
	}
}
