package storage

import (
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
)

// JournalEntry is the in-memory state of one durable cascade journal: the
// decoded head, its progress, and its lease.
//
// While an entry exists its node is fenced: every write that touches the
// node (a put of the node, a put or tombstone of an edge with it as an
// endpoint, a cascade that would tombstone such an edge) is refused with
// ErrCascadeInFlight. The registry is rebuilt from the jobs keyspace when the
// store opens, so it always equals the set of durable journal heads (plus
// poison heads that could not be decoded, which fence nothing because their
// node is unknown).
//
// Ownership is a lease held in memory: one process owns the store, so a
// lease needs no durable record. An applier takes the lease, heartbeats it on
// every chunk, and commits each chunk through WithLease, which serialises
// the journal's commits: two appliers can never commit chunks of the same
// journal at once, and a stale holder whose lease was taken over finds out
// before its next commit.
type JournalEntry struct {
	Scope   Scope
	HeadKey []byte
	J       Journal

	edgesDone atomic.Int64

	applyMu   sync.Mutex // serialises chunk commits of this journal
	mu        sync.Mutex // guards the fields below; never held across I/O
	owner     uint64
	heartbeat time.Time
	failures  int
	lastErr   string
	failedAt  time.Time
}

var leaseTokens atomic.Uint64

// NewLeaseToken returns a process-unique lease token.
func NewLeaseToken() uint64 { return leaseTokens.Add(1) }

// TryAcquire takes the lease if nobody holds it or the holder's heartbeat is
// older than ttl.
func (e *JournalEntry) TryAcquire(token uint64, now time.Time, ttl time.Duration) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.owner != 0 && now.Sub(e.heartbeat) <= ttl {
		return false
	}
	e.owner, e.heartbeat = token, now
	return true
}

// Release gives the lease up if token holds it.
func (e *JournalEntry) Release(token uint64) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.owner == token {
		e.owner = 0
	}
}

// ErrLeaseLost: the applier's lease was taken over; it must stop.
var ErrLeaseLost = fmt.Errorf("%w: journal lease lost", ErrStorage)

// WithLease runs fn (a chunk commit) if token still holds the lease, then
// heartbeats it. Commits of one journal are serialised (applyMu), so even a
// stale holder racing the reaper's takeover never commits at the same time
// as the new holder, and finds out it lost the lease before its next chunk.
// Readers of the lease (/v1/journals, the reaper) never wait for the I/O.
func (e *JournalEntry) WithLease(token uint64, now func() time.Time, fn func() error) error {
	e.applyMu.Lock()
	defer e.applyMu.Unlock()
	e.mu.Lock()
	held := e.owner == token
	e.mu.Unlock()
	if !held {
		return ErrLeaseLost
	}
	err := fn()
	e.mu.Lock()
	if e.owner == token {
		e.heartbeat = now()
	}
	e.mu.Unlock()
	return err
}

// Lease reports the holder (0 for none) and the last heartbeat.
func (e *JournalEntry) Lease() (owner uint64, heartbeat time.Time) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.owner, e.heartbeat
}

// RecordFailure notes a failed apply attempt and returns the failure count.
func (e *JournalEntry) RecordFailure(err error, now time.Time) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.failures++
	e.lastErr = err.Error()
	e.failedAt = now
	return e.failures
}

// LastFailure returns when the last failed attempt happened (zero if none).
func (e *JournalEntry) LastFailure() time.Time {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.failedAt
}

// Failures returns the failed attempts so far and the last error.
func (e *JournalEntry) Failures() (int, string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.failures, e.lastErr
}

// EdgesDone returns the number of journaled edges whose tombstone landed.
func (e *JournalEntry) EdgesDone() int64 { return e.edgesDone.Load() }

// SetEdgesDone records progress.
func (e *JournalEntry) SetEdgesDone(n int64) { e.edgesDone.Store(n) }

// PoisonJournal is a journal head that could not be decoded. It is kept
// (never deleted by the service) for an operator to inspect.
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

// Journals is the registry of durable journals (the fences).
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
	delete(r.byKey, string(e.HeadKey))
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

// List returns every journal entry, oldest first.
func (r *Journals) List() []*JournalEntry {
	r.mu.RLock()
	out := make([]*JournalEntry, 0, len(r.byKey))
	for _, e := range r.byKey {
		out = append(out, e)
	}
	r.mu.RUnlock()
	sort.Slice(out, func(i, j int) bool {
		if out[i].J.CreatedAt != out[j].J.CreatedAt {
			return out[i].J.CreatedAt < out[j].J.CreatedAt
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
