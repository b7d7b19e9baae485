package api

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/google/uuid"
	"github.com/telha/telha-cascade/storage"
)

// Options configure the handler. Every field is optional.
type Options struct {
	// Ready reports readiness and, when not ready, why.
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
	Logger   *slog.Logger
}

// Server holds what the handlers need.
type Server struct {
	store *storage.Store
	opts  Options
}

// Handler returns the HTTP handler.
func Handler(store *storage.Store, opts Options) http.Handler {
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	s := &Server{store: store, opts: opts}
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
		mux.HandleFunc("GET /v1/tenants/{t}/nodes/{id}", s.entity(storage.KindNode))
		mux.HandleFunc("GET /v1/tenants/{t}/edges/{id}", s.entity(storage.KindEdge))
		mux.HandleFunc("GET /v1/tenants/{t}/nodes/{id}/edges", s.nodeEdges)
		mux.HandleFunc("GET /v1/tenants/{t}/nodes/{id}/history", s.history(storage.KindNode))
		mux.HandleFunc("GET /v1/tenants/{t}/edges/{id}/history", s.history(storage.KindEdge))
		mux.HandleFunc("GET /v1/journals", s.journals)
	}
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, fmt.Sprintf("no route for %s %s", r.Method, r.URL.Path))
	})
	return mux
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
	writeJSON(w, http.StatusOK, map[string]string{"status": "ready"})
}

type badRequest struct{ msg string }

func (e badRequest) Error() string { return e.msg }

func bad(format string, args ...any) error { return badRequest{fmt.Sprintf(format, args...)} }

// params are the parsed path and query parameters common to every read.
type params struct {
	scope storage.Scope
	id    uuid.UUID
	v, t  storage.Ts
}

// Params parses {t}, {id}, valid and tx. Both default to the store's now:
// the later of the wall clock and the last transaction time, so a read
// right after a write sees it even if tx times ran ahead of the wall clock.
func (s *Server) params(r *http.Request) (params, error) {
	var p params
	sc, err := storage.NewScope(r.PathValue("t"))
	if err != nil {
		return p, bad("tenant %q must match ^[a-z0-9][a-z0-9_-]{0,62}$", r.PathValue("t"))
	}
	p.scope = sc
	if raw := r.PathValue("id"); raw != "" {
		if len(raw) != 36 {
			return p, bad("id %q is not a UUID", raw)
		}
		if p.id, err = uuid.Parse(raw); err != nil {
			return p, bad("id %q is not a UUID", raw)
		}
	}
	// "Now" is the store's now: the later of the wall clock and the last
	// transaction time. Under a burst, tx times run a little ahead of the
	// wall clock (max(now, last+1)), and a delete whose valid_end defaulted
	// to its tx must read deleted right after its result arrives.
	now := max(storage.TsFromTime(s.opts.Now()), s.store.Clock().Last())
	p.v, p.t = now, now
	q := r.URL.Query()
	for _, f := range []struct {
		name string
		dst  *storage.Ts
	}{{"valid", &p.v}, {"tx", &p.t}} {
		vals, ok := q[f.name]
		if !ok {
			continue
		}
		if len(vals) != 1 {
			return p, bad("%s given %d times", f.name, len(vals))
		}
		ts, err := storage.ParseTs(vals[0])
		if err != nil {
			return p, bad("%s: %v", f.name, err)
		}
		*f.dst = ts
	}
	return p, nil
}

func (s *Server) fail(w http.ResponseWriter, err error) {
	var br badRequest
	if errors.As(err, &br) {
		writeError(w, http.StatusBadRequest, br.msg)
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
		v, ok, err := storage.AsOf(s.store.Reader(), p.scope, k, p.id, p.v, p.t)
		if err != nil {
			s.fail(w, err)
			return
		}
		if !ok {
			writeError(w, http.StatusNotFound, fmt.Sprintf("%s %s is absent at valid %s, tx %s", k, p.id, p.v, p.t))
			return
		}
		writeJSON(w, http.StatusOK, VersionJSON(&v))
	}
}

func (s *Server) nodeEdges(w http.ResponseWriter, r *http.Request) {
	p, err := s.params(r)
	if err != nil {
		s.fail(w, err)
		return
	}
	dir := storage.DirBoth
	if ds := r.URL.Query()["dir"]; len(ds) > 1 {
		s.fail(w, bad("dir given %d times", len(ds)))
		return
	}
	if d := r.URL.Query().Get("dir"); d != "" {
		var ok bool
		if dir, ok = storage.ParseDirection(d); !ok {
			s.fail(w, bad("dir %q must be out, in or both", d))
			return
		}
	}
	es, err := storage.EdgesOf(s.store.Reader(), p.scope, p.id, dir, p.v, p.t)
	if err != nil {
		s.fail(w, err)
		return
	}
	out := make([]Version, 0, len(es))
	for i := range es {
		out = append(out, VersionJSON(&es[i]))
	}
	writeJSON(w, http.StatusOK, map[string]any{"edges": out})
}

func (s *Server) history(k storage.Kind) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		p, err := s.params(r)
		if err != nil {
			s.fail(w, err)
			return
		}
		vs, err := storage.History(s.store.Reader(), p.scope, k, p.id)
		if err != nil {
			s.fail(w, err)
			return
		}
		out := make([]Version, 0, len(vs))
		for i := range vs {
			out = append(out, VersionJSON(&vs[i]))
		}
		writeJSON(w, http.StatusOK, map[string]any{"versions": out})
	}
}

// Journal is one entry of /v1/journals. The journals' owner (package
// reaper) fills them; its states are the ones listed in docs/API.md.
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
		out = append(out, s.opts.Journals()...)
	}
	writeJSON(w, http.StatusOK, map[string]any{"journals": out})
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
