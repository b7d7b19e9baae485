package ui

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"embed"
	"encoding/json"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"math"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/telha/telha-cascade/api"
	"github.com/telha/telha-cascade/queue/client"
	"github.com/telha/telha-cascade/storage"
)

//go:embed templates/*.html
var templateFS embed.FS

//go:embed static
var staticFS embed.FS

var pages = template.Must(template.New("").Funcs(funcs).ParseFS(templateFS, "templates/*.html"))

// DeadLetters is what the page needs of the dead-letter stream
// (client.DeadLetterStream).
type DeadLetters interface {
	List(ctx context.Context, f client.DeadLetterFilter) (client.DeadLetterPage, error)
	Get(ctx context.Context, seq uint64) (client.DeadLetter, error)
	Retry(ctx context.Context, seq uint64) (client.Retried, error)
	Discard(ctx context.Context, seq uint64) error
}

// Overview is the overview page's figures (the worker fills them). For a
// principal that sees some tenants only, Scoped is set and the figures of
// the whole worker (requests, queue, disk) are left out: only its
// tenants' journals and dead letters are counted.
type Overview struct {
	Scoped         bool
	RequestsTotal  float64
	RequestsPerSec float64
	RateWindow     string // the span the rates are over
	// RateNote says what the rates are over when it is not the last
	// minute (the worker started less than a minute ago).
	RateNote   string
	ByStatus   []StatusCount
	Pending    string
	AckPending string
	// PendingAsOf: when the queue figures (pending, ack pending, oldest)
	// were read from the server ("" when never).
	PendingAsOf string
	// OldestPending is the age of the oldest request not yet acked ("-"
	// when none or unknown).
	OldestPending string
	Uptime        string
	// NATS is the connection's state ("connected to ...", "reconnecting").
	NATS         string
	NATSOK       bool
	Pause        client.PauseState
	CanPause     bool // filled by the page: the principal may pause
	HasPause     bool // filled by the page: a consumer to pause
	Journals     int
	Poison       int
	DeadLetters  string
	ReaperResult string
	ReaperLast   string
	DiskFree     string
	StoreSize    string
	Partitions   api.Partitions
	// Slots: with --partition-owner dynamic, every slot of the group as
	// this member sees it (empty in the static layout).
	Slots []SlotRow
	// Group: with --partition-owner dynamic, the members and the group's
	// recent changes (nil in the static layout).
	Group *Group
	Build string
}

// Group is a dynamic group as the member serving the page sees it.
type Group struct {
	Member string // this member's id
	Owned  []int  // the slots it owns now
	// FiguresOf says whose the overview's figures are (the member's
	// slots' requests, its uptime, its copies' size).
	FiguresOf string
	Members   []MemberRow
	Events    []EventRow // newest first
	// Journals: in flight on the member's other slots (live) and on the
	// other members' slots, as of their last renewal (the slot serving the
	// page has its own live rows).
	Journals []GroupJournal
	// Finished: the journals that finished last on every slot of the
	// group (this member's, and each other member's newest as of its last
	// renewal), newest first.
	Finished []FinishedJournal
}

// MemberRow is one member of the group.
type MemberRow struct {
	ID, URL string
	Here    bool // the member serving this page
	Leaving bool
	Owns    string // its slots, as owner
	Started time.Time
	Renewed time.Time
}

// EventRow is one change of the group a member saw.
type EventRow struct {
	At   time.Time
	Kind string // joined, left, expired
	What string
}

// GroupJournal is a journal in flight on another slot of the group.
type GroupJournal struct {
	Slot       int
	Member     string
	Tenant     string
	NodeID     string
	RequestID  string
	State      string
	EdgesDone  int64
	EdgesTotal uint64
	AsOf       time.Time
}

// SlotRow is one slot of a dynamic group on the overview.
type SlotRow struct {
	Slot       int
	Partitions string
	Owner      string
	Epoch      uint64
	Ready      bool
	Standbys   string // "member (lag n)", comma-separated
	Applied    uint64
	Checkpoint string // the owner's last checkpoint, when this member owns it
	// Queue and Reaper: the slot's consumer (pending, paused) and last
	// reaper pass, when this member owns it ("" otherwise: see its
	// owner's page).
	Queue, Reaper string
}

// StatusCount is one status's answered requests.
type StatusCount struct {
	Status string
	Count  float64
	PerSec float64
}

// Options configures Handler.
type Options struct {
	Store    *storage.Store
	Auth     *api.Auth
	Journals func() []api.Journal
	// Overview fills the overview for a principal (see Overview.Scoped).
	Overview    func(ctx context.Context, p api.Principal) Overview
	DeadLetters DeadLetters
	// Pause pauses and resumes this replica's consumer (nil: no control).
	Pause Pauser
	// Results lists the recent results (nil: no list).
	Results Results
	// Finished lists the recently finished journals, newest first.
	Finished func() []FinishedJournal
	// Progress is the journals' progress sampled by the worker (nil: the
	// page samples it at each view), for their rate and ETA.
	Progress *Progress
	// Group is the dynamic group (nil in the static layout): the
	// journals page lists the other members' journals from it.
	Group  func() *Group
	Logger *slog.Logger
}

type server struct {
	o        Options
	secret   []byte
	sessions *sessions
	// lookups answers the request lookup as the read API does (the page
	// has checked the tenant already).
	lookups http.Handler
}

// Handler serves /ui/ (mount it at /ui/).
func Handler(o Options) http.Handler {
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Progress == nil {
		o.Progress = NewProgress()
	}
	s := &server{o: o, secret: make([]byte, 32), sessions: newSessions(),
		lookups: api.Handler(o.Store, api.Options{ReadAPI: true, Journals: o.Journals, Logger: o.Logger})}
	_, _ = rand.Read(s.secret)
	mux := http.NewServeMux()
	static, _ := fs.Sub(staticFS, "static")
	files := http.StripPrefix("/ui/static/", http.FileServerFS(static))
	mux.Handle("GET /ui/static/", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Content-Type-Options", "nosniff")
		files.ServeHTTP(w, r)
	}))
	mux.HandleFunc("GET /ui/login", s.loginPage)
	mux.HandleFunc("POST /ui/login", s.login)
	mux.HandleFunc("POST /ui/logout", s.gate(s.logout))
	mux.HandleFunc("GET /ui/{$}", s.gate(s.overview))
	mux.HandleFunc("GET /ui/journals", s.gate(s.journals))
	mux.HandleFunc("GET /ui/dlq", s.gate(s.dlq))
	mux.HandleFunc("POST /ui/dlq/{seq}/{action}", s.gate(s.dlqAction))
	mux.HandleFunc("POST /ui/dlq/bulk", s.gate(s.dlqBulk))
	mux.HandleFunc("POST /ui/consumer/{action}", s.gate(s.pauseAction))
	mux.HandleFunc("GET /ui/requests", s.gate(s.requests))
	mux.HandleFunc("GET /ui/explorer", s.gate(s.explorer))
	return mux
}

// page is what every template gets.
type page struct {
	Title, Page, Who, Flash, Error, CSRF string
	// SignedIn: a token's session, which the header offers to end.
	SignedIn bool
	Refresh  int
	// Paused says the replica's consumer is paused (every page shows it).
	Paused string
	Data   any
}

type handler func(w http.ResponseWriter, r *http.Request, p api.Principal, pg *page, sess *session)

// gate admits the request and fills the page's common parts. Who: the
// worker's mode (loopback, --auth off), a token in the Authorization
// header, or (tokens mode) the token of the browser's session. A POST
// must come from the page's origin with its session's CSRF token (checked
// here, before any handler runs).
func (s *server) gate(h handler) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		p, ok, status, msg := s.o.Auth.Principal(r)
		sess := s.sessions.get(r)
		tokensMode := s.o.Auth.Mode() == api.AuthTokens
		if !ok && tokensMode && status == http.StatusUnauthorized && r.Header.Get("Authorization") == "" && sess != nil && sess.signed {
			p, ok = s.o.Auth.TokenPrincipal(sess.tok)
			if !ok {
				s.sessions.end(sess) // its token left the tokens file
				sess = nil
			}
		}
		if !ok {
			if tokensMode && status != http.StatusMisdirectedRequest && r.Method == http.MethodGet {
				http.Redirect(w, r, "/ui/login", http.StatusSeeOther)
				return
			}
			if status == 0 {
				status, msg = http.StatusUnauthorized, "sign in first"
			}
			http.Error(w, msg, status)
			return
		}
		if sess != nil && sess.signed && (!tokensMode || r.Header.Get("Authorization") != "") {
			sess = nil // a session of another principal than this request's
		}
		if r.Method == http.MethodPost {
			switch {
			case !sameOrigin(r):
				http.Error(w, "this form was not sent from the status page (Origin is another site's)", http.StatusForbidden)
				return
			case sess == nil || !sess.useCSRF(r.PostFormValue("csrf")):
				http.Error(w, "this form is stale or was not sent by the status page (CSRF token mismatch): reload the page", http.StatusForbidden)
				return
			}
		} else if sess == nil && !tokensMode {
			sess = s.sessions.create(api.TokenHash{}, false) // anonymous: its CSRF token and flash
			setSessionCookie(w, r, sess)
		}
		who := p.Name
		if !p.All {
			who = fmt.Sprintf("%s (%s: %s)", p.Name, p.Role, strings.Join(p.Tenants, ", "))
		}
		pg := &page{Who: who}
		if s.o.Pause != nil {
			if st := s.o.Pause.PauseState(); st.Paused {
				pg.Paused = fmt.Sprintf("Consumer %s is %s: no request is consumed.", st.Consumer, st)
			}
		}
		if sess != nil {
			pg.CSRF, pg.SignedIn = sess.CSRF(), sess.signed
			if r.Method == http.MethodGet {
				pg.Flash = sess.takeFlash()
			}
		}
		h(w, r, p, pg, sess)
	}
}

// contentSecurityPolicy: scripts and styles from the page's own files
// only (no inline script, no inline handler), forms posting to the page
// only, no <base>, no framing.
const contentSecurityPolicy = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; object-src 'none'; " +
	"base-uri 'none'; form-action 'self'; frame-ancestors 'none'"

func (s *server) render(w http.ResponseWriter, name string, pg *page) {
	var buf bytes.Buffer
	if err := pages.ExecuteTemplate(&buf, name, pg); err != nil {
		s.o.Logger.Error("status page", "page", name, "err", err)
		http.Error(w, "the page could not be rendered: "+err.Error(), http.StatusInternalServerError)
		return
	}
	h := w.Header()
	h.Set("Content-Type", "text/html; charset=utf-8")
	h.Set("X-Frame-Options", "DENY")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "same-origin") // no-referrer would make browsers send Origin: null on the page's own POSTs
	h.Set("Cache-Control", "no-store")
	h.Set("Content-Security-Policy", contentSecurityPolicy)
	_, _ = w.Write(buf.Bytes())
}

// loginErrors are the sign-in page's messages, by code (?error=).
var loginErrors = map[string]string{
	"unknown": "Unknown token.",
	"stale":   "The sign-in form was stale: try again.",
	"expired": "Your session ended: sign in again.",
}

func (s *server) loginPage(w http.ResponseWriter, r *http.Request) {
	pre := randomID()
	http.SetCookie(w, &http.Cookie{Name: loginCookie, Value: pre, Path: "/ui/login", MaxAge: 3600, HttpOnly: true, Secure: secure(r), SameSite: http.SameSiteStrictMode})
	s.render(w, "login", &page{Title: "Sign in", Page: "login", Error: loginErrors[r.URL.Query().Get("error")], CSRF: s.loginCSRF(pre)})
}

func (s *server) login(w http.ResponseWriter, r *http.Request) {
	c, err := r.Cookie(loginCookie)
	if !sameOrigin(r) || err != nil || c.Value == "" || !hmac.Equal([]byte(r.PostFormValue("csrf")), []byte(s.loginCSRF(c.Value))) {
		http.Redirect(w, r, "/ui/login?error=stale", http.StatusSeeOther)
		return
	}
	p, h, ok := s.o.Auth.CheckToken(strings.TrimSpace(r.PostFormValue("token")))
	if !ok {
		http.Redirect(w, r, "/ui/login?error=unknown", http.StatusSeeOther)
		return
	}
	if old := s.sessions.get(r); old != nil {
		s.sessions.end(old)
	}
	sess := s.sessions.create(h, true) // a new id at every sign-in
	clearCookie(w, r, loginCookie, "/ui/login")
	setSessionCookie(w, r, sess)
	s.o.Logger.Info("status page: signed in", "token", p.Name)
	http.Redirect(w, r, "/ui/", http.StatusSeeOther)
}

func (s *server) logout(w http.ResponseWriter, r *http.Request, p api.Principal, _ *page, sess *session) {
	s.sessions.end(sess)
	clearCookie(w, r, sessionCookie, "/ui/")
	if sess.signed {
		s.o.Logger.Info("status page: signed out", "token", p.Name)
		http.Redirect(w, r, "/ui/login", http.StatusSeeOther)
		return
	}
	http.Redirect(w, r, "/ui/", http.StatusSeeOther)
}

func (s *server) overview(w http.ResponseWriter, r *http.Request, p api.Principal, pg *page, _ *session) {
	pg.Title, pg.Page = "Overview", "overview"
	if s.o.Overview != nil {
		o := s.o.Overview(r.Context(), p)
		o.HasPause, o.CanPause = s.o.Pause != nil, s.o.Pause != nil && mayPause(p)
		if s.o.Pause != nil {
			o.Pause = s.o.Pause.PauseState()
		}
		pg.Data = o
	}
	pg.Refresh = OverviewRefresh
	s.render(w, "overview", pg)
}

// OverviewRefresh is how often the overview reloads itself (seconds).
const OverviewRefresh = 5

// journalRow is a journal with its progress figures.
type journalRow struct {
	api.Journal
	Percent float64
	// Rate is the edges a second observed over the last ProgressWindow
	// (RateText as shown: "estimating" until there is enough progress
	// observed); ETA the time left at that rate ("-" when it cannot be
	// told).
	Rate     float64
	RateText string
	ETA      string
	// Attempts counts the attempt in progress: an applying journal is on
	// attempt Failures+1.
	Attempts int
	// StateText is the state as people read it ("applying (attempt 2)").
	StateText string
}

type journalsData struct {
	Rows     []journalRow
	Finished []FinishedJournal
	// Group: a member's page; Others: the journals in flight on the other
	// members' slots (as of their last renewal).
	Group  bool
	Others []GroupJournal
}

func (s *server) journals(w http.ResponseWriter, r *http.Request, p api.Principal, pg *page, _ *session) {
	pg.Title, pg.Page = "Journals", "journals"
	var d journalsData
	rows := []journalRow(nil)
	if s.o.Journals != nil {
		all := s.o.Journals()
		s.o.Progress.Observe(time.Now(), all)
		for _, j := range all {
			if !p.Sees(j.Tenant) {
				continue
			}
			row := journalRow{Journal: j, RateText: "-", ETA: "-", Attempts: j.Failures, StateText: j.State}
			switch j.State {
			case "applying":
				row.Attempts = j.Failures + 1
				row.StateText = fmt.Sprintf("applying (attempt %d)", row.Attempts)
			case "failing":
				row.StateText = fmt.Sprintf("failing (%d failed attempts; retried after a backoff)", j.Failures)
			case "waiting":
				row.StateText = "waiting for an earlier journal"
				if j.WaitingFor != "" {
					row.StateText += " (node " + j.WaitingFor + ")"
				}
			}
			if j.EdgesTotal > 0 {
				row.Percent = math.Round(1000*float64(j.EdgesDone)/float64(j.EdgesTotal)) / 10
			}
			row.Rate, row.RateText, row.ETA = estimate(s.o.Progress, j)
			rows = append(rows, row)
		}
	}
	d.Rows = rows
	var g *Group
	if s.o.Group != nil {
		g = s.o.Group()
	}
	if g != nil {
		d.Group = true
		for _, j := range g.Journals {
			if p.Sees(j.Tenant) {
				d.Others = append(d.Others, j)
			}
		}
	}
	if len(rows) > 0 || len(d.Others) > 0 {
		pg.Refresh = 1
	}
	finished := []FinishedJournal(nil)
	switch {
	case g != nil:
		finished = g.Finished // every slot's, not only the one serving the page
	case s.o.Finished != nil:
		finished = s.o.Finished()
	}
	for _, f := range finished {
		if p.Sees(f.Tenant) {
			d.Finished = append(d.Finished, f)
		}
	}
	pg.Data = d
	s.render(w, "journals", pg)
}

// The dead-letter page shows DLQPageSize letters a page, and of each at
// most MaxBodyShown bytes of its body (and MaxHeaderShown of each header
// value). A body is pretty-printed only when it is at most MaxPrettyBytes
// and nests at most MaxPrettyDepth deep (indenting costs its depth times
// its lines), else shown as it came, cut: a page costs O(its size),
// whatever the bodies hold.
const (
	DLQPageSize    = 50
	MaxBodyShown   = 16 << 10
	MaxHeaderShown = 1 << 10
	MaxPrettyBytes = 16 << 10
	MaxPrettyDepth = 32
	maxPrettyOut   = 64 << 10
)

// letterRow is a dead letter made readable.
type letterRow struct {
	client.DeadLetter
	// Body is the body to show (pretty-printed JSON, text or base64), at
	// most MaxBodyShown bytes; BodyCut says it was cut.
	Body       string
	BodyKind   string // json, text, binary
	BodyCut    bool
	HeaderRows []headerRow
}

type headerRow struct{ Name, Value string }

type dlqData struct {
	Tenant, Reason string
	Letters        []letterRow
	Total          uint64
	Operate        bool
	Next           string // the next (older) page's link: older letters exist
	// Search: the reason filter's bounded scan stopped before finding
	// one more letter; the link searches on from where it stopped.
	Search string
	First  bool // the first page (no cursor)
}

func (s *server) dlq(w http.ResponseWriter, r *http.Request, p api.Principal, pg *page, _ *session) {
	pg.Title, pg.Page = "Dead letters", "dlq"
	q := r.URL.Query()
	d := dlqData{Tenant: q.Get("tenant"), Reason: q.Get("reason"), Operate: p.Operates(), First: q.Get("before") == ""}
	if s.o.DeadLetters != nil {
		f := client.DeadLetterFilter{Tenant: d.Tenant, Reason: d.Reason, Limit: DLQPageSize + 1, Full: true} // one more: is there an older one?
		if b := q.Get("before"); b != "" {
			n, err := strconv.ParseUint(b, 10, 64)
			if err != nil || n == 0 {
				pg.Error = fmt.Sprintf("before %q is not a stream sequence", b)
			}
			f.Before = n
		}
		if !p.All {
			f.Tenants = p.Tenants
		}
		if pg.Error == "" {
			res, err := s.o.DeadLetters.List(r.Context(), f)
			if err != nil {
				pg.Error = "the dead-letter stream could not be read: " + err.Error()
			}
			d.Total = res.Total
			show, older, search := pageCut(len(res.Letters), DLQPageSize, res.Next, func(i int) uint64 { return res.Letters[i].Seq })
			for _, l := range res.Letters[:show] {
				d.Letters = append(d.Letters, showLetter(l))
			}
			link := func(before uint64) string {
				v := url.Values{"before": {strconv.FormatUint(before, 10)}}
				if d.Tenant != "" {
					v.Set("tenant", d.Tenant)
				}
				if d.Reason != "" {
					v.Set("reason", d.Reason)
				}
				return "/ui/dlq?" + v.Encode()
			}
			if older != 0 {
				d.Next = link(older)
			}
			if search != 0 {
				d.Search = link(search)
			}
		}
	}
	pg.Data = d
	s.render(w, "dlq", pg)
}

// showLetter bounds what the page shows of a dead letter.
func showLetter(l client.DeadLetter) letterRow {
	row := letterRow{DeadLetter: l}
	switch {
	case len(l.Body) > 0:
		row.BodyKind = "json"
		if pretty, ok := prettyJSON(l.Body); ok {
			row.Body = pretty
		} else {
			row.Body, row.BodyCut = cut(string(l.Body), MaxBodyShown)
		}
	case l.BodyText != "":
		row.BodyKind = "text"
		row.Body, row.BodyCut = cut(l.BodyText, MaxBodyShown)
	case l.BodyBase64 != "":
		row.BodyKind = "binary"
		row.Body, row.BodyCut = cut(l.BodyBase64, MaxBodyShown)
	}
	names := make([]string, 0, len(l.Headers))
	for k := range l.Headers {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		v, _ := cut(l.Headers[k], MaxHeaderShown)
		name, _ := cut(k, 128)
		row.HeaderRows = append(row.HeaderRows, headerRow{name, v})
	}
	// The page needs none of these in full any more.
	row.DeadLetter.Body, row.DeadLetter.BodyText, row.DeadLetter.BodyBase64, row.DeadLetter.Headers = nil, "", "", nil
	row.DeadLetter.Error, _ = cut(l.Error, MaxHeaderShown)
	row.DeadLetter.RequestID, _ = cut(l.RequestID, 256)
	row.DeadLetter.MsgID, _ = cut(l.MsgID, 256)
	return row
}

// prettyJSON indents a JSON body when that costs O(its size): at most
// MaxPrettyBytes, nested at most MaxPrettyDepth deep, indented at most
// maxPrettyOut.
func prettyJSON(b []byte) (string, bool) {
	if len(b) > MaxPrettyBytes || jsonDepth(b) > MaxPrettyDepth {
		return "", false
	}
	var out bytes.Buffer
	if json.Indent(&out, b, "", "  ") != nil || out.Len() > maxPrettyOut {
		return "", false
	}
	return out.String(), true
}

// jsonDepth is the deepest nesting of brackets in b, outside strings (one
// pass, no allocation).
func jsonDepth(b []byte) int {
	depth, deepest, inString, escaped := 0, 0, false, false
	for _, c := range b {
		switch {
		case inString:
			switch {
			case escaped:
				escaped = false
			case c == '\\':
				escaped = true
			case c == '"':
				inString = false
			}
		case c == '"':
			inString = true
		case c == '{' || c == '[':
			depth++
			deepest = max(deepest, depth)
		case c == '}' || c == ']':
			depth--
		}
	}
	return deepest
}

// cut returns s's first n bytes (on a rune boundary) and whether it cut.
func cut(s string, n int) (string, bool) {
	if len(s) <= n {
		return s, false
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n], true
}

// dlqFlash are the messages after a retry or discard (kept in the
// session, shown once; a URL never carries them).
func (s *server) dlqAction(w http.ResponseWriter, r *http.Request, p api.Principal, _ *page, sess *session) {
	if !p.Operates() {
		s.o.Auth.Denied("forbidden_role")
		http.Error(w, fmt.Sprintf("token %q has role %s: retrying and discarding need operate", p.Name, p.Role), http.StatusForbidden)
		return
	}
	seq, err := strconv.ParseUint(r.PathValue("seq"), 10, 64)
	if err != nil || s.o.DeadLetters == nil {
		http.Error(w, "no such dead letter", http.StatusNotFound)
		return
	}
	l, err := s.o.DeadLetters.Get(r.Context(), seq)
	if err != nil || !p.Sees(l.Tenant) {
		if err == nil {
			s.o.Auth.Denied("forbidden_tenant")
		}
		http.Error(w, fmt.Sprintf("no dead letter %d you may act on", seq), http.StatusNotFound)
		return
	}
	switch r.PathValue("action") {
	case "retry":
		res, err := s.o.DeadLetters.Retry(r.Context(), seq)
		if err != nil {
			sess.setFlash("Retry failed: " + err.Error())
			http.Redirect(w, r, "/ui/dlq", http.StatusSeeOther)
			return
		}
		sess.setFlash(fmt.Sprintf("Dead letter %d retried: request %s republished to %s (request stream seq %d) and removed from the dead letters.",
			seq, res.RequestID, res.Subject, res.RequestStreamSeq))
	case "discard":
		if err := s.o.DeadLetters.Discard(r.Context(), seq); err != nil {
			sess.setFlash("Discard failed: " + err.Error())
			http.Redirect(w, r, "/ui/dlq", http.StatusSeeOther)
			return
		}
		sess.setFlash(fmt.Sprintf("Dead letter %d discarded (request %s, reason %s).", seq, l.RequestID, l.Reason))
	default:
		http.Error(w, "unknown action", http.StatusNotFound)
		return
	}
	s.o.Logger.Info("status page: dead letter "+r.PathValue("action"), "seq", seq, "by", p.Name, "tenant", l.Tenant, "request_id", l.RequestID)
	http.Redirect(w, r, "/ui/dlq", http.StatusSeeOther)
}

type requestsData struct {
	Tenant, ID, Answer string
	// NotFound: the lookup found no receipt and nothing in flight.
	NotFound bool
	// DeadLetter is the request's dead letter (an invalid request stores
	// no receipt), DeadLetterLink the dead-letter page showing it.
	DeadLetter     *client.DeadLetter
	DeadLetterLink string
	// SearchCut: no dead letter among the tenant's newest; older ones
	// were not searched.
	SearchCut bool
	// Recent is the list of recent requests (the page without an id).
	Recent *recentData
}

func (s *server) requests(w http.ResponseWriter, r *http.Request, p api.Principal, pg *page, _ *session) {
	pg.Title, pg.Page = "Requests", "requests"
	q := r.URL.Query()
	d := requestsData{Tenant: q.Get("tenant"), ID: q.Get("id")}
	if d.Tenant != "" && d.ID != "" {
		var found bool
		d.Answer, found = s.lookup(r.Context(), p, d.Tenant, d.ID)
		if !found && p.Sees(d.Tenant) {
			d.NotFound = true
			if l, ok, cut := s.findDeadLetter(r.Context(), d.Tenant, d.ID); ok {
				d.DeadLetter = &l
				d.DeadLetterLink = "/ui/dlq?" + url.Values{"tenant": {d.Tenant}, "before": {strconv.FormatUint(l.Seq+1, 10)}}.Encode() + "#letter-" + strconv.FormatUint(l.Seq, 10)
			} else {
				d.SearchCut = cut
			}
		}
	} else {
		d.Recent = s.recent(r.Context(), p, q)
	}
	pg.Data = d
	s.render(w, "requests", pg)
}

// lookup answers a request lookup in the read API's own words, and
// whether the request was found (answered or in flight).
func (s *server) lookup(ctx context.Context, p api.Principal, tenant, rid string) (string, bool) {
	if !p.Sees(tenant) {
		s.o.Auth.Denied("forbidden_tenant")
		return fmt.Sprintf("your token may not read tenant %q", tenant), true
	}
	found := false
	var out strings.Builder
	for _, path := range []string{"/v1/tenants/" + url.PathEscape(tenant) + "/requests/" + url.PathEscape(rid),
		"/v1/tenants/" + url.PathEscape(tenant) + "/erasures/" + url.PathEscape(rid)} {
		rec := &recorder{h: http.Header{}}
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, path, nil)
		s.lookups.ServeHTTP(rec, req)
		if strings.Contains(path, "/erasures/") && rec.code == http.StatusNotFound {
			continue
		}
		if strings.Contains(path, "/requests/") && rec.code == http.StatusOK {
			found = true
		}
		var b bytes.Buffer
		if json.Indent(&b, rec.body.Bytes(), "", "  ") != nil {
			b.Write(rec.body.Bytes())
		}
		fmt.Fprintf(&out, "GET %s → %d\n%s\n", path, rec.code, b.String())
	}
	return out.String(), found
}

type recorder struct {
	h    http.Header
	code int
	body bytes.Buffer
}

func (r *recorder) Header() http.Header { return r.h }
func (r *recorder) WriteHeader(c int)   { r.code = c }
func (r *recorder) Write(b []byte) (int, error) {
	if r.code == 0 {
		r.code = http.StatusOK
	}
	return r.body.Write(b)
}

// explorer data.
type explorerData struct {
	Tenant, Kind, ID, Valid, Tx string
	AsOfValid, AsOfTx           string
	Live                        bool
	// InFlight names the journal in flight that kept the coordinate's tx
	// below the one asked (as the read API's cascade_in_flight).
	InFlight  string
	Version   string
	Edges     []edgeRow
	MoreEdges bool
	// The edges shown are EdgesFrom+1 to EdgesFrom+len(Edges) of
	// EdgesTotal (EdgesMore: more than EdgesTotal, the count's bound, or
	// EdgesUnknown: the count met a cascade in flight); EdgesNext is the
	// next page's link (the same coordinate), EdgesFirst the first's.
	EdgesFrom             int
	EdgesTotal            int
	EdgesMore             bool
	EdgesUnknown          bool
	EdgesNext, EdgesFirst string
	// Deleted says how a node or edge that reads absent was deleted ("" if
	// it was not: not valid yet at this valid time, or no version yet).
	Deleted string
	// Committed is the store's committed tx (the hints of the empty form).
	Committed                 string
	History                   []historyRow
	HistoryNext, HistoryFirst string // links to the next page and the first
	SVG                       template.HTML
}

type edgeRow struct{ ID, Src, Dst, Label, Valid, Tx, Link string }

type historyRow struct {
	Tx, Valid, RequestID string
	Tombstone, Erased    bool
	Before, At           string
	RequestLink          string
}

// Explorer pages: ExplorerEdges edges and HistoryPageSize versions a page;
// ExplorerEdgeCount bounds the count of a node's edges at the coordinate
// (past it the page says "more than").
const (
	ExplorerEdges     = 50
	HistoryPageSize   = 100
	ExplorerEdgeCount = 10_000
)

func fmtTs(t storage.Ts) string {
	if t == storage.OpenEnd || t == storage.NoTs {
		return "open"
	}
	return t.Time().Format(storage.TimeLayout)
}

func (s *server) explorer(w http.ResponseWriter, r *http.Request, p api.Principal, pg *page, _ *session) {
	pg.Title, pg.Page = "As-of explorer", "explorer"
	q := r.URL.Query()
	d := explorerData{Tenant: q.Get("tenant"), Kind: q.Get("kind"), ID: q.Get("id"), Valid: q.Get("valid"), Tx: q.Get("tx")}
	if d.Kind == "" {
		d.Kind = "node"
	}
	pg.Data = &d
	d.Committed = fmtTs(s.o.Store.Committed())
	if d.ID == "" {
		s.render(w, "explorer", pg)
		return
	}
	fail := func(msg string) {
		pg.Error, d.ID = msg, ""
		s.render(w, "explorer", pg)
	}
	sc, err := storage.NewScope(d.Tenant)
	if err != nil {
		fail(fmt.Sprintf("tenant %q is not a tenant name", d.Tenant))
		return
	}
	if !p.Sees(d.Tenant) {
		s.o.Auth.Denied("forbidden_tenant")
		fail(fmt.Sprintf("your token may not read tenant %q", d.Tenant))
		return
	}
	id, err := uuid.Parse(d.ID)
	if err != nil {
		fail(fmt.Sprintf("id %q is not a UUID", d.ID))
		return
	}
	kind := storage.KindNode
	if d.Kind == "edge" {
		kind = storage.KindEdge
	}
	var after *[2]storage.Ts
	if h := q.Get("hafter"); h != "" {
		a, b, ok := strings.Cut(h, "_")
		x, errA := strconv.ParseInt(a, 10, 64)
		y, errB := strconv.ParseInt(b, 10, 64)
		if !ok || errA != nil || errB != nil {
			fail(fmt.Sprintf("hafter %q is not a history cursor", h))
			return
		}
		after = &[2]storage.Ts{storage.Ts(x), storage.Ts(y)}
	}
	// eafter: where the previous page of edges stopped (o:<edge id> in the
	// out rows, i:<edge id> in the in rows); en: how many came before.
	var eafter *storage.EdgeCursor
	if e := q.Get("eafter"); e != "" {
		dir, eid, ok := strings.Cut(e, ":")
		u, err := uuid.Parse(eid)
		n, nerr := strconv.Atoi(q.Get("en"))
		if !ok || (dir != "o" && dir != "i") || err != nil || nerr != nil || n < 0 {
			fail(fmt.Sprintf("eafter %q (en %q) is not an edge cursor", e, q.Get("en")))
			return
		}
		eafter, d.EdgesFrom = &storage.EdgeCursor{Out: dir == "o", ID: u}, n
	}
	// The coordinate, as the read API takes it (safe time: default tx the
	// committed one; a tx above it is answered at it; a journal in flight
	// on the node, or on a neighbour an edge leads to, lowers it below the
	// journal's tx, which the page says). The page never waits.
	committed := s.o.Store.Committed()
	v, t := max(storage.TsFromTime(time.Now()), committed), committed
	if d.Valid != "" {
		if v, err = storage.ParseTs(d.Valid); err != nil {
			fail(fmt.Sprintf("valid %q: %v", d.Valid, err))
			return
		}
	}
	if d.Tx != "" {
		if t, err = storage.ParseTs(d.Tx); err != nil {
			fail(fmt.Sprintf("tx %q: %v", d.Tx, err))
			return
		}
		t = min(t, committed)
	}
	rd := s.o.Store.Reader()
	nodes := []uuid.UUID{id}
	if kind == storage.KindEdge {
		if latest, ok, err := storage.Latest(rd, sc, kind, id); err == nil && ok {
			nodes = []uuid.UUID{latest.Src, latest.Dst}
		}
	}
	var inflight *storage.JournalEntry
	if safe, by := s.o.Store.SafeAt(sc, t, nodes...); by != nil {
		t, inflight = safe, by
	}
	var edges storage.EdgesPage
	if kind == storage.KindNode {
		for {
			page, blocked, err := api.SafeEdgesPage(s.o.Store, sc, id, storage.DirBoth, v, t, eafter, ExplorerEdges, 40*ExplorerEdges)
			if err != nil {
				fail(err.Error())
				return
			}
			if blocked == nil {
				edges = page
				break
			}
			select {
			case <-blocked.Removed(): // finished meanwhile: read again at t
			default:
				t, inflight = blocked.J.Tx-1, blocked
			}
		}
	}
	if inflight != nil {
		d.InFlight = fmt.Sprintf("node %s, request %s, tx %s", inflight.J.NodeID, inflight.J.Prov.RequestID, fmtTs(inflight.J.Tx))
	}
	d.AsOfValid, d.AsOfTx = fmtTs(v), fmtTs(t)
	ver, ok, err := storage.AsOf(rd, sc, kind, id, v, t)
	if err != nil {
		fail(err.Error())
		return
	}
	d.Live = ok
	if ok {
		b, _ := json.MarshalIndent(api.VersionJSON(&ver), "", "  ")
		d.Version = string(b)
	} else if d.Deleted, err = deletedAt(s.o.Store, sc, kind, id, t); err != nil {
		fail(err.Error())
		return
	}
	link := func(kind string, id uuid.UUID, v, t storage.Ts) string {
		return "/ui/explorer?" + url.Values{"tenant": {d.Tenant}, "kind": {kind}, "id": {id.String()}, "valid": {fmtTs(v)}, "tx": {fmtTs(t)}}.Encode()
	}
	for _, e := range edges.Edges {
		d.Edges = append(d.Edges, edgeRow{ID: e.ID.String(), Src: e.Src.String(), Dst: e.Dst.String(), Label: e.Label,
			Valid: fmtTs(e.Valid.Start) + " – " + fmtTs(e.Valid.End), Tx: fmtTs(e.Tx.Start), Link: link("edge", e.ID, v, t)})
	}
	d.MoreEdges = edges.Next != nil
	d.EdgesTotal = d.EdgesFrom + len(edges.Edges)
	if edges.Next != nil {
		more, capped, unknown, err := s.countEdges(sc, id, v, t, edges.Next, ExplorerEdgeCount-d.EdgesTotal)
		if err != nil {
			fail(err.Error())
			return
		}
		d.EdgesTotal += more
		d.EdgesMore, d.EdgesUnknown = capped, unknown
		c := edges.Next
		dir := "i"
		if c.Out {
			dir = "o"
		}
		// The next page reads at the coordinate this one was answered at.
		d.EdgesNext = "/ui/explorer?" + url.Values{"tenant": {d.Tenant}, "kind": {"node"}, "id": {d.ID}, "valid": {fmtTs(v)}, "tx": {fmtTs(t)},
			"eafter": {dir + ":" + c.ID.String()}, "en": {strconv.Itoa(d.EdgesFrom + len(edges.Edges))}}.Encode()
	}
	if eafter != nil {
		d.EdgesFirst = "/ui/explorer?" + url.Values{"tenant": {d.Tenant}, "kind": {"node"}, "id": {d.ID}, "valid": {fmtTs(v)}, "tx": {fmtTs(t)}}.Encode()
	}
	// The history, a page at a time (versions not committed yet are not
	// shown: safe time).
	hist, next, err := storage.HistoryPage(rd, sc, kind, id, after, HistoryPageSize, committed)
	if err != nil {
		fail(err.Error())
		return
	}
	for _, h := range hist {
		d.History = append(d.History, historyRow{Tx: fmtTs(h.Tx.Start), Valid: fmtTs(h.Valid.Start) + " – " + fmtTs(h.Valid.End),
			RequestID: h.Prov.RequestID, Tombstone: h.Tombstone, Erased: h.Erased, RequestLink: reqLinkIf(d.Tenant, h.Prov.RequestID),
			Before: link(d.Kind, id, v, h.Tx.Start-1), At: link(d.Kind, id, v, h.Tx.Start)})
	}
	self := url.Values{"tenant": {d.Tenant}, "kind": {d.Kind}, "id": {d.ID}}
	if d.Valid != "" {
		self.Set("valid", d.Valid)
	}
	if d.Tx != "" {
		self.Set("tx", d.Tx)
	}
	if next != nil {
		nv := url.Values{}
		for k, vs := range self {
			nv[k] = vs
		}
		nv.Set("hafter", fmt.Sprintf("%d_%d", next[0], next[1]))
		d.HistoryNext = "/ui/explorer?" + nv.Encode()
	}
	if after != nil {
		d.HistoryFirst = "/ui/explorer?" + self.Encode()
	}
	d.SVG = historySVG(hist, committed, v, t, func(h storage.Version) string { return link(d.Kind, id, v, h.Tx.Start) })
	s.render(w, "explorer", pg)
}

// reqLinkIf is the lookup of a request id ("" for none).
func reqLinkIf(tenant, rid string) string {
	if rid == "" {
		return ""
	}
	return requestLink(tenant, rid)
}

// deletedPages bounds the history pages deletedAt reads.
const deletedPages = 20

// deletedAt says, for an entity that reads absent at tx t, the tombstone
// that deleted it: its latest version at or below t when that is a
// tombstone ("deleted at tx X (request R), valid from V"); "" otherwise.
func deletedAt(st *storage.Store, sc storage.Scope, kind storage.Kind, id uuid.UUID, t storage.Ts) (string, error) {
	// The history at t, a page at a time, to its last page (one page in
	// practice: a tombstone ends a history; at most deletedPages, past
	// which the page does not say).
	var hist []storage.Version
	for after, pages := (*[2]storage.Ts)(nil), 0; ; pages++ {
		if pages == deletedPages {
			return "", nil
		}
		page, next, err := storage.HistoryPage(st.Reader(), sc, kind, id, after, HistoryPageSize, t)
		if err != nil {
			return "", err
		}
		if len(page) > 0 {
			hist = page
		}
		if next == nil {
			break
		}
		after = next
	}
	var last *storage.Version
	for i := range hist {
		if hist[i].Tx.Start <= t && (last == nil || hist[i].Tx.Start >= last.Tx.Start) {
			last = &hist[i]
		}
	}
	if last == nil || !last.Tombstone {
		return "", nil
	}
	out := "deleted at tx " + fmtTs(last.Tx.Start)
	if last.Prov.RequestID != "" {
		out += " (request " + last.Prov.RequestID + ")"
	}
	return out + ", valid from " + fmtTs(last.Valid.Start), nil
}

// countEdges counts a node's edges at (v, t) from cursor c on, at most
// limit of them (capped: there are more); unknown: the count met a
// cascade in flight and stopped.
func (s *server) countEdges(sc storage.Scope, id uuid.UUID, v, t storage.Ts, c *storage.EdgeCursor, limit int) (n int, capped, unknown bool, err error) {
	for c != nil {
		if n >= limit {
			return n, true, false, nil
		}
		page, blocked, err := api.SafeEdgesPage(s.o.Store, sc, id, storage.DirBoth, v, t, c, min(limit-n, 1000), 4000)
		if err != nil {
			return n, false, false, err
		}
		if blocked != nil {
			return n, false, true, nil
		}
		n += len(page.Edges)
		c = page.Next
	}
	return min(n, limit), false, false, nil
}

// historySVG draws the versions as boxes over valid time (x), stacked by
// tx time (y, oldest at the bottom), tombstones red, with the coordinate
// as a cross-hair.
func historySVG(hist []storage.Version, committed, v, t storage.Ts, link func(storage.Version) string) template.HTML {
	var vs []storage.Version
	for _, h := range hist {
		if h.Tx.Start <= committed {
			vs = append(vs, h)
		}
	}
	if len(vs) == 0 {
		return ""
	}
	sort.SliceStable(vs, func(i, j int) bool { return vs[i].Tx.Start < vs[j].Tx.Start })
	lo, hi := v, v
	for _, h := range vs {
		lo = min(lo, h.Valid.Start)
		if h.Valid.End != storage.OpenEnd {
			hi = max(hi, h.Valid.End)
		}
		hi = max(hi, h.Valid.Start)
	}
	span := float64(hi - lo)
	if span <= 0 {
		span = 1
	}
	hi = lo + storage.Ts(span*1.15) // room for open ends
	const width, row, left = 760.0, 22.0, 10.0
	x := func(ts storage.Ts) float64 {
		if ts == storage.OpenEnd || ts > hi {
			ts = hi
		}
		return left + (width-2*left)*float64(ts-lo)/float64(hi-lo)
	}
	height := row*float64(len(vs)) + 30 + tickRoom
	var b strings.Builder
	fmt.Fprintf(&b, `<svg id="history-svg" xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" role="img" aria-label="history">`, width, height)
	// Valid-time ticks along the bottom (the axis the boxes span).
	axis := height - 30 - tickRoom
	fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#8a96a3"/>`, left, axis, width-left, axis)
	for _, tk := range validTicks(lo, hi, 5) {
		tx := x(tk)
		fmt.Fprintf(&b, `<line class="tick" x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#8a96a3"/><text class="tick-label" x="%.1f" y="%.1f" text-anchor="middle" fill="#566270">%s</text>`,
			tx, axis, tx, axis+5, tx, axis+17, template.HTMLEscapeString(tickLabel(tk, hi-lo)))
	}
	for i, h := range vs {
		y := axis - row*float64(i+1)
		fill, label := "#2f7de1", "version"
		if h.Tombstone {
			fill, label = "#c62828", "tombstone"
		}
		x0, x1 := x(h.Valid.Start), x(h.Valid.End)
		if x1-x0 < 3 {
			x1 = x0 + 3
		}
		fmt.Fprintf(&b, `<a href="%s"><rect class="%s" x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s" opacity="0.8"><title>%s at tx %s, valid %s – %s</title></rect></a>`,
			template.HTMLEscapeString(link(h)), label, x0, y+2, x1-x0, row-4, fill, label, fmtTs(h.Tx.Start), fmtTs(h.Valid.Start), fmtTs(h.Valid.End))
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" fill="#fff">%s</text>`, x0+3, y+row-8, template.HTMLEscapeString(fmtTs(h.Tx.Start)))
	}
	// The coordinate: valid (vertical) and the last version at or below tx
	// (horizontal).
	cx := x(v)
	fmt.Fprintf(&b, `<line x1="%.1f" y1="0" x2="%.1f" y2="%.0f" stroke="#111" stroke-dasharray="4 3"/>`, cx, cx, axis)
	k := 0
	for i, h := range vs {
		if h.Tx.Start <= t {
			k = i + 1
		}
	}
	cy := axis - row*float64(k)
	fmt.Fprintf(&b, `<line x1="0" y1="%.1f" x2="%.0f" y2="%.1f" stroke="#111" stroke-dasharray="4 3"/>`, cy, width, cy)
	fmt.Fprintf(&b, `<text x="%.1f" y="%.0f">valid %s</text><text x="%.1f" y="%.0f">tx %s (below the line: what reads there)</text>`,
		left, height-8, template.HTMLEscapeString(fmtTs(v)), width/2, height-8, template.HTMLEscapeString(fmtTs(t)))
	b.WriteString(`</svg>`)
	return template.HTML(b.String()) // every interpolated string above is escaped
}

// tickRoom is the room under the boxes for the valid-time ticks.
const tickRoom = 22.0

// validTicks returns about n round instants between lo and hi (a step of
// 1, 2 or 5 times a power of ten of seconds, or of minutes, hours, days).
func validTicks(lo, hi storage.Ts, n int) []storage.Ts {
	if hi <= lo || n < 1 {
		return nil
	}
	if hi-lo <= 0 || hi-lo > storage.Ts(math.MaxInt64/1000) {
		return nil // overflows a Duration: no ticks
	}
	span := time.Duration(hi-lo) * time.Microsecond
	// From the tx clock's grain up: a history written within a millisecond
	// (a put and its tombstone in one test, or one group) still gets ticks.
	// Steps of 1, 2 and 5 (never more than 2.5x apart), so that the
	// smallest step giving at most n ticks gives at least 2.
	steps := []time.Duration{time.Microsecond, 2 * time.Microsecond, 5 * time.Microsecond,
		10 * time.Microsecond, 20 * time.Microsecond, 50 * time.Microsecond,
		100 * time.Microsecond, 200 * time.Microsecond, 500 * time.Microsecond,
		time.Millisecond, 2 * time.Millisecond, 5 * time.Millisecond,
		10 * time.Millisecond, 20 * time.Millisecond, 50 * time.Millisecond,
		100 * time.Millisecond, 200 * time.Millisecond, 500 * time.Millisecond, time.Second, 2 * time.Second, 5 * time.Second,
		10 * time.Second, 30 * time.Second, time.Minute, 2 * time.Minute, 5 * time.Minute, 10 * time.Minute, 30 * time.Minute,
		time.Hour, 2 * time.Hour, 6 * time.Hour, 12 * time.Hour, 24 * time.Hour, 7 * 24 * time.Hour, 30 * 24 * time.Hour, 365 * 24 * time.Hour}
	step := steps[len(steps)-1]
	for _, st := range steps {
		if span/st <= time.Duration(n) {
			step = st
			break
		}
	}
	us := storage.Ts(step / time.Microsecond)
	var out []storage.Ts
	for tk := (lo/us + 1) * us; tk < hi && len(out) < 2*n; tk += us {
		out = append(out, tk)
	}
	return out
}

// tickLabel is a tick's time, as precise as the span needs.
func tickLabel(tk, span storage.Ts) string {
	t := tk.Time().UTC()
	switch d := time.Duration(span) * time.Microsecond; {
	case d < 10*time.Millisecond:
		return t.Format("15:04:05.000000")
	case d < 10*time.Second:
		return t.Format("15:04:05.000")
	case d < 24*time.Hour:
		return t.Format("15:04:05")
	case d < 90*24*time.Hour:
		return t.Format("Jan 2 15:04")
	default:
		return t.Format("2006-01-02")
	}
}
