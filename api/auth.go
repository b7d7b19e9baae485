package api

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"time"
)

// Access control of the read API (CONTRACT §6, "Access"). Bearer tokens
// from a file, each scoped to tenants (or "*") with a role: read (the read
// API) or operate (read, plus the write actions an operator's tools need).
// Without a tokens file the API answers loopback clients only; --auth off
// opens it to everyone. /metrics, /healthz and /readyz are never behind it.
//
// Decisions are made before any data is read, from the path alone, so a
// refusal never says whether an entity exists.

// Role is what a token may do.
type Role string

const (
	RoleRead    Role = "read"
	RoleOperate Role = "operate"
)

// AuthMode is how the API admits requests.
type AuthMode string

const (
	// AuthLoopback: no tokens configured; loopback clients only.
	AuthLoopback AuthMode = "loopback"
	// AuthTokens: a valid bearer token from the tokens file.
	AuthTokens AuthMode = "tokens"
	// AuthOff: everyone (an explicit choice, logged loudly).
	AuthOff AuthMode = "off"
)

// Token is one entry of the tokens file.
type Token struct {
	Name    string   `json:"name"`
	Token   string   `json:"token"`
	Tenants []string `json:"tenants"`
	Role    Role     `json:"role"`
}

// tenant reports whether the token may see tenant t.
func (t *Token) tenant(name string) bool {
	return slices.Contains(t.Tenants, "*") || slices.Contains(t.Tenants, name)
}

// ErrTokensFile: the tokens file cannot be read or is malformed.
var ErrTokensFile = errors.New("tokens file")

// ParseTokens reads a tokens file: {"tokens": [{"name", "token",
// "tenants": ["acme", ...] or ["*"], "role": "read" | "operate"}]}.
func ParseTokens(b []byte) ([]Token, error) {
	var f struct {
		Tokens []Token `json:"tokens"`
	}
	dec := json.NewDecoder(strings.NewReader(string(b)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&f); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrTokensFile, err)
	}
	seen := map[string]bool{}
	for i, t := range f.Tokens {
		switch {
		case len(t.Token) < 16:
			return nil, fmt.Errorf("%w: token %d (%q) is shorter than 16 characters", ErrTokensFile, i, t.Name)
		case t.Role != RoleRead && t.Role != RoleOperate:
			return nil, fmt.Errorf("%w: token %d (%q): role %q, want read or operate", ErrTokensFile, i, t.Name, t.Role)
		case len(t.Tenants) == 0:
			return nil, fmt.Errorf("%w: token %d (%q) names no tenant (use [\"*\"] for all)", ErrTokensFile, i, t.Name)
		case seen[t.Token]:
			return nil, fmt.Errorf("%w: token %d (%q) is listed twice", ErrTokensFile, i, t.Name)
		}
		seen[t.Token] = true
	}
	return f.Tokens, nil
}

// Auth admits or refuses read-API requests. The zero value is not usable;
// see NewAuth.
type Auth struct {
	mode AuthMode
	path string
	// CheckEvery bounds how often the tokens file is re-read (default 1s;
	// negative: on every request).
	checkEvery time.Duration
	log        *slog.Logger
	denied     func(reason string)

	mu        sync.Mutex
	tokens    map[[32]byte]*Token // by SHA-256 of the token
	sum       [32]byte            // of the file's contents
	lastCheck time.Time
}

// AuthConfig configures NewAuth.
type AuthConfig struct {
	Mode       AuthMode
	TokensFile string        // AuthTokens
	CheckEvery time.Duration // 0: 1s; negative: every request
	Logger     *slog.Logger
	// Denied counts refusals by reason: unauthenticated, forbidden_tenant,
	// forbidden_role, loopback_only.
	Denied func(reason string)
}

// NewAuth loads the tokens file (AuthTokens) and returns the gate.
func NewAuth(c AuthConfig) (*Auth, error) {
	a := &Auth{mode: c.Mode, path: c.TokensFile, checkEvery: c.CheckEvery, log: c.Logger, denied: c.Denied}
	if a.checkEvery == 0 {
		a.checkEvery = time.Second
	}
	if a.log == nil {
		a.log = slog.Default()
	}
	if a.denied == nil {
		a.denied = func(string) {}
	}
	switch c.Mode {
	case AuthLoopback, AuthOff:
	case AuthTokens:
		if err := a.reload(true); err != nil {
			return nil, err
		}
	default:
		return nil, fmt.Errorf("auth mode %q, want loopback, tokens or off", c.Mode)
	}
	return a, nil
}

// Mode returns the gate's mode.
func (a *Auth) Mode() AuthMode { return a.mode }

// reload re-reads the tokens file if it changed. At start a bad file is an
// error; later, the tokens in force stay and the error is logged.
func (a *Auth) reload(first bool) error {
	b, err := os.ReadFile(a.path)
	if err != nil {
		err = fmt.Errorf("%w: %v", ErrTokensFile, err)
	}
	var toks []Token
	if err == nil {
		toks, err = ParseTokens(b)
	}
	if err != nil {
		if !first {
			a.log.Error("tokens file not reloaded; the tokens in force stay", "path", a.path, "err", err)
		}
		return err
	}
	sum := sha256.Sum256(b)
	if !first && sum == a.sum {
		return nil
	}
	m := make(map[[32]byte]*Token, len(toks))
	for i := range toks {
		m[sha256.Sum256([]byte(toks[i].Token))] = &toks[i]
	}
	a.tokens, a.sum = m, sum
	if !first {
		a.log.Info("tokens file reloaded", "path", a.path, "tokens", len(m))
	}
	return nil
}

// lookup returns the token a request presents, after re-reading the file
// if it is due.
func (a *Auth) lookup(bearer string) *Token {
	a.mu.Lock()
	defer a.mu.Unlock()
	if now := time.Now(); a.checkEvery < 0 || now.Sub(a.lastCheck) >= a.checkEvery {
		a.lastCheck = now
		_ = a.reload(false)
	}
	// A map keyed by the token's hash: no byte-by-byte comparison of the
	// secret itself.
	return a.tokens[sha256.Sum256([]byte(bearer))]
}

type tokenKey struct{}

// tokenOf returns the token a request was admitted with (nil: loopback or
// auth off, which see every tenant).
func tokenOf(ctx context.Context) *Token {
	t, _ := ctx.Value(tokenKey{}).(*Token)
	return t
}

// mayRead reports whether the request's token may see tenant t.
func mayRead(ctx context.Context, t string) bool {
	tok := tokenOf(ctx)
	return tok == nil || tok.tenant(t)
}

// admit decides a /v1/ request from its path, before anything is read. It
// returns the request to serve (carrying its token), or false when it
// wrote the refusal.
func (a *Auth) admit(w http.ResponseWriter, r *http.Request, needs Role) (*http.Request, bool) {
	switch a.mode {
	case AuthOff:
		return r, true
	case AuthLoopback:
		host, _, err := net.SplitHostPort(r.RemoteAddr)
		if ip := net.ParseIP(host); err == nil && ip != nil && ip.IsLoopback() {
			return r, true
		}
		a.denied("loopback_only")
		writeError(w, http.StatusUnauthorized, "this worker's API answers loopback clients only: it has no --auth-tokens-file (and no --auth off)")
		return nil, false
	}
	bearer, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	var tok *Token
	if ok && bearer != "" {
		tok = a.lookup(bearer)
	}
	if tok == nil {
		a.denied("unauthenticated")
		w.Header().Set("WWW-Authenticate", `Bearer realm="telha-cascade"`)
		writeError(w, http.StatusUnauthorized, "a valid bearer token is required (Authorization: Bearer <token>)")
		return nil, false
	}
	if needs == RoleOperate && tok.Role != RoleOperate {
		a.denied("forbidden_role")
		writeError(w, http.StatusForbidden, fmt.Sprintf("token %q has role %s; this needs operate", tok.Name, tok.Role))
		return nil, false
	}
	if t, ok := tenantOfPath(r.URL.Path); ok && !tok.tenant(t) {
		a.denied("forbidden_tenant")
		writeError(w, http.StatusForbidden, fmt.Sprintf("token %q may not read tenant %s", tok.Name, quoteTenant(t)))
		return nil, false
	}
	return r.WithContext(context.WithValue(r.Context(), tokenKey{}, tok)), true
}

// tenantOfPath returns {t} of /v1/tenants/{t}/...
func tenantOfPath(p string) (string, bool) {
	rest, ok := strings.CutPrefix(p, "/v1/tenants/")
	if !ok {
		return "", false
	}
	t, _, _ := strings.Cut(rest, "/")
	return t, true
}

func quoteTenant(t string) string {
	if len(t) > 64 {
		t = t[:64]
	}
	return fmt.Sprintf("%q", t)
}

// Principal is who a request acts as: a token, or everyone (loopback
// without tokens, or --auth off).
type Principal struct {
	Name    string
	Tenants []string
	Role    Role
	All     bool // every tenant, operate (no tokens configured)
}

// Sees reports whether the principal may read tenant t.
func (p Principal) Sees(t string) bool {
	return p.All || slices.Contains(p.Tenants, "*") || slices.Contains(p.Tenants, t)
}

// Operates reports whether the principal may take write actions.
func (p Principal) Operates() bool { return p.All || p.Role == RoleOperate }

// TokenCookie is the cookie the status page keeps a token in.
const TokenCookie = "telha_token"

// Principal identifies a request for the status page: a bearer token from
// the Authorization header or the TokenCookie cookie. ok is false (with
// the status and message to answer) when the request may not see the page
// at all.
func (a *Auth) Principal(r *http.Request) (p Principal, ok bool, status int, msg string) {
	switch a.mode {
	case AuthOff:
		return Principal{Name: "anyone (--auth off)", All: true}, true, 0, ""
	case AuthLoopback:
		host, _, err := net.SplitHostPort(r.RemoteAddr)
		if ip := net.ParseIP(host); err == nil && ip != nil && ip.IsLoopback() {
			return Principal{Name: "loopback", All: true}, true, 0, ""
		}
		a.denied("loopback_only")
		return p, false, http.StatusUnauthorized, "this worker answers loopback clients only: it has no --auth-tokens-file (and no --auth off)"
	}
	bearer, _ := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if bearer == "" {
		if c, err := r.Cookie(TokenCookie); err == nil {
			bearer = c.Value
		}
	}
	var tok *Token
	if bearer != "" {
		tok = a.lookup(bearer)
	}
	if tok == nil {
		a.denied("unauthenticated")
		return p, false, http.StatusUnauthorized, "sign in with a token"
	}
	return Principal{Name: tok.Name, Tenants: tok.Tenants, Role: tok.Role}, true, 0, ""
}

// Denied counts a refusal the status page makes (forbidden_tenant,
// forbidden_role).
func (a *Auth) Denied(reason string) { a.denied(reason) }
