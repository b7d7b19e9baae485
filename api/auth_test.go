package api_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/google/uuid"
	"github.com/telha/telha-cascade/api"
	"github.com/telha/telha-cascade/cascade"
	"github.com/telha/telha-cascade/storage"
)

// Access control (CONTRACT §6, "Access"): every read endpoint and role
// through the real HTTP handler.

const (
	tokA    = "token-for-tenant-acme-0001"
	tokB    = "token-for-tenant-beta-0002"
	tokAll  = "token-for-every-tenant-03"
	tokOper = "operator-token-acme-00004"
)

func writeTokens(t *testing.T, path string, toks ...api.Token) {
	t.Helper()
	b, _ := json.Marshal(map[string]any{"tokens": toks})
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

type deniedCount struct {
	mu sync.Mutex
	n  map[string]int
}

func (d *deniedCount) add(r string) { d.mu.Lock(); d.n[r]++; d.mu.Unlock() }
func (d *deniedCount) get(r string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.n[r]
}

// authEnv is the apiEnv's store behind a gate.
func authEnv(t *testing.T, mode api.AuthMode) (*apiEnv, http.Handler, string, *deniedCount) {
	e := newEnv(t, 1000)
	path := filepath.Join(t.TempDir(), "tokens.json")
	writeTokens(t, path,
		api.Token{Name: "a", Token: tokA, Tenants: []string{"acme"}, Role: api.RoleRead},
		api.Token{Name: "b", Token: tokB, Tenants: []string{"beta"}, Role: api.RoleRead},
		api.Token{Name: "all", Token: tokAll, Tenants: []string{"*"}, Role: api.RoleRead},
		api.Token{Name: "oper", Token: tokOper, Tenants: []string{"acme"}, Role: api.RoleOperate})
	d := &deniedCount{n: map[string]int{}}
	auth, err := api.NewAuth(api.AuthConfig{Mode: mode, TokensFile: path, CheckEvery: -1, Logger: quiet, Denied: d.add})
	if err != nil {
		t.Fatal(err)
	}
	h := api.Handler(e.store, api.Options{ReadAPI: true, Health: true, Now: e.clock.Now, Logger: quiet, Auth: auth,
		Journals: func() []api.Journal {
			return []api.Journal{{Tenant: "acme", NodeID: uuid.NewString()}, {Tenant: "beta", NodeID: uuid.NewString()}}
		}})
	return e, h, path, d
}

func call(h http.Handler, path, token, remote string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(http.MethodGet, path, nil)
	req.Host = "127.0.0.1:8080" // as a client on this machine names the worker
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if remote != "" {
		req.RemoteAddr = remote
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

// TestAuthEveryEndpointAndRole: with tokens, every tenant endpoint answers
// a token of its tenant (or "*") exactly as an open API would, refuses a
// token of another tenant with 403 and no token or an unknown one with
// 401, whether or not the entity exists (a refusal never says);
// /v1/journals lists only the token's tenants; health and metrics stay
// open.
func TestAuthEveryEndpointAndRole(t *testing.T) {
	e, h, _, denied := authEnv(t, api.AuthTokens)
	n, m, ed := uuid.New(), uuid.New(), uuid.New()
	e.apply(cascade.Request{Op: storage.OpPutNode, ID: n, RequestID: "r1"})
	e.apply(cascade.Request{Op: storage.OpPutNode, ID: m})
	e.apply(cascade.Request{Op: storage.OpPutEdge, ID: ed, Src: n, Dst: m, Label: "x"})
	open := api.Handler(e.store, api.Options{ReadAPI: true, Now: e.clock.Now, Logger: quiet})
	missing := uuid.New()
	var paths []string
	for _, id := range []uuid.UUID{n, missing} {
		paths = append(paths, "/v1/tenants/acme/nodes/"+id.String(), "/v1/tenants/acme/nodes/"+id.String()+"/edges",
			"/v1/tenants/acme/nodes/"+id.String()+"/history")
	}
	for _, id := range []uuid.UUID{ed, missing} {
		paths = append(paths, "/v1/tenants/acme/edges/"+id.String(), "/v1/tenants/acme/edges/"+id.String()+"/history")
	}
	paths = append(paths, "/v1/tenants/acme/requests/r1", "/v1/tenants/acme/requests/nope", "/v1/tenants/acme/erasures/nope")
	for _, p := range paths {
		want := call(open, p, "", "")
		for _, tok := range []string{tokA, tokAll, tokOper} {
			if got := call(h, p, tok, ""); got.Code != want.Code || got.Body.String() != want.Body.String() {
				t.Errorf("GET %s with a token of its tenant: %d %s, open API %d %s", p, got.Code, got.Body, want.Code, want.Body)
			}
		}
		var bodies []string
		for _, c := range []struct {
			tok  string
			code int
		}{{tokB, http.StatusForbidden}, {"", http.StatusUnauthorized}, {"not-a-token-at-all-xyz", http.StatusUnauthorized}} {
			got := call(h, p, c.tok, "")
			if got.Code != c.code {
				t.Errorf("GET %s with token %q: %d %s, want %d", p, c.tok, got.Code, got.Body, c.code)
			}
			if c.code == http.StatusUnauthorized && !strings.HasPrefix(got.Header().Get("WWW-Authenticate"), "Bearer") {
				t.Errorf("GET %s: 401 without WWW-Authenticate", p)
			}
			bodies = append(bodies, got.Body.String())
		}
		// The refusal is the same for an entity that exists and one that
		// does not (only the tenant is named).
		if strings.Contains(strings.Join(bodies, " "), n.String()) || strings.Contains(strings.Join(bodies, " "), missing.String()) {
			t.Errorf("GET %s: a refusal names the entity: %v", p, bodies)
		}
	}
	if denied.get("forbidden_tenant") != len(paths) || denied.get("unauthenticated") != 2*len(paths) {
		t.Errorf("denied counts: %v, want %d forbidden_tenant and %d unauthenticated", denied.n, len(paths), 2*len(paths))
	}

	// Journals: the token's tenants only.
	for tok, want := range map[string][]string{tokA: {"acme"}, tokB: {"beta"}, tokAll: {"acme", "beta"}} {
		var js struct{ Journals []api.Journal }
		rec := call(h, "/v1/journals", tok, "")
		if err := json.Unmarshal(rec.Body.Bytes(), &js); err != nil || rec.Code != http.StatusOK {
			t.Fatalf("journals: %d %s", rec.Code, rec.Body)
		}
		var got []string
		for _, j := range js.Journals {
			got = append(got, j.Tenant)
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("journals seen by %s: %v, want %v", tok, got, want)
		}
	}
	if rec := call(h, "/v1/journals", "", ""); rec.Code != http.StatusUnauthorized {
		t.Errorf("journals without a token: %d", rec.Code)
	}
	// Health and metrics: no token, from anywhere.
	for _, p := range []string{"/healthz", "/readyz"} {
		if rec := call(h, p, "", "203.0.113.9:4000"); rec.Code == http.StatusUnauthorized || rec.Code == http.StatusForbidden {
			t.Errorf("GET %s without a token: %d", p, rec.Code)
		}
	}
}

// TestAuthLoopbackAndOff: without tokens the API answers loopback clients
// only (401 to others, counted); --auth off answers everyone.
func TestAuthLoopbackAndOff(t *testing.T) {
	_, h, _, denied := authEnv(t, api.AuthLoopback)
	p := "/v1/tenants/acme/nodes/" + uuid.NewString()
	for _, remote := range []string{"127.0.0.1:5000", "[::1]:5000"} {
		if rec := call(h, p, "", remote); rec.Code != http.StatusNotFound {
			t.Errorf("loopback %s: %d %s, want the API's 404", remote, rec.Code, rec.Body)
		}
	}
	for _, remote := range []string{"10.1.2.3:5000", "[2001:db8::1]:5000", "garbage"} {
		if rec := call(h, p, tokAll, remote); rec.Code != http.StatusUnauthorized || !strings.Contains(rec.Body.String(), "loopback") {
			t.Errorf("non-loopback %s: %d %s, want 401 saying why", remote, rec.Code, rec.Body)
		}
	}
	if denied.get("loopback_only") != 3 {
		t.Errorf("loopback_only denials: %d, want 3", denied.get("loopback_only"))
	}
	_, off, _, _ := authEnv(t, api.AuthOff)
	if rec := call(off, p, "", "10.1.2.3:5000"); rec.Code != http.StatusNotFound {
		t.Errorf("--auth off from afar: %d, want the API's 404", rec.Code)
	}
}

// TestAuthTokensFileReloads: a changed tokens file applies to the next
// request; a broken one leaves the tokens in force; a bad file at start is
// an error.
func TestAuthTokensFileReloads(t *testing.T) {
	_, h, path, _ := authEnv(t, api.AuthTokens)
	p := "/v1/tenants/beta/nodes/" + uuid.NewString()
	if rec := call(h, p, tokB, ""); rec.Code != http.StatusNotFound {
		t.Fatalf("before the change: %d", rec.Code)
	}
	const newTok = "a-brand-new-token-for-beta"
	writeTokens(t, path, api.Token{Name: "b2", Token: newTok, Tenants: []string{"beta"}, Role: api.RoleRead})
	if rec := call(h, p, tokB, ""); rec.Code != http.StatusUnauthorized {
		t.Errorf("a removed token: %d, want 401", rec.Code)
	}
	if rec := call(h, p, newTok, ""); rec.Code != http.StatusNotFound {
		t.Errorf("the new token: %d, want the API's 404", rec.Code)
	}
	if err := os.WriteFile(path, []byte(`{"tokens": [`), 0o600); err != nil {
		t.Fatal(err)
	}
	if rec := call(h, p, newTok, ""); rec.Code != http.StatusNotFound {
		t.Errorf("after a broken rewrite the tokens in force stay: %d", rec.Code)
	}
	for _, bad := range []string{`{"tokens": [`, `{"tokens": [{"name": "x", "token": "short", "tenants": ["*"], "role": "read"}]}`,
		`{"tokens": [{"name": "x", "token": "long-enough-token-000", "tenants": ["*"], "role": "admin"}]}`,
		`{"tokens": [{"name": "x", "token": "long-enough-token-000", "tenants": [], "role": "read"}]}`,
		`{"tokens": [], "extra": 1}`} {
		if err := os.WriteFile(path, []byte(bad), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := api.NewAuth(api.AuthConfig{Mode: api.AuthTokens, TokensFile: path, Logger: quiet}); err == nil {
			t.Errorf("tokens file %s accepted", bad)
		}
	}
	if _, err := api.NewAuth(api.AuthConfig{Mode: api.AuthTokens, TokensFile: filepath.Join(t.TempDir(), "none"), Logger: quiet}); err == nil {
		t.Error("a missing tokens file accepted")
	}
}
