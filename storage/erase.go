package storage

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/google/uuid"
	"github.com/telha/telha-cascade/internal/scrubmark"
)

// Erasure (CONTRACT §3, "Erasure"): the one operation that rewrites stored
// versions. An erased version keeps its key and everything liveness reads
// (ids, endpoints, label, intervals, tombstone flag, request id, decided
// at); its props become "{}" and its free-text provenance (actor, reason,
// source) empty, and it carries the erased flag. The set of keys never
// changes, so liveness at every (valid, tx) is the same before and after
// (invariant I4).
//
// An erase is journaled like a cascade: its head (jobs state 0xC2) is the
// commit point, written in the request's group batch together with the
// tombstone that kills the entity if it was still live; an eraser then
// rewrites the versions chunk by chunk (each chunk also records the
// progress in the head), scrubs the disk (Scrub) and finishes in one batch
// that deletes the head and stores the receipt, the result outbox row and
// the erasure record. Rewriting an erased version is a no-op, so a resumed
// erase converges.

// EraseJobState (0xC2) and the erasure records' meta sub-keyspace (0x06)
// are in keys.go, with EraseJobKey and ErasureKey.

const (
	// flagErased marks an erased version (version flags).
	flagErased byte = 1 << 4
	// flagQuiet marks a journal that answers no request of its own: the
	// tombstone cascade of an erase_node (journal flags).
	flagQuiet byte = 1 << 4
	// flagVersionsErased: a receipt carries versions_erased (receipt flags).
	flagVersionsErased byte = 1 << 4
)

// EraseJob is an erase head: what to erase, for whom, and how far it got.
type EraseJob struct {
	Op          Op // OpEraseNode or OpEraseEdge
	ID          uuid.UUID
	Tx          Ts         // the erase's commit tx (its receipt's tx_time)
	Prov        Provenance // who asked and why; RequestID is the request to answer
	CreatedAt   Ts         // wall clock at the commit point
	Fingerprint Fingerprint
	Versions    uint64 // versions erased so far
	// HashState is the SHA-256 state (its MarshalBinary) over what was
	// erased so far: the SHA-256 of every erased version's key and old
	// value, in scan order (hashes, not the bytes: a hash state keeps its
	// last partial input block verbatim). A resumed erase continues it, so
	// the final digest does not depend on where chunks (or crashes) fell.
	HashState []byte
}

// EraseRecord is what stays of an erase: who asked, why, when, how many
// versions, and a digest of the erased payloads (never the payloads).
type EraseRecord struct {
	Op                      Op
	ID                      uuid.UUID
	RequestID               string
	Actor, Reason, Source   string
	Tx                      Ts // the erase's commit tx
	RequestedAt, FinishedAt Ts // wall clock
	Versions                uint64
	Digest                  [32]byte
}

// EncodeEraseJob encodes an erase head.
func EncodeEraseJob(j *EraseJob) []byte {
	e := enc{b: make([]byte, 0, 160)}
	e.byte(FormatVersion)
	e.byte(byte(j.Op))
	var flags byte
	if j.Prov.DecidedAt != NoTs {
		flags |= flagDecidedAt
	}
	e.byte(flags)
	e.uuid(j.ID)
	e.i64(int64(j.Tx))
	e.i64(int64(j.CreatedAt))
	e.prov(j.Prov)
	if flags&flagDecidedAt != 0 {
		e.i64(int64(j.Prov.DecidedAt))
	}
	e.b = append(e.b, j.Fingerprint[:]...)
	e.uvar(j.Versions)
	e.bytes(j.HashState)
	return e.b
}

// DecodeEraseJob decodes an erase head.
func DecodeEraseJob(b []byte) (EraseJob, error) {
	d := dec{b: b}
	var j EraseJob
	d.header("erase head")
	j.Op = Op(d.byte())
	flags := d.byte()
	if d.err == nil && j.Op != OpEraseNode && j.Op != OpEraseEdge {
		d.fail("bad op %d", j.Op)
	}
	if d.err == nil && flags&^flagDecidedAt != 0 {
		d.fail("unknown flags %#x", flags)
	}
	j.ID = d.uuid()
	j.Tx = Ts(d.i64())
	j.CreatedAt = Ts(d.i64())
	d.prov(&j.Prov)
	j.Prov.DecidedAt = NoTs
	if flags&flagDecidedAt != 0 {
		j.Prov.DecidedAt = Ts(d.i64())
	}
	copy(j.Fingerprint[:], d.take(16))
	j.Versions = d.uvar()
	j.HashState = d.bytes()
	if d.err == nil && len(j.HashState) > 256 {
		d.fail("hash state of %d bytes", len(j.HashState))
	}
	if err := d.finish("erase head"); err != nil {
		return EraseJob{}, err
	}
	return j, nil
}

// EncodeEraseRecord encodes an erasure record.
func EncodeEraseRecord(r *EraseRecord) []byte {
	e := enc{b: make([]byte, 0, 128)}
	e.byte(FormatVersion)
	e.byte(byte(r.Op))
	e.uuid(r.ID)
	e.i64(int64(r.Tx))
	e.i64(int64(r.RequestedAt))
	e.i64(int64(r.FinishedAt))
	e.uvar(r.Versions)
	e.b = append(e.b, r.Digest[:]...)
	e.str(r.RequestID)
	e.str(r.Actor)
	e.str(r.Reason)
	e.str(r.Source)
	return e.b
}

// DecodeEraseRecord decodes an erasure record.
func DecodeEraseRecord(b []byte) (EraseRecord, error) {
	d := dec{b: b}
	var r EraseRecord
	d.header("erasure record")
	r.Op = Op(d.byte())
	if d.err == nil && r.Op != OpEraseNode && r.Op != OpEraseEdge {
		d.fail("bad op %d", r.Op)
	}
	r.ID = d.uuid()
	r.Tx = Ts(d.i64())
	r.RequestedAt = Ts(d.i64())
	r.FinishedAt = Ts(d.i64())
	r.Versions = d.uvar()
	copy(r.Digest[:], d.take(32))
	r.RequestID = d.str()
	r.Actor = d.str()
	r.Reason = d.str()
	r.Source = d.str()
	if err := d.finish("erasure record"); err != nil {
		return EraseRecord{}, err
	}
	return r, nil
}

// GetErasure reads a request's erasure record.
func GetErasure(r pebble.Reader, sc Scope, requestID string) (EraseRecord, bool, error) {
	v, ok, err := getValue(r, ErasureKey(sc, requestID))
	if err != nil || !ok {
		return EraseRecord{}, false, err
	}
	rec, err := DecodeEraseRecord(v)
	if err != nil {
		return EraseRecord{}, false, fmt.Errorf("erasure record of %q: %w", requestID, err)
	}
	return rec, true, nil
}

// EraseEntry is a registered erase in flight.
type EraseEntry struct {
	Scope   Scope
	HeadKey []byte
	Job     EraseJob // as committed at the commit point (progress is in the store)
	removed chan struct{}
	// committed: the head is durable (List shows only those).
	committed atomic.Bool

	traceMu     sync.Mutex
	traceparent string // the request's W3C traceparent, in memory only
}

// SetTraceparent records the W3C traceparent of the erase's request
// (tracing; not stored).
func (e *EraseEntry) SetTraceparent(tp string) {
	e.traceMu.Lock()
	defer e.traceMu.Unlock()
	e.traceparent = tp
}

// Traceparent returns what SetTraceparent recorded ("" when nothing).
func (e *EraseEntry) Traceparent() string {
	e.traceMu.Lock()
	defer e.traceMu.Unlock()
	return e.traceparent
}

// Removed is closed when the erase has finished (its head deleted), or
// when the transaction that registered it did not commit.
func (e *EraseEntry) Removed() <-chan struct{} { return e.removed }

// Erases is the in-memory registry of erases in flight (loaded at open).
type Erases struct {
	mu sync.Mutex
	m  map[string]*EraseEntry // tenant \x00 request id
}

// stamp returns the CreatedAt of a head begun now: now, or just after the
// newest head registered (in flight, or begun by the transaction running)
// when that is not older. So heads list in the order they were begun,
// their requests' order, even within one microsecond of the wall clock,
// across a step back of it, or after a failover to a member whose clock
// is behind. It depends on the heads in flight only, never on what the
// process did before, so a run that crashed and resumed stamps as one
// that did not.
func (r *Erases) stamp(now Ts) Ts {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, e := range r.m {
		now = max(now, e.Job.CreatedAt+1)
	}
	return now
}

func eraseIndex(sc Scope, requestID string) string { return sc.Tenant() + "\x00" + requestID }

// ByRequest returns the erase in flight of a request id, if any.
func (r *Erases) ByRequest(sc Scope, requestID string) *EraseEntry {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.m[eraseIndex(sc, requestID)]
}

// List returns every erase in flight whose head is durable, oldest first:
// in the order they were begun (their CreatedAt, stamp), which is the
// order of their requests, whatever their txs (an erase's tx is its
// entity's tombstone's, an older one for an entity already dead). So of
// two erases of one entity, or of a node and then one of its edges, the
// first erases the versions and the second finds none left. One
// registered by a transaction still running on the writer is not listed
// (it may yet roll back); ByRequest sees it, for the decisions of the
// requests after it in the same group.
func (r *Erases) List() []*EraseEntry {
	r.mu.Lock()
	out := make([]*EraseEntry, 0, len(r.m))
	for _, e := range r.m {
		if e.committed.Load() {
			out = append(out, e)
		}
	}
	r.mu.Unlock()
	slices.SortFunc(out, func(a, b *EraseEntry) int {
		if c := cmp.Compare(a.Job.CreatedAt, b.Job.CreatedAt); c != 0 {
			return c
		}
		if c := cmp.Compare(a.Job.Tx, b.Job.Tx); c != 0 {
			return c
		}
		return slices.Compare(a.HeadKey, b.HeadKey)
	})
	return out
}

func (r *Erases) add(e *EraseEntry) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.m[eraseIndex(e.Scope, e.Job.Prov.RequestID)] = e
}

func (r *Erases) remove(e *EraseEntry) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.m[eraseIndex(e.Scope, e.Job.Prov.RequestID)] == e {
		delete(r.m, eraseIndex(e.Scope, e.Job.Prov.RequestID))
	}
}

// Erases returns the registry of erases in flight.
func (s *Store) Erases() *Erases { return s.erases }

func (s *Store) loadErases() error {
	s.erases = &Erases{m: map[string]*EraseEntry{}}
	for _, sc := range s.Tenants() {
		lo, hi := JobsInState(sc, EraseJobState)
		err := scan(s.eng, lo, hi, func(k, v []byte) error {
			j, err := DecodeEraseJob(v)
			if err != nil {
				// Not silently dropped: the store refuses to open, the operator
				// sees the key (an erase must not be forgotten).
				return fmt.Errorf("erase head %x: %w", k, err)
			}
			e := &EraseEntry{Scope: sc, HeadKey: append([]byte(nil), k...), Job: j, removed: make(chan struct{})}
			e.committed.Store(true)
			s.erases.add(e)
			return nil
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// EraseHead reads an erase's head as it stands now (its progress).
func (s *Store) EraseHead(r pebble.Reader, e *EraseEntry) (EraseJob, bool, error) {
	v, ok, err := getValue(r, e.HeadKey)
	if err != nil || !ok {
		return EraseJob{}, false, err
	}
	j, err := DecodeEraseJob(v)
	return j, err == nil, err
}

// BeginErase writes an erase head (the erase's commit point once the
// transaction commits) and registers it.
func (t *Txn) BeginErase(sc Scope, j EraseJob) *EraseEntry {
	t.touch(sc)
	t.written = max(t.written, j.Tx)
	j.CreatedAt = t.s.erases.stamp(TsFromTime(t.s.clock.Wall().Now()))
	key := EraseJobKey(sc, j.Tx, j.Prov.RequestID)
	_ = t.b.Set(key, EncodeEraseJob(&j), nil)
	e := &EraseEntry{Scope: sc, HeadKey: key, Job: j, removed: make(chan struct{})}
	t.s.erases.add(e)
	t.AfterCommit(func() { e.committed.Store(true) })
	t.OnRollback(func() {
		t.s.erases.remove(e)
		close(e.removed)
	})
	return e
}

// ProgressErase records an erase's progress in its head (same batch as the
// versions it erased).
func (t *Txn) ProgressErase(e *EraseEntry, j *EraseJob) {
	_ = t.b.Set(e.HeadKey, EncodeEraseJob(j), nil)
}

// EraseVersion rewrites one stored version, under its own key, with its
// payload erased (props "{}", actor, reason and source empty, the erased
// flag). The key, and so every index and adjacency row, stays.
func (t *Txn) EraseVersion(key []byte, v *Version) {
	w := *v
	w.Erased = true
	w.Props = []byte("{}")
	w.Prov.Actor, w.Prov.Reason, w.Prov.Source = "", "", ""
	_ = t.b.Set(key, EncodeVersion(&w), nil)
}

// FinishErase deletes an erase's head and stores, in the same batch, its
// request's receipt, result outbox row and erasure record.
func (t *Txn) FinishErase(e *EraseEntry, rc *Receipt, rec *EraseRecord) error {
	if t.s.erases.ByRequest(e.Scope, e.Job.Prov.RequestID) != e {
		return fmt.Errorf("%w: erase %x", ErrJournalGone, e.HeadKey)
	}
	key, err := DecodeKey(e.HeadKey)
	if err != nil {
		return err
	}
	req := e.Job.Prov.RequestID
	_ = t.b.Delete(e.HeadKey, nil)
	_ = t.b.Set(ReceiptKey(e.Scope, req), EncodeReceipt(rc), nil)
	o := Outbox{RequestID: req, Receipt: *rc}
	_ = t.b.Set(JobKey(e.Scope, ResultOutboxState, key.Priority, key.CreatedAt, key.JobID), EncodeOutbox(&o), nil)
	_ = t.b.Set(ErasureKey(e.Scope, req), EncodeEraseRecord(rec), nil)
	t.putFeedErase(e, rec.Versions)
	t.AfterCommit(func() {
		t.s.erases.remove(e)
		close(e.removed)
	})
	return nil
}

// ScrubStats says what a scrub did.
type ScrubStats struct {
	Flushed      bool
	Compactions  int
	WALsDeleted  int64
	Took         time.Duration
	ObsoleteLeft int64
	// Copies: the copies outside the disk were scrubbed too (CopyScrubber),
	// taking CopiesTook of it (the writer is held only for its last
	// steps: changelog.ScrubCopies).
	Copies     bool
	CopiesTook time.Duration
}

// KeyRange is a key range [Start, End).
type KeyRange struct {
	Start, End []byte
}

// maxScrubRanges bounds the compactions of one scrub (and the ranges of
// its marker, scrubmark.MaxRanges).
const maxScrubRanges = scrubmark.MaxRanges

// ErrScrub: the data directory could not be proven free of erased bytes in
// time (an open snapshot or iterator kept an old file alive).
var ErrScrub = errors.New("scrub incomplete")

// Scrub makes erased bytes leave the disk: it flushes the memtables (the
// WAL files that held the old values become obsolete and are deleted: the
// store opens Pebble without WAL recycling, see OpenPebble), compacts to
// the bottom level the key ranges of the versions the erase rewrote (erased:
// the entity's, and a node's edges') and the tenant's jobs keyspace,
// dropping every shadowed version (no snapshot may be open, see below), and
// waits until Pebble has deleted every obsolete table and WAL file. A
// snapshot older than the erase would keep the old values in the compacted
// tables, so the caller runs it with no journal applier (the only snapshot
// holders) in flight. With Options.Copies it then scrubs the copies
// outside the disk (durable.go, "Erasure and the copies"). Scrub is
// ScrubDisk then ScrubCopies.
func (s *Store) Scrub(ctx context.Context, sc Scope, erased []KeyRange) (ScrubStats, error) {
	st, marker, err := s.ScrubDisk(ctx, sc, erased)
	if err != nil {
		return st, err
	}
	if err := s.ScrubCopies(ctx, marker, &st); err != nil {
		return st, err
	}
	return st, nil
}

// ScrubDisk is Scrub's first part: the disk, and with Options.Copies the
// erase's marker committed (durable.go); marker is its sequence (0 without
// copies), to hand to ScrubCopies.
func (s *Store) ScrubDisk(ctx context.Context, sc Scope, erased []KeyRange) (st ScrubStats, marker uint64, err error) {
	return s.ScrubDiskOf(ctx, []ScrubPart{{Scope: sc, Ranges: erased}})
}

// ScrubPart is what one erase rewrote: its tenant, and the key ranges.
type ScrubPart struct {
	Scope  Scope
	Ranges []KeyRange
}

// ScrubDiskOf is ScrubDisk for several erases at once (rewritten one
// after another, none scrubbed yet): one flush, one wait for the
// obsolete files and one marker for all, and the compaction of the union
// of their ranges and of each tenant's jobs keyspace.
func (s *Store) ScrubDiskOf(ctx context.Context, parts []ScrubPart) (st ScrubStats, marker uint64, err error) {
	start := time.Now()
	defer func() { st.Took = time.Since(start) }()
	// The WAL files that exist now may hold the old values; the flush makes
	// them obsolete, and Pebble deletes them in the background (a metric
	// does not count those pending deletion): wait until they are gone.
	lastWAL, err := s.lastWAL()
	if err != nil {
		return st, 0, err
	}
	if err := s.eng.Flush(); err != nil {
		return st, 0, fmt.Errorf("%w: flush: %w", ErrStorage, err)
	}
	st.Flushed = true
	// The jobs keyspace too: a deleted journal head holds the provenance of
	// the tombstone it wrote, which the erase removed from the versions.
	// The erased entities' versions (at most maxScrubRanges ranges: a
	// hub's edges are merged into spans), and the tenant's jobs keyspace:
	// a deleted journal head holds the provenance of the tombstone it
	// wrote, which the erase removed from the versions. Compacting these
	// and not the tenant's whole keyspaces keeps an erase's cost, and what
	// a checkpoint then uploads, proportional to what it erased (issue 29).
	var ranges, jobs []scrubmark.Range
	tenants := map[string]bool{}
	for _, p := range parts {
		for _, r := range p.Ranges {
			ranges = append(ranges, scrubmark.Range{Start: r.Start, End: r.End})
		}
		if !tenants[p.Scope.Tenant()] {
			tenants[p.Scope.Tenant()] = true
			lo, hi := TenantRange(ksJobs, p.Scope)
			jobs = append(jobs, scrubmark.Range{Start: lo, End: hi})
		}
	}
	jobs = scrubmark.Coalesce(jobs, maxScrubRanges/2)
	ranges = append(scrubmark.Coalesce(ranges, maxScrubRanges-len(jobs)), jobs...)
	for _, r := range ranges {
		if err := s.eng.Compact(ctx, r.Start, r.End, true); err != nil {
			return st, 0, fmt.Errorf("%w: compact: %w", ErrStorage, err)
		}
		st.Compactions++
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		m := s.eng.Metrics()
		left := int64(m.Table.ObsoleteCount) + int64(m.Table.ZombieCount) + m.WAL.ObsoleteFiles
		if n, err := s.walsUpTo(lastWAL); err != nil {
			return st, 0, err
		} else {
			left += int64(n)
		}
		st.ObsoleteLeft = left
		if left == 0 {
			break
		}
		if time.Now().After(deadline) {
			return st, 0, fmt.Errorf("%w: %d obsolete files still on disk after 30s", ErrScrub, left)
		}
		select {
		case <-ctx.Done():
			return st, 0, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
	if s.copies != nil {
		if marker, err = s.commitMarker(ctx, ranges); err != nil {
			return st, 0, err
		}
	}
	return st, marker, nil
}

// ScrubCopies is Scrub's second part: once it returns, the copies outside
// the disk (changelog, checkpoints, standbys) hold no byte erased before
// marker. A scrub of the copies done for a later marker covers an earlier
// one, so erases whose disks were scrubbed one after another share one
// scrub of the copies when each calls ScrubCopies after the last
// ScrubDisk (issue 29, "batched scrubs"; package reaper does so). It adds
// its cost to st, when st is not nil. Without Options.Copies it does
// nothing.
func (s *Store) ScrubCopies(ctx context.Context, marker uint64, st *ScrubStats) error {
	if s.copies == nil {
		return nil
	}
	t0 := time.Now()
	err := s.copies.ScrubCopies(ctx, marker, func(ctx context.Context, fn func() error) error {
		return s.w.do(ctx, Foreground, fn)
	})
	if err != nil {
		return fmt.Errorf("%w: the copies outside the disk (changelog, checkpoints): %w", ErrScrub, err)
	}
	if st != nil {
		st.Copies, st.CopiesTook = true, time.Since(t0)
		st.Took += st.CopiesTook
	}
	return nil
}

// lastWAL returns the highest WAL file number in the store's directory (0
// when it cannot tell: OpenEngine, no directory).
func (s *Store) lastWAL() (uint64, error) {
	var last uint64
	err := s.eachWAL(func(n uint64) { last = max(last, n) })
	return last, err
}

// walsUpTo counts the WAL files numbered n or less still in the directory.
func (s *Store) walsUpTo(n uint64) (int, error) {
	c := 0
	err := s.eachWAL(func(m uint64) {
		if m <= n {
			c++
		}
	})
	return c, err
}

func (s *Store) eachWAL(fn func(n uint64)) error {
	if s.dir == "" || s.fs == nil {
		return nil
	}
	names, err := s.fs.List(s.dir)
	if err != nil {
		return fmt.Errorf("%w: list %s: %w", ErrStorage, s.dir, err)
	}
	for _, name := range names {
		num, ok := strings.CutSuffix(name, ".log")
		if !ok {
			continue
		}
		if n, err := strconv.ParseUint(num, 10, 64); err == nil {
			fn(n)
		}
	}
	return nil
}
