package ui

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"embed"
	"encoding/hex"
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

	"github.com/google/uuid"
	"github.com/telha/telha-cascade/api"
	"github.com/telha/telha-cascade/queue/client"
	"github.com/telha/telha-cascade/storage"
)

//go:embed templates/*.html
var templateFS embed.FS

//go:embed static
var staticFS embed.FS

var pages = template.Must(template.New("").ParseFS(templateFS, "templates/*.html"))

// DeadLetters is what the page needs of the dead-letter stream.
type DeadLetters interface {
	List(ctx context.Context, f client.DeadLetterFilter) ([]client.DeadLetter, uint64, error)
	Get(ctx context.Context, seq uint64) (client.DeadLetter, error)
	Retry(ctx context.Context, seq uint64) (client.Retried, error)
	Discard(ctx context.Context, seq uint64) error
}

// Overview is the overview page's figures (the worker fills them).
type Overview struct {
	RequestsTotal  float64
	RequestsPerSec float64
	RateWindow     string // the span the rates are over
	ByStatus       []StatusCount
	Pending        string
	AckPending     string
	Journals       int
	Poison         int
	DeadLetters    string
	ReaperResult   string
	ReaperLast     string
	DiskFree       string
	StoreSize      string
	Partitions     api.Partitions
	Build          string
}

// StatusCount is one status's answered requests.
type StatusCount struct {
	Status string
	Count  float64
	PerSec float64
}

// Options configures Handler.
type Options struct {
	Store       *storage.Store
	Auth        *api.Auth
	Journals    func() []api.Journal
	Overview    func(ctx context.Context) Overview
	DeadLetters DeadLetters
	Logger      *slog.Logger
}

type server struct {
	o      Options
	secret []byte
	// lookups answers the request lookup as the read API does (the page
	// has checked the tenant already).
	lookups http.Handler
}

// Handler serves /ui/ (mount it at /ui/).
func Handler(o Options) http.Handler {
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	s := &server{o: o, secret: make([]byte, 32),
		lookups: api.Handler(o.Store, api.Options{ReadAPI: true, Journals: o.Journals, Logger: o.Logger})}
	_, _ = rand.Read(s.secret)
	mux := http.NewServeMux()
	static, _ := fs.Sub(staticFS, "static")
	mux.Handle("GET /ui/static/", http.StripPrefix("/ui/static/", http.FileServerFS(static)))
	mux.HandleFunc("GET /ui/login", s.loginPage)
	mux.HandleFunc("POST /ui/login", s.login)
	mux.HandleFunc("GET /ui/{$}", s.gate(s.overview))
	mux.HandleFunc("GET /ui/journals", s.gate(s.journals))
	mux.HandleFunc("GET /ui/dlq", s.gate(s.dlq))
	mux.HandleFunc("POST /ui/dlq/{seq}/{action}", s.gate(s.dlqAction))
	mux.HandleFunc("GET /ui/requests", s.gate(s.requests))
	mux.HandleFunc("GET /ui/explorer", s.gate(s.explorer))
	return mux
}

// page is what every template gets.
type page struct {
	Title, Page, Who, Flash, Error, CSRF string
	Refresh                              int
	Data                                 any
}

type handler func(w http.ResponseWriter, r *http.Request, p api.Principal, pg *page)

// gate admits the request (token, cookie, loopback) and fills the page's
// common parts.
func (s *server) gate(h handler) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		p, ok, status, msg := s.o.Auth.Principal(r)
		if !ok {
			if status == http.StatusUnauthorized && s.o.Auth.Mode() == api.AuthTokens && r.Method == http.MethodGet {
				http.Redirect(w, r, "/ui/login", http.StatusSeeOther)
				return
			}
			http.Error(w, msg, status)
			return
		}
		who := p.Name
		if !p.All {
			who = fmt.Sprintf("%s (%s: %s)", p.Name, p.Role, strings.Join(p.Tenants, ", "))
		}
		pg := &page{Who: who, Flash: r.URL.Query().Get("flash"), CSRF: s.csrf(p)}
		h(w, r, p, pg)
	}
}

// csrf is the token a principal's forms carry: an HMAC of its name under
// the process's random secret (a cookie alone never authorises a POST).
func (s *server) csrf(p api.Principal) string {
	m := hmac.New(sha256.New, s.secret)
	m.Write([]byte(p.Name))
	return hex.EncodeToString(m.Sum(nil))
}

func (s *server) render(w http.ResponseWriter, name string, pg *page) {
	var buf bytes.Buffer
	if err := pages.ExecuteTemplate(&buf, name, pg); err != nil {
		s.o.Logger.Error("status page", "page", name, "err", err)
		http.Error(w, "the page could not be rendered: "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("X-Frame-Options", "DENY")
	w.Header().Set("Content-Security-Policy", "default-src 'self'; script-src 'unsafe-inline'; style-src 'self'; img-src 'self' data:")
	_, _ = w.Write(buf.Bytes())
}

func (s *server) loginPage(w http.ResponseWriter, r *http.Request) {
	s.render(w, "login", &page{Title: "Sign in", Page: "login", Error: r.URL.Query().Get("error")})
}

func (s *server) login(w http.ResponseWriter, r *http.Request) {
	tok := strings.TrimSpace(r.PostFormValue("token"))
	probe, _ := http.NewRequest(http.MethodGet, "/ui/", nil)
	probe.RemoteAddr = r.RemoteAddr
	probe.Header.Set("Authorization", "Bearer "+tok)
	if _, ok, _, _ := s.o.Auth.Principal(probe); !ok || tok == "" {
		http.Redirect(w, r, "/ui/login?error="+url.QueryEscape("unknown token"), http.StatusSeeOther)
		return
	}
	http.SetCookie(w, &http.Cookie{Name: api.TokenCookie, Value: tok, Path: "/", HttpOnly: true, SameSite: http.SameSiteStrictMode})
	http.Redirect(w, r, "/ui/", http.StatusSeeOther)
}

func (s *server) overview(w http.ResponseWriter, r *http.Request, p api.Principal, pg *page) {
	pg.Title, pg.Page = "Overview", "overview"
	if s.o.Overview != nil {
		pg.Data = s.o.Overview(r.Context())
	}
	s.render(w, "overview", pg)
}

// journalRow is a journal with its progress figures.
type journalRow struct {
	api.Journal
	Percent float64
	Rate    float64
	ETA     string
}

func (s *server) journals(w http.ResponseWriter, r *http.Request, p api.Principal, pg *page) {
	pg.Title, pg.Page = "Journals", "journals"
	var rows []journalRow
	if s.o.Journals != nil {
		for _, j := range s.o.Journals() {
			if !p.Sees(j.Tenant) {
				continue
			}
			row := journalRow{Journal: j, ETA: "-"}
			if j.EdgesTotal > 0 {
				row.Percent = math.Round(1000*float64(j.EdgesDone)/float64(j.EdgesTotal)) / 10
			}
			if j.AgeSeconds > 0 {
				row.Rate = float64(j.EdgesDone) / j.AgeSeconds
			}
			if row.Rate > 0 && j.EdgesTotal > 0 {
				left := float64(int64(j.EdgesTotal)-j.EdgesDone) / row.Rate
				row.ETA = (time.Duration(left * float64(time.Second))).Round(time.Second).String()
			}
			rows = append(rows, row)
		}
	}
	if len(rows) > 0 {
		pg.Refresh = 1
	}
	pg.Data = rows
	s.render(w, "journals", pg)
}

// letterRow is a dead letter with its body made readable.
type letterRow struct {
	client.DeadLetter
	PrettyBody string
}

type dlqData struct {
	Tenant, Reason string
	Letters        []letterRow
	Total          uint64
	Operate        bool
}

func (s *server) dlq(w http.ResponseWriter, r *http.Request, p api.Principal, pg *page) {
	pg.Title, pg.Page = "Dead letters", "dlq"
	d := dlqData{Tenant: r.URL.Query().Get("tenant"), Reason: r.URL.Query().Get("reason"), Operate: p.Operates()}
	if s.o.DeadLetters != nil {
		f := client.DeadLetterFilter{Tenant: d.Tenant, Reason: d.Reason, Limit: 200, Full: true}
		if !p.All {
			f.Tenants = p.Tenants
		}
		letters, total, err := s.o.DeadLetters.List(r.Context(), f)
		if err != nil {
			pg.Error = "the dead-letter stream could not be read: " + err.Error()
		}
		d.Total = total
		for _, l := range letters {
			row := letterRow{DeadLetter: l}
			if len(l.Body) > 0 {
				var b bytes.Buffer
				if json.Indent(&b, l.Body, "", "  ") == nil {
					row.PrettyBody = b.String()
				}
			}
			d.Letters = append(d.Letters, row)
		}
	}
	pg.Data = d
	s.render(w, "dlq", pg)
}

func (s *server) dlqAction(w http.ResponseWriter, r *http.Request, p api.Principal, pg *page) {
	if !hmac.Equal([]byte(r.PostFormValue("csrf")), []byte(pg.CSRF)) {
		http.Error(w, "this form is stale or was not sent by the status page (CSRF token mismatch): reload the page", http.StatusForbidden)
		return
	}
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
	var flash string
	switch r.PathValue("action") {
	case "retry":
		res, err := s.o.DeadLetters.Retry(r.Context(), seq)
		if err != nil {
			http.Redirect(w, r, "/ui/dlq?flash="+url.QueryEscape("retry failed: "+err.Error()), http.StatusSeeOther)
			return
		}
		flash = fmt.Sprintf("Dead letter %d retried: request %s republished to %s (request stream seq %d) and removed from the dead letters.",
			seq, res.RequestID, res.Subject, res.RequestStreamSeq)
	case "discard":
		if err := s.o.DeadLetters.Discard(r.Context(), seq); err != nil {
			http.Redirect(w, r, "/ui/dlq?flash="+url.QueryEscape("discard failed: "+err.Error()), http.StatusSeeOther)
			return
		}
		flash = fmt.Sprintf("Dead letter %d discarded (request %s, reason %s).", seq, l.RequestID, l.Reason)
	default:
		http.Error(w, "unknown action", http.StatusNotFound)
		return
	}
	s.o.Logger.Info("status page: dead letter "+r.PathValue("action"), "seq", seq, "by", p.Name, "tenant", l.Tenant, "request_id", l.RequestID)
	http.Redirect(w, r, "/ui/dlq?flash="+url.QueryEscape(flash), http.StatusSeeOther)
}

type requestsData struct {
	Tenant, ID, Answer string
}

func (s *server) requests(w http.ResponseWriter, r *http.Request, p api.Principal, pg *page) {
	pg.Title, pg.Page = "Request lookup", "requests"
	d := requestsData{Tenant: r.URL.Query().Get("tenant"), ID: r.URL.Query().Get("id")}
	if d.Tenant != "" && d.ID != "" {
		d.Answer = s.lookup(r.Context(), p, d.Tenant, d.ID)
	}
	pg.Data = d
	s.render(w, "requests", pg)
}

// lookup answers a request lookup in the read API's own words.
func (s *server) lookup(ctx context.Context, p api.Principal, tenant, rid string) string {
	if !p.Sees(tenant) {
		s.o.Auth.Denied("forbidden_tenant")
		return fmt.Sprintf("your token may not read tenant %q", tenant)
	}
	var out strings.Builder
	for _, path := range []string{"/v1/tenants/" + url.PathEscape(tenant) + "/requests/" + url.PathEscape(rid),
		"/v1/tenants/" + url.PathEscape(tenant) + "/erasures/" + url.PathEscape(rid)} {
		rec := &recorder{h: http.Header{}}
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, path, nil)
		s.lookups.ServeHTTP(rec, req)
		if strings.Contains(path, "/erasures/") && rec.code == http.StatusNotFound {
			continue
		}
		var b bytes.Buffer
		if json.Indent(&b, rec.body.Bytes(), "", "  ") != nil {
			b.Write(rec.body.Bytes())
		}
		fmt.Fprintf(&out, "GET %s → %d\n%s\n", path, rec.code, b.String())
	}
	return out.String()
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
	InFlight                    string
	Version                     string
	Edges                       []edgeRow
	MoreEdges                   bool
	History                     []historyRow
	SVG                         template.HTML
}

type edgeRow struct{ ID, Src, Dst, Label, Valid, Tx, Link string }

type historyRow struct {
	Tx, Valid, RequestID string
	Tombstone, Erased    bool
	Before, At           string
}

func fmtTs(t storage.Ts) string {
	if t == storage.OpenEnd || t == storage.NoTs {
		return "open"
	}
	return t.Time().Format(storage.TimeLayout)
}

func (s *server) explorer(w http.ResponseWriter, r *http.Request, p api.Principal, pg *page) {
	pg.Title, pg.Page = "As-of explorer", "explorer"
	q := r.URL.Query()
	d := explorerData{Tenant: q.Get("tenant"), Kind: q.Get("kind"), ID: q.Get("id"), Valid: q.Get("valid"), Tx: q.Get("tx")}
	if d.Kind == "" {
		d.Kind = "node"
	}
	pg.Data = &d
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
	// The coordinate, as the read API takes it (safe time: default tx the
	// committed one; a tx above it is answered at it).
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
	nodes := []uuid.UUID{id}
	rd := s.o.Store.Reader()
	if kind == storage.KindEdge {
		if latest, ok, err := storage.Latest(rd, sc, kind, id); err == nil && ok {
			nodes = []uuid.UUID{latest.Src, latest.Dst}
		}
	}
	if safe, by := s.o.Store.SafeAt(sc, t, nodes...); by != nil {
		t, d.InFlight = safe, fmtTs(by.J.Tx)
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
	}
	link := func(kind string, id uuid.UUID, v, t storage.Ts) string {
		return "/ui/explorer?" + url.Values{"tenant": {d.Tenant}, "kind": {kind}, "id": {id.String()}, "valid": {fmtTs(v)}, "tx": {fmtTs(t)}}.Encode()
	}
	if kind == storage.KindNode {
		page, err := storage.EdgesOfPage(rd, sc, id, storage.DirBoth, v, t, nil, 50, 2000, func(other uuid.UUID) bool {
			_, by := s.o.Store.SafeAt(sc, t, other)
			return by == nil
		})
		if err == nil {
			for _, e := range page.Edges {
				d.Edges = append(d.Edges, edgeRow{ID: e.ID.String(), Src: e.Src.String(), Dst: e.Dst.String(), Label: e.Label,
					Valid: fmtTs(e.Valid.Start) + " – " + fmtTs(e.Valid.End), Tx: fmtTs(e.Tx.Start), Link: link("edge", e.ID, v, t)})
			}
			d.MoreEdges = page.Next != nil
		}
	}
	hist, err := storage.History(rd, sc, kind, id)
	if err != nil {
		fail(err.Error())
		return
	}
	for _, h := range hist {
		if h.Tx.Start > committed {
			continue // not committed yet: not shown (safe time)
		}
		d.History = append(d.History, historyRow{Tx: fmtTs(h.Tx.Start), Valid: fmtTs(h.Valid.Start) + " – " + fmtTs(h.Valid.End),
			RequestID: h.Prov.RequestID, Tombstone: h.Tombstone, Erased: h.Erased,
			Before: link(d.Kind, id, v, h.Tx.Start-1), At: link(d.Kind, id, v, h.Tx.Start)})
	}
	d.SVG = historySVG(hist, committed, v, t, func(h storage.Version) string { return link(d.Kind, id, v, h.Tx.Start) })
	s.render(w, "explorer", pg)
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
	height := row*float64(len(vs)) + 30
	var b strings.Builder
	fmt.Fprintf(&b, `<svg id="history-svg" xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" role="img" aria-label="history">`, width, height)
	for i, h := range vs {
		y := height - 30 - row*float64(i+1)
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
	fmt.Fprintf(&b, `<line x1="%.1f" y1="0" x2="%.1f" y2="%.0f" stroke="#111" stroke-dasharray="4 3"/>`, cx, cx, height-24)
	k := 0
	for i, h := range vs {
		if h.Tx.Start <= t {
			k = i + 1
		}
	}
	cy := height - 30 - row*float64(k)
	fmt.Fprintf(&b, `<line x1="0" y1="%.1f" x2="%.0f" y2="%.1f" stroke="#111" stroke-dasharray="4 3"/>`, cy, width, cy)
	fmt.Fprintf(&b, `<text x="%.1f" y="%.0f">valid %s</text><text x="%.1f" y="%.0f">tx %s (below the line: what reads there)</text>`,
		left, height-8, template.HTMLEscapeString(fmtTs(v)), width/2, height-8, template.HTMLEscapeString(fmtTs(t)))
	b.WriteString(`</svg>`)
	return template.HTML(b.String()) // every interpolated string above is escaped
}
