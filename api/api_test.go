package api_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/telha/telha-cascade/api"
	"github.com/telha/telha-cascade/cascade"
	"github.com/telha/telha-cascade/storage"
)

// httptest tests of the JSON shapes of CONTRACT §6 against a real store.

var (
	quiet = slog.New(slog.NewTextHandler(io.Discard, nil))
	t0    = time.Date(2024, 3, 5, 6, 7, 8, 123456789, time.UTC)
	// timeRE is RFC 3339 UTC with exactly six fractional digits.
	timeRE = regexp.MustCompile(`^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}Z$`)
)

type apiEnv struct {
	t     *testing.T
	clock *storage.ManualClock
	fault *storage.FaultEngine
	store *storage.Store
	ops   *cascade.Ops
	h     http.Handler
	sc    storage.Scope
}

func newEnv(t *testing.T, maxBatchOps int) *apiEnv {
	t.Helper()
	e := &apiEnv{t: t, clock: storage.NewManualClock(t0), sc: storage.MustScope("acme")}
	st, err := storage.OpenStore(t.TempDir(), storage.Options{Clock: e.clock, Logger: quiet, WrapEngine: func(inner storage.Engine) storage.Engine {
		e.fault = storage.NewFaultEngine(inner)
		return e.fault
	}})
	if err != nil {
		t.Fatal(err)
	}
	e.store = st
	e.ops = cascade.New(st, cascade.Options{MaxBatchOps: maxBatchOps, Logger: quiet})
	t.Cleanup(func() {
		if err := st.Close(); err != nil {
			t.Error(err)
		}
	})
	e.h = api.Handler(st, api.Options{ReadAPI: true, Health: true, Now: e.clock.Now, Logger: quiet})
	return e
}

// apply applies one request and fails the test unless it is ok; it
// returns the tx. The clock moves a second first, so tx times are distinct
// and easy to name.
func (e *apiEnv) apply(r cascade.Request) storage.Ts {
	e.t.Helper()
	e.clock.Advance(time.Second)
	if r.Scope.IsZero() {
		r.Scope = e.sc
	}
	for _, p := range []*storage.Ts{&r.ValidFrom, &r.ValidTo, &r.ValidEnd, &r.Prov.DecidedAt} {
		if *p == 0 {
			*p = storage.NoTs
		}
	}
	out, _, err := e.ops.Apply(context.Background(), []cascade.Request{r})
	if err != nil {
		e.t.Fatal(err)
	}
	oc := out[0]
	if oc.Kind == cascade.Journaled {
		if _, err := e.ops.ApplyJournal(context.Background(), oc.Journal, cascade.JournalObserver{}); err != nil {
			e.t.Fatalf("journaled %v: %v", r.Op, err)
		}
		return oc.Journal.J.Tx
	}
	if oc.Err != nil {
		e.t.Fatalf("%v %s: %v", r.Op, r.ID, oc.Err)
	}
	return oc.Receipt.Tx
}

type response struct {
	code   int
	ct     string
	body   []byte
	header http.Header
}

func (e *apiEnv) get(path string) response {
	e.t.Helper()
	rec := httptest.NewRecorder()
	e.h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
	return response{rec.Code, rec.Header().Get("Content-Type"), rec.Body.Bytes(), rec.Header()}
}

// getJSON fetches path, wants the code and decodes the body into out.
func (e *apiEnv) getJSON(path string, want int, out any) response {
	e.t.Helper()
	r := e.get(path)
	if r.code != want {
		e.t.Fatalf("GET %s: %d %s, want %d", path, r.code, r.body, want)
	}
	if r.ct != "application/json" {
		e.t.Fatalf("GET %s: Content-Type %q", path, r.ct)
	}
	if out != nil {
		if err := json.Unmarshal(r.body, out); err != nil {
			e.t.Fatalf("GET %s: %v in %s", path, err, r.body)
		}
	}
	return r
}

func fmtTs(ts storage.Ts) string { return ts.Time().Format(storage.TimeLayout) }

func q(ts storage.Ts) string { return url.QueryEscape(ts.Time().Format(time.RFC3339Nano)) }

func keys[M ~map[string]V, V any](m M) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

var versionKeys = []string{"dst", "erased", "id", "label", "props", "provenance", "src", "tombstone", "tx_from", "tx_to", "valid_from", "valid_to"}

// checkVersionShape checks the raw version JSON: exactly the documented
// keys, times in TimeLayout or null, tx_to null, props an object.
// checkEntityShape checks the body of an entity GET: a version plus the
// coordinate it was answered at (as_of_valid, as_of_tx), which it strips.
func checkEntityShape(t *testing.T, raw json.RawMessage, edge bool) map[string]json.RawMessage {
	t.Helper()
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatalf("entity %s: %v", raw, err)
	}
	for _, k := range []string{"as_of_valid", "as_of_tx"} {
		if !timeRE.MatchString(strings.Trim(string(m[k]), `"`)) {
			t.Fatalf("entity %s: %s %s is not a time", raw, k, m[k])
		}
		delete(m, k)
	}
	b, _ := json.Marshal(m)
	return checkVersionShape(t, b, edge)
}

func checkVersionShape(t *testing.T, raw json.RawMessage, edge bool) map[string]json.RawMessage {
	t.Helper()
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatalf("version %s: %v", raw, err)
	}
	if got := keys(m); !slices.Equal(got, versionKeys) {
		t.Fatalf("version keys %v, want %v", got, versionKeys)
	}
	if string(m["tx_to"]) != "null" {
		t.Fatalf("tx_to %s, want null (versions are never closed)", m["tx_to"])
	}
	for _, k := range []string{"valid_from", "valid_to", "tx_from"} {
		if string(m[k]) == "null" {
			if k == "tx_from" {
				t.Fatalf("tx_from is null")
			}
			continue
		}
		var s string
		if err := json.Unmarshal(m[k], &s); err != nil || !timeRE.MatchString(s) {
			t.Fatalf("%s = %s, want RFC 3339 UTC with 6 fractional digits", k, m[k])
		}
	}
	for _, k := range []string{"src", "dst", "label"} {
		if isNull := string(m[k]) == "null"; isNull == edge {
			t.Fatalf("%s = %s for an edge=%v version", k, m[k], edge)
		}
	}
	if len(m["props"]) == 0 || m["props"][0] != '{' {
		t.Fatalf("props %s, want an object", m["props"])
	}
	var prov map[string]json.RawMessage
	if err := json.Unmarshal(m["provenance"], &prov); err != nil {
		t.Fatal(err)
	}
	if got := keys(prov); !slices.Equal(got, []string{"actor", "decided_at", "reason", "request_id", "source"}) {
		t.Fatalf("provenance keys %v", got)
	}
	return m
}

func TestVersionJSONShape(t *testing.T) {
	e := newEnv(t, 0)
	n, m, ed := uuid.New(), uuid.New(), uuid.New()
	vf := storage.TsFromTime(time.Date(1960, 1, 2, 3, 4, 5, 6000, time.UTC))
	decided := storage.TsFromTime(time.Date(2023, 12, 31, 23, 59, 59, 999999000, time.UTC))
	txN := e.apply(cascade.Request{Op: storage.OpPutNode, RequestID: "req-n", ID: n, ValidFrom: vf,
		Props: []byte(`{"name":"Ada","tags":["x"],"n":null}`),
		Prov:  storage.Provenance{Actor: "alice", Reason: "onboarding", Source: "crm", DecidedAt: decided}})
	e.apply(cascade.Request{Op: storage.OpPutNode, ID: m})
	vt := storage.TsFromTime(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	txE := e.apply(cascade.Request{Op: storage.OpPutEdge, RequestID: "req-e", ID: ed, Src: n, Dst: m, Label: "knows", ValidFrom: vf, ValidTo: vt})

	var raw json.RawMessage
	e.getJSON("/v1/tenants/acme/nodes/"+n.String()+"?valid=2000-01-01T00:00:00Z", 200, &raw)
	v := checkEntityShape(t, raw, false)
	want := map[string]string{
		"id": `"` + n.String() + `"`, "src": "null", "dst": "null", "label": "null",
		"valid_from": `"1960-01-02T03:04:05.000006Z"`, "valid_to": "null",
		"tx_from": `"` + fmtTs(txN) + `"`, "tx_to": "null", "tombstone": "false",
		"props":      `{"name":"Ada","tags":["x"],"n":null}`,
		"provenance": `{"actor":"alice","reason":"onboarding","source":"crm","request_id":"req-n","decided_at":"2023-12-31T23:59:59.999999Z"}`,
	}
	for k, w := range want {
		if string(v[k]) != w {
			t.Errorf("node %s = %s, want %s", k, v[k], w)
		}
	}
	if fmtTs(txN) != "2024-03-05T06:07:09.123456Z" {
		t.Errorf("tx_from %s: the clock's nanoseconds are truncated to microseconds", fmtTs(txN))
	}

	e.getJSON("/v1/tenants/acme/edges/"+ed.String()+"?valid=2000-01-01T00:00:00Z", 200, &raw)
	v = checkEntityShape(t, raw, true)
	want = map[string]string{
		"id": `"` + ed.String() + `"`, "src": `"` + n.String() + `"`, "dst": `"` + m.String() + `"`, "label": `"knows"`,
		"valid_from": `"1960-01-02T03:04:05.000006Z"`, "valid_to": `"2030-01-01T00:00:00.000000Z"`,
		"tx_from": `"` + fmtTs(txE) + `"`, "tx_to": "null", "tombstone": "false", "props": "{}",
		"provenance": `{"actor":"","reason":"","source":"","request_id":"req-e","decided_at":null}`,
	}
	for k, w := range want {
		if string(v[k]) != w {
			t.Errorf("edge %s = %s, want %s", k, v[k], w)
		}
	}
	// The decoded struct agrees with the raw shape.
	var dv api.Version
	e.getJSON("/v1/tenants/acme/edges/"+ed.String()+"?valid=2000-01-01T00:00:00Z", 200, &dv)
	if dv.TxTo != nil || dv.ValidTo == nil || *dv.Src != n.String() || dv.Provenance.DecidedAt != nil {
		t.Errorf("decoded edge %+v", dv)
	}
	// Open ends stay null for an open valid_to even far in valid time.
	e.getJSON("/v1/tenants/acme/nodes/"+n.String()+"?valid=9999-12-31T23:59:59Z", 200, &raw)
	if v := checkEntityShape(t, raw, false); string(v["valid_to"]) != "null" {
		t.Errorf("valid_to %s", v["valid_to"])
	}
	// The edge's valid interval is [vf, vt): at vt it reads absent.
	e.getJSON("/v1/tenants/acme/edges/"+ed.String()+"?valid="+q(vt), 404, nil)
	e.getJSON("/v1/tenants/acme/edges/"+ed.String()+"?valid="+q(vt-1), 200, nil)
	// Before its tx the node reads absent; at its tx it reads live.
	e.getJSON("/v1/tenants/acme/nodes/"+n.String()+"?valid=2000-01-01T00:00:00Z&tx="+q(txN-1), 404, nil)
	e.getJSON("/v1/tenants/acme/nodes/"+n.String()+"?valid=2000-01-01T00:00:00Z&tx="+q(txN), 200, nil)
}

func TestHistoriesAscendingWithTombstones(t *testing.T) {
	e := newEnv(t, 0)
	n, m, ed := uuid.New(), uuid.New(), uuid.New()
	from := storage.TsFromTime(time.Date(1990, 1, 1, 0, 0, 0, 0, time.UTC))
	tx1 := e.apply(cascade.Request{Op: storage.OpPutNode, ID: n, ValidFrom: from, Props: []byte(`{"v":1}`)})
	e.apply(cascade.Request{Op: storage.OpPutNode, ID: m, ValidFrom: from})
	tx2 := e.apply(cascade.Request{Op: storage.OpPutEdge, ID: ed, Src: n, Dst: m, Label: "a", ValidFrom: from})
	tx3 := e.apply(cascade.Request{Op: storage.OpPutNode, ID: n, ValidFrom: from, Props: []byte(`{"v":2}`)})
	tx4 := e.apply(cascade.Request{Op: storage.OpPutEdge, ID: ed, Src: n, Dst: m, Label: "b", ValidFrom: from, Props: []byte(`{"w":1}`)})
	// A past valid_end (OQ-1): the cascade tombstones the node and its edge.
	end := storage.TsFromTime(time.Date(2001, 1, 1, 0, 0, 0, 0, time.UTC))
	tx5 := e.apply(cascade.Request{Op: storage.OpTombstoneNode, RequestID: "del-n", ID: n, ValidEnd: end, Prov: storage.Provenance{Actor: "dpo"}})

	var h struct{ Versions []json.RawMessage }
	e.getJSON("/v1/tenants/acme/nodes/"+n.String()+"/history", 200, &h)
	if len(h.Versions) != 3 {
		t.Fatalf("node history has %d versions, want 3", len(h.Versions))
	}
	wantTx := []storage.Ts{tx1, tx3, tx5}
	for i, raw := range h.Versions {
		v := checkVersionShape(t, raw, false)
		if string(v["tx_from"]) != `"`+fmtTs(wantTx[i])+`"` {
			t.Errorf("node version %d tx_from %s, want %s (ascending tx)", i, v["tx_from"], fmtTs(wantTx[i]))
		}
		if tomb := string(v["tombstone"]) == "true"; tomb != (i == 2) {
			t.Errorf("node version %d tombstone %s", i, v["tombstone"])
		}
	}
	last := checkVersionShape(t, h.Versions[2], false)
	if string(last["valid_from"]) != `"2001-01-01T00:00:00.000000Z"` || string(last["valid_to"]) != "null" || string(last["props"]) != "{}" ||
		!strings.Contains(string(last["provenance"]), `"request_id":"del-n"`) {
		t.Errorf("node tombstone %s", h.Versions[2])
	}
	e.getJSON("/v1/tenants/acme/edges/"+ed.String()+"/history", 200, &h)
	if len(h.Versions) != 3 {
		t.Fatalf("edge history has %d versions, want 3", len(h.Versions))
	}
	for i, want := range []storage.Ts{tx2, tx4, tx5} {
		v := checkVersionShape(t, h.Versions[i], true)
		if string(v["tx_from"]) != `"`+fmtTs(want)+`"` {
			t.Errorf("edge version %d tx_from %s, want %s", i, v["tx_from"], fmtTs(want))
		}
	}
	if v := checkVersionShape(t, h.Versions[2], true); string(v["tombstone"]) != "true" || string(v["label"]) != `"b"` {
		t.Errorf("edge tombstone %s: it keeps the last label", h.Versions[2])
	}
	// The history of an id that never existed is 404, like its GET.
	e.getJSON("/v1/tenants/acme/nodes/"+uuid.NewString()+"/history", 404, nil)
	// History reads as of tx (versions with tx_from <= tx): none by 2000;
	// it ignores valid but still validates it.
	e.getJSON("/v1/tenants/acme/nodes/"+n.String()+"/history?tx=2000-01-01T00:00:00Z", 404, nil)
	e.getJSON("/v1/tenants/acme/nodes/"+n.String()+"/history?valid=2000-01-01T00:00:00Z", 200, &h)
	if len(h.Versions) != 3 {
		t.Errorf("history with valid 2000: %d versions", len(h.Versions))
	}
	e.getJSON("/v1/tenants/acme/nodes/"+n.String()+"/history?tx=soon", 400, nil)

	// Point reads agree: live before valid_end and before tx5; absent after.
	var v api.Version
	e.getJSON("/v1/tenants/acme/nodes/"+n.String()+"?valid=2000-06-01T00:00:00Z", 200, &v)
	if string(v.Props) != `{"v":2}` {
		t.Errorf("node at valid 2000 now: props %s, want the latest version's", v.Props)
	}
	e.getJSON("/v1/tenants/acme/nodes/"+n.String()+"?valid=2001-01-01T00:00:00Z", 404, nil)
	e.getJSON("/v1/tenants/acme/nodes/"+n.String()+"?valid=2001-01-01T00:00:00Z&tx="+q(tx5-1), 200, &v)
	e.getJSON("/v1/tenants/acme/nodes/"+n.String()+"?valid=2001-01-01T00:00:00Z&tx="+q(tx3-1), 200, &v)
	if string(v.Props) != `{"v":1}` {
		t.Errorf("node as of before its second version: props %s", v.Props)
	}
}

func TestNodeEdgesDirections(t *testing.T) {
	e := newEnv(t, 0)
	a, b, c := uuid.New(), uuid.New(), uuid.New()
	for _, n := range []uuid.UUID{a, b, c} {
		e.apply(cascade.Request{Op: storage.OpPutNode, ID: n})
	}
	ab, ca, aa := uuid.New(), uuid.New(), uuid.New()
	e.apply(cascade.Request{Op: storage.OpPutEdge, ID: ab, Src: a, Dst: b, Label: "out"})
	e.apply(cascade.Request{Op: storage.OpPutEdge, ID: ca, Src: c, Dst: a, Label: "in"})
	e.apply(cascade.Request{Op: storage.OpPutEdge, ID: aa, Src: a, Dst: a, Label: "self"})
	// A new version of ab: still one entry.
	before := e.apply(cascade.Request{Op: storage.OpPutEdge, ID: ab, Src: a, Dst: b, Label: "out2"})

	edges := func(node uuid.UUID, query string) []string {
		t.Helper()
		var body struct{ Edges []json.RawMessage }
		r := e.getJSON("/v1/tenants/acme/nodes/"+node.String()+"/edges"+query, 200, &body)
		if body.Edges == nil {
			t.Fatalf("edges %s: %s, want a list", query, r.body)
		}
		var ids []string
		for _, raw := range body.Edges {
			v := checkVersionShape(t, raw, true)
			var id string
			_ = json.Unmarshal(v["id"], &id)
			ids = append(ids, id)
		}
		sort.Strings(ids)
		return ids
	}
	sorted := func(us ...uuid.UUID) []string {
		var out []string
		for _, u := range us {
			out = append(out, u.String())
		}
		sort.Strings(out)
		return out
	}
	for _, c := range []struct {
		query string
		want  []string
	}{
		{"", sorted(ab, ca, aa)},
		{"?dir=both", sorted(ab, ca, aa)},
		{"?dir=out", sorted(ab, aa)},
		{"?dir=in", sorted(ca, aa)},
	} {
		if got := edges(a, c.query); !slices.Equal(got, c.want) {
			t.Errorf("edges of a%s = %v, want %v (each once)", c.query, got, c.want)
		}
	}
	if got := edges(b, "?dir=out"); len(got) != 0 {
		t.Errorf("out edges of b: %v", got)
	}
	// An unknown node: 200 with an empty list (not null) and no next page.
	emptyList := func(path string) {
		t.Helper()
		var raw map[string]json.RawMessage
		e.getJSON(path, 200, &raw)
		if string(raw["edges"]) != "[]" || string(raw["next"]) != "null" {
			t.Errorf("%s: %v, want an empty list and no next page", path, raw)
		}
	}
	emptyList("/v1/tenants/acme/nodes/" + uuid.NewString() + "/edges")
	// Another tenant's view of the same node id is empty.
	emptyList("/v1/tenants/acme2/nodes/" + a.String() + "/edges")

	// Cascade b: ab goes; a's other edges stay. As of before, ab is there,
	// also listed from b although b itself reads absent at a valid time
	// before it existed.
	e.apply(cascade.Request{Op: storage.OpTombstoneNode, ID: b})
	if got := edges(a, ""); !slices.Equal(got, sorted(ca, aa)) {
		t.Errorf("edges of a after b's cascade: %v", got)
	}
	if got := edges(b, ""); len(got) != 0 {
		t.Errorf("edges of deleted b: %v (ghosts)", got)
	}
	if got := edges(a, "?tx="+q(before)); !slices.Equal(got, sorted(ab, ca, aa)) {
		t.Errorf("edges of a as of before: %v", got)
	}
	var lbl struct{ Edges []api.Version }
	e.getJSON("/v1/tenants/acme/nodes/"+b.String()+"/edges?dir=in&tx="+q(before), 200, &lbl)
	if len(lbl.Edges) != 1 || *lbl.Edges[0].Label != "out2" {
		t.Errorf("in edges of b as of before: %+v, want ab's latest version", lbl.Edges)
	}
	// Bad dir: 400.
	var eb struct{ Error string }
	e.getJSON("/v1/tenants/acme/nodes/"+a.String()+"/edges?dir=OUT", 400, &eb)
	if eb.Error == "" {
		t.Error("400 without an error")
	}
}

func TestNotFoundAndErrorBodies(t *testing.T) {
	e := newEnv(t, 0)
	n := uuid.New()
	for _, c := range []struct {
		path string
		code int
	}{
		{"/v1/tenants/acme/nodes/" + n.String(), 404},
		{"/v1/tenants/acme/edges/" + n.String(), 404},
		{"/v1/nope", 404},
		{"/v1/tenants/acme/nodes/" + n.String() + "/edges/extra", 404},
		{"/", 404},
		{"/v1/tenants/BAD/nodes/" + n.String(), 400},
		{"/v1/tenants/" + strings.Repeat("a", 64) + "/nodes/" + n.String(), 400},
		{"/v1/tenants/acme/nodes/" + strings.ReplaceAll(n.String(), "-", ""), 400},
		{"/v1/tenants/acme/nodes/urn:uuid:" + n.String(), 400},
		{"/v1/tenants/acme/nodes/" + n.String() + "?valid=now", 400},
		{"/v1/tenants/acme/nodes/" + n.String() + "?valid=", 400},
		{"/v1/tenants/acme/nodes/" + n.String() + "?tx=10000-01-01T00:00:00Z", 400},
		{"/v1/tenants/acme/nodes/" + n.String() + "?tx=2020-01-01T00:00:00Z&tx=2020-01-01T00:00:00Z", 400},
		{"/v1/tenants/acme/edges/" + n.String() + "/history?valid=x", 400},
		{"/v1/tenants/acme/nodes/" + n.String() + "?valid=2020-01-01T00:00:00Z", 404},
		{"/v1/tenants/acme/nodes/" + n.String() + "?valid=2020-01-01T00:00:00.5%2B05:30", 404},
		{"/v1/tenants/acme/nodes/" + n.String() + "?valid=1969-12-31T23:59:59.999999999Z", 404},
		{"/v1/tenants/acme/nodes/" + n.String() + "?valid=2020-01-01t00:00:00z", 404},
		{"/v1/tenants/acme/nodes/" + n.String() + "?tx=2020-01-01T00:00:00%2B24:00", 400},
		{"/v1/tenants/acme/nodes/" + strings.ToUpper(n.String()), 404},
		// Unknown parameters are refused, not ignored (a read "now" would
		// answer 404 as if the node were deleted).
		{"/v1/tenants/acme/nodes/" + n.String() + "?as_of_tx=2020-01-01T00:00:00Z", 400},
		{"/v1/tenants/acme/nodes/" + n.String() + "/history?dir=out", 400},
		{"/v1/tenants/acme/requests/r1?tx=2020-01-01T00:00:00Z", 400},
		{"/v1/journals?tenant=acme", 400},
		{"/v1/tenants/acme/nodes/" + n.String() + "/edges?dir=out&limit=5", 200},
		{"/v1/tenants/acme/nodes/" + n.String() + "/edges?dir=", 400},
		// A query that does not decode is refused whole, not read "now"
		// without the pairs that failed (URL.Query drops them).
		{"/v1/tenants/acme/nodes/" + n.String() + "?valid=2020-01-01T00:00:00Z;x", 400},
		{"/v1/tenants/acme/nodes/" + n.String() + "?valid=2020-01-01T00:00:00Z%ZZ", 400},
		{"/v1/tenants/acme/nodes/" + n.String() + "?tx=2020-01-01T00:00:00Z&tx=%ZZ", 400},
		{"/v1/tenants/acme/nodes/" + n.String() + "?%ZZ=1", 400},
		{"/v1/tenants/acme/nodes/" + n.String() + "/history?tx=2020-01-01T00:00:00Z;", 400},
		{"/v1/tenants/acme/nodes/" + n.String() + "/edges?dir=sideways;", 400},
		{"/v1/tenants/acme/nodes?tx=%ZZ", 400},
		{"/v1/journals?%ZZ", 400},
		// A trailing slash names no route: 404, not 405 (GET is allowed).
		{"/v1/tenants/acme/nodes/" + n.String() + "/", 404},
		{"/v1/tenants/acme/nodes/", 404},
		{"/v1/tenants/acme/nodes/" + n.String() + "/history/", 404},
		{"/v1/journals/", 404},
	} {
		r := e.get(c.path)
		var body map[string]json.RawMessage
		if err := json.Unmarshal(r.body, &body); err != nil {
			t.Errorf("GET %s: %d body %q is not JSON", c.path, r.code, r.body)
			continue
		}
		var msg string
		_ = json.Unmarshal(body["error"], &msg)
		if c.code == http.StatusOK {
			if r.code != c.code {
				t.Errorf("GET %s: %d %s, want %d", c.path, r.code, r.body, c.code)
			}
			continue
		}
		if c.code == http.StatusNotFound { // a 404 also says the coordinate it was answered at
			delete(body, "as_of_valid")
			delete(body, "as_of_tx")
		}
		if r.code != c.code || msg == "" || len(body) != 1 || r.ct != "application/json" {
			t.Errorf("GET %s: %d %s (%s), want %d with {\"error\": ...}", c.path, r.code, r.body, r.ct, c.code)
		}
	}
	// Methods other than GET (and HEAD) are not routes.
	rec := httptest.NewRecorder()
	e.h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/v1/tenants/acme/nodes/"+n.String(), strings.NewReader("{}")))
	if rec.Code != 405 && rec.Code != 404 {
		t.Errorf("POST: %d", rec.Code)
	}
}

// TestJournalsList: /v1/journals serves what the journals' owner reports
// (package reaper fills the entries; its tests check the states), always a
// list, with the contract's keys.
func TestJournalsList(t *testing.T) {
	var list []api.Journal
	st, err := storage.OpenStore(t.TempDir(), storage.Options{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	h := api.Handler(st, api.Options{ReadAPI: true, Logger: quiet, Journals: func() []api.Journal { return list }})
	get := func() (int, []byte) {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("GET", "/v1/journals", nil))
		return rec.Code, rec.Body.Bytes()
	}
	if code, body := get(); code != 200 || strings.TrimSpace(string(body)) != `{"journals":[]}` {
		t.Fatalf("no journals: %d %s", code, body)
	}
	tx, ve := "2024-03-05T06:07:08.123456Z", "2020-05-06T07:08:09.000010Z"
	list = []api.Journal{
		{Tenant: "acme", NodeID: uuid.NewString(), RequestID: "del-hub", TxTime: &tx, ValidEnd: &ve, EdgesTotal: 6, EdgesDone: 2,
			AgeSeconds: 90, State: "failing", Failures: 1, LastError: "disk gone"},
		{Tenant: "acme", State: "poison", Key: "07c0", LastError: "decode: bad"},
	}
	code, body := get()
	var raw struct{ Journals []map[string]json.RawMessage }
	if err := json.Unmarshal(body, &raw); code != 200 || err != nil || len(raw.Journals) != 2 {
		t.Fatalf("journals %d %s %v", code, body, err)
	}
	for _, k := range []string{"tenant", "node_id", "request_id", "tx_time", "valid_end", "edges_total", "edges_done", "age_seconds", "state", "failures", "last_error"} {
		if _, ok := raw.Journals[0][k]; !ok {
			t.Errorf("journal has no %q: %v", k, keys(raw.Journals[0]))
		}
	}
	if string(raw.Journals[1]["tx_time"]) != "null" || string(raw.Journals[1]["key"]) != `"07c0"` {
		t.Errorf("poison journal: %s", body)
	}
}

func TestHealthAndRouting(t *testing.T) {
	st, err := storage.OpenStore(t.TempDir(), storage.Options{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	metrics := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "m 1\n") })
	ready := false
	h := api.Handler(st, api.Options{ReadAPI: true, Health: true, Metrics: metrics, Logger: quiet,
		Ready: func() (bool, []string) {
			if ready {
				return true, nil
			}
			return false, []string{"nats: not connected"}
		}})
	get := func(h http.Handler, p string) (int, string) {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, p, nil))
		return rec.Code, rec.Body.String()
	}
	if c, b := get(h, "/healthz"); c != 200 || !strings.Contains(b, `"ok"`) {
		t.Errorf("healthz %d %s", c, b)
	}
	if c, b := get(h, "/readyz"); c != 503 || !strings.Contains(b, "nats: not connected") {
		t.Errorf("readyz not ready: %d %s", c, b)
	}
	ready = true
	if c, _ := get(h, "/readyz"); c != 200 {
		t.Errorf("readyz ready: %d", c)
	}
	if c, b := get(h, "/metrics"); c != 200 || b != "m 1\n" {
		t.Errorf("metrics %d %q", c, b)
	}
	// ReadAPI off: /v1 is not routed; health stays.
	off := api.Handler(st, api.Options{Health: true, Logger: quiet})
	if c, b := get(off, "/v1/journals"); c != 404 || !json.Valid([]byte(b)) {
		t.Errorf("read API off: %d %s", c, b)
	}
	// Health off: only the read API.
	only := api.Handler(st, api.Options{ReadAPI: true, Logger: quiet})
	if c, _ := get(only, "/healthz"); c != 404 {
		t.Errorf("health off: /healthz %d", c)
	}
	if c, _ := get(only, "/v1/journals"); c != 200 {
		t.Errorf("health off: /v1/journals %d", c)
	}
}
