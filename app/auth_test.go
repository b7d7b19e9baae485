package app

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/telha/telha-cascade/internal/testnats"
)

// TestE2EAuthTokens: a worker with --auth-tokens-file asks every /v1/
// request for a token of its tenant (401 without one, 403 for another
// tenant, counted in telha_api_denied_total), and leaves /metrics and the
// probes open. Bad auth flags are usage errors.
func TestE2EAuthTokens(t *testing.T) {
	ns := testnats.Start(t)
	path := filepath.Join(t.TempDir(), "tokens.json")
	if err := os.WriteFile(path, []byte(`{"tokens": [{"name": "grafana", "token": "acme-reader-token-0001", "tenants": ["acme"], "role": "read"}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	w := startWorker(t, ns, t.TempDir(), Options{}, "--auth-tokens-file", path)
	get := func(p, tok string) int {
		req, _ := http.NewRequest(http.MethodGet, w.base+p, nil)
		if tok != "" {
			req.Header.Set("Authorization", "Bearer "+tok)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	node := "/v1/tenants/acme/nodes/" + uuid.NewString()
	for _, c := range []struct {
		path, tok string
		want      int
	}{
		{node, "", http.StatusUnauthorized},
		{node, "wrong-token-wrong-token", http.StatusUnauthorized},
		{node, "acme-reader-token-0001", http.StatusNotFound},
		{"/v1/tenants/other/nodes/" + uuid.NewString(), "acme-reader-token-0001", http.StatusForbidden},
		{"/v1/journals", "acme-reader-token-0001", http.StatusOK},
		{"/metrics", "", http.StatusOK},
		{"/healthz", "", http.StatusOK},
		{"/readyz", "", http.StatusOK},
	} {
		if got := get(c.path, c.tok); got != c.want {
			t.Errorf("GET %s (token %q): %d, want %d", c.path, c.tok, got, c.want)
		}
	}
	if v := metricValue(t, w, `telha_api_denied_total{reason="unauthenticated"}`); v != 2 {
		t.Errorf("unauthenticated denials: %v, want 2", v)
	}
	if v := metricValue(t, w, `telha_api_denied_total{reason="forbidden_tenant"}`); v != 1 {
		t.Errorf("forbidden_tenant denials: %v, want 1", v)
	}
	for _, args := range [][]string{{"--auth", "tokens"}, {"--auth", "maybe"}, {"--auth", "off", "--auth-tokens-file", path}} {
		if _, err := ParseFlags(append([]string{"--data-dir", t.TempDir()}, args...), func(string) string { return "" }, io.Discard); err == nil || !strings.Contains(err.Error(), "auth") {
			t.Errorf("flags %v: %v, want a usage error about --auth", args, err)
		}
	}
}

// pageClient is a browser-like client of the status page: a cookie jar,
// Origin on its POSTs, and the CSRF token of the last page it read.
type pageClient struct {
	t    *testing.T
	base string
	c    *http.Client
	csrf string
}

func newPageClient(t *testing.T, base string) *pageClient {
	jar, _ := cookiejar.New(nil)
	return &pageClient{t: t, base: base, c: &http.Client{Jar: jar}}
}

var pageCSRF = regexp.MustCompile(`name="csrf" (?:value|content)="([^"]+)"`)

func (p *pageClient) get(path string) (int, string) {
	p.t.Helper()
	resp, err := p.c.Get(p.base + path)
	if err != nil {
		p.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if m := pageCSRF.FindSubmatch(b); m != nil {
		p.csrf = string(m[1])
	}
	return resp.StatusCode, string(b)
}

func (p *pageClient) post(path string, form url.Values) (int, string) {
	p.t.Helper()
	form.Set("csrf", p.csrf)
	req, _ := http.NewRequest(http.MethodPost, p.base+path, strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Origin", p.base)
	resp, err := p.c.Do(req)
	if err != nil {
		p.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if m := pageCSRF.FindSubmatch(b); m != nil {
		p.csrf = string(m[1])
	}
	return resp.StatusCode, string(b)
}

// TestStatusPageScopedTokenAndRetry (issue 20 items 4 and 23): a token of
// tenant acme sees acme's dead letters and their count on the overview
// and the dead-letter page, not the worker's totals; a dead letter of
// acme whose Telha-Original-Subject names tenant beta's subject (or the
// JetStream API), retried through the page with acme's operate token,
// goes to telha.req.acme: nothing lands in beta, the results stream keeps
// its results.
func TestStatusPageScopedTokenAndRetry(t *testing.T) {
	ns := testnats.Start(t)
	path := filepath.Join(t.TempDir(), "tokens.json")
	toks := `{"tokens": [{"name": "oper-a", "token": "operator-token-for-acme-1", "tenants": ["acme"], "role": "operate"},
		{"name": "all", "token": "reader-token-for-everyone", "tenants": ["*"], "role": "read"}]}`
	if err := os.WriteFile(path, []byte(toks), 0o600); err != nil {
		t.Fatal(err)
	}
	w := startWorker(t, ns, t.TempDir(), Options{}, "--auth-tokens-file", path)
	bus := newBus(t, ns)
	for i := 0; i < 3; i++ { // beta's dead letters and requests, which acme's token must not count
		id := uuid.NewString()
		bus.sendRaw("telha.req.beta", []byte(`{"request_id":"`+id+`","op":"put_node","tenant":"beta","id":"bad"}`), "beta."+id)
		bus.wait(id)
	}
	victim := uuid.NewString()
	ctx := context.Background()
	var seqs []uint64
	for _, planted := range []string{"telha.req.beta", "$JS.API.STREAM.PURGE.TELHA_RES"} {
		m := nats.NewMsg("telha.dlq.acme")
		m.Data = []byte(`{"request_id":"` + uuid.NewString() + `","op":"put_node","tenant":"beta","id":"` + victim + `"}`)
		m.Header.Set("Telha-Reason", "invalid")
		m.Header.Set("Telha-Original-Subject", planted)
		ack, err := bus.js.PublishMsg(ctx, m)
		if err != nil {
			t.Fatal(err)
		}
		seqs = append(seqs, ack.Sequence)
	}
	resInfo := func() uint64 {
		s, err := bus.js.Stream(ctx, "TELHA_RES")
		if err != nil {
			t.Fatal(err)
		}
		info, err := s.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return info.State.Msgs
	}
	resBefore := resInfo()

	p := newPageClient(t, w.base)
	p.get("/ui/login")
	if code, _ := p.post("/ui/login", url.Values{"token": {"operator-token-for-acme-1"}}); code != http.StatusOK {
		t.Fatalf("sign-in: %d", code)
	}
	_, body := p.get("/ui/")
	if !strings.Contains(body, `id="scoped"`) || strings.Contains(body, `id="requests-total"`) || !strings.Contains(body, `<b id="dead-letters">2</b>`) {
		t.Fatalf("overview of acme's token: want acme's 2 dead letters and no worker totals: %s", body)
	}
	_, body = p.get("/ui/dlq")
	if !strings.Contains(body, "2 shown, newest first, of 2") {
		t.Fatalf("dead letters of acme's token: %s", body)
	}
	for _, seq := range seqs {
		if code, body := p.post(fmt.Sprintf("/ui/dlq/%d/retry", seq), url.Values{}); code != http.StatusOK || !strings.Contains(body, "republished to telha.req.acme") {
			t.Fatalf("retry %d: %d %s", seq, code, body)
		}
	}
	// The retries are answered (invalid: the body names another tenant)
	// and dead-lettered again, on acme.
	testnats.Eventually(t, 30*time.Second, "the retried letters dead-lettered again on acme", func() bool {
		n := 0
		for _, d := range bus.deadLetters() {
			if d.Subject == "telha.dlq.acme" && strings.Contains(string(d.Data), victim) {
				n++
			}
		}
		return n == 2
	})
	req, _ := http.NewRequest(http.MethodGet, w.base+"/v1/tenants/beta/nodes/"+victim, nil)
	req.Header.Set("Authorization", "Bearer reader-token-for-everyone")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Fatalf("beta's node planted through acme's retry: %d", resp.StatusCode)
	}
	if after := resInfo(); after < resBefore {
		t.Fatalf("results stream: %d messages, was %d", after, resBefore)
	}
}
