package storage

import (
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
)

// JournalEntry is a durable cascade journal head, as the registry holds it.
//
// While an entry is registered its node is fenced: every write that touches
// the node (a put of the node, a put or tombstone of an edge with it as an
// endpoint, an inline cascade that would tombstone such an edge) is refused
// with ErrCascadeInFlight, and a journaled cascade that shares an edge with
// it waits for it if it came later (see cascade.ScanJournal). The registry
// equals the set of durable journal heads at every point of the commit
// order: it is loaded at open, and changed only on the writer, in the task
// whose commit makes the change true (Txn.BeginJournal, Txn.RemoveJournal).
//
// What the fence buys (Invariant, frozen neighbourhood): from the commit of
// a journal head for node N until its removal, the only versions written of
// edges touching N are the tombstones of N's own journal and of journals
// committed before it (lower tx). So N's edges can be re-read from the
// adjacency keyspaces at any time and give the cascade's write-set.
//
// The entry holds no lease, progress or failure count: the journal's runner
// (package reaper) owns those.
type JournalEntry struct {
	Scope   Scope
	HeadKey []byte
	J       Journal

	removed   chan struct{} // closed when the removal commits, or when the head's transaction rolls back
	committed atomic.Bool   // the head is durable (List shows only those)

	traceMu     sync.Mutex
	traceparent string // the request's W3C traceparent, in memory only
}

// SetTraceparent records the W3C traceparent of the request that committed
// the journal (tracing; not stored: a journal resumed after a restart
// starts a trace of its own).
func (e *JournalEntry) SetTraceparent(tp string) {
	e.traceMu.Lock()
	defer e.traceMu.Unlock()
	e.traceparent = tp
}

// Traceparent returns what SetTraceparent recorded ("" when nothing).
func (e *JournalEntry) Traceparent() string {
	e.traceMu.Lock()
	defer e.traceMu.Unlock()
	return e.traceparent
}

func newJournalEntry(sc Scope, key []byte, j Journal) *JournalEntry {
	return &JournalEntry{Scope: sc, HeadKey: key, J: j, removed: make(chan struct{})}
}

// Removed returns a channel closed once the journal's fence is down: its
// removal has committed, or the transaction that registered it did not
// commit (a waiter then finds it no longer registered).
func (e *JournalEntry) Removed() <-chan struct{} { return e.removed }

// PoisonJournal is a journal head that could not be decoded. It is kept
// (never deleted by the service) for an operator to inspect. It fences
// nothing: its node is unknown.
type PoisonJournal struct {
	Scope   Scope
	HeadKey []byte
	Err     string
	Seen    time.Time
}

type nodeRef struct {
	tenant string
	node   uuid.UUID
}

type reqRef struct {
	tenant, request string
}

// Journals is the registry of durable journals (the fences). Reads are safe
// from any goroutine; changes happen on the writer only.
type Journals struct {
	mu     sync.RWMutex
	byNode map[nodeRef]*JournalEntry
	byReq  map[reqRef]*JournalEntry
	byKey  map[string]*JournalEntry
	poison map[string]*PoisonJournal
}

func newJournals() *Journals {
	return &Journals{
		byNode: map[nodeRef]*JournalEntry{},
		byReq:  map[reqRef]*JournalEntry{},
		byKey:  map[string]*JournalEntry{},
		poison: map[string]*PoisonJournal{},
	}
}

// Fenced returns the journal fencing node, or nil.
func (r *Journals) Fenced(s Scope, node uuid.UUID) *JournalEntry {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.byNode[nodeRef{s.tenant, node}]
}

// ByRequest returns the in-flight journal of a request id, or nil.
func (r *Journals) ByRequest(s Scope, requestID string) *JournalEntry {
	if requestID == "" {
		return nil
	}
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.byReq[reqRef{s.tenant, requestID}]
}

// ByKey returns the entry of a head key, or nil.
func (r *Journals) ByKey(headKey []byte) *JournalEntry {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.byKey[string(headKey)]
}

// Registered reports whether e is (still) registered.
func (r *Journals) Registered(e *JournalEntry) bool { return r.ByKey(e.HeadKey) == e }

// FencesBefore returns the nodes of a tenant fenced by journals committed
// before tx (lower tx), each with its journal. Called on the writer
// (Store.Exclusive) together with a snapshot, it tells a journal's applier
// which of its neighbours an earlier journal may still write.
func (r *Journals) FencesBefore(s Scope, tx Ts) map[uuid.UUID]*JournalEntry {
	r.mu.RLock()
	defer r.mu.RUnlock()
	out := map[uuid.UUID]*JournalEntry{}
	for ref, e := range r.byNode {
		if ref.tenant == s.tenant && e.J.Tx < tx {
			out[ref.node] = e
		}
	}
	return out
}

// Fences returns every node of a tenant fenced by a journal, with its
// journal. Called on the writer (Store.Exclusive) together with a
// snapshot, it tells an erase which journals may still write below the
// snapshot's cut.
func (r *Journals) Fences(s Scope) map[uuid.UUID]*JournalEntry {
	r.mu.RLock()
	defer r.mu.RUnlock()
	out := map[uuid.UUID]*JournalEntry{}
	for ref, e := range r.byNode {
		if ref.tenant == s.tenant {
			out[ref.node] = e
		}
	}
	return out
}

// FencesUpTo returns the nodes of a tenant fenced by a journal with tx <=
// t, each with its journal: a copy of the registry's own index (one
// journal per node: a node is not journaled again while it is fenced),
// taken under its lock, without the tenant's other journals or a sort.
// An edge walk answered at t takes it before its view (api.SafeEdgesPage).
//
// It includes entries whose head is durable but which the writer has not
// yet marked committed (List skips those): the writer advances Committed
// past a journal's tx before it runs the after-commit action that marks
// it, so a reader may already read at a t at or above that tx; left out,
// a journal that lands and drops its fence during the walk would be
// missed. An entry of a transaction still running has a tx above
// Committed, so it is returned only for a t above Committed (and if that
// transaction rolls back, its Removed channel is closed).
func (r *Journals) FencesUpTo(s Scope, t Ts) map[uuid.UUID]*JournalEntry {
	r.mu.RLock()
	defer r.mu.RUnlock()
	var out map[uuid.UUID]*JournalEntry
	for ref, e := range r.byNode {
		if ref.tenant == s.tenant && e.J.Tx <= t {
			if out == nil {
				out = map[uuid.UUID]*JournalEntry{}
			}
			out[ref.node] = e
		}
	}
	return out
}

func (r *Journals) add(e *JournalEntry) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.byNode[nodeRef{e.Scope.tenant, e.J.NodeID}] = e
	if e.J.Prov.RequestID != "" {
		r.byReq[reqRef{e.Scope.tenant, e.J.Prov.RequestID}] = e
	}
	r.byKey[string(e.HeadKey)] = e
}

func (r *Journals) remove(e *JournalEntry) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.byNode[nodeRef{e.Scope.tenant, e.J.NodeID}] == e {
		delete(r.byNode, nodeRef{e.Scope.tenant, e.J.NodeID})
	}
	if r.byReq[reqRef{e.Scope.tenant, e.J.Prov.RequestID}] == e {
		delete(r.byReq, reqRef{e.Scope.tenant, e.J.Prov.RequestID})
	}
	if r.byKey[string(e.HeadKey)] == e {
		delete(r.byKey, string(e.HeadKey))
	}
}

// addPoison records an undecodable head; it reports whether it is new.
func (r *Journals) addPoison(p *PoisonJournal) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.poison[string(p.HeadKey)]; ok {
		return false
	}
	r.poison[string(p.HeadKey)] = p
	return true
}

// List returns every durable journal entry, in commit order (by tx). An
// entry registered by a transaction still running on the writer is not
// listed: it fences its node for that transaction's decisions, but it may
// yet roll back.
func (r *Journals) List() []*JournalEntry {
	r.mu.RLock()
	out := make([]*JournalEntry, 0, len(r.byKey))
	for _, e := range r.byKey {
		if e.committed.Load() {
			out = append(out, e)
		}
	}
	r.mu.RUnlock()
	sort.Slice(out, func(i, j int) bool {
		if out[i].J.Tx != out[j].J.Tx {
			return out[i].J.Tx < out[j].J.Tx
		}
		return string(out[i].HeadKey) < string(out[j].HeadKey)
	})
	return out
}

// Poison returns the journal heads that could not be decoded.
func (r *Journals) Poison() []*PoisonJournal {
	r.mu.RLock()
	defer r.mu.RUnlock()
	out := make([]*PoisonJournal, 0, len(r.poison))
	for _, p := range r.poison {
		out = append(out, p)
	}
	sort.Slice(out, func(i, j int) bool { return string(out[i].HeadKey) < string(out[j].HeadKey) })
	return out
}

// Len returns the number of decodable journals.
func (r *Journals) Len() int {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return len(r.byKey)
}
