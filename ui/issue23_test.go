package ui_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/telha/telha-cascade/api"
	"github.com/telha/telha-cascade/cascade"
	"github.com/telha/telha-cascade/queue/client"
	"github.com/telha/telha-cascade/storage"
	"github.com/telha/telha-cascade/ui"
)

// The status page after issue 23 (items 7 to 12), through its handler.

// anon returns a loopback visitor's session cookie and the CSRF token of
// the page it read.
func (w *world) anon(path string) (*http.Cookie, string) {
	w.t.Helper()
	rec := w.do(req{path: path})
	c := cookie(rec, "telha_session")
	if c == nil {
		w.t.Fatalf("GET %s: no session cookie", path)
	}
	return c, csrfOf(w.t, rec.Body.String())
}

func (w *world) post(path string, form url.Values, c *http.Cookie) *postResult {
	w.t.Helper()
	rec := w.do(req{method: http.MethodPost, path: path, form: form, cookies: []*http.Cookie{c}, header: map[string]string{"Origin": "http://127.0.0.1:8080"}})
	return &postResult{Code: rec.Code, Location: rec.Header().Get("Location"), Body: rec.Body.String()}
}

type postResult struct {
	Code           int
	Location, Body string
}

func unescape(s string) string { return strings.ReplaceAll(s, "&amp;", "&") }

// TestExplorerEdgesPagedCountedAndDeleted (item 8): a node's 120 edges are
// shown 50 a page with their total and a next page at the same coordinate;
// the last page has no next; a tombstoned node reads "deleted at tx X"
// with its request, and the history's request ids link to the lookup; the
// empty form has hints; the chart has valid-time ticks.
func TestExplorerEdgesPagedCountedAndDeleted(t *testing.T) {
	w := newWorld(t, worldOpts{mode: api.AuthLoopback})
	sc := storage.MustScope("acme")
	ctx := context.Background()
	apply := func(r cascade.Request) cascade.Outcome {
		t.Helper()
		r.Scope = sc
		for _, p := range []*storage.Ts{&r.ValidFrom, &r.ValidTo, &r.ValidEnd, &r.Prov.DecidedAt} {
			*p = storage.NoTs
		}
		out, _, err := w.ops.Apply(ctx, []cascade.Request{r})
		if err != nil || out[0].Err != nil {
			t.Fatalf("%v: %+v %v", r.Op, out[0], err)
		}
		return out[0]
	}
	hub := uuid.New()
	apply(cascade.Request{Op: storage.OpPutNode, ID: hub, RequestID: "put-hub"})
	for i := 0; i < 120; i++ {
		m := uuid.New()
		apply(cascade.Request{Op: storage.OpPutNode, ID: m})
		apply(cascade.Request{Op: storage.OpPutEdge, ID: uuid.New(), Src: hub, Dst: m, Label: "rel"})
	}
	path := "/ui/explorer?" + url.Values{"tenant": {"acme"}, "kind": {"node"}, "id": {hub.String()}}.Encode()
	seen := map[string]bool{}
	edgeRE := regexp.MustCompile(`<tr class="edge"><td class="id"><a href="[^"]+">([0-9a-f-]{36})</a>`)
	for _, want := range []string{"Edges 1–50 of 120.", "Edges 51–100 of 120.", "Edges 101–120 of 120."} {
		body := w.do(req{path: path}).Body.String()
		if !strings.Contains(body, want) {
			t.Fatalf("explorer page: want %q in %s", want, regexp.MustCompile(`id="edges-count">[^\n]*`).FindString(body))
		}
		for _, m := range edgeRE.FindAllStringSubmatch(body, -1) {
			if seen[m[1]] {
				t.Fatalf("edge %s on two pages", m[1])
			}
			seen[m[1]] = true
		}
		m := regexp.MustCompile(`id="edges-next" href="([^"]+)"`).FindStringSubmatch(body)
		if want == "Edges 101–120 of 120." {
			if m != nil {
				t.Fatal("the last page of edges links to a next one")
			}
			break
		}
		if m == nil {
			t.Fatalf("page %q has no next link", want)
		}
		path = unescape(m[1])
		if !strings.Contains(path, "tx=") || !strings.Contains(path, "valid=") {
			t.Fatalf("next page %s does not keep the coordinate", path)
		}
	}
	if len(seen) != 120 {
		t.Fatalf("%d distinct edges over the pages, want 120", len(seen))
	}

	// A leaf node tombstoned: deleted at its tx, by its request.
	leaf := uuid.New()
	apply(cascade.Request{Op: storage.OpPutNode, ID: leaf, RequestID: "put-leaf"})
	out := apply(cascade.Request{Op: storage.OpTombstoneNode, ID: leaf, RequestID: "del-leaf"})
	tx := out.Receipt.Tx.Time().Format(storage.TimeLayout)
	body := w.do(req{path: "/ui/explorer?" + url.Values{"tenant": {"acme"}, "kind": {"node"}, "id": {leaf.String()}}.Encode()}).Body.String()
	state := regexp.MustCompile(`id="state">([^<]*)<`).FindStringSubmatch(body)
	if state == nil || !strings.HasPrefix(state[1], "deleted at tx "+tx) || !strings.Contains(state[1], "del-leaf") {
		t.Fatalf("a tombstoned node reads %q, want deleted at tx %s (request del-leaf)", state, tx)
	}
	if !strings.Contains(body, `<a class="request" href="/ui/requests?id=del-leaf&amp;tenant=acme">del-leaf</a>`) {
		t.Fatal("the history's request id is not a link to the lookup")
	}
	if strings.Count(body, `class="tick"`) < 2 {
		t.Fatal("the history chart has no time ticks")
	}
	// Absent for another reason: never written at this tx.
	body = w.do(req{path: "/ui/explorer?" + url.Values{"tenant": {"acme"}, "kind": {"node"}, "id": {uuid.NewString()}}.Encode()}).Body.String()
	if !strings.Contains(body, "absent (not valid at this time, or no version yet at this tx)") {
		t.Fatal("an unknown node does not read absent")
	}
	if body := w.do(req{path: "/ui/explorer"}).Body.String(); !strings.Contains(body, `id="hints"`) || !strings.Contains(body, "the committed tx, now") {
		t.Fatal("the empty form has no hints")
	}
}

// deadLetter publishes a dead letter of tenant with body and headers.
func (w *world) deadLetter(tenant string, body []byte, hdr map[string]string) {
	w.t.Helper()
	m := nats.NewMsg("telha.dlq." + tenant)
	m.Data = body
	for k, v := range hdr {
		m.Header.Set(k, v)
	}
	if _, err := w.js.PublishMsg(context.Background(), m); err != nil {
		w.t.Fatal(err)
	}
}

// TestRequestLookupFindsTheDeadLetter (items 9 and 11): a request never
// stored (invalid) points to its dead letter, found by request id or, for
// a body without a readable one, by its message id; the dead-letter page
// shows that message id in the request column.
func TestRequestLookupFindsTheDeadLetter(t *testing.T) {
	w := newWorld(t, worldOpts{mode: api.AuthLoopback, nats: true})
	w.deadLetter("acme", []byte(`{"request_id":"bad-1","op":"put_node","id":"nope"}`), map[string]string{"Telha-Reason": "invalid", "Telha-Error": "id: not a UUID"})
	w.deadLetter("acme", []byte(`{not json`), map[string]string{"Telha-Reason": "invalid", "Telha-Error": "decode: invalid character", "Telha-Original-Msg-Id": "acme.bad-2"})
	for _, rid := range []string{"bad-1", "bad-2"} {
		body := w.do(req{path: "/ui/requests?" + url.Values{"tenant": {"acme"}, "id": {rid}}.Encode()}).Body.String()
		if !strings.Contains(body, `id="dead-letter-link"`) || !strings.Contains(body, "dead-lettered as <b>invalid</b>") {
			t.Fatalf("lookup of %s: no pointer to its dead letter in %s", rid, body[strings.Index(body, "<h1>"):])
		}
	}
	if body := w.do(req{path: "/ui/requests?tenant=acme&id=never"}).Body.String(); !strings.Contains(body, "No dead letter of tenant acme names this request") {
		t.Fatal("a request never seen: no word on the dead letters")
	}
	if body := w.do(req{path: "/ui/dlq"}).Body.String(); !strings.Contains(body, "msg id acme.bad-2") || !strings.Contains(body, `href="/ui/requests?id=bad-1&amp;tenant=acme"`) {
		t.Fatal("the dead-letter page shows neither the message id of a body without request_id nor links to the lookup")
	}
}

// TestRecentRequests (item 9): the requests page lists the results
// stream's newest results, a page at a time, filtered by status, scoped to
// the token's tenants.
func TestRecentRequests(t *testing.T) {
	w := newWorld(t, worldOpts{mode: api.AuthTokens, nats: true, extra: func(w *world, o *ui.Options) {
		o.Results = client.ResultStream{JS: mustJS(t, w.nc), Stream: "TELHA_RES", Prefix: "telha"}
	}})
	ctx := context.Background()
	for i := 0; i < 130; i++ {
		tenant, status := "acme", client.StatusOK
		if i%2 == 1 {
			tenant = "beta"
		}
		if i%10 == 0 {
			status = client.StatusNotFound
		}
		b, _ := json.Marshal(client.Result{RequestID: fmt.Sprintf("r-%03d", i), Tenant: tenant, Status: status, Op: "put_node", ID: uuid.NewString()})
		if _, err := w.js.Publish(ctx, "telha.res."+tenant, b); err != nil {
			t.Fatal(err)
		}
	}
	sess := w.signIn(tokRead)
	rows := regexp.MustCompile(`<tr class="result" data-request="([^"]+)" data-status="([^"]+)">`)
	path, got := "/ui/requests", []string{}
	for pages := 0; path != ""; pages++ {
		body := w.do(req{path: path, cookies: []*http.Cookie{sess}}).Body.String()
		for _, m := range rows.FindAllStringSubmatch(body, -1) {
			got = append(got, m[1])
		}
		path = ""
		if m := regexp.MustCompile(`id="recent-next" href="([^"]+)"`).FindStringSubmatch(body); m != nil {
			path = unescape(m[1])
		}
		if pages > 5 {
			t.Fatal("more than 5 pages of 65 results")
		}
	}
	if len(got) != 65 || got[0] != "r-128" || got[64] != "r-000" {
		t.Fatalf("acme's reader saw %d results (%v ... ), want acme's 65, newest first", len(got), got[:min(3, len(got))])
	}
	body := w.do(req{path: "/ui/requests?status=not_found", cookies: []*http.Cookie{sess}}).Body.String()
	ms := rows.FindAllStringSubmatch(body, -1)
	if len(ms) != 13 {
		t.Fatalf("not_found of acme: %d rows, want 13", len(ms))
	}
	for _, m := range ms {
		if m[2] != "not_found" {
			t.Fatalf("status filter: a %s row", m[2])
		}
	}
	if body := w.do(req{path: "/ui/requests?tenant=beta", cookies: []*http.Cookie{sess}}).Body.String(); rows.MatchString(body) || !strings.Contains(body, `may not read tenant &#34;beta&#34;`) {
		t.Fatal("acme's reader lists beta's results")
	}
}

// signIn signs a token in and returns its session cookie.
func (w *world) signIn(tok string) *http.Cookie {
	w.t.Helper()
	lp := w.do(req{path: "/ui/login"})
	rec := w.do(req{method: http.MethodPost, path: "/ui/login", form: url.Values{"token": {tok}, "csrf": {csrfOf(w.t, lp.Body.String())}},
		cookies: []*http.Cookie{cookie(lp, "telha_login")}})
	c := cookie(rec, "telha_session")
	if c == nil {
		w.t.Fatalf("sign-in of %s: %d %s", tok[:6], rec.Code, rec.Header().Get("Location"))
	}
	return c
}

// TestDeadLettersBulk (item 11): an operate visitor discards the dead
// letters a filtered page shows, in one POST carrying the page's CSRF
// token; other tenants' letters stay; a bulk action without the token,
// from another origin, or over a page is refused.
func TestDeadLettersBulk(t *testing.T) {
	w := newWorld(t, worldOpts{mode: api.AuthLoopback, nats: true})
	for i := 0; i < 3; i++ {
		w.deadLetter("acme", []byte(fmt.Sprintf(`{"request_id":"a-%d"}`, i)), map[string]string{"Telha-Reason": "invalid"})
		w.deadLetter("beta", []byte(fmt.Sprintf(`{"request_id":"b-%d"}`, i)), map[string]string{"Telha-Reason": "invalid"})
	}
	w.deadLetter("acme", []byte(`{"request_id":"a-failed"}`), map[string]string{"Telha-Reason": "failed"})
	sess, _ := w.anon("/ui/dlq?tenant=acme&reason=invalid")
	page := w.do(req{path: "/ui/dlq?tenant=acme&reason=invalid", cookies: []*http.Cookie{sess}}).Body.String()
	csrf := csrfOf(t, page)
	var seqs []string
	for _, m := range regexp.MustCompile(`<tr class="letter" id="letter-(\d+)"`).FindAllStringSubmatch(page, -1) {
		seqs = append(seqs, m[1])
	}
	if len(seqs) != 3 || !strings.Contains(page, `id="bulk-discard"`) {
		t.Fatalf("acme's invalid page: %d letters, bulk buttons %v", len(seqs), strings.Contains(page, `id="bulk-discard"`))
	}
	form := url.Values{"csrf": {csrf}, "action": {"discard"}, "tenant": {"acme"}, "reason": {"invalid"}, "seq": seqs}
	if r := w.do(req{method: http.MethodPost, path: "/ui/dlq/bulk", form: form, cookies: []*http.Cookie{sess}, header: map[string]string{"Origin": "https://attacker.example"}}); r.Code != http.StatusForbidden {
		t.Fatalf("a bulk discard from another origin: %d", r.Code)
	}
	res := w.post("/ui/dlq/bulk", form, sess)
	if res.Code != http.StatusSeeOther {
		t.Fatalf("bulk discard: %d %s", res.Code, res.Body)
	}
	body := w.do(req{path: unescape(res.Location), cookies: []*http.Cookie{sess}}).Body.String()
	if !strings.Contains(body, "3 dead letters discarded") {
		t.Fatalf("after the bulk discard: no message saying so in %s", regexp.MustCompile(`(?s)<main>.{0,400}`).FindString(body))
	}
	all := w.do(req{path: "/ui/dlq"}).Body.String()
	if n := strings.Count(all, `class="letter"`); n != 4 || strings.Contains(all, `data-request="a-0"`) || !strings.Contains(all, `data-request="a-failed"`) {
		t.Fatalf("after discarding acme's invalid letters: %d letters left, want beta's 3 and acme's failed one", n)
	}
	// The same CSRF token again: refused (one use).
	if r := w.post("/ui/dlq/bulk", form, sess); r.Code != http.StatusForbidden {
		t.Fatalf("a bulk discard with a used CSRF token: %d", r.Code)
	}
	// Over a page: refused.
	sess2, csrf := w.anon("/ui/dlq")
	many := url.Values{"csrf": {csrf}, "action": {"retry"}}
	for i := 0; i < ui.DLQPageSize+1; i++ {
		many.Add("seq", fmt.Sprint(i+1))
	}
	if r := w.post("/ui/dlq/bulk", many, sess2); r.Code != http.StatusBadRequest {
		t.Fatalf("a bulk retry of %d letters: %d, want 400", ui.DLQPageSize+1, r.Code)
	}
}

// natsPauser pauses a real consumer (what *queue.Worker does).
type natsPauser struct{ js jetstream.JetStream }

func (p *natsPauser) PauseState() client.PauseState {
	st, err := client.ConsumerPause(context.Background(), p.js, "TELHA_REQ", "telha-worker-0")
	if err != nil {
		return client.PauseState{Consumer: "telha-worker-0"}
	}
	return st
}

func (p *natsPauser) Pause(ctx context.Context, until time.Time, _ string) (client.PauseState, error) {
	return client.PauseConsumer(ctx, p.js, "TELHA_REQ", "telha-worker-0", until)
}

func (p *natsPauser) Resume(ctx context.Context, _ string) (client.PauseState, error) {
	return client.ResumeConsumer(ctx, p.js, "TELHA_REQ", "telha-worker-0")
}

// TestPauseFromThePage (item 12): the overview pauses and resumes the
// replica's consumer (a POST with the page's CSRF token); every page then
// says the consumer is paused; a token of some tenants, even operate, may
// not pause (it stops every tenant) and sees no button.
func TestPauseFromThePage(t *testing.T) {
	for _, mode := range []api.AuthMode{api.AuthLoopback, api.AuthTokens} {
		w := newWorld(t, worldOpts{mode: mode, nats: true, extra: func(w *world, o *ui.Options) {
			o.Pause = &natsPauser{js: mustJS(t, w.nc)}
			o.Overview = func(context.Context, api.Principal) ui.Overview { return ui.Overview{Pending: "1,234"} }
		}})
		if _, err := w.js.CreateOrUpdateConsumer(context.Background(), "TELHA_REQ", jetstream.ConsumerConfig{Durable: "telha-worker-0", AckPolicy: jetstream.AckExplicitPolicy}); err != nil {
			t.Fatal(err)
		}
		if mode == api.AuthTokens {
			sess := w.signIn(tokOper)
			page := w.do(req{path: "/ui/", cookies: []*http.Cookie{sess}}).Body.String()
			if strings.Contains(page, `id="pause"`) {
				t.Fatal("a token of tenant acme gets a pause button")
			}
			if r := w.post("/ui/consumer/pause", url.Values{"csrf": {csrfOf(t, page)}}, sess); r.Code != http.StatusForbidden {
				t.Fatalf("a token of tenant acme pausing: %d, want 403", r.Code)
			}
			continue
		}
		sess, _ := w.anon("/ui/")
		page := w.do(req{path: "/ui/", cookies: []*http.Cookie{sess}}).Body.String()
		if !strings.Contains(page, `id="pause"`) || !strings.Contains(page, `<meta http-equiv="refresh" content="5">`) || !strings.Contains(page, "1,234") {
			t.Fatal("overview: no pause button, no refresh, or the figures")
		}
		if r := w.post("/ui/consumer/pause", url.Values{"csrf": {csrfOf(t, page)}, "for": {"1h"}}, sess); r.Code != http.StatusSeeOther {
			t.Fatalf("pause: %d %s", r.Code, r.Body)
		}
		st, err := client.ConsumerPause(context.Background(), w.js, "TELHA_REQ", "telha-worker-0")
		if err != nil || !st.Paused || st.Forever() || time.Until(st.Until) < 50*time.Minute {
			t.Fatalf("after pausing for 1h from the page: %+v %v", st, err)
		}
		page = w.do(req{path: "/ui/", cookies: []*http.Cookie{sess}}).Body.String()
		if !strings.Contains(page, `id="flash">Consumer telha-worker-0: paused until`) || !strings.Contains(page, `id="resume"`) {
			t.Fatal("after the pause: no message, or no resume button")
		}
		for _, p := range []string{"/ui/", "/ui/journals", "/ui/dlq"} {
			if body := w.do(req{path: p, cookies: []*http.Cookie{sess}}).Body.String(); !strings.Contains(body, `id="paused-banner"`) {
				t.Fatalf("%s does not say the consumer is paused", p)
			}
		}
		page = w.do(req{path: "/ui/", cookies: []*http.Cookie{sess}}).Body.String()
		if r := w.post("/ui/consumer/resume", url.Values{"csrf": {csrfOf(t, page)}}, sess); r.Code != http.StatusSeeOther {
			t.Fatalf("resume: %d", r.Code)
		}
		if st, err := client.ConsumerPause(context.Background(), w.js, "TELHA_REQ", "telha-worker-0"); err != nil || st.Paused {
			t.Fatalf("after resuming: %+v %v", st, err)
		}
	}
}

// TestJournalsAttemptsLinksAndHistory (item 10): an applying journal on
// its first attempt reads "applying (attempt 1)", not 0; request ids link
// to the lookup; finished journals are listed with their outcome.
func TestJournalsAttemptsLinksAndHistory(t *testing.T) {
	node := uuid.NewString()
	w := newWorld(t, worldOpts{mode: api.AuthLoopback, extra: func(w *world, o *ui.Options) {
		o.Journals = func() []api.Journal {
			return []api.Journal{{Tenant: "acme", NodeID: node, RequestID: "del-hub", State: "applying", EdgesTotal: 20_001, EdgesDone: 12_345, AgeSeconds: 3}}
		}
		o.Finished = func() []ui.FinishedJournal {
			return []ui.FinishedJournal{{Tenant: "acme", NodeID: node, RequestID: "del-old", Outcome: "ok", EdgesTombstoned: 200_000, Attempts: 1, Finished: time.Now(), Took: 42 * time.Second},
				{Tenant: "beta", NodeID: node, RequestID: "del-beta", Outcome: "ok"}}
		}
	}})
	body := w.do(req{path: "/ui/journals"}).Body.String()
	for _, want := range []string{"applying (attempt 1)", `data-attempts="1"`, `href="/ui/requests?id=del-hub&amp;tenant=acme"`, "12,345 of 20,001 edges",
		`<tr class="finished" data-request="del-old">`, "200,000", "42s"} {
		if !strings.Contains(body, want) {
			t.Errorf("journals page lacks %q", want)
		}
	}
}

// TestNum: thousands separators.
func TestNum(t *testing.T) {
	for in, want := range map[any]string{0: "0", 999: "999", 1000: "1,000", 20001: "20,001", -1234567: "-1,234,567", uint64(1e12): "1,000,000,000,000", 1234.5: "1,234.5", 2e6: "2,000,000"} {
		if got := ui.Num(in); got != want {
			t.Errorf("Num(%v) = %q, want %q", in, got, want)
		}
	}
}
