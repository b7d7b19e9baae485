package api_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/telha/telha-cascade/api"
	"github.com/telha/telha-cascade/cascade"
	"github.com/telha/telha-cascade/storage"
)

// Issue 20, the read API's side: the Authorization scheme in any case,
// DNS rebinding in loopback mode, history refusing a tx that disagrees
// with its cursor, the access log without query values, a bound on reads
// waiting, and the edge walk against a journal that finishes during it.

// TestAuthBearerSchemeAnyCase: the scheme of Authorization is
// case-insensitive (RFC 7235 §2.1), and may be followed by several spaces.
func TestAuthBearerSchemeAnyCase(t *testing.T) {
	_, h, _, _ := authEnv(t, api.AuthTokens)
	p := "/v1/tenants/acme/nodes/" + uuid.NewString()
	for _, hdr := range []string{"Bearer " + tokA, "bearer " + tokA, "BEARER " + tokA, "bEaReR   " + tokA} {
		req := httptest.NewRequest(http.MethodGet, p, nil)
		req.Header.Set("Authorization", hdr)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != http.StatusNotFound {
			t.Errorf("Authorization %q: %d %s, want the API's 404", strings.Replace(hdr, tokA, "<token>", 1), rec.Code, rec.Body)
		}
	}
	for _, hdr := range []string{"Basic " + tokA, "Bearer", "Bearer ", tokA, "Bearertoken-for-tenant-acme-0001"} {
		req := httptest.NewRequest(http.MethodGet, p, nil)
		req.Header.Set("Authorization", hdr)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != http.StatusUnauthorized {
			t.Errorf("Authorization %q: %d, want 401", hdr, rec.Code)
		}
	}
}

// TestAuthLoopbackRefusesForeignHost: without tokens, a loopback peer
// naming another host (a page of attacker.example that DNS rebinding sent
// to 127.0.0.1) is refused; loopback host names with any port are served.
func TestAuthLoopbackRefusesForeignHost(t *testing.T) {
	_, h, _, denied := authEnv(t, api.AuthLoopback)
	p := "/v1/tenants/acme/nodes/" + uuid.NewString()
	get := func(host string) *httptest.ResponseRecorder {
		req := httptest.NewRequest(http.MethodGet, p, nil)
		req.RemoteAddr, req.Host = "127.0.0.1:40000", host
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec
	}
	for _, host := range []string{"attacker.example", "attacker.example:8080", "127.0.0.1.nip.io", "localhost.attacker.example", "10.0.0.1:8080", ""} {
		if rec := get(host); rec.Code != http.StatusMisdirectedRequest || !strings.Contains(rec.Body.String(), "loopback host") {
			t.Errorf("Host %q from a loopback peer: %d %s, want 421", host, rec.Code, rec.Body)
		}
	}
	if denied.get("loopback_only") != 6 {
		t.Errorf("loopback_only denials: %d, want 6", denied.get("loopback_only"))
	}
	for _, host := range []string{"localhost", "localhost:8080", "LOCALHOST:1", "localhost.:80", "127.0.0.1", "127.0.0.1:8080", "127.3.4.5:9", "[::1]:8080", "[::1]"} {
		if rec := get(host); rec.Code != http.StatusNotFound {
			t.Errorf("Host %q: %d %s, want the API's 404", host, rec.Code, rec.Body)
		}
	}
}

// TestHistoryRefusesATxAgainstItsCursor: a history page asked with a cursor
// and an explicit tx that is not the cursor's is refused (400), as an edge
// walk's is; the cursor's own tx is accepted.
func TestHistoryRefusesATxAgainstItsCursor(t *testing.T) {
	e := newEnv(t, 100_000)
	n := uuid.New()
	var txs []storage.Ts
	for i := 0; i < 3; i++ {
		txs = append(txs, e.apply(cascade.Request{Op: storage.OpPutNode, ID: n}))
	}
	base := "/v1/tenants/acme/nodes/" + n.String() + "/history?limit=1"
	var first struct {
		Next   *string `json:"next"`
		AsOfTx string  `json:"as_of_tx"`
	}
	e.getJSON(base, http.StatusOK, &first)
	if first.Next == nil {
		t.Fatal("no next page")
	}
	cur := "&cursor=" + url.QueryEscape(*first.Next)
	r := e.get(base + cur + "&tx=" + q(txs[0]))
	if r.code != http.StatusBadRequest || !strings.Contains(string(r.body), "cursor") {
		t.Fatalf("a cursor with another tx: %d %s, want 400 naming the cursor", r.code, r.body)
	}
	e.getJSON(base+cur+"&tx="+url.QueryEscape(first.AsOfTx), http.StatusOK, nil)
	e.getJSON(base+cur, http.StatusOK, nil)
}

// TestCursorsStayInTheirWalk: a cursor given out for one tenant's walk
// (a list, a node's edges, a history) is refused (400) by the same walk
// of another tenant holding the same ids, and by another entity's walk;
// the nil UUID as an entity id is refused (400), as the queue refuses it.
func TestCursorsStayInTheirWalk(t *testing.T) {
	e := newEnv(t, 100_000)
	n, m := uuid.New(), uuid.New()
	for _, tenant := range []string{"acme", "other"} {
		e.sc = storage.MustScope(tenant)
		for range 3 {
			e.apply(cascade.Request{Op: storage.OpPutNode, ID: n})
			e.apply(cascade.Request{Op: storage.OpPutNode, ID: m})
			e.apply(cascade.Request{Op: storage.OpPutEdge, ID: uuid.New(), Src: n, Dst: m})
		}
	}
	for _, walk := range []string{"/nodes?limit=1", "/edges?limit=1", "/nodes/" + n.String() + "/edges?limit=1", "/nodes/" + n.String() + "/history?limit=1"} {
		var first struct {
			Next *string `json:"next"`
		}
		e.getJSON("/v1/tenants/acme"+walk, http.StatusOK, &first)
		if first.Next == nil {
			t.Fatalf("%s: no next page", walk)
		}
		cur := "&cursor=" + url.QueryEscape(*first.Next)
		e.getJSON("/v1/tenants/acme"+walk+cur, http.StatusOK, nil)
		if r := e.get("/v1/tenants/other" + walk + cur); r.code != http.StatusBadRequest || !strings.Contains(string(r.body), "cursor") {
			t.Errorf("acme's cursor of %s on tenant other: %d %s, want 400 naming the cursor", walk, r.code, r.body)
		}
	}
	var first struct {
		Next *string `json:"next"`
	}
	e.getJSON("/v1/tenants/acme/nodes/"+n.String()+"/history?limit=1", http.StatusOK, &first)
	if r := e.get("/v1/tenants/acme/nodes/" + m.String() + "/history?limit=1&cursor=" + url.QueryEscape(*first.Next)); r.code != http.StatusBadRequest {
		t.Errorf("a history cursor on another node's history: %d %s, want 400", r.code, r.body)
	}
	for _, path := range []string{"/nodes/", "/edges/"} {
		if r := e.get("/v1/tenants/acme" + path + uuid.Nil.String()); r.code != http.StatusBadRequest || !strings.Contains(string(r.body), "nil UUID") {
			t.Errorf("the nil UUID as an id of %s: %d %s, want 400", path, r.code, r.body)
		}
	}
}

// TestAccessLogHasNoQueryValues: the debug access log names the query's
// parameters, never their values.
func TestAccessLogHasNoQueryValues(t *testing.T) {
	e := newEnv(t, 100_000)
	var buf syncBuf
	h := api.Handler(e.store, api.Options{ReadAPI: true, Now: e.clock.Now, Logger: slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/v1/tenants/acme/nodes/"+uuid.NewString()+"?access_token=hunter2-secret&valid=2024-01-01T00:00:00Z&x%3Dy=zz-value", nil))
	log := buf.String()
	if !strings.Contains(log, "msg=http") || !strings.Contains(log, "access_token") || !strings.Contains(log, "valid") {
		t.Fatalf("access log %q: want the parameter names", log)
	}
	for _, v := range []string{"hunter2", "2024-01-01", "zz-value"} {
		if strings.Contains(log, v) {
			t.Errorf("access log %q holds the query value %q", log, v)
		}
	}
}

type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) { s.mu.Lock(); defer s.mu.Unlock(); return s.b.Write(p) }
func (s *syncBuf) String() string              { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

// TestWaitingReadsAreBounded: past MaxWaiting reads waiting at once, a
// read that would wait is answered 503 with Retry-After at once; a read
// that needs no wait is served; when a wait ends its slot is free again.
func TestWaitingReadsAreBounded(t *testing.T) {
	e := newEnv(t, 100_000)
	h := api.Handler(e.store, api.Options{ReadAPI: true, Now: e.clock.Now, Logger: quiet, MaxWaiting: 1})
	n := uuid.New()
	e.apply(cascade.Request{Op: storage.OpPutNode, ID: n})
	far := q(e.store.Committed() + storage.Ts(time.Hour))
	path := "/v1/tenants/acme/nodes/" + n.String()
	read := func(ctx context.Context, query string) *httptest.ResponseRecorder {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path+query, nil).WithContext(ctx))
		return rec
	}
	// One read waits (30 s, until cancelled) for a tx far ahead (again if
	// a probe below held the slot at that instant).
	ctx, cancel := context.WithCancel(context.Background())
	waited := make(chan int, 1)
	go func() {
		for {
			if code := read(ctx, "?wait=30s&tx="+far).Code; code != http.StatusServiceUnavailable || ctx.Err() != nil {
				waited <- code
				return
			}
		}
	}()
	// Another read that would wait: 503 once the first holds the slot. The
	// probes' context is done already: one that gets the slot lets it go
	// at once (and answers 200 without waiting).
	gone, stop := context.WithCancel(context.Background())
	stop()
	deadline := time.Now().Add(20 * time.Second)
	for {
		rec := read(gone, "?wait=30s&tx="+far)
		if rec.Code == http.StatusServiceUnavailable {
			if rec.Header().Get("Retry-After") == "" || !strings.Contains(rec.Body.String(), "waiting") {
				t.Fatalf("busy: %d %v %s, want Retry-After and why", rec.Code, rec.Header(), rec.Body)
			}
			break
		}
		if rec.Code != http.StatusOK || time.Now().After(deadline) {
			t.Fatalf("a second waiting read: %d %s, want 503 while the first waits", rec.Code, rec.Body)
		}
		runtime.Gosched()
	}
	if rec := read(context.Background(), ""); rec.Code != http.StatusOK {
		t.Fatalf("a read without wait: %d %s", rec.Code, rec.Body)
	}
	cancel()
	if code := <-waited; code != http.StatusOK {
		t.Fatalf("the waiting read: %d", code)
	}
	c, stop2 := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer stop2()
	if rec := read(c, "?wait=30s&tx="+far); rec.Code != http.StatusOK {
		t.Fatalf("a waiting read after the slot freed: %d %s", rec.Code, rec.Body)
	}
}

// TestEdgeWalkMeetsAJournalFinishing: the walk of node A reaches its edge
// to N while N's journal (which tombstones A->N) finishes: the walk's
// iterator took its view before the journal's last chunk, the fence drops
// before the walk checks N. The answer must not show A->N live at a tx at
// or above the journal's (where it is dead); read again at its coordinate
// it is the same. A hook pauses the walk at N, deterministically.
func TestEdgeWalkMeetsAJournalFinishing(t *testing.T) {
	e := newEnv(t, cascade.MinMaxBatchOps)
	a, n := uuid.New(), uuid.New()
	e.apply(cascade.Request{Op: storage.OpPutNode, ID: a})
	e.apply(cascade.Request{Op: storage.OpPutNode, ID: n})
	an := uuid.New()
	e.apply(cascade.Request{Op: storage.OpPutEdge, ID: an, Src: a, Dst: n, Label: "rel"})
	for i := 0; i < 10; i++ { // enough edges for N's tombstone to be journaled
		m := uuid.New()
		e.apply(cascade.Request{Op: storage.OpPutNode, ID: m})
		e.apply(cascade.Request{Op: storage.OpPutEdge, ID: uuid.New(), Src: n, Dst: m, Label: "rel"})
	}
	e.clock.Advance(time.Second)
	out, _, err := e.ops.Apply(context.Background(), []cascade.Request{{Scope: e.sc, Op: storage.OpTombstoneNode, ID: n, RequestID: "del-n",
		ValidFrom: storage.NoTs, ValidTo: storage.NoTs, ValidEnd: storage.NoTs, Prov: storage.Provenance{DecidedAt: storage.NoTs}}})
	if err != nil || out[0].Kind != cascade.Journaled {
		t.Fatalf("tombstone_node: %+v %v, want journaled", out[0], err)
	}
	j := out[0].Journal
	// Unrelated writes move the committed tx above the journal's.
	e.apply(cascade.Request{Op: storage.OpPutNode, ID: uuid.New()})

	paused, resume := make(chan struct{}), make(chan struct{})
	var once sync.Once
	defer api.SetWalkHook(func(other uuid.UUID) {
		if other == n {
			once.Do(func() { close(paused); <-resume })
		}
	})()
	path := "/v1/tenants/acme/nodes/" + a.String() + "/edges"
	type page struct {
		Edges   []api.Version   `json:"edges"`
		AsOfTx  string          `json:"as_of_tx"`
		AsOfV   string          `json:"as_of_valid"`
		Flight  json.RawMessage `json:"cascade_in_flight"`
		rawCode int
	}
	get := func(p string) page {
		rec := httptest.NewRecorder()
		e.h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, p, nil))
		var pg page
		if err := json.Unmarshal(rec.Body.Bytes(), &pg); err != nil {
			t.Errorf("GET %s: %d %s", p, rec.Code, rec.Body)
		}
		pg.rawCode = rec.Code
		return pg
	}
	done := make(chan page, 1)
	go func() { done <- get(path) }()
	select {
	case <-paused:
	case pg := <-done:
		t.Fatalf("the walk never reached N: %+v", pg)
	}
	// N's journal lands whole and its fence drops, the walk paused at N.
	if _, err := e.ops.ApplyJournal(context.Background(), j, cascade.JournalObserver{}); err != nil {
		t.Fatal(err)
	}
	if e.store.Journals().Fenced(e.sc, n) != nil {
		t.Fatal("N still fenced after its journal")
	}
	close(resume)
	first := <-done
	if first.rawCode != http.StatusOK {
		t.Fatalf("walk: %d", first.rawCode)
	}
	tm, err := time.Parse(time.RFC3339Nano, first.AsOfTx)
	if err != nil {
		t.Fatal(err)
	}
	at := storage.TsFromTime(tm)
	if at >= j.J.Tx && len(first.Edges) != 0 {
		t.Fatalf("the walk answered A->N live at tx %s, at or above N's tombstone (tx %s)", first.AsOfTx, fmtTs(j.J.Tx))
	}
	if at < j.J.Tx && len(first.Edges) != 1 {
		t.Fatalf("the walk answered %d edges below N's tombstone, want A->N", len(first.Edges))
	}
	again := get(path + "?valid=" + url.QueryEscape(first.AsOfV) + "&tx=" + url.QueryEscape(first.AsOfTx))
	if fmt.Sprint(len(again.Edges)) != fmt.Sprint(len(first.Edges)) || again.AsOfTx != first.AsOfTx {
		t.Fatalf("read again at (%s, %s): %d edges at %s, first %d", first.AsOfV, first.AsOfTx, len(again.Edges), again.AsOfTx, len(first.Edges))
	}
}
