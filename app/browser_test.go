package app

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"
	"github.com/google/uuid"
	"github.com/telha/telha-cascade/internal/testnats"
	"github.com/telha/telha-cascade/queue"
	"github.com/telha/telha-cascade/storage"
	"github.com/telha/telha-cascade/ui"
)

// Browser tests of the status page (/ui/), in headless Chromium (Debian's
// chromium package; .ci/run installs it). They fail, not skip, when CI is
// set and no browser is found. Screenshots of each page are kept under
// $TELHA_UI_SCREENSHOTS (default: a directory in the system's temp dir);
// with $TELHA_UI_README_IMAGES set to a directory (docs/images), the
// README's screenshots are written there too (ui-overview.png,
// ui-journals.png, ui-explorer.png, ui-requests.png):
//
//	TELHA_UI_README_IMAGES=$PWD/docs/images go test -count=1 -run 'TestBrowserStatusPage$' ./app

type browser struct {
	t    *testing.T
	ctx  context.Context
	base string
	shot string // screenshots directory

	mu     sync.Mutex
	errors []string
}

func chromiumPath(t *testing.T) string {
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("CI") != "" {
		t.Fatal("no Chromium on a CI machine: .ci/run installs Debian's chromium package")
	}
	t.Skip("no Chromium here (apt-get install -y chromium); CI runs this test")
	return ""
}

func newBrowser(t *testing.T, base string) *browser {
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(chromiumPath(t)), chromedp.NoSandbox,
		chromedp.Flag("window-size", "1280,1000"), chromedp.Flag("disable-gpu", true))
	actx, cancelA := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(func() { cancel(); cancelA() })
	b := &browser{t: t, ctx: ctx, base: base, shot: os.Getenv("TELHA_UI_SCREENSHOTS")}
	if b.shot == "" {
		b.shot = filepath.Join(os.TempDir(), "telha-ui-screenshots")
	}
	_ = os.MkdirAll(b.shot, 0o755)
	// Console errors, exceptions and browser-log errors (a blocked asset, a
	// CSP violation) of every page.
	console := chromedp.Console(ctx)
	go func() {
		for m, err := range console {
			if err != nil {
				return
			}
			if m.Type == "error" || m.IsException() {
				b.record(m.String())
			}
		}
	}()
	// confirm() of retry and discard: yes.
	dialogs := chromedp.Events(ctx, page.JavascriptDialogOpening)
	go func() {
		for _, err := range dialogs {
			if err != nil {
				return
			}
			_, _ = chromedp.Call(ctx, page.HandleJavaScriptDialog, page.HandleJavaScriptDialogParams{Accept: true})
		}
	}()
	return b
}

func (b *browser) record(s string) {
	b.mu.Lock()
	b.errors = append(b.errors, s)
	b.mu.Unlock()
}

// open loads a page and fails on any console error it logged.
func (b *browser) open(path string) {
	b.t.Helper()
	// A page that refreshes itself (meta refresh) may start its own
	// navigation just as this one starts, and Chromium aborts one of
	// them (net::ERR_ABORTED): that is the page working, so load again.
	var err error
	for attempt := 0; attempt < 5; attempt++ {
		err = chromedp.Do(b.ctx, chromedp.Navigate(b.base+path), chromedp.WaitReady(chromedp.CSS("body")))
		if err == nil || !strings.Contains(err.Error(), "net::ERR_ABORTED") {
			break
		}
	}
	if err != nil {
		b.t.Fatalf("GET %s: %v", path, err)
	}
	b.noErrors(path)
}

func (b *browser) noErrors(where string) {
	b.t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.errors) > 0 {
		b.t.Fatalf("%s: console errors: %v", where, b.errors)
	}
}

func (b *browser) do(what string, actions ...chromedp.Action[chromedp.Void]) {
	b.t.Helper()
	if err := chromedp.Do(b.ctx, actions...); err != nil {
		b.t.Fatalf("%s: %v", what, err)
	}
}

func (b *browser) screenshot(name string) {
	b.t.Helper()
	png, err := chromedp.Run(b.ctx, chromedp.CaptureScreenshot()) // the viewport, 1280 x 1000
	if err != nil {
		b.t.Fatalf("screenshot %s: %v", name, err)
	}
	p := filepath.Join(b.shot, name+".png")
	if err := os.WriteFile(p, png, 0o644); err != nil {
		b.t.Fatal(err)
	}
	b.t.Logf("screenshot %s", p)
	if dir := os.Getenv("TELHA_UI_README_IMAGES"); dir != "" && readmeShots[name] {
		p := filepath.Join(dir, "ui-"+name+".png")
		if err := os.WriteFile(p, png, 0o644); err != nil {
			b.t.Fatal(err)
		}
		b.t.Logf("README screenshot %s", p)
	}
}

// readmeShots are the screenshots the README shows.
var readmeShots = map[string]bool{"overview": true, "journals": true, "explorer": true, "requests": true}

// nodes returns the elements matching sel (none is fine).
func (b *browser) nodes(sel string) []*chromedp.Node {
	b.t.Helper()
	var ns []*chromedp.Node
	var err error
	for attempt := 0; attempt < 5; attempt++ {
		ns, err = chromedp.Run(b.ctx, chromedp.Nodes(chromedp.CSSAll(sel), chromedp.AtLeast(0)))
		if err == nil || !replaced(err) {
			break
		}
	}
	if err != nil {
		b.t.Fatalf("query %s: %v", sel, err)
	}
	return ns
}

func (b *browser) count(sel string) int { return len(b.nodes(sel)) }

// text returns the text of the first element matching sel. A page that
// refreshes itself may replace that element between the query and the
// read (a CI run under load failed so: "No node with given id found"):
// the text is then read again from the new page.
func (b *browser) text(sel string) string {
	b.t.Helper()
	var s string
	var err error
	for attempt := 0; attempt < 5; attempt++ {
		s, err = chromedp.Run(b.ctx, chromedp.Text(chromedp.CSS(sel)))
		if err == nil || !replaced(err) {
			break
		}
	}
	if err != nil {
		b.t.Fatalf("text of %s: %v", sel, err)
	}
	return s
}

// replaced: the element or the document a query found is gone (the page
// refreshed itself meanwhile).
func replaced(err error) bool {
	for _, s := range []string{"No node with given id found", "Cannot find context with specified id", "Execution context was destroyed"} {
		if strings.Contains(err.Error(), s) {
			return true
		}
	}
	return false
}

func (b *browser) attr(sel, name string) string {
	ns := b.nodes(sel)
	if len(ns) == 0 {
		return ""
	}
	return ns[0].AttributeValue(name)
}

// until reloads path until ok says so (60 s at most).
func (b *browser) until(path, what string, ok func() bool) {
	b.t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		b.open(path)
		if ok() {
			return
		}
		if time.Now().After(deadline) {
			b.t.Fatalf("%s: not seen on %s within 60s", what, path)
		}
	}
}

// buildHub writes a hub with n edges straight into a worker's data
// directory (before the worker starts), 10,000 edges a transaction.
func buildHub(t *testing.T, dir, tenant string, n int) uuid.UUID {
	t.Helper()
	st, err := storage.OpenStore(filepath.Join(dir, "pebble"), storage.Options{Logger: testLog})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	sc := storage.MustScope(tenant)
	hub := uuid.New()
	open := storage.NodeWrite{ValidFrom: storage.NoTs, ValidTo: storage.NoTs}
	for done := -1; done < n; {
		err := st.Update(context.Background(), func(tx *storage.Txn) error {
			if done < 0 {
				w := open
				w.ID = hub
				_, err := tx.PutNode(sc, w)
				done = 0
				return err
			}
			for i := 0; i < 10_000 && done < n; i, done = i+1, done+1 {
				w := open
				w.ID = uuid.New()
				if _, err := tx.PutNode(sc, w); err != nil {
					return err
				}
				if _, err := tx.PutEdge(sc, storage.EdgeWrite{ID: uuid.New(), Src: hub, Dst: w.ID, Label: "rel", ValidFrom: storage.NoTs, ValidTo: storage.NoTs}); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	return hub
}

// TestBrowserStatusPage drives the status page of a real worker in
// headless Chromium: every page loads without a console error; a journal's
// bar advances during a 200k-edge cascade (20k under -race) and the page
// shows it done; the explorer shows the hub alive just before its
// tombstone's tx and dead at it, with its edges; a poison message appears
// under dead letters, retry republishes it to its original subject and it
// comes back as a new dead letter, discard removes another, and the list
// says so each time; the request lookup answers.
func TestBrowserStatusPage(t *testing.T) {
	ns := testnats.Start(t)
	dir := t.TempDir()
	edges := 200_000
	if raceOn || testing.Short() {
		edges = 20_000
	}
	hub := buildHub(t, dir, "acme", edges)
	w := startWorker(t, ns, dir, Options{}, "--max-batch-ops", "5000", "--journal-chunk-ops", "1000")
	bus := newBus(t, ns)
	b := newBrowser(t, w.base)

	b.open("/ui/")
	if b.count("#requests-total") != 1 || !strings.Contains(b.text("#partitions"), "owns partitions") {
		t.Fatal("overview: figures missing")
	}
	// Issue 23 item 7: uptime, NATS, the consumer, pending's as-of, the
	// oldest pending, a self-refresh.
	if b.text("#nats") != "connected" || b.text("#consumer-state") != "consuming" || b.text("#uptime") == "" ||
		b.count(`meta[http-equiv="refresh"]`) != 1 || b.text("#oldest-pending") == "" {
		t.Fatalf("overview: NATS %q, consumer %q, uptime %q", b.text("#nats"), b.text("#consumer-state"), b.text("#uptime"))
	}
	b.until("/ui/", "queue pending with its as-of", func() bool { return strings.HasPrefix(b.text("#pending-as-of"), "as of 20") })

	// Issue 23 item 12: pause from the page; every page and /readyz say
	// so (still 200); a request waits; resume, and it is answered.
	b.do("pause", chromedp.Click(chromedp.CSS("#pause")), chromedp.WaitVisible(chromedp.CSS("#flash")))
	if f := b.text("#flash"); !strings.Contains(f, "paused until resumed") || b.text("#consumer-state") != "paused" || b.count("#paused-banner") != 1 {
		t.Fatalf("after pause: flash %q, consumer %q", f, b.text("#consumer-state"))
	}
	b.noErrors("pause")
	if code, body := httpGet(t, w.base+"/readyz"); code != 200 || !strings.Contains(body, "paused until resumed") {
		t.Fatalf("/readyz while paused: %d %s, want 200 with the pause", code, body)
	}
	waiting := bus.send("acme", node(uuid.NewString()))
	b.until("/ui/", "the request waiting while paused", func() bool { return b.text("#pending") == "1" })
	b.open("/ui/journals")
	if b.count("#paused-banner") != 1 {
		t.Fatal("the journals page does not say the consumer is paused")
	}
	b.open("/ui/")
	b.do("resume", chromedp.Click(chromedp.CSS("#resume")), chromedp.WaitVisible(chromedp.CSS("#flash")))
	if f := b.text("#flash"); !strings.Contains(f, "consuming") || b.count("#paused-banner") != 0 {
		t.Fatalf("after resume: flash %q", f)
	}
	mustOK(t, bus.wait(waiting))
	if code, body := httpGet(t, w.base+"/readyz"); code != 200 || strings.Contains(body, "paused") {
		t.Fatalf("/readyz after resume: %d %s", code, body)
	}
	b.open("/ui/")
	b.screenshot("overview")

	// The cascade, watched on the journals page.
	rid := bus.send("acme", tombNode(hub.String()))
	var first int
	progress := func() (done, total int) {
		done, _ = strconv.Atoi(b.attr(".journal", "data-done"))
		total, _ = strconv.Atoi(b.attr(".journal", "data-total"))
		return
	}
	b.until("/ui/journals", "a journal with progress", func() bool {
		if b.count(".journal") == 0 {
			return false
		}
		first, _ = progress()
		return first > 0
	})
	if s := b.text(".journal .state"); !strings.HasPrefix(s, "applying (attempt 1)") && !strings.HasPrefix(s, "pending") && !strings.HasPrefix(s, "waiting") {
		t.Fatalf("journal state %q, want applying (attempt 1)", s)
	}
	if href := b.attr(".journal a.request", "href"); !strings.Contains(href, "/ui/requests?") || !strings.Contains(href, rid) {
		t.Fatalf("the journal's request is no link to the lookup: %q", href)
	}
	b.screenshot("journals")
	b.until("/ui/journals", "the journal's bar advancing", func() bool {
		if b.count(".journal") == 0 {
			return true // done already: it advanced to the end
		}
		done, total := progress()
		return done > first && total == edges
	})
	res := mustOK(t, bus.wait(rid))
	b.until("/ui/journals", "the journal done", func() bool { return b.count("#no-journals") == 1 })
	// Issue 23 item 10: it stays listed, finished, with its outcome.
	if sel := fmt.Sprintf(`tr.finished[data-request=%q] .outcome`, rid); b.count(sel) != 1 || b.text(sel) != "ok" {
		t.Fatalf("the finished journal is not in the recent history (%d rows)", b.count("tr.finished"))
	}

	// The explorer: alive just before the tombstone's tx, dead at it.
	tx := parseTx(t, res.TxTime)
	at := func(tx storage.Ts) string {
		return "/ui/explorer?" + url.Values{"tenant": {"acme"}, "kind": {"node"}, "id": {hub.String()}, "tx": {tx.Time().Format(storage.TimeLayout)}}.Encode()
	}
	b.open(at(tx - 1))
	if s := b.text("#state"); s != "alive" || b.count("tr.edge") == 0 || b.count("#history-svg rect") != 2 {
		t.Fatalf("explorer before the tombstone: state %q, %d edges, %d boxes", s, b.count("tr.edge"), b.count("#history-svg rect"))
	}
	// Issue 23 item 8: a total (bounded), a next page, ticks, links.
	if c := b.text("#edges-count"); !strings.HasPrefix(c, "Edges 1–50 of ") || b.count("#edges-next") != 1 || b.count("#history-svg .tick") < 2 {
		t.Fatalf("explorer edges: %q, next %d, ticks %d", c, b.count("#edges-next"), b.count("#history-svg .tick"))
	}
	if edges >= ui.ExplorerEdgeCount && !strings.Contains(b.text("#edges-count"), "more than 10,000") {
		t.Fatalf("explorer edges of a hub of %d: %q", edges, b.text("#edges-count"))
	}
	b.screenshot("explorer")
	b.do("next edges", chromedp.Click(chromedp.CSS("#edges-next")), chromedp.WaitVisible(chromedp.CSS("#edges-first")))
	if c := b.text("#edges-count"); !strings.HasPrefix(c, "Edges 51–100 of ") || b.count("tr.edge") != 50 {
		t.Fatalf("explorer, second page of edges: %q, %d rows", c, b.count("tr.edge"))
	}
	b.noErrors("next edges")
	b.open(at(tx))
	if s := b.text("#state"); !strings.HasPrefix(s, "deleted at tx "+res.TxTime) || !strings.Contains(s, rid) || b.count("tr.edge") != 0 || b.count("#history-svg rect.tombstone") != 1 {
		t.Fatalf("explorer at the tombstone: state %q, %d edges", s, b.count("tr.edge"))
	}
	b.do("the tombstone's request", chromedp.Click(chromedp.CSS(fmt.Sprintf(`#history a.request[href*=%q]`, rid))), chromedp.WaitVisible(chromedp.CSS("#answer")))
	if a := b.text("#answer"); !strings.Contains(a, `"journaled": true`) {
		t.Fatalf("the history's request link: %q", a)
	}
	b.open("/ui/explorer")
	if b.count("#hints") != 1 {
		t.Fatal("the explorer's empty form has no hints")
	}

	// Dead letters: a poison message, retried (it comes back), another
	// discarded.
	poison := func() string {
		id := uuid.NewString()
		bus.sendRaw("telha.req.acme", []byte(`{"request_id":"`+id+`","op":"put_node","tenant":"acme","id":"not-a-uuid"}`), "acme."+id)
		if r := bus.wait(id); r.Status != queue.StatusInvalid {
			t.Fatalf("poison: %+v", r)
		}
		return id
	}
	p1 := poison()
	row := func(rid string) (seq string) {
		return b.attr(fmt.Sprintf(`tr.letter[data-request=%q]`, rid), "data-seq")
	}
	var seq1 string
	b.until("/ui/dlq", "the poison message under dead letters", func() bool { seq1 = row(p1); return seq1 != "" })
	b.screenshot("dead-letters")
	b.do("retry", chromedp.Click(chromedp.CSS(fmt.Sprintf("#letter-%s .retry", seq1))), chromedp.WaitVisible(chromedp.CSS("#flash")))
	if f := b.text("#flash"); !strings.Contains(f, "retried") || !strings.Contains(f, "telha.req.acme") {
		t.Fatalf("after retry: %q", f)
	}
	b.noErrors("retry")
	b.until("/ui/dlq", "the retried poison back as a new dead letter", func() bool { s := row(p1); return s != "" && s != seq1 })
	p2 := poison()
	var seq2 string
	b.until("/ui/dlq", "a second poison message", func() bool { seq2 = row(p2); return seq2 != "" })
	b.do("discard", chromedp.Click(chromedp.CSS(fmt.Sprintf("#letter-%s .discard", seq2))), chromedp.WaitVisible(chromedp.CSS("#flash")))
	if f := b.text("#flash"); !strings.Contains(f, "discarded") {
		t.Fatalf("after discard: %q", f)
	}
	if row(p2) != "" {
		t.Fatal("the discarded dead letter is still listed")
	}
	b.noErrors("discard")

	// Issue 23 item 9: the invalid request's lookup points to its dead
	// letter.
	b.open("/ui/requests?" + url.Values{"tenant": {"acme"}, "id": {p1}}.Encode())
	b.do("the dead letter of an invalid request", chromedp.Click(chromedp.CSS("#dead-letter-link")), chromedp.WaitVisible(chromedp.CSS("#dead-letters")))
	if row(p1) == "" {
		t.Fatal("the lookup's dead-letter link does not show it")
	}
	// Issue 23 item 11: a bulk discard of a filtered page.
	b.open("/ui/dlq?tenant=acme&reason=invalid")
	n := b.count("tr.letter")
	b.do("bulk discard", chromedp.Click(chromedp.CSS("#bulk-discard")), chromedp.WaitVisible(chromedp.CSS("#flash")))
	if f := b.text("#flash"); !strings.Contains(f, fmt.Sprintf("%d dead letters discarded", n)) || b.count("tr.letter") != 0 {
		t.Fatalf("bulk discard of %d: %q, %d left", n, f, b.count("tr.letter"))
	}
	b.noErrors("bulk discard")

	// Request lookup.
	b.open("/ui/requests?" + url.Values{"tenant": {"acme"}, "id": {rid}}.Encode())
	if a := b.text("#answer"); !strings.Contains(a, rid) || !strings.Contains(a, `"journaled": true`) {
		t.Fatalf("request lookup: %q", a)
	}
	b.screenshot("request-lookup")
	// The recent requests, newest first; the not_found filter.
	b.open("/ui/requests")
	if b.count(fmt.Sprintf(`tr.result[data-request=%q]`, rid)) != 1 || b.count(fmt.Sprintf(`tr.result[data-request=%q][data-status="invalid"]`, p1)) < 1 {
		t.Fatalf("recent requests: %d rows, the cascade's or the invalid one missing", b.count("tr.result"))
	}
	b.screenshot("requests")
	b.open("/ui/requests?status=ok")
	if b.count(`tr.result[data-status="invalid"]`) != 0 || b.count("tr.result") == 0 {
		t.Fatal("recent requests filtered by ok: wrong rows")
	}

	// Issue 32 item 7.1: the page takes a wide screen's width, and never
	// breaks an id across lines: on a narrow screen a table scrolls
	// sideways in its box.
	b.do("a wide screen", chromedp.EmulateViewport(1920, 1000))
	b.open("/ui/requests")
	if wd := b.eval(`document.querySelector('main').getBoundingClientRect().width`); wd < 1800 {
		t.Fatalf("on a screen 1,920 px wide the page is %.0f px wide", wd)
	}
	b.do("a narrow screen", chromedp.EmulateViewport(700, 1000))
	for _, path := range []string{"/ui/requests", "/ui/journals", at(tx - 1)} {
		b.open(path)
		b.idsOnOneLine(path)
	}
	b.open("/ui/requests")
	if b.eval(`(() => { const s = document.querySelector('#recent').parentElement; return s.scrollWidth > s.clientWidth && getComputedStyle(s).overflowX === 'auto' ? 1 : 0 })()`) != 1 {
		t.Fatal("on a narrow screen the recent requests do not scroll sideways in their box")
	}
	b.screenshot("requests-narrow")
	b.do("the usual screen", chromedp.EmulateViewport(1280, 1000))
}

// eval evaluates a JavaScript expression to a number.
func (b *browser) eval(js string) float64 {
	b.t.Helper()
	v, err := chromedp.Run(b.ctx, chromedp.Evaluate[float64](js))
	if err != nil {
		b.t.Fatalf("evaluate %s: %v", js, err)
	}
	return v
}

// idsOnOneLine fails when the page has no id cell, or an id cell (a UUID,
// a request id) takes more than one line.
func (b *browser) idsOnOneLine(where string) {
	b.t.Helper()
	res, err := chromedp.Run(b.ctx, chromedp.Evaluate[string](`(() => {
		const cells = [...document.querySelectorAll('td.id')].filter(td => td.textContent.trim() !== '');
		const bad = [];
		for (const td of cells) {
			const r = document.createRange();
			r.selectNodeContents(td);
			const cs = getComputedStyle(td);
			let lh = parseFloat(cs.lineHeight);
			if (isNaN(lh)) lh = 1.45 * parseFloat(cs.fontSize);
			if (r.getBoundingClientRect().height > 1.5 * lh) bad.push(td.textContent.trim());
		}
		return JSON.stringify({n: cells.length, bad: bad});
	})()`))
	if err != nil {
		b.t.Fatalf("%s: ids: %v", where, err)
	}
	var out struct {
		N   int      `json:"n"`
		Bad []string `json:"bad"`
	}
	if err := json.Unmarshal([]byte(res), &out); err != nil {
		b.t.Fatalf("%s: %s: %v", where, res, err)
	}
	if out.N == 0 || len(out.Bad) > 0 {
		b.t.Fatalf("%s on a narrow screen: %d id cells, broken across lines: %v", where, out.N, out.Bad)
	}
}

// TestBrowserStatusPageTokens: with a tokens file, the page asks for a
// sign-in; a read token sees dead letters without retry or discard, and a
// retry posted anyway is refused (403); a token of another tenant sees
// nothing of the first (its dead letters, journals and nodes); an operate
// token gets the buttons; sign-out asks for a token again.
func TestBrowserStatusPageTokens(t *testing.T) {
	ns := testnats.Start(t)
	path := filepath.Join(t.TempDir(), "tokens.json")
	toks := `{"tokens": [
		{"name": "reader-a", "token": "reader-token-for-acme-01", "tenants": ["acme"], "role": "read"},
		{"name": "oper-a", "token": "operator-token-for-acme-1", "tenants": ["acme"], "role": "operate"},
		{"name": "reader-b", "token": "reader-token-for-beta-01", "tenants": ["beta"], "role": "read"}]}`
	if err := os.WriteFile(path, []byte(toks), 0o600); err != nil {
		t.Fatal(err)
	}
	w := startWorker(t, ns, t.TempDir(), Options{}, "--auth-tokens-file", path)
	bus := newBus(t, ns)
	n := uuid.NewString()
	mustOK(t, bus.wait(bus.send("acme", node(n))))
	id := uuid.NewString()
	bus.sendRaw("telha.req.acme", []byte(`{"request_id":"`+id+`","op":"put_node","tenant":"acme","id":"bad"}`), "acme."+id)
	if r := bus.wait(id); r.Status != queue.StatusInvalid {
		t.Fatalf("poison: %+v", r)
	}
	signIn := func(tok string) *browser {
		b := newBrowser(t, w.base)
		b.do("sign in", chromedp.Navigate(w.base+"/ui/"), chromedp.WaitVisible(chromedp.CSS("#token")),
			chromedp.SendKeys(chromedp.CSS("#token"), tok), chromedp.Click(chromedp.CSS("#signin")),
			chromedp.WaitVisible(chromedp.CSS("#journals")))
		loc, err := chromedp.Run(b.ctx, chromedp.Location())
		if err != nil || !strings.HasSuffix(loc, "/ui/") {
			t.Fatalf("after sign-in at %s", loc)
		}
		return b
	}
	ra := signIn("reader-token-for-acme-01")
	ra.open("/ui/dlq")
	if ra.count("tr.letter") != 1 || ra.count(".retry") != 0 || ra.count(".discard") != 0 {
		t.Fatalf("read token: %d dead letters, %d retry buttons", ra.count("tr.letter"), ra.count(".retry"))
	}
	seq := ra.attr("tr.letter", "data-seq")
	status, err := chromedp.Run(ra.ctx, chromedp.Evaluate[int](fmt.Sprintf(`fetch('/ui/dlq/%s/retry', {method: 'POST', body: new URLSearchParams({csrf: document.querySelector('meta[name=csrf]').content})}).then(r => r.status)`, seq),
		chromedp.EvalAwaitPromise))
	if err != nil || status != 403 {
		t.Fatalf("a read token posting a retry: %d %v, want 403", status, err)
	}
	ra.screenshot("dead-letters-read-token")

	rb := signIn("reader-token-for-beta-01")
	rb.open("/ui/dlq")
	if rb.count("tr.letter") != 0 {
		t.Fatal("a token of tenant beta sees acme's dead letters")
	}
	rb.open("/ui/explorer?" + url.Values{"tenant": {"acme"}, "kind": {"node"}, "id": {n}}.Encode())
	if e := rb.text("#error"); !strings.Contains(e, "may not read tenant") || rb.count("#state") != 0 {
		t.Fatalf("a token of tenant beta exploring acme: %q", e)
	}
	rb.open("/ui/requests?" + url.Values{"tenant": {"acme"}, "id": {id}}.Encode())
	if a := rb.text("#answer"); !strings.Contains(a, "may not read tenant") || strings.Contains(a, "status") {
		t.Fatalf("a token of tenant beta looking up acme's request: %q", a)
	}

	oa := signIn("operator-token-for-acme-1")
	oa.open("/ui/dlq")
	if oa.count(".retry") != 1 || oa.count(".discard") != 1 {
		t.Fatal("an operate token gets no retry and discard")
	}
	// Sign-out ends the session: the page asks for a token again.
	oa.do("sign out", chromedp.Click(chromedp.CSS("#signout")), chromedp.WaitVisible(chromedp.CSS("#token")))
	oa.open("/ui/dlq")
	if oa.count("#token") != 1 || oa.count("tr.letter") != 0 {
		t.Fatal("after sign-out the dead letters still show")
	}
}
