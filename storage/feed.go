package storage

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"

	"github.com/cockroachdb/pebble/v2"
	"github.com/google/uuid"
)

// The change feed's source (CONTRACT §5, "Change feed"; the publisher is
// queue.FeedPublisher).
//
// The feed is not a second copy of what committed: it is read from the
// tenant's tx_time_index, which every version's batch already writes, up
// to the tenant's feed horizon (FeedHorizon): the committed tx, lowered
// below the tx of any journal of the tenant still in flight. Below the
// horizon nothing will ever be written again, so a position in the index
// is final: a feed read from a position is the same on every replay, on
// every copy of the store (a standby promoted after a failover reads what
// the old owner read).
//
// Order within a tenant: by tx; within one tx, a request's edges (by id)
// before its nodes (by id), so a cascade's node tombstone comes after
// every edge it tombstoned. An erase, which writes no version, is a row of
// its own (FeedEraseState) written with its erasure record, keyed by the
// committed tx when it finished: it comes after every change committed
// before it finished.
//
// Where the tenant's feed stands is a cursor row (FeedCursorState),
// written by the publisher after the messages up to it are stored
// (SaveFeed), in the same batch that deletes the erase rows published.

// FeedOp is what a change did to its entity.
type FeedOp uint8

const (
	FeedPut       FeedOp = 1 // a new live version (its props, unless the feed omits them)
	FeedTombstone FeedOp = 2 // a tombstone version (a cascade's edges: Cause names the node)
	FeedErase     FeedOp = 3 // an erase finished: the entity's (and a node's edges') payloads are gone
)

func (o FeedOp) String() string {
	switch o {
	case FeedPut:
		return "put"
	case FeedTombstone:
		return "tombstone"
	case FeedErase:
		return "erase"
	}
	return fmt.Sprintf("op(%d)", uint8(o))
}

// Change is one entry of a tenant's feed.
type Change struct {
	Op FeedOp
	// V is the version (put, tombstone); for an erase, only Kind, ID and
	// Tx.Start (the erase's tx, its result's tx_time) are set, and
	// Prov.RequestID.
	V Version
	// Cause: the node whose tombstone, at the same tx, tombstoned this edge
	// (uuid.Nil otherwise).
	Cause uuid.UUID
	// VersionsErased: an erase's count of versions rewritten.
	VersionsErased uint64
	// EraseKey is an erase row's key (deleted by SaveFeed once published).
	EraseKey []byte
	// Scrubbed: an erase whose puts have left the feed already (SaveFeed's
	// scrubbed): its result needs no more, and its publication no scrub.
	Scrubbed bool
	// erase: an erase's row as stored, which SaveFeed marks scrubbed.
	erase feedErase
}

// FeedPos is a position in a tenant's feed: every change before it has
// been published. The zero value is the feed's start.
type FeedPos struct {
	Tx Ts // the tx being or last published (NoTs: none yet)
	// Phase within Tx: feedTxDone (every change of Tx is behind), or
	// feedInEdges / feedInNodes, after (ID, Valid).
	Phase byte
	ID    uuid.UUID
	Valid Ts
}

const (
	feedTxDone  byte = 0
	feedInEdges byte = 1
	feedInNodes byte = 2
)

// FeedCursorKey is the key of a tenant's feed cursor.
func FeedCursorKey(sc Scope) []byte { return JobKey(sc, FeedCursorState, 0, 0, uuid.Nil) }

// EncodeFeedPos encodes a cursor (33 bytes).
func EncodeFeedPos(p FeedPos) []byte {
	b := make([]byte, 0, 34)
	b = append(b, 1) // format
	b = binary.BigEndian.AppendUint64(b, uint64(p.Tx))
	b = append(b, p.Phase)
	b = append(b, p.ID[:]...)
	return binary.BigEndian.AppendUint64(b, uint64(p.Valid))
}

// DecodeFeedPos decodes a cursor; malformed input is an ErrDecode.
func DecodeFeedPos(b []byte) (FeedPos, error) {
	if len(b) != 34 || b[0] != 1 || b[9] > feedInNodes {
		return FeedPos{}, fmt.Errorf("%w: feed cursor %x", ErrDecode, b)
	}
	var p FeedPos
	p.Tx = Ts(binary.BigEndian.Uint64(b[1:]))
	p.Phase = b[9]
	copy(p.ID[:], b[10:26])
	p.Valid = Ts(binary.BigEndian.Uint64(b[26:]))
	return p, nil
}

// FeedCursor returns where the tenant's feed stands (the zero position
// when nothing was published yet).
func (s *Store) FeedCursor(sc Scope) (FeedPos, error) {
	v, ok, err := getValue(s.eng, FeedCursorKey(sc))
	if err != nil || !ok {
		return FeedPos{}, err
	}
	return DecodeFeedPos(v)
}

// FeedGen counts the tenant's committed write transactions since the
// store opened. A feed reader that read the tenant up to a horizon no
// journal held back has nothing new to read while it does not move.
func (s *Store) FeedGen(sc Scope) uint64 {
	s.tenantsMu.RLock()
	defer s.tenantsMu.RUnlock()
	return s.feedGens[sc.tenant]
}

// FeedHorizon is the highest tx of the tenant's feed that is final: the
// committed tx, below the tx of the tenant's oldest journal in flight (its
// chunks still land at that tx).
func (s *Store) FeedHorizon(sc Scope) Ts {
	h := s.Committed()
	for _, e := range s.journals.FencesUpTo(sc, h) {
		h = min(h, e.J.Tx-1)
	}
	return h
}

// feedErase is an erase row's value.
type feedErase struct {
	Op        Op
	Kind      Kind
	ID        uuid.UUID
	Tx        Ts
	RequestID string
	Versions  uint64
	// Scrubbed: the erased puts have left the feed (format 2; format 1,
	// what earlier rows hold, is the same without it).
	Scrubbed bool
}

func encodeFeedErase(f *feedErase) []byte {
	e := enc{b: make([]byte, 0, 48+len(f.RequestID))}
	if f.Scrubbed {
		e.byte(2)
	} else {
		e.byte(1)
	}
	e.byte(byte(f.Op))
	e.byte(byte(f.Kind))
	e.uuid(f.ID)
	e.i64(int64(f.Tx))
	e.str(f.RequestID)
	e.uvar(f.Versions)
	return e.b
}

func decodeFeedErase(b []byte) (feedErase, error) {
	d := dec{b: b}
	var f feedErase
	switch d.byte() {
	case 1:
	case 2:
		f.Scrubbed = true
	default:
		d.fail("feed erase format")
	}
	f.Op = Op(d.byte())
	f.Kind = Kind(d.byte())
	f.ID = d.uuid()
	f.Tx = Ts(d.i64())
	f.RequestID = d.str()
	f.Versions = d.uvar()
	if d.err == nil && f.Kind != KindNode && f.Kind != KindEdge {
		d.fail("feed erase kind")
	}
	return f, d.finish("feed erase")
}

// putFeedErase writes an erase's feed row in the batch that finishes it,
// positioned after every tx committed so far.
func (t *Txn) putFeedErase(e *EraseEntry, versions uint64) {
	t.touch(e.Scope)
	at := max(t.s.Committed(), e.Job.Tx)
	kind := KindNode
	if e.Job.Op == OpEraseEdge {
		kind = KindEdge
	}
	key := JobKey(e.Scope, FeedEraseState, 0, at, uuid.NewSHA1(uuid.NameSpaceOID, []byte(e.Job.Prov.RequestID)))
	_ = t.b.Set(key, encodeFeedErase(&feedErase{Op: e.Job.Op, Kind: kind, ID: e.Job.ID, Tx: e.Job.Tx, RequestID: e.Job.Prov.RequestID, Versions: versions}), nil)
}

// FeedRead is one read of a tenant's feed (ReadFeed).
type FeedRead struct {
	Scope Scope
	From  FeedPos
	UpTo  Ts  // the horizon: no change above it is read
	Max   int // changes at most (at least 1)
}

// ReadFeed calls fn for the tenant's changes after r.From, in feed order,
// up to r.UpTo, at most r.Max of them; it returns the position after the
// last change fn took. fn's Change is only valid during the call. An error
// of fn stops the read (the position returned is the last one fn took).
func (s *Store) ReadFeed(ctx context.Context, r FeedRead, fn func(*Change) error) (FeedPos, error) {
	fr := feedReader{sc: r.Scope, pos: r.From, upTo: r.UpTo, max: max(r.Max, 1), fn: fn}
	snap := s.eng.NewSnapshot()
	defer snap.Close()
	fr.r = snap
	err := fr.run(ctx)
	return fr.pos, err
}

type feedReader struct {
	r     pebble.Reader
	sc    Scope
	pos   FeedPos
	upTo  Ts
	max   int
	n     int
	fn    func(*Change) error
	c     Change
	k     []byte
	dead  map[uuid.UUID]bool // nodes tombstoned at the tx being read
	nodes []Version          // the nodes of the tx being read, published after its edges
	erase []feedEraseRow
}

type feedEraseRow struct {
	at  Ts
	key []byte
	f   feedErase
}

// errFeedFull stops a read that reached its Max.
var errFeedFull = fmt.Errorf("feed read full")

// run reads the index in one pass: a tx's entries come nodes first (kind
// 1 < 2), so its nodes are read and held (a request writes few), then its
// edges are published as they come, then its nodes.
func (fr *feedReader) run(ctx context.Context) error {
	if err := fr.loadErases(); err != nil {
		return err
	}
	from := fr.pos.Tx
	switch {
	case fr.pos == (FeedPos{}): // the feed's start
		from = NoTs
	case fr.pos.Phase == feedTxDone:
		from = fr.pos.Tx + 1
	}
	if from > fr.upTo {
		return fr.stopped(fr.erasesBefore(fr.upTo + 1))
	}
	lo, hi := IdxRange(fr.sc, false, from, fr.upTo+1)
	it, err := fr.r.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: hi})
	if err != nil {
		return fmt.Errorf("%w: iterator: %w", ErrStorage, err)
	}
	defer it.Close()
	ok := it.First()
	for ok {
		key, err := DecodeKey(it.Key())
		if err != nil {
			return err
		}
		tx := key.Tx
		resuming := fr.pos.Tx == tx && fr.pos.Phase != feedTxDone
		if !resuming {
			// Erases that finished before this tx committed come first.
			if err := fr.erasesBefore(tx); err != nil {
				return fr.stopped(err)
			}
		}
		// The tx's nodes: held, and their tombstones are the causes.
		fr.nodes = fr.nodes[:0]
		clear(fr.dead)
		for ok && key.Tx == tx && key.Kind == KindNode {
			v, err := fr.version(it.Key(), key)
			if err != nil {
				return err
			}
			fr.nodes = append(fr.nodes, v)
			if v.Tombstone {
				if fr.dead == nil {
					fr.dead = map[uuid.UUID]bool{}
				}
				fr.dead[v.ID] = true
			}
			if ok = it.Next(); ok {
				if key, err = DecodeKey(it.Key()); err != nil {
					return err
				}
			}
		}
		// Its edges, as they come (a cascade's may be a million).
		for ok && key.Tx == tx && key.Kind == KindEdge {
			if !resuming || fr.pos.Phase == feedInEdges && after(key.ID, key.Valid, fr.pos.ID, fr.pos.Valid) {
				v, err := fr.version(it.Key(), key)
				if err != nil {
					return err
				}
				if err := fr.emit(ctx, &v, FeedPos{Tx: tx, Phase: feedInEdges, ID: v.ID, Valid: v.Valid.Start}); err != nil {
					return fr.stopped(err)
				}
			}
			if ok = it.Next(); ok {
				if key, err = DecodeKey(it.Key()); err != nil {
					return err
				}
			}
		}
		// Then its nodes.
		for i := range fr.nodes {
			v := &fr.nodes[i]
			if resuming && fr.pos.Phase == feedInNodes && !after(v.ID, v.Valid.Start, fr.pos.ID, fr.pos.Valid) {
				continue
			}
			if err := fr.emit(ctx, v, FeedPos{Tx: tx, Phase: feedInNodes, ID: v.ID, Valid: v.Valid.Start}); err != nil {
				return fr.stopped(err)
			}
		}
		fr.pos = FeedPos{Tx: tx, Phase: feedTxDone}
	}
	if err := it.Error(); err != nil {
		return fmt.Errorf("%w: iterate: %w", ErrStorage, err)
	}
	return fr.stopped(fr.erasesBefore(fr.upTo + 1))
}

// after reports whether (id, valid) comes after (pid, pvalid) in index
// order. A position within a phase with no entity (uuid.Nil) is before
// every entity of it.
func after(id uuid.UUID, valid Ts, pid uuid.UUID, pvalid Ts) bool {
	if pid == uuid.Nil {
		return true
	}
	if c := bytes.Compare(id[:], pid[:]); c != 0 {
		return c > 0
	}
	return valid > pvalid
}

// version reads the version an index entry names.
func (fr *feedReader) version(idxKey []byte, key Key) (Version, error) {
	fr.k = appendVersionKey(fr.k[:0], versionSpace(key.Kind), fr.sc, key.ID, key.Tx, key.Valid)
	raw, ok, err := getValue(fr.r, fr.k)
	if err != nil {
		return Version{}, err
	}
	if !ok {
		return Version{}, fmt.Errorf("%w: index entry %x has no version", ErrDecode, idxKey)
	}
	return DecodeVersion(raw)
}

// emit hands one version's change to fn, and moves the position past it.
func (fr *feedReader) emit(ctx context.Context, v *Version, pos FeedPos) error {
	if fr.n >= fr.max {
		return errFeedFull
	}
	if fr.n%256 == 255 {
		if err := ctx.Err(); err != nil {
			return err
		}
	}
	fr.c = Change{Op: FeedPut, V: *v}
	if v.Tombstone {
		fr.c.Op = FeedTombstone
		if v.Kind == KindEdge {
			switch {
			case fr.dead[v.Src]:
				fr.c.Cause = v.Src
			case fr.dead[v.Dst]:
				fr.c.Cause = v.Dst
			}
		}
	}
	if err := fr.fn(&fr.c); err != nil {
		return err
	}
	fr.n++
	fr.pos = pos
	return nil
}

func (fr *feedReader) stopped(err error) error {
	if err == errFeedFull {
		return nil
	}
	return err
}

// loadErases reads the tenant's erase rows up to the horizon (few: each is
// deleted once published).
func (fr *feedReader) loadErases() error {
	lo, hi := JobsInState(fr.sc, FeedEraseState)
	return scan(fr.r, lo, hi, func(k, v []byte) error {
		key, err := DecodeKey(k)
		if err != nil {
			return err
		}
		if key.CreatedAt > fr.upTo {
			return nil
		}
		f, err := decodeFeedErase(v)
		if err != nil {
			return err
		}
		fr.erase = append(fr.erase, feedEraseRow{at: key.CreatedAt, key: append([]byte(nil), k...), f: f})
		return nil
	})
}

// erasesBefore publishes the erase rows positioned below tx.
func (fr *feedReader) erasesBefore(tx Ts) error {
	for len(fr.erase) > 0 && fr.erase[0].at < tx {
		if fr.n >= fr.max {
			return errFeedFull
		}
		row := fr.erase[0]
		fr.c = eraseChange(row.key, &row.f)
		if err := fr.fn(&fr.c); err != nil {
			return err
		}
		fr.n++
		fr.erase = fr.erase[1:]
	}
	return nil
}

func eraseChange(key []byte, f *feedErase) Change {
	return Change{Op: FeedErase, V: Version{Kind: f.Kind, ID: f.ID, Tx: Open(f.Tx), Prov: Provenance{RequestID: f.RequestID}},
		VersionsErased: f.Versions, EraseKey: key, Scrubbed: f.Scrubbed, erase: *f}
}

// FeedErasesToScrub returns the tenant's erases (as their feed changes)
// whose puts have not been scrubbed from the feed yet, wherever the
// tenant's feed stands: an erase's rewrites are committed when its row is
// written, so a publisher may delete the erased puts it published before
// and answer the erase without waiting for the feed to reach it (the
// puts it publishes later are read from the store, erased).
func (s *Store) FeedErasesToScrub(sc Scope) ([]Change, error) {
	lo, hi := JobsInState(sc, FeedEraseState)
	var out []Change
	err := scan(s.eng, lo, hi, func(k, v []byte) error {
		f, err := decodeFeedErase(v)
		if err != nil {
			return err
		}
		if !f.Scrubbed {
			out = append(out, eraseChange(append([]byte(nil), k...), &f))
		}
		return nil
	})
	return out, err
}

// SaveFeed records, in one durable batch through the writer, where each
// tenant's feed now stands, marks the erase rows scrubbed (changes from
// FeedErasesToScrub whose puts left the feed), and deletes the erase rows
// published.
func (s *Store) SaveFeed(ctx context.Context, pos map[Scope]FeedPos, erased [][]byte, scrubbed ...*Change) error {
	return s.Update(ctx, func(t *Txn) error {
		for sc, p := range pos {
			_ = t.b.Set(FeedCursorKey(sc), EncodeFeedPos(p), nil)
		}
		for _, c := range scrubbed {
			f := c.erase
			f.Scrubbed = true
			_ = t.b.Set(c.EraseKey, encodeFeedErase(&f), nil)
		}
		// After the marks: a row published in the same save is gone.
		for _, k := range erased {
			_ = t.b.Delete(k, nil)
		}
		return nil
	})
}

// FeedBehind reports whether the tenant's feed has changes up to its
// horizon that its saved cursor has not passed yet (what a publisher has
// still to publish, or to save).
func (s *Store) FeedBehind(ctx context.Context, sc Scope) (bool, error) {
	from, err := s.FeedCursor(sc)
	if err != nil {
		return false, err
	}
	behind := false
	_, err = s.ReadFeed(ctx, FeedRead{Scope: sc, From: from, UpTo: s.FeedHorizon(sc), Max: 1}, func(*Change) error {
		behind = true
		return nil
	})
	return behind, err
}

// FeedErasePending reports whether the erase of requestID still waits for
// the change feed: its row is there and not marked scrubbed (the erased
// puts have not all left the feed yet). Its result waits for it
// (reaper.Config.WaitFeed).
func (s *Store) FeedErasePending(sc Scope, requestID string) (bool, error) {
	id := uuid.NewSHA1(uuid.NameSpaceOID, []byte(requestID))
	lo, hi := JobsInState(sc, FeedEraseState)
	found := false
	err := scan(s.eng, lo, hi, func(k, v []byte) error {
		key, err := DecodeKey(k)
		if err != nil {
			return err
		}
		if key.JobID == id {
			f, err := decodeFeedErase(v)
			if err != nil {
				return err
			}
			found = !f.Scrubbed
		}
		return nil
	})
	return found, err
}
