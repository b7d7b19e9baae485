package api

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/telha/telha-cascade/storage"
)

// Options configure the handler. Every field is optional.
type Options struct {
	// Copy: the store is a copy another writer keeps (a standby's,
	// storage.OpenCopy). Nothing is waited for on it (its committed tx
	// and fences move only when the caller refreshes it): a later page
	// meeting a cascade in flight, or whose cursor is above its committed
	// tx, answers 503 with Retry-After.
	Copy bool
	// Ready reports readiness and, when not ready, why; when ready, the
	// strings are notes (/readyz shows them, still 200).
	Ready func() (bool, []string)
	// Metrics serves /metrics.
	Metrics http.Handler
	// Now is the wall clock (default time.Now).
	Now func() time.Time
	// ReadAPI serves /v1/...; false leaves only health and metrics (the read
	// API bound elsewhere or disabled).
	ReadAPI bool
	// Health serves /healthz, /readyz and /metrics.
	Health bool
	// Journals lists the journals for /v1/journals, oldest first (nil: an
	// empty list).
	Journals func() []Journal
	// Partitions describes what this replica owns, for /v1/partitions.
	Partitions func() Partitions
	// Auth admits /v1/ requests (nil: everyone, as --auth off).
	Auth *Auth
	// MaxWaiting bounds the reads waiting at once (for safe time to reach
	// the tx asked, or for a journal in flight: the wait parameter, and a
	// later page of an edge walk); past it a read that would wait is
	// answered 503 with Retry-After at once. 0: DefaultMaxWaiting.
	MaxWaiting int
	Logger     *slog.Logger
}

// DefaultMaxWaiting is the default bound on reads waiting at once.
const DefaultMaxWaiting = 256

// Server holds what the handlers need.
type Server struct {
	store *storage.Store
	opts  Options
	// waiting holds a slot per read that waits (see Options.MaxWaiting).
	waiting chan struct{}
}

// Handler returns the HTTP handler.
func Handler(store *storage.Store, opts Options) http.Handler {
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.MaxWaiting <= 0 {
		opts.MaxWaiting = DefaultMaxWaiting
	}
	s := &Server{store: store, opts: opts, waiting: make(chan struct{}, opts.MaxWaiting)}
	mux := http.NewServeMux()
	if opts.Health {
		mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
			writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
		})
		mux.HandleFunc("GET /readyz", s.readyz)
		if opts.Metrics != nil {
			mux.Handle("GET /metrics", opts.Metrics)
		}
	}
	if opts.ReadAPI {
		read, list := []string{"valid", "tx", "wait"}, []string{"valid", "tx", "wait", "limit", "cursor"}
		mux.HandleFunc("GET /v1/tenants/{t}/nodes/{id}", only(s.entity(storage.KindNode), read...))
		mux.HandleFunc("GET /v1/tenants/{t}/edges/{id}", only(s.entity(storage.KindEdge), read...))
		mux.HandleFunc("GET /v1/tenants/{t}/nodes/{id}/edges", only(s.nodeEdges, append(list, "dir")...))
		mux.HandleFunc("GET /v1/tenants/{t}/nodes/{id}/history", only(s.history(storage.KindNode), list...))
		mux.HandleFunc("GET /v1/tenants/{t}/edges/{id}/history", only(s.history(storage.KindEdge), list...))
		listing := []string{"valid", "tx", "as_of_valid", "as_of_tx", "wait", "limit", "cursor"}
		mux.HandleFunc("GET /v1/tenants/{t}/nodes", only(s.list(storage.KindNode), listing...))
		mux.HandleFunc("GET /v1/tenants/{t}/edges", only(s.list(storage.KindEdge), listing...))
		// {request_id...}: an id may hold slashes, escaped (%2F); the
		// mux does not match one segment that is "%2F" alone.
		mux.HandleFunc("GET /v1/tenants/{t}/requests/{request_id...}", only(s.request))
		mux.HandleFunc("GET /v1/tenants/{t}/erasures/{request_id...}", only(s.erasure))
		mux.HandleFunc("GET /v1/journals", only(s.journals))
		mux.HandleFunc("GET /v1/partitions", only(s.partitions))
	}
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		if routeMatches(r.URL.Path, opts) {
			w.Header().Set("Allow", "GET, HEAD")
			writeError(w, http.StatusMethodNotAllowed, fmt.Sprintf("%s is not allowed on %s (allowed: GET, HEAD)", r.Method, r.URL.Path))
			return
		}
		hint := ""
		if len(r.URL.Path) > 1 && strings.HasSuffix(r.URL.Path, "/") && routeMatches(strings.TrimSuffix(r.URL.Path, "/"), opts) {
			hint = " (the API's paths end without a slash)"
		}
		writeError(w, http.StatusNotFound, fmt.Sprintf("no route for %s %s%s", r.Method, storage.QuoteShort(r.URL.Path), hint))
	})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		began := time.Now()
		sw := &statusWriter{ResponseWriter: w, code: http.StatusOK}
		defer func() {
			// The query's parameter names, never its values (a token or
			// anything else a client put in a URL stays out of the logs).
			opts.Logger.Debug("http", "method", r.Method, "path", storage.QuoteShort(r.URL.Path), "params", queryNames(r.URL.RawQuery), "status", sw.code,
				"bytes", sw.n, "took", time.Since(began), "remote", r.RemoteAddr)
		}()
		// An empty path segment (/v1/tenants//nodes/...) is a bad request,
		// not a redirect to a cleaned path. Looked for in the path as sent:
		// an escaped slash is part of its segment (a request id "/a" is
		// looked up as requests/%2Fa).
		if strings.Contains(r.URL.EscapedPath(), "//") {
			writeError(sw, http.StatusBadRequest, fmt.Sprintf("the path %s has an empty segment", storage.QuoteShort(r.URL.Path)))
			return
		}
		if opts.ReadAPI && opts.Auth != nil && strings.HasPrefix(r.URL.Path, "/v1/") {
			admitted, ok := opts.Auth.admit(sw, r, RoleRead)
			if !ok {
				return
			}
			mux.ServeHTTP(sw, admitted)
			return
		}
		mux.ServeHTTP(sw, r)
	})
}

// only answers 400 to a read with a query parameter the route does not
// know, naming the ones it does: a misspelt or foreign parameter
// (?as_of_tx=...) would otherwise be ignored, and the read answer "now"
// as if nothing were asked, a 404 indistinguishable from a delete. A
// query that does not decode (a bad %-escape, a ';') is 400 for the same
// reason: URL.Query drops the pairs it cannot decode, so ?tx=...%ZZ or
// ?tx=...;x would be read "now".
func only(h http.HandlerFunc, known ...string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		q, err := url.ParseQuery(r.URL.RawQuery)
		if err != nil {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("the query does not decode: %s (escape %% as %%25 and ; as %%3B)", storage.QuoteShort(err.Error())))
			return
		}
		for name := range q {
			if slices.Contains(known, name) {
				continue
			}
			if len(known) == 0 {
				writeError(w, http.StatusBadRequest, fmt.Sprintf("unknown query parameter %s: %s takes none", storage.QuoteShort(name), r.Pattern[len("GET "):]))
				return
			}
			writeError(w, http.StatusBadRequest, fmt.Sprintf("unknown query parameter %s (known here: %s)", storage.QuoteShort(name), strings.Join(known, ", ")))
			return
		}
		h(w, r)
	}
}

// queryNames lists the parameter names of a raw query, sorted, without
// their values (bounded: at most 16 names of 32 bytes).
func queryNames(raw string) string {
	if raw == "" {
		return ""
	}
	var names []string
	seen := map[string]bool{}
	for part := range strings.SplitSeq(raw, "&") {
		name, _, _ := strings.Cut(part, "=")
		if n, err := url.QueryUnescape(name); err == nil {
			name = n
		}
		if len(name) > 32 {
			name = name[:32] + "…"
		}
		if seen[name] {
			continue
		}
		seen[name] = true
		if len(names) == 16 {
			names = append(names, "…")
			break
		}
		names = append(names, name)
	}
	sort.Strings(names)
	return storage.QuoteShort(strings.Join(names, ","))
}

// statusWriter remembers the status and size of a response (access log).
type statusWriter struct {
	http.ResponseWriter
	code, n int
}

func (s *statusWriter) WriteHeader(code int) { s.code = code; s.ResponseWriter.WriteHeader(code) }

func (s *statusWriter) Write(b []byte) (int, error) {
	n, err := s.ResponseWriter.Write(b)
	s.n += n
	return n, err
}

// routes are the GET routes, for telling a wrong method (405) from a wrong
// path (404).
var (
	healthRoutes = []string{"/healthz", "/readyz", "/metrics"}
	readRoutes   = []string{"/v1/tenants/*/nodes", "/v1/tenants/*/edges", "/v1/tenants/*/nodes/*", "/v1/tenants/*/edges/*", "/v1/tenants/*/nodes/*/edges",
		"/v1/tenants/*/nodes/*/history", "/v1/tenants/*/edges/*/history", "/v1/tenants/*/requests/*", "/v1/tenants/*/erasures/*", "/v1/journals", "/v1/partitions"}
)

func routeMatches(path string, opts Options) bool {
	var routes []string
	if opts.Health {
		routes = append(routes, healthRoutes...)
	}
	if opts.ReadAPI {
		routes = append(routes, readRoutes...)
	}
	// Only the leading slash is trimmed: a trailing one is an empty last
	// segment, which no route has (the mux answers no path ending in "/"
	// but "/" itself), so such a path is 404, never 405.
	segs := strings.Split(strings.TrimPrefix(path, "/"), "/")
	for _, r := range routes {
		rs := strings.Split(strings.Trim(r, "/"), "/")
		if len(rs) != len(segs) {
			continue
		}
		ok := true
		for i := range rs {
			if segs[i] == "" || rs[i] != "*" && rs[i] != segs[i] {
				ok = false
				break
			}
		}
		if ok {
			return true
		}
	}
	return false
}

func (s *Server) readyz(w http.ResponseWriter, _ *http.Request) {
	ok, why := true, []string(nil)
	if s.opts.Ready != nil {
		ok, why = s.opts.Ready()
	}
	if !ok {
		writeJSON(w, http.StatusServiceUnavailable, map[string]any{"status": "not ready", "reasons": why})
		return
	}
	if len(why) > 0 {
		// Ready, with something worth knowing (a paused consumer: healthy,
		// consuming nothing until resumed).
		writeJSON(w, http.StatusOK, map[string]any{"status": "ready", "notes": why})
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "ready"})
}

type badRequest struct{ msg string }

func (e badRequest) Error() string { return e.msg }

func bad(format string, args ...any) error { return badRequest{fmt.Sprintf(format, args...)} }

// params are the parsed path and query parameters common to every read.
type params struct {
	scope                storage.Scope
	id                   uuid.UUID
	v, t                 storage.Ts
	explicitV, explicitT bool
	// asked is the tx the reader asked for (t before safe time lowered it).
	asked storage.Ts
	// wait bounds how long the read may wait for safe time to reach asked.
	deadline time.Time
	// inflight is the journal that kept t below asked, if any.
	inflight *storage.JournalEntry
}

// Params parses {t}, {id}, valid and tx. Both default to the store's now:
// the later of the wall clock and the last transaction time, so a read
// right after a write sees it even if tx times ran ahead of the wall clock.
func (s *Server) params(r *http.Request) (params, error) {
	var p params
	sc, err := storage.NewScope(r.PathValue("t"))
	if err != nil {
		return p, bad("tenant %s must match ^[a-z0-9][a-z0-9_-]{0,62}$", storage.QuoteShort(r.PathValue("t")))
	}
	p.scope = sc
	if raw := r.PathValue("id"); raw != "" {
		if len(raw) != 36 {
			return p, bad("id %s is not a UUID (8-4-4-4-12 hex digits)", storage.QuoteShort(raw))
		}
		if p.id, err = uuid.Parse(raw); err != nil {
			return p, bad("id %s is not a UUID (8-4-4-4-12 hex digits)", storage.QuoteShort(raw))
		}
		if p.id == uuid.Nil {
			// The queue refuses it as an id, src or dst: it names nothing.
			return p, bad("id %s is the nil UUID, which names no entity", raw)
		}
	}
	// "Now" is the store's safe now (storage/safetime.go): tx defaults to
	// the committed tx (nothing can be written at or below it any more but
	// by a journal in flight), valid to the later of the wall clock and that
	// tx (under a burst, tx times run a little ahead of the wall clock, and
	// a delete whose valid_end defaulted to its tx must read deleted right
	// after its result arrives).
	committed := s.store.Committed()
	p.v, p.t = max(storage.TsFromTime(s.opts.Now()), committed), committed
	q := r.URL.Query()
	p.deadline = time.Now()
	if ws, ok := q["wait"]; ok {
		if len(ws) != 1 {
			return p, bad("wait given %d times", len(ws))
		}
		d, err := parseWait(ws[0])
		if err != nil {
			return p, err
		}
		p.deadline = p.deadline.Add(d)
	}
	for _, f := range []struct {
		name string
		dst  *storage.Ts
		set  *bool
	}{{"valid", &p.v, &p.explicitV}, {"tx", &p.t, &p.explicitT}} {
		vals, ok := q[f.name]
		if !ok {
			continue
		}
		*f.set = true
		if len(vals) != 1 {
			return p, bad("%s given %d times", f.name, len(vals))
		}
		ts, err := storage.ParseTs(vals[0])
		if err != nil {
			return p, bad("%s: %v", f.name, err)
		}
		*f.dst = ts
	}
	p.asked = p.t
	if p.t > committed {
		// Not every tx up to t is committed yet: wait (up to wait) or
		// answer at the committed tx, which the answer says.
		if time.Until(p.deadline) > 0 {
			if !s.acquireWait() {
				return p, errBusy
			}
			ctx, cancel := context.WithDeadline(r.Context(), p.deadline)
			committed = s.store.WaitCommitted(ctx, p.t)
			cancel()
			s.releaseWait()
		}
		p.t = min(p.t, committed)
		if !p.explicitV {
			p.v = max(p.v, committed)
		}
	}
	return p, nil
}

// MaxWait bounds the wait parameter.
const MaxWait = 30 * time.Second

// parseWait reads wait: a Go duration ("2s", "500ms") or seconds ("2.5").
func parseWait(v string) (time.Duration, error) {
	d, err := time.ParseDuration(v)
	if err != nil {
		f, ferr := strconv.ParseFloat(v, 64)
		if ferr != nil || f != f {
			return 0, bad("wait %s must be a duration such as 2s or 500ms", storage.QuoteShort(v))
		}
		d = time.Duration(f * float64(time.Second))
	}
	if d < 0 || d > MaxWait {
		return 0, bad("wait %s must be between 0 and %s", storage.QuoteShort(v), MaxWait)
	}
	return d, nil
}

// settle lowers p.t below every journal in flight that fences one of nodes
// with a tx at or below it (their chunks may still land there), after
// waiting for them until p's deadline (storage/safetime.go).
func (s *Server) settle(ctx context.Context, p *params, nodes ...uuid.UUID) error {
	for {
		t, by := s.store.SafeAt(p.scope, p.t, nodes...)
		if by == nil {
			return nil
		}
		removed, err := s.waitJournal(ctx, by, p.deadline)
		if err != nil {
			return err
		}
		if !removed {
			p.t, p.inflight = t, by
			return nil
		}
	}
}

// errBusy: a read would wait, and MaxWaiting reads wait already.
var errBusy = errors.New("busy")

func (s *Server) acquireWait() bool {
	select {
	case s.waiting <- struct{}{}:
		return true
	default:
		return false
	}
}

func (s *Server) releaseWait() { <-s.waiting }

// waitJournal waits until e is removed or the deadline passes; it reports
// whether e was removed. A wait takes one of MaxWaiting slots (errBusy
// when none is free); a deadline passed already never waits.
func (s *Server) waitJournal(ctx context.Context, e *storage.JournalEntry, deadline time.Time) (bool, error) {
	select {
	case <-e.Removed():
		return true, nil
	default:
	}
	d := time.Until(deadline)
	if d <= 0 {
		return false, nil
	}
	if !s.acquireWait() {
		return false, errBusy
	}
	defer s.releaseWait()
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-e.Removed():
		return true, nil
	case <-timer.C:
	case <-ctx.Done():
	}
	return false, nil
}

// asOf is what every read answers besides its data: the coordinate it was
// answered at, and, when a journal in flight kept the tx below the one
// asked, that journal.
type asOf struct {
	AsOfValid storage.Ts    `json:"as_of_valid"`
	AsOfTx    storage.Ts    `json:"as_of_tx"`
	InFlight  *inFlightJSON `json:"cascade_in_flight,omitempty"`
}

type inFlightJSON struct {
	NodeID    string     `json:"node_id"`
	RequestID string     `json:"request_id"`
	Tx        storage.Ts `json:"tx"`
}

func (p *params) asOf() asOf {
	a := asOf{AsOfValid: p.v, AsOfTx: p.t}
	if e := p.inflight; e != nil {
		a.InFlight = &inFlightJSON{NodeID: e.J.NodeID.String(), RequestID: e.J.Prov.RequestID, Tx: e.J.Tx}
	}
	return a
}

func (s *Server) fail(w http.ResponseWriter, err error) {
	var br badRequest
	if errors.As(err, &br) {
		writeError(w, http.StatusBadRequest, br.msg)
		return
	}
	if errors.Is(err, errBusy) {
		w.Header().Set("Retry-After", "1")
		writeError(w, http.StatusServiceUnavailable, fmt.Sprintf("%d reads are waiting already (the most this worker lets wait at once): retry, or read without wait", cap(s.waiting)))
		return
	}
	s.opts.Logger.Error("read failed", "err", err)
	writeError(w, http.StatusInternalServerError, "internal error: "+err.Error())
}

func (s *Server) entity(k storage.Kind) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		p, err := s.params(r)
		if err != nil {
			s.fail(w, err)
			return
		}
		if err := s.settleEntity(r.Context(), &p, k); err != nil {
			s.fail(w, err)
			return
		}
		v, ok, err := storage.AsOf(s.store.Reader(), p.scope, k, p.id, p.v, p.t)
		if err != nil {
			s.fail(w, err)
			return
		}
		if !ok {
			writeJSON(w, http.StatusNotFound, struct {
				Error string `json:"error"`
				asOf
			}{fmt.Sprintf("%s %s is absent at valid %s, tx %s", k, p.id, p.v, p.t), p.asOf()})
			return
		}
		writeJSON(w, http.StatusOK, struct {
			Version
			asOf
		}{VersionJSON(&v), p.asOf()})
	}
}

// settleEntity settles p for a read of one entity: a node's own fence, or
// an edge's endpoints' (immutable, so its latest version names them).
func (s *Server) settleEntity(ctx context.Context, p *params, k storage.Kind) error {
	if k == storage.KindNode {
		return s.settle(ctx, p, p.id)
	}
	latest, ok, err := storage.Latest(s.store.Reader(), p.scope, storage.KindEdge, p.id)
	if err != nil || !ok {
		return err
	}
	return s.settle(ctx, p, latest.Src, latest.Dst)
}

// cursorAhead answers a later page whose cursor's coordinate t is above
// the committed tx, and reports whether it did: 400 on the store that
// issued it (it did not), 503 with Retry-After on a copy (Options.Copy),
// which may simply not have applied t yet (the owner issued the cursor).
func (s *Server) cursorAhead(w http.ResponseWriter, t storage.Ts) bool {
	if t <= s.store.Committed() {
		return false
	}
	if s.opts.Copy {
		w.Header().Set("Retry-After", "1")
		writeError(w, http.StatusServiceUnavailable, fmt.Sprintf("this copy has not applied the cursor's coordinate (tx %s) yet; retry", t))
		return true
	}
	s.fail(w, bad("the cursor's coordinate (tx %s) is above the committed tx: this store did not issue it", t))
	return true
}

// Paging of the list reads: limit (default DefaultLimit, at most
// MaxLimit) and an opaque cursor from the previous page's "next". A cursor
// carries the coordinate of its first page, so every page of a walk answers
// at the same (valid, tx).
const (
	DefaultLimit = 1_000
	MaxLimit     = 10_000
)

func (s *Server) limit(r *http.Request) (int, error) {
	vals := r.URL.Query()["limit"]
	switch len(vals) {
	case 0:
		return DefaultLimit, nil
	case 1:
	default:
		return 0, bad("limit given %d times", len(vals))
	}
	n, err := strconv.Atoi(vals[0])
	if err != nil || n < 1 || n > MaxLimit {
		return 0, bad("limit %s must be a whole number from 1 to %d", storage.QuoteShort(vals[0]), MaxLimit)
	}
	return n, nil
}

// cursor is the decoded form of a "next" value.
type cursor struct {
	kind     byte      // 'e' edges, 'h' history, or a list's
	id       uuid.UUID // the walk's walkTag: its tenant and entity
	v, t     storage.Ts
	dir      storage.Direction
	out      bool
	edge     uuid.UUID
	tx, vals storage.Ts
}

// walkTag names one walk, a tenant's list or an entity's edges or
// history in one tenant, in its cursors: a cursor given out for one walk
// is refused by every other, another tenant's among them.
func walkTag(sc storage.Scope, id uuid.UUID) uuid.UUID {
	h := sha256.New()
	h.Write([]byte("telha cursor\x00" + sc.Tenant() + "\x00"))
	h.Write(id[:])
	var t uuid.UUID
	copy(t[:], h.Sum(nil))
	return t
}

// cursorVersion: 2 since cursors carry a walkTag (1: the entity's id,
// nil for a list; refused since, start the walk again).
const cursorVersion = 2

func (c *cursor) encode() string {
	b := []byte{cursorVersion, c.kind}
	b = append(b, c.id[:]...)
	b = binary.BigEndian.AppendUint64(b, uint64(c.v))
	b = binary.BigEndian.AppendUint64(b, uint64(c.t))
	o := byte(0)
	if c.out {
		o = 1
	}
	b = append(b, byte(c.dir), o)
	b = append(b, c.edge[:]...)
	b = binary.BigEndian.AppendUint64(b, uint64(c.tx))
	b = binary.BigEndian.AppendUint64(b, uint64(c.vals))
	return base64.RawURLEncoding.EncodeToString(b)
}

// readCursor decodes the cursor parameter, if any, for a walk of kind
// whose walkTag is id; it must be one this API gave out for the same walk.
func readCursor(r *http.Request, kind byte, id uuid.UUID) (*cursor, error) {
	vals := r.URL.Query()["cursor"]
	if len(vals) == 0 {
		return nil, nil
	}
	if len(vals) > 1 {
		return nil, bad("cursor given %d times", len(vals))
	}
	b, err := base64.RawURLEncoding.DecodeString(vals[0])
	if err != nil || len(b) != 2+16+8+8+2+16+8+8 || b[0] != cursorVersion || b[1] != kind {
		return nil, bad("cursor %s is not a cursor of this list (use the previous page's \"next\")", storage.QuoteShort(vals[0]))
	}
	c := &cursor{kind: kind}
	copy(c.id[:], b[2:18])
	c.v = storage.Ts(binary.BigEndian.Uint64(b[18:26]))
	c.t = storage.Ts(binary.BigEndian.Uint64(b[26:34]))
	c.dir, c.out = storage.Direction(b[34]), b[35] == 1
	copy(c.edge[:], b[36:52])
	c.tx = storage.Ts(binary.BigEndian.Uint64(b[52:60]))
	c.vals = storage.Ts(binary.BigEndian.Uint64(b[60:68]))
	if c.id != id {
		return nil, bad("cursor %s belongs to another walk (another entity's, or another tenant's)", storage.QuoteShort(vals[0]))
	}
	return c, nil
}

func nextJSON(c *cursor) *string {
	if c == nil {
		return nil
	}
	n := c.encode()
	return &n
}

func (s *Server) nodeEdges(w http.ResponseWriter, r *http.Request) {
	p, err := s.params(r)
	if err != nil {
		s.fail(w, err)
		return
	}
	dir := storage.DirBoth
	if ds, given := r.URL.Query()["dir"]; given {
		if len(ds) > 1 {
			s.fail(w, bad("dir given %d times", len(ds)))
			return
		}
		var ok bool
		if dir, ok = storage.ParseDirection(ds[0]); !ok {
			s.fail(w, bad("dir %s must be out, in or both", storage.QuoteShort(ds[0])))
			return
		}
	}
	limit, err := s.limit(r)
	if err != nil {
		s.fail(w, err)
		return
	}
	tag := walkTag(p.scope, p.id)
	c, err := readCursor(r, 'e', tag)
	if err != nil {
		s.fail(w, err)
		return
	}
	var after *storage.EdgeCursor
	if c != nil {
		if (p.explicitV && p.v != c.v) || (p.explicitT && p.asked != c.t) || c.dir != dir {
			s.fail(w, bad("the cursor belongs to a walk at another coordinate or direction"))
			return
		}
		if s.cursorAhead(w, c.t) {
			return
		}
		p.v, p.t = c.v, c.t
		after = &storage.EdgeCursor{Out: c.out, ID: c.edge}
	} else if err := s.settle(r.Context(), &p, p.id); err != nil {
		s.fail(w, err)
		return
	}
	var page storage.EdgesPage
	for {
		// An edge to a node fenced by a journal at or below t may be half
		// written: a first page lowers t below it (or waits); a later page,
		// whose walk is pinned, waits for it (it never lowers t mid-walk).
		var blocked *storage.JournalEntry
		page, blocked, err = SafeEdgesPage(s.store, p.scope, p.id, dir, p.v, p.t, after, limit, 10*limit+1000)
		if err != nil || blocked == nil {
			break
		}
		if c != nil {
			deadline := time.Now().Add(MaxWait)
			if s.opts.Copy {
				deadline = time.Now() // a copy's fence drops only when a read refreshes it
			}
			removed, err := s.waitJournal(r.Context(), blocked, deadline)
			if err != nil {
				s.fail(w, err)
				return
			}
			if !removed {
				w.Header().Set("Retry-After", "5")
				writeError(w, http.StatusServiceUnavailable, fmt.Sprintf("the walk's coordinate (tx %s) meets the cascade of node %s in flight; retry this page", p.t, blocked.J.NodeID))
				return
			}
			continue
		}
		removed, err := s.waitJournal(r.Context(), blocked, p.deadline)
		if err != nil {
			s.fail(w, err)
			return
		}
		if !removed {
			p.t, p.inflight = blocked.J.Tx-1, blocked
		}
	}
	if err != nil {
		s.fail(w, err)
		return
	}
	out := make([]Version, 0, len(page.Edges))
	for i := range page.Edges {
		out = append(out, VersionJSON(&page.Edges[i]))
	}
	var next *cursor
	if page.Next != nil {
		next = &cursor{kind: 'e', id: tag, v: p.v, t: p.t, dir: dir, out: page.Next.Out, edge: page.Next.ID}
	}
	writeJSON(w, http.StatusOK, struct {
		Edges []Version `json:"edges"`
		Next  *string   `json:"next"`
		asOf
	}{out, nextJSON(next), p.asOf()})
}

func (s *Server) history(k storage.Kind) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		p, err := s.params(r)
		if err != nil {
			s.fail(w, err)
			return
		}
		limit, err := s.limit(r)
		if err != nil {
			s.fail(w, err)
			return
		}
		tag := walkTag(p.scope, p.id)
		c, err := readCursor(r, 'h', tag)
		if err != nil {
			s.fail(w, err)
			return
		}
		var after *[2]storage.Ts
		if c != nil {
			if p.explicitT && p.asked != c.t {
				s.fail(w, bad("the cursor belongs to a history read at another tx (tx %s, the cursor's %s): drop tx, or start again without the cursor", p.asked, c.t))
				return
			}
			if s.cursorAhead(w, c.t) {
				return
			}
			after = &[2]storage.Ts{c.tx, c.vals}
			p.t = c.t
		} else if err := s.settleEntity(r.Context(), &p, k); err != nil {
			s.fail(w, err)
			return
		}
		vs, nx, err := storage.HistoryPage(s.store.Reader(), p.scope, k, p.id, after, limit, p.t)
		if err != nil {
			s.fail(w, err)
			return
		}
		if c == nil && len(vs) == 0 {
			writeJSON(w, http.StatusNotFound, struct {
				Error string `json:"error"`
				asOf
			}{fmt.Sprintf("%s %s has no version at or before tx %s", k, p.id, p.t), p.asOf()})
			return
		}
		out := make([]Version, 0, len(vs))
		for i := range vs {
			out = append(out, VersionJSON(&vs[i]))
		}
		var next *cursor
		if nx != nil {
			next = &cursor{kind: 'h', id: tag, t: p.t, tx: nx[0], vals: nx[1]}
		}
		writeJSON(w, http.StatusOK, struct {
			Versions []Version `json:"versions"`
			Next     *string   `json:"next"`
			asOf
		}{out, nextJSON(next), p.asOf()})
	}
}

// Request is the answer of /v1/tenants/{t}/requests/{request_id}: the
// stored receipt of a request (state answered), or, while its journaled
// cascade runs, that journal (state in_flight). Receipts are kept for
// ever; the results stream keeps results for --results-max-age.
type Request struct {
	RequestID       string   `json:"request_id"`
	Tenant          string   `json:"tenant"`
	State           string   `json:"state"` // answered or in_flight
	Op              string   `json:"op"`
	ID              string   `json:"id"`
	Status          string   `json:"status,omitempty"`
	TxTime          *string  `json:"tx_time"`
	EdgesTombstoned uint64   `json:"edges_tombstoned"`
	Journaled       bool     `json:"journaled"`
	Journal         *Journal `json:"journal,omitempty"`
	// VersionsErased: erase_node and erase_edge only.
	VersionsErased *uint64 `json:"versions_erased,omitempty"`
}

func (s *Server) request(w http.ResponseWriter, r *http.Request) {
	sc, err := storage.NewScope(r.PathValue("t"))
	if err != nil {
		s.fail(w, bad("tenant %s must match ^[a-z0-9][a-z0-9_-]{0,62}$", storage.QuoteShort(r.PathValue("t"))))
		return
	}
	rid, ok := requestIDOf(w, r)
	if !ok {
		return
	}
	// In flight first, then the receipt: a request that finishes between
	// the two lookups is found answered, never missed (its erase or
	// journal leaves the lists only after its receipt is committed).
	// An erase runs from its head (journaled), with its node's cascade
	// journal, when it has one, listed under its request id: both are
	// named, as the erasure lookup and /v1/journals name them.
	if e := s.store.Erases().ByRequest(sc, rid); e != nil {
		head, err := s.eraseHead(e)
		if err != nil {
			s.fail(w, err)
			return
		}
		n := head.Versions
		writeJSON(w, http.StatusOK, Request{RequestID: rid, Tenant: sc.Tenant(), State: "in_flight", Op: e.Job.Op.String(), ID: e.Job.ID.String(),
			Journaled: true, Journal: s.journalOf(sc, rid), VersionsErased: &n})
		return
	}
	if j := s.journalOf(sc, rid); j != nil {
		writeJSON(w, http.StatusOK, Request{RequestID: rid, Tenant: sc.Tenant(), State: "in_flight", Op: storage.OpTombstoneNode.String(),
			ID: j.NodeID, Journaled: true, Journal: j})
		return
	}
	rc, ok, err := storage.GetReceipt(s.store.Reader(), sc, rid)
	if err != nil {
		s.fail(w, err)
		return
	}
	if ok {
		out := Request{RequestID: rid, Tenant: sc.Tenant(), State: "answered", Op: rc.Op.String(), ID: rc.ID.String(),
			Status: rc.Status.String(), EdgesTombstoned: rc.EdgesTombstoned, Journaled: rc.Journaled}
		if rc.Op == storage.OpEraseNode || rc.Op == storage.OpEraseEdge {
			n := rc.VersionsErased
			out.VersionsErased = &n
		}
		if rc.Status == storage.StatusOK {
			tx := rc.Tx.Time().Format(storage.TimeLayout)
			out.TxTime = &tx
		}
		writeJSON(w, http.StatusOK, out)
		return
	}
	writeError(w, http.StatusNotFound, fmt.Sprintf("no request %s in tenant %s (never seen, or invalid: invalid requests store nothing)", storage.QuoteShort(rid), sc.Tenant()))
}

// journalOf returns the entry of /v1/journals of the tenant's request
// rid, or nil when none runs.
func (s *Server) journalOf(sc storage.Scope, rid string) *Journal {
	if s.opts.Journals == nil {
		return nil
	}
	for _, j := range s.opts.Journals() {
		if j.Tenant == sc.Tenant() && j.RequestID == rid {
			return &j
		}
	}
	return nil
}

// requestIDOf returns the request id of a lookup's path, or answers 404
// as for any path ending in a slash when there is none.
func requestIDOf(w http.ResponseWriter, r *http.Request) (string, bool) {
	rid := r.PathValue("request_id")
	if rid == "" {
		writeError(w, http.StatusNotFound, fmt.Sprintf("no route for %s %s (the API's paths end without a slash)", r.Method, storage.QuoteShort(r.URL.Path)))
		return "", false
	}
	return rid, true
}

// Journal is one entry of /v1/journals. The journals' owner (package
// reaper) fills them; its states are the ones listed in docs/CONTRACT.md
// §6 (/v1/journals).
type Journal struct {
	Tenant     string  `json:"tenant"`
	NodeID     string  `json:"node_id"`
	RequestID  string  `json:"request_id"`
	TxTime     *string `json:"tx_time"`
	ValidEnd   *string `json:"valid_end"`
	EdgesTotal uint64  `json:"edges_total"` // 0 until the applier has counted them
	EdgesDone  int64   `json:"edges_done"`
	AgeSeconds float64 `json:"age_seconds"`
	State      string  `json:"state"`
	WaitingFor string  `json:"waiting_for,omitempty"` // state waiting: the node of the earlier journal
	Failures   int     `json:"failures,omitempty"`
	LastError  string  `json:"last_error,omitempty"`
	Key        string  `json:"key,omitempty"`
}

func (s *Server) journals(w http.ResponseWriter, r *http.Request) {
	out := []Journal{}
	if s.opts.Journals != nil {
		for _, j := range s.opts.Journals() {
			if mayRead(r.Context(), j.Tenant) { // a token sees its tenants' journals only
				out = append(out, j)
			}
		}
	}
	writeJSON(w, http.StatusOK, map[string]any{"journals": out})
}

// Partitions is /v1/partitions: the partitioning of the request stream
// and this replica's share of it.
type Partitions struct {
	Partitions int    `json:"partitions"` // P
	Replica    int    `json:"replica"`    // i
	Replicas   int    `json:"replicas"`   // N
	Owned      []int  `json:"owned"`
	Rule       string `json:"rule"`
}

func (s *Server) partitions(w http.ResponseWriter, _ *http.Request) {
	if s.opts.Partitions == nil {
		writeError(w, http.StatusNotFound, "partitions are not known here")
		return
	}
	writeJSON(w, http.StatusOK, s.opts.Partitions())
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	_ = enc.Encode(v)
}

func writeError(w http.ResponseWriter, code int, msg string) {
	writeJSON(w, code, map[string]string{"error": msg})
}
