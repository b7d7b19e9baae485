package cascade

import (
	"context"
	"crypto/sha256"
	"encoding"
	"errors"
	"fmt"
	"hash"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/google/uuid"
	"github.com/telha/telha-cascade/storage"
)

// Erasure (CONTRACT §3, "Erasure"; storage/erase.go for the records).
//
// erase_node and erase_edge commit like a tombstone: in the request's group
// batch, the entity's tombstone when it is still live (erase_node: its
// whole cascade, inline or journaled, exactly as tombstone_node, the
// journal marked quiet so that it answers nothing itself) and the erase
// head, the commit point. ApplyErase then waits for the node's journal, if
// any, rewrites every version of the entity (and, for a node, of every
// edge that ever touched it: its adjacency rows, which are never deleted,
// name them all) with its payload erased, in chunks that each record the
// progress in the head, scrubs the disk, and finishes: head deleted,
// receipt, result outbox row and erasure record stored in one batch.

// EraseSink takes erases once their head has committed.
type EraseSink interface {
	BeginErase(e *storage.EraseEntry)
}

// beginErase decides and writes an erase in the group's batch. It returns
// the registered erase, or a refusal (err, a status sentinel), or nothing
// at all (nil, 0, nil) when the erase does not fit the group.
func (o *Ops) beginErase(t *storage.Txn, r *Request, b budget, fp storage.Fingerprint) (*storage.EraseEntry, storage.Ts, error) {
	if r.RequestID == "" {
		return nil, 0, fmt.Errorf("%w: %s needs a request id", ErrInvalid, r.Op)
	}
	if r.Prov.Reason == "" {
		return nil, 0, fmt.Errorf("%w: %s needs provenance.reason", ErrInvalid, r.Op)
	}
	sc := r.Scope
	// tx is the erase's: the tombstone's it writes, else the entity's
	// latest (a tombstone, or the one a journal in flight writes at its tx):
	// never a fresh tx that nothing would be written under (safetime.go).
	var tx storage.Ts
	if r.Op == storage.OpEraseNode {
		latest, ok, err := t.Latest(sc, storage.KindNode, r.ID)
		if err != nil {
			return nil, 0, err
		}
		if !ok {
			return nil, 0, fmt.Errorf("%w: node %s", ErrNotFound, r.ID)
		}
		tx = latest.Tx.Start
		fence := t.Fenced(sc, r.ID)
		if fence != nil {
			tx = max(tx, fence.J.Tx) // its cascade lands at the journal's tx
		}
		if !latest.Tombstone && fence == nil {
			// Still live: its cascade first, exactly as tombstone_node.
			tr := *r
			tr.Op = storage.OpTombstoneNode
			d, err := o.decideNode(t, &tr, b)
			if err != nil {
				return nil, 0, err
			}
			d.fingerprint = fp
			if !d.fits || !b.fits(r, 1) {
				return nil, 0, nil
			}
			if d.journaled {
				e := t.BeginQuietJournal(sc, r.ID, d.validEnd, d.tx, r.Prov, fp)
				e.SetTraceparent(r.Traceparent)
				if o.sink != nil {
					t.AfterCommit(func() { o.sink.Begin(e) })
				}
			} else {
				o.writeNode(t, &tr, d)
			}
			tx = d.tx
		} else if !b.fits(r, 1) {
			return nil, 0, nil
		}
	} else {
		latest, ok, err := t.Latest(sc, storage.KindEdge, r.ID)
		if err != nil {
			return nil, 0, err
		}
		if !ok {
			return nil, 0, fmt.Errorf("%w: edge %s", ErrNotFound, r.ID)
		}
		// An edge a journal in flight writes (still live, dead only from
		// after the journal's valid end, which it narrows, or already
		// written at the journal's tx) is refused alike, as tombstone_edge
		// refuses it: an answer never reveals how far the cascade has got.
		// One the journal leaves as it is is no part of it, and is erased.
		for _, n := range []uuid.UUID{latest.Src, latest.Dst} {
			if f := t.Fenced(sc, n); f != nil && (!latest.Tombstone || latest.Valid.Start > f.J.ValidEnd || latest.Tx.Start >= f.J.Tx) {
				return nil, 0, fmt.Errorf("%w: endpoint node %s of edge %s is being tombstoned (journal tx %s)", ErrCascadeInFlight, n, r.ID, f.J.Tx)
			}
		}
		if !b.fits(r, storage.OpsPerEdgeVersion+1) {
			return nil, 0, nil
		}
		tx = latest.Tx.Start
		if !latest.Tombstone {
			if tx, err = o.tombstoneEdge(t, r); err != nil {
				return nil, 0, err
			}
		}
	}
	e := t.BeginErase(sc, storage.EraseJob{Op: r.Op, ID: r.ID, Tx: tx, Prov: r.Prov, Fingerprint: fp})
	e.SetTraceparent(r.Traceparent)
	if o.eraseSink != nil {
		t.AfterCommit(func() { o.eraseSink.BeginErase(e) })
	}
	return e, tx, nil
}

// EraseWaitLimit bounds how long one attempt at an erase waits for a
// journal in flight (or, before its scrub, for the open snapshots of
// journal appliers); past it the attempt fails with ErrEraseWaiting and is
// retried after a backoff.
var EraseWaitLimit = 2 * time.Minute

// ErrEraseWaiting: an erase's attempt waited too long for a journal.
var ErrEraseWaiting = errors.New("erase waiting")

// journalTouching returns a journal in flight that may still write a
// version of the erase's target: one fencing the node itself or any node
// sharing an edge with it (erase_node), or either endpoint (erase_edge).
// r and fenced are read together, at one point of the commit order
// (Store.Exclusive): fenced holds the tenant's fenced nodes then.
func journalTouching(r pebble.Reader, sc storage.Scope, j storage.EraseJob, fenced map[uuid.UUID]*storage.JournalEntry) (*storage.JournalEntry, error) {
	if len(fenced) == 0 {
		return nil, nil
	}
	if j.Op == storage.OpEraseEdge {
		latest, ok, err := storage.Latest(r, sc, storage.KindEdge, j.ID)
		if err != nil || !ok {
			return nil, err
		}
		for _, n := range []uuid.UUID{latest.Src, latest.Dst} {
			if f := fenced[n]; f != nil {
				return f, nil
			}
		}
		return nil, nil
	}
	if f := fenced[j.ID]; f != nil {
		return f, nil
	}
	var found *storage.JournalEntry
	for _, out := range []bool{true, false} {
		p := storage.AdjPrefix(sc, out, j.ID)
		err := scanRange(r, p, storage.PrefixEnd(p), func(_, v []byte) error {
			row, err := storage.DecodeAdj(v)
			if err != nil {
				return fmt.Errorf("%w: %w", ErrStorage, err)
			}
			if f := fenced[row.Other]; f != nil {
				found = f
				return errFound
			}
			return nil
		})
		if found != nil {
			return found, nil
		}
		if err != nil {
			return nil, err
		}
	}
	return nil, nil
}

var errFound = errors.New("found")

// EraseObserver sees an erase's progress (tests hold it between chunks).
type EraseObserver struct {
	// Chunk: n versions are erased and durable (after each chunk).
	Chunk func(n uint64)
}

// ApplyErase finishes erase e (see Applier.ApplyErase), applying the
// node's cascade journal itself when the engine has no JournalSink.
func (o *Ops) ApplyErase(ctx context.Context, e *storage.EraseEntry, obs EraseObserver) (storage.Receipt, error) {
	return o.applier.applyErase(ctx, e, obs, o.sink == nil)
}

// ApplyErase finishes erase e (the first pass and a resume alike): it waits
// for the node's cascade journal (the owner of journals applies it), erases
// what is left, scrubs the disk and the copies and stores the answer. It
// returns the request's receipt. It is RewriteErase, ScrubErases of it
// alone, then FinishErase.
func (o *Applier) ApplyErase(ctx context.Context, e *storage.EraseEntry, obs EraseObserver) (storage.Receipt, error) {
	return o.applyErase(ctx, e, obs, false)
}

func (o *Applier) applyErase(ctx context.Context, e *storage.EraseEntry, obs EraseObserver, applyJournals bool) (storage.Receipt, error) {
	p, err := o.rewriteErase(ctx, e, obs, applyJournals)
	if err != nil {
		return storage.Receipt{}, err
	}
	if err := o.ScrubErases(ctx, []*PreparedErase{p}); err != nil {
		return storage.Receipt{}, err
	}
	return o.FinishErase(ctx, p)
}

// PreparedErase is an erase whose versions are erased (RewriteErase)
// and, once ScrubErases has run for it, whose disk is scrubbed; the scrub
// of its copies and its answer are left (FinishErase).
type PreparedErase struct {
	e    *storage.EraseEntry
	head storage.EraseJob
	// ranges: the keys the rewrite replaced, for the scrub of the disk.
	ranges []storage.KeyRange
	// scrubbed: ScrubErases scrubbed the disk for it, up to marker.
	scrubbed bool
	marker   uint64
	st       storage.ScrubStats
}

// Entry is the erase prepared.
func (p *PreparedErase) Entry() *storage.EraseEntry { return p.e }

// RewriteErase is the first step of an erase: it waits for the journals
// touching the entity and erases what is left (its versions rewritten).
// The erased bytes stay on the disk until ScrubErases. Erases are
// rewritten one at a time and never beside another erase's scrub or
// finish (package reaper keeps that rule); several rewritten one after
// another share one scrub of the disk (ScrubErases) and then one scrub of
// the copies (the first FinishErase's): a backlog of erases costs a flush
// and a compaction per round, not per erase. Nothing of an erase
// rewritten needs undoing: one never finished is applied again from the
// start (by the next attempt, or after a restart).
func (o *Applier) RewriteErase(ctx context.Context, e *storage.EraseEntry, obs EraseObserver) (*PreparedErase, error) {
	return o.rewriteErase(ctx, e, obs, false)
}

func (o *Applier) rewriteErase(ctx context.Context, e *storage.EraseEntry, obs EraseObserver, applyJournals bool) (*PreparedErase, error) {
	sc, j := e.Scope, e.Job
	// The erase reads what it rewrites from one snapshot, its cut. Every
	// journal in flight that may still write a version the erase must
	// rewrite (the node's own cascade, and the cascades of its neighbours,
	// or of an edge's endpoints, which may narrow a shared edge) lands at
	// its own older tx, so it must have finished at the cut: the snapshot
	// and the fences are taken together on the writer (one point of the
	// commit order), and a journal found fencing the neighbourhood is
	// waited for and the cut taken again. A journal committed after the
	// cut writes at a tx above every tx the cut holds, like any later
	// request: the erased versions are exactly those up to the cut.
	// (Bounded: a journal stuck for longer fails this attempt, which is
	// retried after a backoff, and the erases behind it go on.)
	var snap *pebble.Snapshot
	release := func() {
		if snap != nil {
			_ = snap.Close()
			snap = nil
		}
	}
	defer release()
	waitUntil := time.Now().Add(EraseWaitLimit)
	for {
		var fenced map[uuid.UUID]*storage.JournalEntry
		err := o.store.Exclusive(ctx, func() error {
			snap = o.store.NewSnapshot()
			fenced = o.store.Journals().Fences(sc)
			return nil
		})
		if err != nil {
			return nil, err
		}
		f, err := journalTouching(snap, sc, j, fenced)
		if err != nil {
			return nil, err
		}
		if f == nil {
			break
		}
		release() // not held while waiting: the scrubs of others wait for zero snapshots
		if applyJournals {
			if _, err := o.ApplyJournal(ctx, f, JournalObserver{}); err != nil && !errors.Is(err, storage.ErrJournalGone) {
				return nil, fmt.Errorf("erase of %s %s: the cascade of node %s: %w", j.Op, j.ID, f.J.NodeID, err)
			}
			continue
		}
		timer := time.NewTimer(time.Until(waitUntil))
		select {
		case <-f.Removed():
			timer.Stop()
		case <-timer.C:
			return nil, fmt.Errorf("%w: erase of %s %s waited %s for the cascade of node %s (tx %s)", ErrEraseWaiting, j.Op, j.ID, EraseWaitLimit, f.J.NodeID, f.J.Tx)
		case <-ctx.Done():
			timer.Stop()
			return nil, ctx.Err()
		}
	}
	if o.hooks.EraseChecked != nil {
		o.hooks.EraseChecked(e)
	}
	head, ok, err := o.store.EraseHead(snap, e)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, fmt.Errorf("%w: erase %x", storage.ErrJournalGone, e.HeadKey)
	}
	ranges, err := o.eraseVersions(ctx, e, snap, &head, obs)
	release() // before the scrub, which waits for zero snapshots
	if err != nil {
		return nil, err
	}
	return &PreparedErase{e: e, head: head, ranges: ranges}, nil
}

// ScrubErases scrubs the disk once for erases rewritten (RewriteErase):
// one flush, one compaction of every range they rewrote and of their
// tenants' jobs keyspaces, one wait for the obsolete files, and with
// copies one marker. Each is then ready for FinishErase.
func (o *Applier) ScrubErases(ctx context.Context, ps []*PreparedErase) error {
	if len(ps) == 0 {
		return nil
	}
	parts := make([]storage.ScrubPart, 0, len(ps))
	for _, p := range ps {
		parts = append(parts, storage.ScrubPart{Scope: p.e.Scope, Ranges: p.ranges})
	}
	st, marker, err := o.scrubDisk(ctx, parts)
	if err != nil {
		return err
	}
	for _, p := range ps {
		p.scrubbed, p.marker, p.st, p.ranges = true, marker, st, nil
	}
	return nil
}

// FinishErase finishes a prepared erase: it scrubs the copies (at once
// when the scrub of a later prepared erase already covered this one),
// then stores the answer. It returns the request's receipt.
func (o *Applier) FinishErase(ctx context.Context, p *PreparedErase) (storage.Receipt, error) {
	e, head := p.e, p.head
	sc, j := e.Scope, e.Job
	if !p.scrubbed {
		return storage.Receipt{}, fmt.Errorf("erase of %s %s: finished before the scrub of its disk (ScrubErases)", j.Op, j.ID)
	}
	st := p.st
	if err := o.store.ScrubCopies(ctx, p.marker, &st); err != nil {
		return storage.Receipt{}, err
	}
	if o.hooks.EraseScrubbed != nil {
		o.hooks.EraseScrubbed(st)
	}
	// The receipt's tx is the erase's own, decided when it began
	// (beginErase): the tx at which the entity reads dead, its tombstone's
	// (the one it wrote, the one it found, or the one the journal in flight
	// writes at its tx). A version another request wrote later (a node's
	// cascade narrowing an erased edge's tombstone) does not move it: the
	// erasure record and the feed's erase message say the same tx.
	tx := j.Tx
	digest, err := eraseHash(head.HashState)
	if err != nil {
		return storage.Receipt{}, err
	}
	var sum [32]byte
	copy(sum[:], digest.Sum(nil))
	// The edges its own cascade tombstoned: the edge versions at its tx
	// (one tx per request, so nothing else wrote there), when the node's
	// tombstone at that tx is its own (every version records the request
	// that wrote it, and erasing keeps it). A node already dead, or being
	// tombstoned by another request's journal, had its edges tombstoned by
	// that request, whose receipt says how many: this one tombstoned none.
	var edges uint64
	own := false
	if j.Op == storage.OpEraseNode {
		latest, ok, err := storage.Latest(o.store.Reader(), sc, storage.KindNode, j.ID)
		if err != nil {
			return storage.Receipt{}, err
		}
		own = ok && latest.Tombstone && latest.Tx.Start == j.Tx && latest.Prov.RequestID == j.Prov.RequestID
	}
	if own {
		err := storage.ScanIndex(o.store.Reader(), sc, false, j.Tx, j.Tx+1, func(ie storage.IndexEntry) error {
			if ie.Kind == storage.KindEdge {
				edges++
			}
			return nil
		})
		if err != nil {
			return storage.Receipt{}, err
		}
	}
	rc := storage.Receipt{Op: j.Op, Status: storage.StatusOK, ID: j.ID, Tx: tx, VersionsErased: head.Versions, Fingerprint: j.Fingerprint,
		EdgesTombstoned: edges, Journaled: true}
	rec := storage.EraseRecord{Op: j.Op, ID: j.ID, RequestID: j.Prov.RequestID, Actor: j.Prov.Actor, Reason: j.Prov.Reason, Source: j.Prov.Source,
		Tx: j.Tx, RequestedAt: j.CreatedAt, FinishedAt: storage.TsFromTime(o.store.Clock().Wall().Now()), Versions: head.Versions, Digest: sum}
	if err := o.store.Update(ctx, func(t *storage.Txn) error { return t.FinishErase(e, &rc, &rec) }); err != nil {
		return storage.Receipt{}, err
	}
	return rc, nil
}

// ResumeErases applies every erase in flight, oldest first (tests, tools;
// package reaper does this in production).
func (o *Ops) ResumeErases(ctx context.Context) (int, error) {
	n := 0
	for _, e := range o.store.Erases().List() {
		if _, err := o.ApplyErase(ctx, e, EraseObserver{}); err != nil {
			return n, err
		}
		n++
	}
	return n, nil
}

// erasedVersion is one version to erase in the next chunk.
type erasedVersion struct {
	key []byte
	v   storage.Version
	sum [32]byte // SHA-256 of its key and old value
}

// eraseVersions rewrites every version of the erase's target that is not
// erased yet in snap (the erase's cut), in chunks of at most ChunkOps puts, the head that records
// the progress included (ChunkOps is never above max_batch_ops). It returns
// the key ranges of every entity whose versions it visited (erased now or
// by an earlier attempt): the ranges the scrub compacts.
func (o *Applier) eraseVersions(ctx context.Context, e *storage.EraseEntry, snap *pebble.Snapshot, head *storage.EraseJob, obs EraseObserver) ([]storage.KeyRange, error) {
	var ranges []storage.KeyRange
	err := o.eraseVersionsInto(ctx, e, snap, head, obs, &ranges)
	return ranges, err
}

func (o *Applier) eraseVersionsInto(ctx context.Context, e *storage.EraseEntry, snap *pebble.Snapshot, head *storage.EraseJob, obs EraseObserver, ranges *[]storage.KeyRange) error {
	sc, j := e.Scope, e.Job
	// A chunk's versions, their keys in one buffer reused from chunk to
	// chunk (no allocation per version in a million-version erase).
	var (
		chunk []erasedVersion
		keys  []byte
		vh    = sha256.New()
	)
	h, err := eraseHash(head.HashState)
	if err != nil {
		return err
	}
	flush := func() error {
		if len(chunk) == 0 {
			return nil
		}
		for i := range chunk {
			h.Write(chunk[i].sum[:])
		}
		state, err := h.(encoding.BinaryMarshaler).MarshalBinary()
		if err != nil {
			return err
		}
		next := *head
		next.Versions += uint64(len(chunk))
		next.HashState = state
		err = o.store.Update(ctx, func(t *storage.Txn) error {
			for i := range chunk {
				t.EraseVersion(chunk[i].key, &chunk[i].v)
			}
			t.ProgressErase(e, &next)
			return nil
		})
		if err != nil {
			return fmt.Errorf("erase of %s %s: %w", j.Op, j.ID, err)
		}
		*head = next
		chunk, keys = chunk[:0], keys[:0]
		if obs.Chunk != nil {
			obs.Chunk(head.Versions)
		}
		return nil
	}
	versions := func(kind storage.Kind, id uuid.UUID) error {
		p := storage.VersionPrefix(sc, kind, id)
		*ranges = append(*ranges, storage.KeyRange{Start: p, End: storage.PrefixEnd(p)})
		return scanRange(snap, p, storage.PrefixEnd(p), func(k, v []byte) error {
			ver, err := storage.DecodeVersion(v)
			if err != nil {
				return fmt.Errorf("%w: %w", ErrStorage, err)
			}
			if ver.Erased {
				return nil
			}
			// The digest is over each version's own SHA-256, never its
			// bytes: the hash state is stored in the head, and a SHA-256
			// state keeps the last partial block of its input verbatim.
			ev := erasedVersion{v: ver}
			vh.Reset()
			vh.Write(k)
			vh.Write(v)
			vh.Sum(ev.sum[:0])
			start := len(keys)
			keys = append(keys, k...)
			ev.key = keys[start:len(keys):len(keys)]
			chunk = append(chunk, ev)
			if len(chunk) >= o.chunkOps-1 { // and the head: at most chunkOps puts
				return flush()
			}
			return nil
		})
	}
	if j.Op == storage.OpEraseEdge {
		if err := versions(storage.KindEdge, j.ID); err != nil {
			return err
		}
		return flush()
	}
	if err := versions(storage.KindNode, j.ID); err != nil {
		return err
	}
	// Every edge that ever touched the node: its out rows, then its in rows
	// (a self-loop's in row is skipped: its out row took it). Rows of one
	// edge are adjacent (edge id, then tx, valid), so one "last" suffices.
	for _, out := range []bool{true, false} {
		p := storage.AdjPrefix(sc, out, j.ID)
		var last uuid.UUID
		err := scanRange(snap, p, storage.PrefixEnd(p), func(k, v []byte) error {
			key, err := storage.DecodeKey(k)
			if err != nil {
				return fmt.Errorf("%w: %w", ErrStorage, err)
			}
			if key.ID == last {
				return nil
			}
			last = key.ID
			if !out {
				row, err := storage.DecodeAdj(v)
				if err != nil {
					return fmt.Errorf("%w: %w", ErrStorage, err)
				}
				if row.Other == j.ID {
					return nil
				}
			}
			return versions(storage.KindEdge, key.ID)
		})
		if err != nil {
			return err
		}
	}
	return flush()
}

// eraseHash returns the running SHA-256 of an erase, resumed from state.
func eraseHash(state []byte) (hash.Hash, error) {
	h := sha256.New()
	if len(state) > 0 {
		if err := h.(encoding.BinaryUnmarshaler).UnmarshalBinary(state); err != nil {
			return nil, fmt.Errorf("%w: erase hash state: %w", ErrDecode, err)
		}
	}
	return h, nil
}

// scanRange calls fn for every key in [lo, hi) of r.
func scanRange(r pebble.Reader, lo, hi []byte, fn func(k, v []byte) error) error {
	it, err := r.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: hi})
	if err != nil {
		return fmt.Errorf("%w: %w", ErrStorage, err)
	}
	for ok := it.First(); ok; ok = it.Next() {
		v, err := it.ValueAndErr()
		if err != nil {
			_ = it.Close()
			return fmt.Errorf("%w: %w", ErrStorage, err)
		}
		if err := fn(it.Key(), v); err != nil {
			_ = it.Close()
			return err
		}
	}
	if err := it.Close(); err != nil {
		return fmt.Errorf("%w: %w", ErrStorage, err)
	}
	return nil
}

// scrub makes the erased bytes leave the disk (storage.Store.Scrub). A
// snapshot older than the erase's writes would keep the old values through
// the compaction, so it first waits until no snapshot is open (journal
// appliers hold one while they run).
func (o *Applier) scrubDisk(ctx context.Context, parts []storage.ScrubPart) (storage.ScrubStats, uint64, error) {
	waitUntil := time.Now().Add(EraseWaitLimit)
	for {
		n := o.store.Engine().Metrics().Snapshots.Count
		if n == 0 {
			break
		}
		if time.Now().After(waitUntil) {
			return storage.ScrubStats{}, 0, fmt.Errorf("%w: %d Pebble snapshots (journal appliers) stayed open for %s before the scrub", ErrEraseWaiting, n, EraseWaitLimit)
		}
		select {
		case <-ctx.Done():
			return storage.ScrubStats{}, 0, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
	return o.store.ScrubDiskOf(ctx, parts)
}
