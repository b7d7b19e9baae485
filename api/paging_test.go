package api_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/telha/telha-cascade/api"
	"github.com/telha/telha-cascade/cascade"
	"github.com/telha/telha-cascade/storage"
)

type edgePage struct {
	Edges     []api.Version `json:"edges"`
	Next      *string       `json:"next"`
	AsOfValid string        `json:"as_of_valid"`
	AsOfTx    string        `json:"as_of_tx"`
}

// TestEdgesArePaged walks a node of 2,500 edges (out, in and a self-loop)
// page by page: every edge once, pages of at most limit, every page at the
// first page's coordinate (an edge added during the walk does not appear),
// and a bad limit or a foreign cursor is a 400.
func TestEdgesArePaged(t *testing.T) {
	e := newEnv(t, 100_000)
	hub := uuid.New()
	e.apply(cascade.Request{Op: storage.OpPutNode, ID: hub})
	want := map[string]bool{}
	var reqs []cascade.Request
	for i := 0; i < 2499; i++ {
		m, id := uuid.New(), uuid.New()
		reqs = append(reqs, cascade.Request{Op: storage.OpPutNode, ID: m})
		src, dst := hub, m
		if i%2 == 1 {
			src, dst = m, hub
		}
		reqs = append(reqs, cascade.Request{Op: storage.OpPutEdge, ID: id, Src: src, Dst: dst, Label: "l"})
		want[id.String()] = true
	}
	self := uuid.New()
	reqs = append(reqs, cascade.Request{Op: storage.OpPutEdge, ID: self, Src: hub, Dst: hub, Label: "self"})
	want[self.String()] = true
	applyAll(t, e, reqs)

	seen := map[string]int{}
	path := "/v1/tenants/acme/nodes/" + hub.String() + "/edges?limit=1000"
	var coord string
	pages := 0
	next := ""
	for {
		p := path
		if next != "" {
			p += "&cursor=" + url.QueryEscape(next)
		}
		var pg edgePage
		e.getJSON(p, 200, &pg)
		pages++
		if len(pg.Edges) > 1000 {
			t.Fatalf("page %d holds %d edges, over the limit", pages, len(pg.Edges))
		}
		if coord == "" {
			coord = pg.AsOfValid + " " + pg.AsOfTx
			// A write during the walk: the pinned coordinate does not see it.
			m, id := uuid.New(), uuid.New()
			applyAll(t, e, []cascade.Request{{Op: storage.OpPutNode, ID: m}, {Op: storage.OpPutEdge, ID: id, Src: hub, Dst: m, Label: "late"}})
		} else if got := pg.AsOfValid + " " + pg.AsOfTx; got != coord {
			t.Fatalf("page %d answered at %s, the first at %s", pages, got, coord)
		}
		for _, v := range pg.Edges {
			seen[v.ID]++
		}
		if pg.Next == nil {
			break
		}
		next = *pg.Next
	}
	if pages != 3 || len(seen) != len(want) {
		t.Fatalf("%d pages, %d distinct edges; want 3 pages and %d edges", pages, len(seen), len(want))
	}
	for id, n := range seen {
		if n != 1 || !want[id] {
			t.Fatalf("edge %s seen %d times (known %v)", id, n, want[id])
		}
	}
	for _, bad := range []string{"?limit=0", "?limit=10001", "?limit=ten", "?cursor=nope", "?limit=5&limit=6"} {
		e.getJSON("/v1/tenants/acme/nodes/"+hub.String()+"/edges"+bad, 400, nil)
	}
	// A cursor of another node's walk is refused.
	e.getJSON("/v1/tenants/acme/nodes/"+uuid.NewString()+"/edges?cursor="+url.QueryEscape(next), 400, nil)
}

// TestHistoryIsPaged: five versions, two a page.
func TestHistoryIsPaged(t *testing.T) {
	e := newEnv(t, 100_000)
	n := uuid.New()
	for i := 0; i < 5; i++ {
		e.apply(cascade.Request{Op: storage.OpPutNode, ID: n})
	}
	var all []string
	next := ""
	for pages := 1; ; pages++ {
		p := "/v1/tenants/acme/nodes/" + n.String() + "/history?limit=2"
		if next != "" {
			p += "&cursor=" + url.QueryEscape(next)
		}
		var h struct {
			Versions []api.Version `json:"versions"`
			Next     *string       `json:"next"`
		}
		e.getJSON(p, 200, &h)
		for _, v := range h.Versions {
			all = append(all, *v.TxFrom)
		}
		if h.Next == nil {
			if pages != 3 {
				t.Fatalf("%d pages, want 3", pages)
			}
			break
		}
		next = *h.Next
	}
	if len(all) != 5 {
		t.Fatalf("%d versions, want 5", len(all))
	}
	for i := 1; i < len(all); i++ {
		if all[i] <= all[i-1] {
			t.Fatalf("history out of order: %v", all)
		}
	}
}

// TestRequestLookup: a request's stored answer by tenant and request id;
// 404 for one never seen (and for another tenant's).
func TestRequestLookup(t *testing.T) {
	e := newEnv(t, 100_000)
	n := uuid.New()
	out, _, err := e.ops.Apply(context.Background(), []cascade.Request{{Scope: e.sc, Op: storage.OpPutNode, ID: n, RequestID: "look-1",
		ValidFrom: storage.NoTs, ValidTo: storage.NoTs, ValidEnd: storage.NoTs, Prov: storage.Provenance{DecidedAt: storage.NoTs}}})
	if err != nil || out[0].Err != nil {
		t.Fatal(err, out[0].Err)
	}
	var r api.Request
	e.getJSON("/v1/tenants/acme/requests/look-1", 200, &r)
	if r.State != "answered" || r.Status != "ok" || r.Op != "put_node" || r.ID != n.String() || r.TxTime == nil || *r.TxTime != fmtTs(out[0].Receipt.Tx) {
		t.Fatalf("lookup %+v", r)
	}
	e.getJSON("/v1/tenants/acme/requests/never", 404, nil)
	e.getJSON("/v1/tenants/acme2/requests/look-1", 404, nil)
	// An id with slashes is one path segment, escaped: its leading,
	// trailing or doubled slashes are no empty segment of the path (a
	// black-box probe: ids "/", "/a" and "a//b" were answered, then their
	// lookups were 400 "empty segment").
	for _, rid := range []string{"/", "/a", "a//b", "b/"} {
		out, _, err := e.ops.Apply(context.Background(), []cascade.Request{{Scope: e.sc, Op: storage.OpPutNode, ID: uuid.New(), RequestID: rid,
			ValidFrom: storage.NoTs, ValidTo: storage.NoTs, ValidEnd: storage.NoTs, Prov: storage.Provenance{DecidedAt: storage.NoTs}}})
		if err != nil || out[0].Err != nil {
			t.Fatal(err, out[0].Err)
		}
		var r api.Request
		e.getJSON("/v1/tenants/acme/requests/"+url.PathEscape(rid), 200, &r)
		if r.RequestID != rid || r.State != "answered" {
			t.Fatalf("lookup of %q: %+v", rid, r)
		}
	}
}

// TestRoutingAnswers: a wrong method is 405 with Allow; an empty path
// segment is 400; a long bad parameter is quoted once, cut short; a '+'
// decoded to a space gets a hint.
func TestRoutingAnswers(t *testing.T) {
	e := newEnv(t, 100_000)
	for _, m := range []string{http.MethodPost, http.MethodDelete, http.MethodPut} {
		for _, p := range []string{"/v1/journals", "/v1/tenants/acme/nodes/" + uuid.NewString(), "/v1/tenants/acme/requests/x"} {
			rec := httptest.NewRecorder()
			e.h.ServeHTTP(rec, httptest.NewRequest(m, p, nil))
			if rec.Code != http.StatusMethodNotAllowed || !strings.Contains(rec.Header().Get("Allow"), "GET") {
				t.Errorf("%s %s: %d Allow %q, want 405 with Allow: GET", m, p, rec.Code, rec.Header().Get("Allow"))
			}
		}
	}
	e.getJSON("/v1/tenants//nodes/"+uuid.NewString(), 400, nil)
	// A listing's coordinates are named as the client gave them.
	for _, name := range []string{"as_of_tx", "as_of_valid"} {
		r := e.get("/v1/tenants/acme/nodes?" + name + "=bogus")
		if r.code != 400 || !strings.Contains(string(r.body), name+":") {
			t.Errorf("%s=bogus: %d %s, want 400 naming %s", name, r.code, r.body, name)
		}
	}
	if r := e.get("/v1/journals/"); r.code != 404 || !strings.Contains(string(r.body), "without a slash") {
		t.Errorf("GET /v1/journals/: %d %s, want 404 with a hint", r.code, r.body)
	}
	e.getJSON("/v1/nowhere", 404, nil)
	long := strings.Repeat("9", 8<<10)
	r := e.get("/v1/tenants/acme/nodes/" + uuid.NewString() + "?tx=" + long)
	if r.code != 400 || len(r.body) > 400 || strings.Count(string(r.body), "9999") > 20 {
		t.Fatalf("an 8 KB bad tx: %d, %d bytes: %s", r.code, len(r.body), r.body)
	}
	r = e.get("/v1/tenants/acme/nodes/" + uuid.NewString() + "?tx=2020-01-01T00:00:00+02:00")
	if r.code != 400 || !strings.Contains(string(r.body), "%2B") {
		t.Fatalf("a '+' that became a space: %d %s, want a hint to write %%2B", r.code, r.body)
	}
}

func applyAll(t *testing.T, e *apiEnv, reqs []cascade.Request) {
	t.Helper()
	for i := range reqs {
		reqs[i].Scope = e.sc
		reqs[i].ValidFrom, reqs[i].ValidTo, reqs[i].ValidEnd, reqs[i].Prov.DecidedAt = storage.NoTs, storage.NoTs, storage.NoTs, storage.NoTs
	}
	out, _, err := e.ops.Apply(context.Background(), reqs)
	if err != nil {
		t.Fatal(err)
	}
	for i, oc := range out {
		if oc.Err != nil {
			t.Fatalf("request %d: %v", i, oc.Err)
		}
	}
}

// TestACopyRetriesACursorAheadOfIt: a later page whose cursor's tx is
// above the committed tx is a 400 on the store that issued it, but a 503
// with Retry-After on a copy (api.Options.Copy, a standby's): the copy may
// only lag behind the owner that issued the cursor.
func TestACopyRetriesACursorAheadOfIt(t *testing.T) {
	e := newEnv(t, 100_000)
	hub := uuid.New()
	e.apply(cascade.Request{Op: storage.OpPutNode, ID: hub})
	var reqs []cascade.Request
	for i := 0; i < 3; i++ {
		m := uuid.New()
		reqs = append(reqs, cascade.Request{Op: storage.OpPutNode, ID: m}, cascade.Request{Op: storage.OpPutEdge, ID: uuid.New(), Src: hub, Dst: m, Label: "l"})
	}
	applyAll(t, e, reqs)
	path := "/v1/tenants/acme/nodes/" + hub.String() + "/edges?limit=2"
	var pg edgePage
	e.getJSON(path, 200, &pg)
	if pg.Next == nil {
		t.Fatal("no second page")
	}
	later := path + "&cursor=" + url.QueryEscape(*pg.Next)

	behind := newEnv(t, 100_000) // a store that has applied less
	behind.getJSON(later, 400, nil)
	behind.h = api.Handler(behind.store, api.Options{ReadAPI: true, Copy: true, Now: behind.clock.Now, Logger: quiet})
	r := behind.getJSON(later, 503, nil)
	if ra := r.header.Get("Retry-After"); ra == "" {
		t.Fatal("the copy's 503 has no Retry-After")
	}
}
