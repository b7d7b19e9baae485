package api

import (
	"encoding/hex"
	"fmt"
	"net/http"

	"github.com/telha/telha-cascade/storage"
)

// Erasure is the answer of /v1/tenants/{t}/erasures/{request_id}: the
// erasure record of an erase_node or erase_edge (state done), or, while it
// runs, its progress (state in_flight). It never holds erased data: the
// digest is SHA-256 over the SHA-256 of each erased version's key and old
// value, in the order erased, so whoever kept a copy can prove what was
// erased.
type Erasure struct {
	RequestID      string  `json:"request_id"`
	Tenant         string  `json:"tenant"`
	State          string  `json:"state"` // done or in_flight
	Op             string  `json:"op"`
	ID             string  `json:"id"`
	Actor          string  `json:"actor"`
	Reason         string  `json:"reason"`
	Source         string  `json:"source"`
	TxTime         *string `json:"tx_time"`
	RequestedAt    *string `json:"requested_at"`
	FinishedAt     *string `json:"finished_at,omitempty"` // done only
	VersionsErased uint64  `json:"versions_erased"`
	Digest         string  `json:"digest,omitempty"`
}

func (s *Server) erasure(w http.ResponseWriter, r *http.Request) {
	sc, err := storage.NewScope(r.PathValue("t"))
	if err != nil {
		s.fail(w, bad("tenant %s must match ^[a-z0-9][a-z0-9_-]{0,62}$", storage.QuoteShort(r.PathValue("t"))))
		return
	}
	rid, ok := requestIDOf(w, r)
	if !ok {
		return
	}
	// In flight first, then the record: an erase that finishes between the
	// two lookups is found done, never missed.
	if e := s.store.Erases().ByRequest(sc, rid); e != nil {
		head, err := s.eraseHead(e)
		if err != nil {
			s.fail(w, err)
			return
		}
		j := e.Job
		writeJSON(w, http.StatusOK, Erasure{RequestID: rid, Tenant: sc.Tenant(), State: "in_flight", Op: j.Op.String(), ID: j.ID.String(),
			Actor: j.Prov.Actor, Reason: j.Prov.Reason, Source: j.Prov.Source, TxTime: ts(j.Tx), RequestedAt: ts(j.CreatedAt),
			VersionsErased: head.Versions})
		return
	}
	rec, ok, err := storage.GetErasure(s.store.Reader(), sc, rid)
	if err != nil {
		s.fail(w, err)
		return
	}
	if ok {
		writeJSON(w, http.StatusOK, Erasure{RequestID: rid, Tenant: sc.Tenant(), State: "done", Op: rec.Op.String(), ID: rec.ID.String(),
			Actor: rec.Actor, Reason: rec.Reason, Source: rec.Source, TxTime: ts(rec.Tx), RequestedAt: ts(rec.RequestedAt),
			FinishedAt: ts(rec.FinishedAt), VersionsErased: rec.Versions, Digest: "sha256:" + hex.EncodeToString(rec.Digest[:])})
		return
	}
	writeError(w, http.StatusNotFound, fmt.Sprintf("no erasure %s in tenant %s", storage.QuoteShort(rid), sc.Tenant()))
}

// eraseHead returns the head of erase e as stored (how far it got), or
// as registered when it is not durable yet.
func (s *Server) eraseHead(e *storage.EraseEntry) (storage.EraseJob, error) {
	head, ok, err := s.store.EraseHead(s.store.Reader(), e)
	if !ok {
		head = e.Job
	}
	return head, err
}
