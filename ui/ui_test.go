package ui_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/telha/telha-cascade/api"
	"github.com/telha/telha-cascade/cascade"
	"github.com/telha/telha-cascade/internal/testnats"
	"github.com/telha/telha-cascade/queue/client"
	"github.com/telha/telha-cascade/storage"
	"github.com/telha/telha-cascade/ui"
)

// The status page through its HTTP handler (issue 20 items 3, 7, 14, 20
// and 23), on a real store and, for dead letters, a real NATS server.

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

const (
	tokRead = "reader-token-for-acme-0001"
	tokOper = "operate-token-for-acme-001"
)

type world struct {
	t     *testing.T
	store *storage.Store
	ops   *cascade.Ops
	auth  *api.Auth
	h     http.Handler
	nc    *nats.Conn // the page's own connection (its stats count what it read)
	js    jetstream.JetStream
}

type worldOpts struct {
	mode api.AuthMode
	nats bool
	// extra completes the page's options (given the world, its NATS
	// connection set when nats).
	extra func(w *world, o *ui.Options)
}

func newWorld(t *testing.T, o worldOpts) *world {
	t.Helper()
	w := &world{t: t}
	st, err := storage.OpenStore(t.TempDir(), storage.Options{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	w.store = st
	w.ops = cascade.New(st, cascade.Options{MaxBatchOps: cascade.MinMaxBatchOps, Logger: quiet})
	path := filepath.Join(t.TempDir(), "tokens.json")
	b, _ := json.Marshal(map[string]any{"tokens": []api.Token{
		{Name: "reader", Token: tokRead, Tenants: []string{"acme"}, Role: api.RoleRead},
		{Name: "oper", Token: tokOper, Tenants: []string{"acme"}, Role: api.RoleOperate}}})
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	w.auth, err = api.NewAuth(api.AuthConfig{Mode: o.mode, TokensFile: path, CheckEvery: -1, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	opts := ui.Options{Store: st, Auth: w.auth, Logger: quiet}
	if o.nats {
		ns := testnats.Start(t)
		w.nc = testnats.Connect(t, ns.ClientURL())
		if w.js, err = jetstream.New(w.nc); err != nil {
			t.Fatal(err)
		}
		pub := testnats.Connect(t, ns.ClientURL())
		pjs, _ := jetstream.New(pub)
		if _, err := pjs.CreateStream(context.Background(), jetstream.StreamConfig{Name: "TELHA_DLQ", Subjects: []string{"telha.dlq.*"}}); err != nil {
			t.Fatal(err)
		}
		if _, err := pjs.CreateStream(context.Background(), jetstream.StreamConfig{Name: "TELHA_REQ", Subjects: []string{"telha.req.*"}}); err != nil {
			t.Fatal(err)
		}
		if _, err := pjs.CreateStream(context.Background(), jetstream.StreamConfig{Name: "TELHA_RES", Subjects: []string{"telha.res.*"}}); err != nil {
			t.Fatal(err)
		}
		w.js = pjs // the test publishes on its own connection
		opts.DeadLetters = client.DeadLetterStream{JS: mustJS(t, w.nc), Stream: "TELHA_DLQ", Prefix: "telha"}
	}
	if o.extra != nil {
		o.extra(w, &opts)
	}
	w.h = ui.Handler(opts)
	return w
}

func mustJS(t *testing.T, nc *nats.Conn) jetstream.JetStream {
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js
}

// req is one request to the page, from a loopback client naming the
// worker 127.0.0.1:8080 unless the headers say otherwise.
type req struct {
	method, path string
	form         url.Values
	header       map[string]string
	cookies      []*http.Cookie
}

func (w *world) do(r req) *httptest.ResponseRecorder {
	w.t.Helper()
	if r.method == "" {
		r.method = http.MethodGet
	}
	var body io.Reader
	if r.form != nil {
		body = strings.NewReader(r.form.Encode())
	}
	hr := httptest.NewRequest(r.method, r.path, body)
	hr.RemoteAddr, hr.Host = "127.0.0.1:50000", "127.0.0.1:8080"
	if r.form != nil {
		hr.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	for k, v := range r.header {
		if k == "Host" {
			hr.Host = v
			continue
		}
		hr.Header.Set(k, v)
	}
	for _, c := range r.cookies {
		hr.AddCookie(c)
	}
	rec := httptest.NewRecorder()
	w.h.ServeHTTP(rec, hr)
	return rec
}

func cookie(rec *httptest.ResponseRecorder, name string) *http.Cookie {
	for _, c := range rec.Result().Cookies() {
		if c.Name == name {
			return c
		}
	}
	return nil
}

var csrfRE = regexp.MustCompile(`name="csrf" (?:value|content)="([^"]+)"`)

func csrfOf(t *testing.T, body string) string {
	t.Helper()
	m := csrfRE.FindStringSubmatch(body)
	if m == nil {
		t.Fatalf("no CSRF token in %.300s", body)
	}
	return m[1]
}

// deep is a JSON body of about size bytes nested depth deep.
func deep(depth int) []byte {
	return []byte(strings.Repeat("[", depth) + strings.Repeat("]", depth))
}

// TestDeadLetterPageIsBounded (item 3): four dead letters of 20 KB nested
// 10,000 deep make a page of bounded size, built with bounded memory; a
// tenant filter among 2,000 other tenants' dead letters reads the page,
// not the stream.
func TestDeadLetterPageIsBounded(t *testing.T) {
	w := newWorld(t, worldOpts{mode: api.AuthLoopback, nats: true})
	ctx := context.Background()
	for i := 0; i < 4; i++ {
		m := nats.NewMsg("telha.dlq.acme")
		m.Data = deep(10_000)
		m.Header.Set("Telha-Reason", "invalid")
		if _, err := w.js.PublishMsg(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	var ms runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms)
	before := ms.TotalAlloc
	rec := w.do(req{path: "/ui/dlq"})
	runtime.ReadMemStats(&ms)
	alloc := ms.TotalAlloc - before
	body := rec.Body.String()
	if rec.Code != http.StatusOK || strings.Count(body, `class="letter"`) != 4 {
		t.Fatalf("dlq page: %d, %d letters", rec.Code, strings.Count(body, `class="letter"`))
	}
	t.Logf("page %d bytes, %d bytes allocated", len(body), alloc)
	if len(body) > 256<<10 {
		t.Errorf("the page of 4 dead letters of 20 KB is %d bytes, want O(the letters)", len(body))
	}
	if alloc > 64<<20 {
		t.Errorf("the page allocated %d MB, want O(the letters)", alloc>>20)
	}
	if !strings.Contains(body, "Shown cut") {
		t.Error("a body too deep to indent is not said to be shown cut")
	}

	// A tenant filter among other tenants' dead letters.
	for i := 0; i < 2000; i++ {
		if _, err := w.js.Publish(ctx, fmt.Sprintf("telha.dlq.other%d", i%13), []byte(`{"request_id":"x"}`)); err != nil {
			t.Fatal(err)
		}
	}
	in := w.nc.Stats().InMsgs
	rec = w.do(req{path: "/ui/dlq?tenant=acme"})
	read := w.nc.Stats().InMsgs - in
	if rec.Code != http.StatusOK || strings.Count(rec.Body.String(), `class="letter"`) != 4 || !strings.Contains(rec.Body.String(), "of 4 of tenant acme") {
		t.Fatalf("dlq page of acme: %d %d letters", rec.Code, strings.Count(rec.Body.String(), `class="letter"`))
	}
	if read > 200 {
		t.Errorf("the page of acme's 4 dead letters read %d messages of a 2,004-message stream", read)
	}
	t.Logf("tenant filter: %d messages read", read)
}

// TestStatusPageHeadersAndScripts (item 20): no inline script anywhere, a
// CSP without 'unsafe-inline' and with form-action, base-uri and
// frame-ancestors; ?flash= shows nothing.
func TestStatusPageHeadersAndScripts(t *testing.T) {
	w := newWorld(t, worldOpts{mode: api.AuthLoopback, nats: true})
	if _, err := w.js.Publish(context.Background(), "telha.dlq.acme", []byte(`{"request_id":"r1"}`)); err != nil {
		t.Fatal(err)
	}
	inline := regexp.MustCompile(`(?i)<script(?:\s[^>]*)?>[^<]|\son[a-z]+\s*=`)
	for _, p := range []string{"/ui/", "/ui/journals", "/ui/dlq", "/ui/requests?tenant=acme&id=r1", "/ui/explorer?tenant=acme&id=" + uuid.NewString(), "/ui/login"} {
		rec := w.do(req{path: p})
		csp := rec.Header().Get("Content-Security-Policy")
		for _, want := range []string{"script-src 'self'", "form-action 'self'", "base-uri 'none'", "frame-ancestors 'none'"} {
			if !strings.Contains(csp, want) {
				t.Errorf("%s: CSP %q lacks %s", p, csp, want)
			}
		}
		if strings.Contains(csp, "unsafe-inline") {
			t.Errorf("%s: CSP %q allows inline script", p, csp)
		}
		if m := inline.FindString(rec.Body.String()); m != "" {
			t.Errorf("%s: inline script %q", p, m)
		}
	}
	rec := w.do(req{path: "/ui/static/ui.js"})
	if rec.Code != http.StatusOK || !strings.Contains(rec.Header().Get("Content-Type"), "javascript") || !strings.Contains(rec.Body.String(), "data-confirm") {
		t.Fatalf("ui.js: %d %s", rec.Code, rec.Header().Get("Content-Type"))
	}
	rec = w.do(req{path: "/ui/dlq?flash=" + url.QueryEscape("Your session expired: call +1 555 0100")})
	if strings.Contains(rec.Body.String(), "555 0100") {
		t.Fatal("?flash= text is shown on the page")
	}
}

// TestStatusPageSessions (item 20): the sign-in POST needs its form's
// CSRF token; the cookie holds a random session id (HttpOnly,
// SameSite=Strict, an expiry, Secure behind https), never the token; the
// old token cookie opens nothing; CSRF tokens differ per session and serve
// one POST; a POST from another origin is refused; sign-out ends the
// session.
func TestStatusPageSessions(t *testing.T) {
	w := newWorld(t, worldOpts{mode: api.AuthTokens})
	signIn := func(tok string, hdr map[string]string) (*http.Cookie, *httptest.ResponseRecorder) {
		t.Helper()
		lp := w.do(req{path: "/ui/login", header: hdr})
		pre := cookie(lp, "telha_login")
		if pre == nil || strings.Contains(pre.Value, tok) {
			t.Fatalf("sign-in page: no pre-session cookie")
		}
		rec := w.do(req{method: http.MethodPost, path: "/ui/login", form: url.Values{"token": {tok}, "csrf": {csrfOf(t, lp.Body.String())}},
			cookies: []*http.Cookie{pre}, header: hdr})
		return cookie(rec, "telha_session"), rec
	}
	// Without the form's token (a page of another site posting a token):
	// no session.
	rec := w.do(req{method: http.MethodPost, path: "/ui/login", form: url.Values{"token": {tokOper}}})
	if c := cookie(rec, "telha_session"); c != nil || !strings.Contains(rec.Header().Get("Location"), "error=") {
		t.Fatalf("a sign-in without its CSRF token: %d %v %s", rec.Code, c, rec.Header().Get("Location"))
	}
	sess, rec := signIn(tokOper, nil)
	if sess == nil || rec.Header().Get("Location") != "/ui/" {
		t.Fatalf("sign-in: %d %s", rec.Code, rec.Header().Get("Location"))
	}
	if strings.Contains(sess.Value, tokOper) || len(sess.Value) < 32 || !sess.HttpOnly || sess.SameSite != http.SameSiteStrictMode || sess.MaxAge <= 0 || sess.Secure {
		t.Fatalf("session cookie %+v: want a random id, HttpOnly, SameSite=Strict, an expiry, not Secure over http", sess)
	}
	if s2, _ := signIn(tokOper, map[string]string{"X-Forwarded-Proto": "https"}); s2 == nil || !s2.Secure {
		t.Fatalf("session cookie behind https: %+v, want Secure", s2)
	}
	// The old cookie with the raw token opens nothing.
	if rec := w.do(req{path: "/ui/dlq", cookies: []*http.Cookie{{Name: "telha_token", Value: tokOper}}}); rec.Code != http.StatusSeeOther {
		t.Fatalf("a cookie holding the token: %d, want the sign-in redirect", rec.Code)
	}
	page := w.do(req{path: "/ui/dlq", cookies: []*http.Cookie{sess}})
	if page.Code != http.StatusOK {
		t.Fatalf("the page with the session: %d", page.Code)
	}
	csrf := csrfOf(t, page.Body.String())
	other, _ := signIn(tokOper, nil)
	if c2 := csrfOf(t, w.do(req{path: "/ui/dlq", cookies: []*http.Cookie{other}}).Body.String()); c2 == csrf {
		t.Fatal("two sessions of one token share a CSRF token")
	}
	post := func(csrf string, hdr map[string]string) int {
		return w.do(req{method: http.MethodPost, path: "/ui/dlq/1/discard", form: url.Values{"csrf": {csrf}}, cookies: []*http.Cookie{sess}, header: hdr}).Code
	}
	if code := post("wrong", nil); code != http.StatusForbidden {
		t.Fatalf("a POST with a wrong CSRF token: %d", code)
	}
	if code := post(csrf, map[string]string{"Origin": "https://attacker.example"}); code != http.StatusForbidden {
		t.Fatalf("a POST from another origin: %d", code)
	}
	if code := post(csrf, map[string]string{"Origin": "http://127.0.0.1:8080"}); code != http.StatusNotFound { // past the gate: no such dead letter
		t.Fatalf("a POST from the page: %d, want the action's 404", code)
	}
	if code := post(csrf, nil); code != http.StatusForbidden {
		t.Fatalf("a CSRF token used twice: %d, want 403", code)
	}
	// Sign-out ends the session.
	csrf = csrfOf(t, w.do(req{path: "/ui/", cookies: []*http.Cookie{sess}}).Body.String())
	rec = w.do(req{method: http.MethodPost, path: "/ui/logout", form: url.Values{"csrf": {csrf}}, cookies: []*http.Cookie{sess}})
	if rec.Code != http.StatusSeeOther || cookie(rec, "telha_session") == nil || cookie(rec, "telha_session").MaxAge >= 0 {
		t.Fatalf("sign-out: %d %v", rec.Code, rec.Result().Cookies())
	}
	if rec := w.do(req{path: "/ui/dlq", cookies: []*http.Cookie{sess}}); rec.Code != http.StatusSeeOther {
		t.Fatalf("the session after sign-out: %d, want the sign-in redirect", rec.Code)
	}
}

// TestStatusPageRefusesForeignHost (item 7): without tokens, a request to
// the page naming another host (DNS rebinding) gets no page and no CSRF
// token; a POST from another origin is refused even with the token.
func TestStatusPageRefusesForeignHost(t *testing.T) {
	w := newWorld(t, worldOpts{mode: api.AuthLoopback})
	rec := w.do(req{path: "/ui/dlq", header: map[string]string{"Host": "attacker.example"}})
	if rec.Code == http.StatusOK || strings.Contains(rec.Body.String(), "csrf") {
		t.Fatalf("Host attacker.example: %d %.200s", rec.Code, rec.Body)
	}
	page := w.do(req{path: "/ui/dlq"})
	sess := cookie(page, "telha_session")
	if page.Code != http.StatusOK || sess == nil {
		t.Fatalf("the page from localhost: %d", page.Code)
	}
	csrf := csrfOf(t, page.Body.String())
	rec = w.do(req{method: http.MethodPost, path: "/ui/dlq/1/discard", form: url.Values{"csrf": {csrf}}, cookies: []*http.Cookie{sess},
		header: map[string]string{"Origin": "http://attacker.example"}})
	if rec.Code != http.StatusForbidden {
		t.Fatalf("a POST from another origin: %d", rec.Code)
	}
}

// explorerState reads the explorer's answer line.
func explorerState(t *testing.T, body string) (asOfTx string, inFlight bool, edges int) {
	m := regexp.MustCompile(`At valid <code>[^<]*</code>, tx <code>([^<]*)</code>`).FindStringSubmatch(body)
	if m == nil {
		t.Fatalf("no answer in %.500s", body)
	}
	return m[1], strings.Contains(body, `id="in-flight"`), strings.Count(body, `class="edge"`)
}

// TestExplorerShowsAFencedNeighbour (item 14): node A's edge leads to N,
// whose journaled tombstone is in flight: the explorer answers A below the
// journal's tx, with A->N, and says a cascade is in flight, as the read
// API does (not an empty edge list at the committed tx).
func TestExplorerShowsAFencedNeighbour(t *testing.T) {
	w := newWorld(t, worldOpts{mode: api.AuthLoopback})
	sc := storage.MustScope("acme")
	ctx := context.Background()
	a, n := uuid.New(), uuid.New()
	apply := func(r cascade.Request) cascade.Outcome {
		t.Helper()
		r.Scope = sc
		for _, p := range []*storage.Ts{&r.ValidFrom, &r.ValidTo, &r.ValidEnd, &r.Prov.DecidedAt} {
			*p = storage.NoTs
		}
		out, _, err := w.ops.Apply(ctx, []cascade.Request{r})
		if err != nil || (out[0].Err != nil && out[0].Kind != cascade.Journaled) {
			t.Fatalf("%v: %+v %v", r.Op, out[0], err)
		}
		return out[0]
	}
	apply(cascade.Request{Op: storage.OpPutNode, ID: a})
	apply(cascade.Request{Op: storage.OpPutNode, ID: n})
	apply(cascade.Request{Op: storage.OpPutEdge, ID: uuid.New(), Src: a, Dst: n, Label: "rel"})
	for i := 0; i < 10; i++ {
		m := uuid.New()
		apply(cascade.Request{Op: storage.OpPutNode, ID: m})
		apply(cascade.Request{Op: storage.OpPutEdge, ID: uuid.New(), Src: n, Dst: m, Label: "rel"})
	}
	out := apply(cascade.Request{Op: storage.OpTombstoneNode, ID: n, RequestID: "del-n"})
	if out.Kind != cascade.Journaled {
		t.Fatalf("tombstone_node of N: %+v, want journaled", out)
	}
	apply(cascade.Request{Op: storage.OpPutNode, ID: uuid.New()}) // the committed tx moves past the journal's

	path := "/ui/explorer?" + url.Values{"tenant": {"acme"}, "kind": {"node"}, "id": {a.String()}}.Encode()
	tx, inFlight, edges := explorerState(t, w.do(req{path: path}).Body.String())
	if !inFlight || edges != 1 || tx >= out.Journal.J.Tx.Time().Format(storage.TimeLayout) {
		t.Fatalf("explorer of A with N's cascade in flight (tx %s): answered at %s, in flight %v, %d edges; want below the journal, in flight, A->N",
			out.Journal.J.Tx.Time().Format(storage.TimeLayout), tx, inFlight, edges)
	}
	if _, err := w.ops.ApplyJournal(ctx, out.Journal, cascade.JournalObserver{}); err != nil {
		t.Fatal(err)
	}
	if _, inFlight, edges := explorerState(t, w.do(req{path: path}).Body.String()); inFlight || edges != 0 {
		t.Fatalf("after the cascade: in flight %v, %d edges", inFlight, edges)
	}
}

// TestExplorerHistoryIsPaged (item 23): a long history is shown a page at
// a time, with a link to the next.
func TestExplorerHistoryIsPaged(t *testing.T) {
	w := newWorld(t, worldOpts{mode: api.AuthLoopback})
	sc := storage.MustScope("acme")
	n := uuid.New()
	const versions = 250
	for i := 0; i < versions; i++ {
		if _, err := w.ops.PutNode(context.Background(), sc, storage.NodeWrite{ID: n, ValidFrom: storage.NoTs, ValidTo: storage.NoTs}); err != nil {
			t.Fatal(err)
		}
	}
	path := "/ui/explorer?" + url.Values{"tenant": {"acme"}, "kind": {"node"}, "id": {n.String()}}.Encode()
	seen := 0
	for pages := 1; ; pages++ {
		body := w.do(req{path: path}).Body.String()
		rows := strings.Count(body, `class="history-row"`)
		if rows == 0 || rows > ui.HistoryPageSize {
			t.Fatalf("page %d: %d versions, want 1 to %d", pages, rows, ui.HistoryPageSize)
		}
		seen += rows
		m := regexp.MustCompile(`id="history-next" href="([^"]+)"`).FindStringSubmatch(body)
		if m == nil {
			if pages != 3 {
				t.Fatalf("%d pages, want 3", pages)
			}
			break
		}
		path = strings.ReplaceAll(m[1], "&amp;", "&")
	}
	if seen != versions {
		t.Fatalf("%d versions over the pages, want %d", seen, versions)
	}
}

var _ = time.Second
