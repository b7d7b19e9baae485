package ui

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/telha/telha-cascade/api"
)

// Sessions of the status page. A browser holds a random session id in an
// HttpOnly, SameSite=Strict cookie (Secure when the page is served over
// TLS or behind an https proxy), never a token: the session keeps the
// SHA-256 of the token it signed in with (tokens mode), resolved against
// the tokens file on every request, so a token removed from the file ends
// its sessions. Without tokens (loopback, --auth off) a browser gets an
// anonymous session on its first page, for its CSRF token and flash.
//
// Every POST (sign-in, sign-out, retry, discard) must come from the page's
// own origin (Origin, when the browser sends it) and carry the session's
// CSRF token, which is random per session and replaced after every POST
// that used it. Sessions live in memory: a restart signs everyone out.

const (
	sessionCookie = "telha_session"
	loginCookie   = "telha_login"
	// SessionTTL is how long a session lasts from its sign-in.
	SessionTTL = 8 * time.Hour
	// MaxSessions bounds the sessions kept; past it the oldest go first.
	MaxSessions = 10_000
)

type session struct {
	id      string
	tok     api.TokenHash
	signed  bool // signed in with a token (tokens mode)
	created time.Time
	expires time.Time

	// mu guards what changes during the session's life.
	mu    sync.Mutex
	csrf  string
	flash string
}

// CSRF returns the session's current CSRF token.
func (s *session) CSRF() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.csrf
}

// useCSRF checks a form's token against the session's and, when it
// matches, replaces it: a token serves one POST.
func (s *session) useCSRF(got string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.csrf == "" || !hmac.Equal([]byte(got), []byte(s.csrf)) {
		return false
	}
	s.csrf = randomID()
	return true
}

func (s *session) setFlash(msg string) {
	s.mu.Lock()
	s.flash = msg
	s.mu.Unlock()
}

func (s *session) takeFlash() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	f := s.flash
	s.flash = ""
	return f
}

type sessions struct {
	mu  sync.Mutex
	m   map[string]*session
	now func() time.Time
}

func newSessions() *sessions { return &sessions{m: map[string]*session{}, now: time.Now} }

func randomID() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	return base64.RawURLEncoding.EncodeToString(b)
}

// create starts a session (signed in with tok when signed).
func (ss *sessions) create(tok api.TokenHash, signed bool) *session {
	now := ss.now()
	s := &session{id: randomID(), tok: tok, signed: signed, created: now, expires: now.Add(SessionTTL), csrf: randomID()}
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if len(ss.m) >= MaxSessions {
		for id, o := range ss.m {
			if !now.Before(o.expires) {
				delete(ss.m, id)
			}
		}
	}
	for len(ss.m) >= MaxSessions {
		var oldest *session
		for _, o := range ss.m {
			if oldest == nil || o.created.Before(oldest.created) {
				oldest = o
			}
		}
		delete(ss.m, oldest.id)
	}
	ss.m[s.id] = s
	return s
}

// get returns the live session of a request's cookie, or nil.
func (ss *sessions) get(r *http.Request) *session {
	c, err := r.Cookie(sessionCookie)
	if err != nil || c.Value == "" {
		return nil
	}
	ss.mu.Lock()
	defer ss.mu.Unlock()
	s := ss.m[c.Value]
	if s != nil && !ss.now().Before(s.expires) {
		delete(ss.m, s.id)
		return nil
	}
	return s
}

func (ss *sessions) end(s *session) {
	ss.mu.Lock()
	delete(ss.m, s.id)
	ss.mu.Unlock()
}

// secure reports whether the browser reached the page over https (TLS
// here, or a proxy in front saying so): the cookies are then Secure.
func secure(r *http.Request) bool {
	if r.TLS != nil {
		return true
	}
	if strings.EqualFold(strings.TrimSpace(strings.Split(r.Header.Get("X-Forwarded-Proto"), ",")[0]), "https") {
		return true
	}
	return strings.Contains(strings.ToLower(r.Header.Get("Forwarded")), "proto=https")
}

func setSessionCookie(w http.ResponseWriter, r *http.Request, s *session) {
	http.SetCookie(w, &http.Cookie{Name: sessionCookie, Value: s.id, Path: "/ui/", MaxAge: int(time.Until(s.expires).Seconds()),
		HttpOnly: true, Secure: secure(r), SameSite: http.SameSiteStrictMode})
}

func clearCookie(w http.ResponseWriter, r *http.Request, name, path string) {
	http.SetCookie(w, &http.Cookie{Name: name, Value: "", Path: path, MaxAge: -1, HttpOnly: true, Secure: secure(r), SameSite: http.SameSiteStrictMode})
}

// sameOrigin reports whether a POST comes from the page's own origin. A
// browser sends Origin with every POST; its host must be the one the
// request was sent to (Host, or X-Forwarded-Host behind a proxy: a page
// of another site cannot set that header without a CORS preflight, which
// this page never grants). Without Origin (a client that is not a
// browser, or an old one), Sec-Fetch-Site, when sent, must say the same
// origin; the CSRF token is checked either way.
func sameOrigin(r *http.Request) bool {
	o := r.Header.Get("Origin")
	if o == "" {
		sfs := r.Header.Get("Sec-Fetch-Site")
		return sfs == "" || sfs == "same-origin" || sfs == "none"
	}
	u, err := url.Parse(o)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return false // "null" included: a sandboxed frame, a file, a redirect across origins
	}
	if strings.EqualFold(u.Host, r.Host) {
		return true
	}
	fh := strings.TrimSpace(strings.Split(r.Header.Get("X-Forwarded-Host"), ",")[0])
	return fh != "" && strings.EqualFold(u.Host, fh)
}

// loginCSRF is the sign-in form's token: an HMAC of the browser's
// pre-session cookie under the process's secret (there is no session
// before the sign-in; a page of another site can neither read the cookie
// nor compute the HMAC).
func (s *server) loginCSRF(cookie string) string {
	m := hmac.New(sha256.New, s.secret)
	m.Write([]byte("login\x00" + cookie))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}
