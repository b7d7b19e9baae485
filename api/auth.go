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

type principalKey struct{}

// mayRead reports whether the request's principal may see tenant t (a
// request admitted without a gate sees every tenant).
func mayRead(ctx context.Context, t string) bool {
	p, ok := ctx.Value(principalKey{}).(Principal)
	return !ok || p.Sees(t)
}

// identify says who a request is: everyone (--auth off, or a loopback
// client without tokens configured) or the holder of the token of the
// Authorization header. ok is false, with the status and message to
// answer and the refusal counted, when it is no one.
//
// Without tokens, a loopback peer is trusted only when it names this
// worker by a loopback host (localhost, 127.0.0.0/8, [::1], any port): a
// page of another site that a browser resolved to 127.0.0.1 (DNS
// rebinding) sends its own host name, and is refused.
func (a *Auth) identify(r *http.Request) (p Principal, ok bool, status int, msg string) {
	switch a.mode {
	case AuthOff:
		return Principal{Name: "anyone (--auth off)", All: true}, true, 0, ""
	case AuthLoopback:
		host, _, err := net.SplitHostPort(r.RemoteAddr)
		if ip := net.ParseIP(host); err != nil || ip == nil || !ip.IsLoopback() {
			a.denied("loopback_only")
			return p, false, http.StatusUnauthorized, "this worker's API answers loopback clients only: it has no --auth-tokens-file (and no --auth off)"
		}
		if !LoopbackHost(r.Host) {
			a.denied("loopback_only")
			return p, false, http.StatusMisdirectedRequest, fmt.Sprintf("this worker has no --auth-tokens-file: it answers requests for a loopback host name only (localhost, 127.0.0.1, [::1]), not Host %s", quoteTenant(r.Host))
		}
		return Principal{Name: "loopback", All: true}, true, 0, ""
	}
	bearer, _ := BearerToken(r.Header.Get("Authorization"))
	var tok *Token
	if bearer != "" {
		tok = a.lookup(bearer)
	}
	if tok == nil {
		a.denied("unauthenticated")
		return p, false, http.StatusUnauthorized, "a valid bearer token is required (Authorization: Bearer <token>)"
	}
	return tok.principal(), true, 0, ""
}

func (t *Token) principal() Principal {
	return Principal{Name: t.Name, Tenants: t.Tenants, Role: t.Role}
}

// BearerToken returns the token of an Authorization header value of the
// Bearer scheme. The scheme is case-insensitive (RFC 7235 §2.1) and may be
// followed by several spaces.
func BearerToken(h string) (string, bool) {
	scheme, rest, ok := strings.Cut(strings.TrimLeft(h, " "), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	tok := strings.Trim(rest, " ")
	return tok, tok != ""
}

// LoopbackHost reports whether a Host header names this machine's loopback
// interface: localhost, an address of 127.0.0.0/8 or [::1], with any port.
func LoopbackHost(hostport string) bool {
	host := hostport
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		host = h
	} else if strings.HasPrefix(host, "[") && strings.HasSuffix(host, "]") {
		host = host[1 : len(host)-1]
	}
	host = strings.TrimSuffix(host, ".")
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// admit decides a /v1/ request from its path, before anything is read. It
// returns the request to serve (carrying its principal), or false when it
// wrote the refusal.
func (a *Auth) admit(w http.ResponseWriter, r *http.Request, needs Role) (*http.Request, bool) {
	p, ok, status, msg := a.identify(r)
	switch {
	case !ok:
		if a.mode == AuthTokens {
			w.Header().Set("WWW-Authenticate", `Bearer realm="telha-cascade"`)
		}
		writeError(w, status, msg)
		return nil, false
	case needs == RoleOperate && !p.Operates():
		a.denied("forbidden_role")
		writeError(w, http.StatusForbidden, fmt.Sprintf("token %q has role %s; this needs operate", p.Name, p.Role))
		return nil, false
	}
	if t, ok := tenantOfPath(r.URL.Path); ok && !p.Sees(t) {
		a.denied("forbidden_tenant")
		writeError(w, http.StatusForbidden, fmt.Sprintf("token %q may not read tenant %s", p.Name, quoteTenant(t)))
		return nil, false
	}
	return r.WithContext(context.WithValue(r.Context(), principalKey{}, p)), true
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

// Principal identifies a request for the status page from its mode and
// Authorization header (see identify). The page's own sign-in is a
// server-side session (package ui) that resolves through TokenPrincipal.
func (a *Auth) Principal(r *http.Request) (p Principal, ok bool, status int, msg string) {
	return a.identify(r)
}

// TokenHash is how a session remembers a token: its SHA-256, never the
// token itself.
type TokenHash [32]byte

// CheckToken returns the principal of a token (a sign-in) and the hash a
// session keeps of it.
func (a *Auth) CheckToken(token string) (Principal, TokenHash, bool) {
	if a.mode != AuthTokens || token == "" {
		return Principal{}, TokenHash{}, false
	}
	tok := a.lookup(token)
	if tok == nil {
		return Principal{}, TokenHash{}, false
	}
	return tok.principal(), sha256.Sum256([]byte(token)), true
}

// TokenPrincipal returns the principal of the token a session signed in
// with, as the tokens file says now: a token removed from the file ends
// its sessions.
func (a *Auth) TokenPrincipal(h TokenHash) (Principal, bool) {
	if a.mode != AuthTokens {
		return Principal{}, false
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if now := time.Now(); a.checkEvery < 0 || now.Sub(a.lastCheck) >= a.checkEvery {
		a.lastCheck = now
		_ = a.reload(false)
	}
	tok := a.tokens[h]
	if tok == nil {
		return Principal{}, false
	}
	return tok.principal(), true
}

// Denied counts a refusal the status page makes (forbidden_tenant,
// forbidden_role).
func (a *Auth) Denied(reason string) { a.denied(reason) }
