package api

import (
	"net/http"
	"net/url"

	"github.com/google/uuid"
	"github.com/telha/telha-cascade/storage"
)

// The listing of a tenant's live entities (issue 31: what a change-feed
// consumer that fell behind the feed's retention resyncs from):
// GET /v1/tenants/{t}/nodes and /v1/tenants/{t}/edges, paged by id, at
// one coordinate for the whole walk. The coordinate's tx is settled below
// every journal of the tenant still in flight (its chunks may still land
// there), so the listing at as_of_tx X is final, and the feed from X+1µs
// on (client.ChangesConfig.From) continues it without a gap or a
// duplicate.

// listParams maps the listing's as_of_valid and as_of_tx onto valid and
// tx (either name; not both).
func listParams(r *http.Request) (*http.Request, error) {
	q := r.URL.Query()
	changed := false
	for _, p := range [][2]string{{"as_of_tx", "tx"}, {"as_of_valid", "valid"}} {
		if vs, ok := q[p[0]]; ok {
			if _, both := q[p[1]]; both {
				return nil, bad("%s and %s name the same coordinate: give one", p[0], p[1])
			}
			// Checked under the name the client gave, so the error names it.
			if len(vs) != 1 {
				return nil, bad("%s given %d times", p[0], len(vs))
			}
			if _, err := storage.ParseTs(vs[0]); err != nil {
				return nil, bad("%s: %v", p[0], err)
			}
			q[p[1]] = vs
			delete(q, p[0])
			changed = true
		}
	}
	if !changed {
		return r, nil
	}
	r2 := r.Clone(r.Context())
	r2.URL = &url.URL{Path: r.URL.Path, RawQuery: q.Encode()}
	return r2, nil
}

func (s *Server) list(k storage.Kind) http.HandlerFunc {
	ck := byte('n')
	if k == storage.KindEdge {
		ck = 'g'
	}
	return func(w http.ResponseWriter, r *http.Request) {
		r, err := listParams(r)
		if err != nil {
			s.fail(w, err)
			return
		}
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
		tag := walkTag(p.scope, uuid.Nil)
		c, err := readCursor(r, ck, tag)
		if err != nil {
			s.fail(w, err)
			return
		}
		after := uuid.Nil
		if c != nil {
			if (p.explicitV && p.v != c.v) || (p.explicitT && p.asked != c.t) {
				s.fail(w, bad("the cursor belongs to a listing at another coordinate: drop valid and tx, or start again without the cursor"))
				return
			}
			if s.cursorAhead(w, c.t) {
				return
			}
			p.v, p.t, after = c.v, c.t, c.edge
		} else {
			// Below every journal of the tenant in flight at or below t.
			var oldest *storage.JournalEntry
			for _, e := range s.store.Journals().FencesUpTo(p.scope, p.t) {
				if oldest == nil || e.J.Tx < oldest.J.Tx {
					oldest = e
				}
			}
			if oldest != nil {
				p.t, p.inflight = oldest.J.Tx-1, oldest
			}
		}
		vs, nx, err := storage.LivePage(s.store.Reader(), p.scope, k, p.v, p.t, after, limit, 10*limit+1000)
		if err != nil {
			s.fail(w, err)
			return
		}
		out := make([]Version, 0, len(vs))
		for i := range vs {
			out = append(out, VersionJSON(&vs[i]))
		}
		var next *cursor
		if nx != nil {
			next = &cursor{kind: ck, id: tag, v: p.v, t: p.t, edge: *nx}
		}
		if k == storage.KindEdge {
			writeJSON(w, http.StatusOK, struct {
				Edges []Version `json:"edges"`
				Next  *string   `json:"next"`
				asOf
			}{out, nextJSON(next), p.asOf()})
			return
		}
		writeJSON(w, http.StatusOK, struct {
			Nodes []Version `json:"nodes"`
			Next  *string   `json:"next"`
			asOf
		}{out, nextJSON(next), p.asOf()})
	}
}
