package app

import (
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
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

// TestOverviewRatesOverTheLastMinute: the overview's rates are against the
// oldest count it saw in the last minute, none on a first load.
func TestOverviewRatesOverTheLastMinute(t *testing.T) {
	var w rateWindow
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	if base, _ := w.window(t0, map[string]float64{"ok": 10}); base != nil {
		t.Fatal("a first load has no window")
	}
	base, since := w.window(t0.Add(30*time.Second), map[string]float64{"ok": 40})
	if base["ok"] != 10 || since != 30*time.Second {
		t.Fatalf("after 30 s: %v over %s, want 10 over 30s", base, since)
	}
	base, since = w.window(t0.Add(80*time.Second), map[string]float64{"ok": 100})
	if base["ok"] != 40 || since != 50*time.Second {
		t.Fatalf("after 80 s: %v over %s, want the 30 s sample (40) over 50s", base, since)
	}
}
