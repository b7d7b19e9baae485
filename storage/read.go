package storage

import (
	"bytes"
	"errors"
	"fmt"

	"github.com/cockroachdb/pebble/v2"
	"github.com/google/uuid"
)

// The read path. Every function takes a pebble.Reader (the DB, a snapshot,
// or a transaction's indexed batch) and decides liveness by the one rule:
//
//	Latest-tx-wins: at (v, t), among the versions whose valid interval
//	contains v and whose tx interval contains t, the one with the highest
//	tx.start wins. A winning tombstone reads as absent; no winner reads as
//	absent.
//
// winner below is the rule; nothing else in the package decides liveness.

// winner accumulates candidates and keeps the rule's winner at (v, t).
type winner struct {
	v, t  Ts
	found bool
	tx    Ts
	valid Interval
	tomb  bool
}

// offer considers one version; it reports whether it became the winner.
func (w *winner) offer(valid, tx Interval, tomb bool) bool {
	if !valid.Contains(w.v) || !tx.Contains(w.t) {
		return false
	}
	if w.found && tx.Start <= w.tx {
		return false
	}
	w.found, w.tx, w.valid, w.tomb = true, tx.Start, valid, tomb
	return true
}

// live reports whether the winner exists and is not a tombstone.
func (w *winner) live() bool { return w.found && !w.tomb }

// Latest returns the latest-recorded version (highest tx.start, regardless
// of valid time) of an entity. This is what write refusals (resurrection,
// dead endpoints) and cascade collection look at.
func Latest(r pebble.Reader, sc Scope, k Kind, id uuid.UUID) (Version, bool, error) {
	p := VersionPrefix(sc, k, id)
	it, done, err := openPrefixIter(r, p)
	if err != nil {
		return Version{}, false, err
	}
	defer done()
	// A prefix iteration consults only the tables whose filter may hold the
	// entity, where Last would seek every level. Versions are in tx order,
	// so the last one is the latest; past latestWalk of them, Last (one
	// seek of every level) is cheaper than walking on.
	// (A prefix iteration cannot step back, so the walk keeps a copy of
	// the value it passes.)
	var (
		last  []byte
		found bool
	)
	for ok, n := it.SeekPrefixGE(p), 0; ok; ok, n = it.Next(), n+1 {
		if n == latestWalk {
			if !it.Last() {
				break
			}
			return decodeAt(it)
		}
		val, err := it.ValueAndErr()
		if err != nil {
			return Version{}, false, fmt.Errorf("%w: read %x: %w", ErrStorage, it.Key(), err)
		}
		last, found = append(last[:0], val...), true
	}
	if err := it.Error(); err != nil {
		return Version{}, false, fmt.Errorf("%w: %w", ErrStorage, err)
	}
	if !found {
		return Version{}, false, nil
	}
	v, err := DecodeVersion(last)
	if err != nil {
		return Version{}, false, fmt.Errorf("latest version of %x: %w", p, err)
	}
	return v, true, nil
}

// latestWalk is how many versions of one entity Latest walks in its prefix
// iteration before it seeks the last one instead.
const latestWalk = 8

func decodeAt(it *pebble.Iterator) (Version, bool, error) {
	val, err := it.ValueAndErr()
	if err != nil {
		return Version{}, false, fmt.Errorf("%w: read %x: %w", ErrStorage, it.Key(), err)
	}
	v, err := DecodeVersion(val)
	if err != nil {
		return Version{}, false, fmt.Errorf("key %x: %w", it.Key(), err)
	}
	return v, true, nil
}

// AsOf returns the version of an entity that reads live at (v, t), or
// ok=false when the entity reads absent there.
func AsOf(r pebble.Reader, sc Scope, k Kind, id uuid.UUID, v, t Ts) (Version, bool, error) {
	p := VersionPrefix(sc, k, id)
	upper := PrefixEnd(p)
	if t < OpenEnd {
		// Versions are ordered by tx.start; none with tx.start > t can win.
		upper = putTs(append([]byte(nil), p...), t+1)
	}
	it, done, err := openIter(r, p, upper)
	if err != nil {
		return Version{}, false, err
	}
	defer done()
	w := winner{v: v, t: t}
	// Walk newest first: the first candidate that contains (v, t) wins.
	for ok := it.Last(); ok; ok = it.Prev() {
		val, err := it.ValueAndErr()
		if err != nil {
			return Version{}, false, fmt.Errorf("%w: read %x: %w", ErrStorage, it.Key(), err)
		}
		valid, tx, tomb, err := versionIntervals(val)
		if err != nil {
			return Version{}, false, fmt.Errorf("key %x: %w", it.Key(), err)
		}
		if !w.offer(valid, tx, tomb) {
			continue
		}
		if tomb {
			return Version{}, false, nil
		}
		return decodeAt(it)
	}
	if err := it.Error(); err != nil {
		return Version{}, false, fmt.Errorf("%w: %w", ErrStorage, err)
	}
	return Version{}, false, nil
}

// History returns every version of an entity, tombstones included, in
// ascending tx order.
func History(r pebble.Reader, sc Scope, k Kind, id uuid.UUID) ([]Version, error) {
	p := VersionPrefix(sc, k, id)
	var out []Version
	err := scan(r, p, PrefixEnd(p), func(key, val []byte) error {
		v, err := DecodeVersion(val)
		if err != nil {
			return fmt.Errorf("key %x: %w", key, err)
		}
		out = append(out, v)
		return nil
	})
	return out, err
}

// Direction selects adjacency rows.
type Direction uint8

const (
	DirOut Direction = 1 << iota
	DirIn
	DirBoth = DirOut | DirIn
)

// ParseDirection parses "out", "in" or "both".
func ParseDirection(s string) (Direction, bool) {
	switch s {
	case "out":
		return DirOut, true
	case "in":
		return DirIn, true
	case "both":
		return DirBoth, true
	}
	return 0, false
}

// AdjEdge is one edge found through the adjacency keyspaces: the edge id and
// the winning (or latest) row.
type AdjEdge struct {
	ID  uuid.UUID
	Out bool // found in adjacency_out of the node
	Row AdjRow
}

// ScanAdjLatest streams, for each edge filed under node in one direction,
// the edge's latest-recorded adjacency row (highest tx.start). Cascade
// collection uses it: it reads only the node's adjacency rows, in key order.
func ScanAdjLatest(r pebble.Reader, sc Scope, out bool, node uuid.UUID, fn func(AdjEdge) error) error {
	return scanAdjGroups(r, sc, out, node, func(id uuid.UUID, rows []AdjRow) error {
		return fn(AdjEdge{ID: id, Out: out, Row: rows[len(rows)-1]})
	})
}

// scanAdjGroups calls fn once per edge id with all of its rows under node in
// ascending (tx, valid) order.
func scanAdjGroups(r pebble.Reader, sc Scope, out bool, node uuid.UUID, fn func(uuid.UUID, []AdjRow) error) error {
	p := AdjPrefix(sc, out, node)
	return scanAdjGroupsFrom(r, p, p, fn)
}

// EdgesOf returns the edges that read live at (v, t) through node's
// adjacency rows in the given direction, each edge once (a self-loop found
// in both directions is reported once), whether or not the node itself reads
// live there.
func EdgesOf(r pebble.Reader, sc Scope, node uuid.UUID, dir Direction, v, t Ts) ([]Version, error) {
	var out []Version
	seen := map[uuid.UUID]bool{}
	for _, o := range []bool{true, false} {
		if (o && dir&DirOut == 0) || (!o && dir&DirIn == 0) {
			continue
		}
		err := scanAdjGroups(r, sc, o, node, func(id uuid.UUID, rows []AdjRow) error {
			if seen[id] {
				return nil
			}
			ver, live, err := liveEdge(r, sc, id, rows, v, t)
			if err != nil || !live {
				return err
			}
			seen[id] = true
			out = append(out, ver)
			return nil
		})
		if err != nil {
			return nil, err
		}
	}
	return out, nil
}

// liveEdge decides an edge from its adjacency rows at (v, t) and, when it
// reads live there, reads the winning edge version.
func liveEdge(r pebble.Reader, sc Scope, id uuid.UUID, rows []AdjRow, v, t Ts) (Version, bool, error) {
	w := winner{v: v, t: t}
	for _, c := range rows {
		w.offer(c.Valid, c.Tx, c.Tombstone)
	}
	if !w.live() {
		return Version{}, false, nil
	}
	val, ok, err := getValue(r, EdgeKey(sc, id, w.tx, w.valid.Start))
	if err != nil {
		return Version{}, false, err
	}
	if !ok {
		return Version{}, false, fmt.Errorf("%w: adjacency row of edge %s at tx %s has no edge version", ErrDecode, id, w.tx)
	}
	ver, err := DecodeVersion(val)
	return ver, err == nil, err
}

// IndexEntry is one valid_time_index or tx_time_index entry.
type IndexEntry struct {
	Kind      Kind
	ID        uuid.UUID
	Tx, Valid Ts
}

// ScanIndex streams the index entries whose time on the chosen axis lies in
// [from, to): "what changed between t1 and t2" on the tx axis, "what starts
// holding between v1 and v2" on the valid axis.
func ScanIndex(r pebble.Reader, sc Scope, validAxis bool, from, to Ts, fn func(IndexEntry) error) error {
	lo, hi := IdxRange(sc, validAxis, from, to)
	return scan(r, lo, hi, func(key, _ []byte) error {
		k, err := DecodeKey(key)
		if err != nil {
			return err
		}
		return fn(IndexEntry{Kind: k.Kind, ID: k.ID, Tx: k.Tx, Valid: k.Valid})
	})
}

// LiveAt returns every entity of kind k that reads live at (v, t), found
// through the valid-time index (every version whose valid interval contains
// v starts at or before v) and resolved by the rule.
func LiveAt(r pebble.Reader, sc Scope, k Kind, v, t Ts) ([]Version, error) {
	seen := map[uuid.UUID]bool{}
	var ids []uuid.UUID
	from := Ts(NoTs + 1)
	to := v + 1
	if v == OpenEnd {
		to = OpenEnd
	}
	err := ScanIndex(r, sc, true, from, to, func(e IndexEntry) error {
		if e.Kind == k && e.Tx <= t && !seen[e.ID] {
			seen[e.ID] = true
			ids = append(ids, e.ID)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	var out []Version
	for _, id := range ids {
		ver, ok, err := AsOf(r, sc, k, id, v, t)
		if err != nil {
			return nil, err
		}
		if ok {
			out = append(out, ver)
		}
	}
	return out, nil
}

// Store-level convenience readers on the latest committed state.

// NodeAsOf reads a node at (v, t).
func (s *Store) NodeAsOf(sc Scope, id uuid.UUID, v, t Ts) (Version, bool, error) {
	return AsOf(s.eng, sc, KindNode, id, v, t)
}

// EdgeAsOf reads an edge at (v, t).
func (s *Store) EdgeAsOf(sc Scope, id uuid.UUID, v, t Ts) (Version, bool, error) {
	return AsOf(s.eng, sc, KindEdge, id, v, t)
}

// EdgesOf lists a node's live edges at (v, t).
func (s *Store) EdgesOf(sc Scope, node uuid.UUID, dir Direction, v, t Ts) ([]Version, error) {
	return EdgesOf(s.eng, sc, node, dir, v, t)
}

// History lists every version of an entity in ascending tx order.
func (s *Store) History(sc Scope, k Kind, id uuid.UUID) ([]Version, error) {
	return History(s.eng, sc, k, id)
}

// Latest returns an entity's latest-recorded version.
func (s *Store) Latest(sc Scope, k Kind, id uuid.UUID) (Version, bool, error) {
	return Latest(s.eng, sc, k, id)
}

// Dump calls fn for every key and value in the store, in key order (used by
// the byte-for-byte convergence tests).
func Dump(r pebble.Reader, fn func(k, v []byte) error) error {
	return scan(r, nil, nil, fn)
}

// EqualContents compares two readers key by key and returns a description
// of the first difference, or "" when they hold identical bytes.
func EqualContents(a, b pebble.Reader, skip func(k []byte) bool) (string, error) {
	type kv struct{ k, v []byte }
	var as, bs []kv
	collect := func(r pebble.Reader, dst *[]kv) error {
		return scan(r, nil, nil, func(k, v []byte) error {
			if skip != nil && skip(k) {
				return nil
			}
			*dst = append(*dst, kv{append([]byte(nil), k...), append([]byte(nil), v...)})
			return nil
		})
	}
	if err := collect(a, &as); err != nil {
		return "", err
	}
	if err := collect(b, &bs); err != nil {
		return "", err
	}
	for i := 0; i < len(as) || i < len(bs); i++ {
		switch {
		case i >= len(as):
			return fmt.Sprintf("only in second: %x", bs[i].k), nil
		case i >= len(bs):
			return fmt.Sprintf("only in first: %x", as[i].k), nil
		case !bytes.Equal(as[i].k, bs[i].k):
			return fmt.Sprintf("key %d differs: %x vs %x", i, as[i].k, bs[i].k), nil
		case !bytes.Equal(as[i].v, bs[i].v):
			return fmt.Sprintf("value of %x differs", as[i].k), nil
		}
	}
	return "", nil
}

// EdgesPage is one page of EdgesOf: the edges live at (v, t) through
// node's adjacency rows in dir, in (direction, edge id) order, out rows
// first, at most limit of them, reading at most scanLimit edges' rows (so a
// page over a node whose edges are mostly dead still answers quickly, with
// fewer than limit edges). A self-loop is reported once (from the out rows
// when dir has them). After is the cursor of the previous page (nil: the
// first); Next is the cursor of the following page, nil at the end.
type EdgesPage struct {
	Edges []Version
	Next  *EdgeCursor
}

// EdgeCursor is where a page of a node's edges stopped: after edge ID in
// the out (Out) or in rows.
type EdgeCursor struct {
	Out bool
	ID  uuid.UUID
}

// EdgesOfPage reads one page of a node's edges (see EdgesPage).
//
// ok, when set, is asked about the other endpoint of every edge the page
// reads (taken or not); false stops the page (safe time: the caller lowers
// t or waits, and reads the page again).
func EdgesOfPage(r pebble.Reader, sc Scope, node uuid.UUID, dir Direction, v, t Ts, after *EdgeCursor, limit, scanLimit int, ok func(other uuid.UUID) bool) (EdgesPage, error) {
	var page EdgesPage
	scanned := 0
	for _, out := range []bool{true, false} {
		if (out && dir&DirOut == 0) || (!out && dir&DirIn == 0) {
			continue
		}
		if after != nil && out && !after.Out {
			continue // the cursor is in the in rows already
		}
		p := AdjPrefix(sc, out, node)
		lo := p
		if after != nil && after.Out == out {
			lo = PrefixEnd(append(append([]byte(nil), p...), after.ID[:]...))
		}
		var last uuid.UUID
		stop := errors.New("page full")
		err := scanAdjGroupsFrom(r, p, lo, func(id uuid.UUID, rows []AdjRow) error {
			if len(page.Edges) == limit || scanned == scanLimit {
				page.Next = &EdgeCursor{Out: out, ID: last}
				return stop
			}
			scanned++
			last = id
			if ok != nil && rows[0].Other != node && !ok(rows[0].Other) {
				return stop
			}
			if !out && dir&DirOut != 0 && rows[0].Other == node {
				return nil // a self-loop, reported from the out rows
			}
			ver, live, err := liveEdge(r, sc, id, rows, v, t)
			if err != nil || !live {
				return err
			}
			page.Edges = append(page.Edges, ver)
			return nil
		})
		if errors.Is(err, stop) {
			if page.Next == nil { // stopped by ok: the caller reads it again
				return EdgesPage{}, nil
			}
			return page, nil
		}
		if err != nil {
			return page, err
		}
	}
	return page, nil
}

// scanAdjGroupsFrom is scanAdjGroups over the rows under prefix p from key
// lo on.
func scanAdjGroupsFrom(r pebble.Reader, p, lo []byte, fn func(uuid.UUID, []AdjRow) error) error {
	var (
		cur   uuid.UUID
		rows  []AdjRow
		idOff = len(p)
	)
	flush := func() error {
		if len(rows) == 0 {
			return nil
		}
		err := fn(cur, rows)
		rows = rows[:0]
		return err
	}
	each := func(fn func(k, v []byte) error) error { return scan(r, lo, PrefixEnd(p), fn) }
	if len(lo) == len(p) { // from the start: a prefix iteration (bloom filters)
		each = func(fn func(k, v []byte) error) error { return scanPrefix(r, p, fn) }
	}
	err := each(func(key, val []byte) error {
		if len(key) != idOff+32 {
			return fmt.Errorf("%w: adjacency key %x has bad length", ErrDecode, key)
		}
		var id uuid.UUID
		copy(id[:], key[idOff:idOff+16])
		if id != cur || len(rows) == 0 {
			if err := flush(); err != nil {
				return err
			}
			cur = id
		}
		row, err := DecodeAdj(val)
		if err != nil {
			return fmt.Errorf("key %x: %w", key, err)
		}
		rows = append(rows, row)
		return nil
	})
	if err != nil {
		return err
	}
	return flush()
}

// HistoryPage reads up to limit versions of an entity with tx.start <=
// upTo, in ascending tx order, after the version at (afterTx, afterValid)
// when after is set; next is set when more follow.
func HistoryPage(r pebble.Reader, sc Scope, k Kind, id uuid.UUID, after *[2]Ts, limit int, upTo Ts) (vs []Version, next *[2]Ts, err error) {
	p := VersionPrefix(sc, k, id)
	lo := p
	if after != nil {
		lo = PrefixEnd(VersionKey(sc, k, id, after[0], after[1]))
	}
	hi := PrefixEnd(p)
	if upTo < OpenEnd {
		hi = putTs(append([]byte(nil), p...), upTo+1) // versions are keyed by tx first
	}
	stop := errors.New("page full")
	err = scan(r, lo, hi, func(key, val []byte) error {
		if len(vs) == limit {
			last := vs[len(vs)-1]
			next = &[2]Ts{last.Tx.Start, last.Valid.Start}
			return stop
		}
		v, err := DecodeVersion(val)
		if err != nil {
			return fmt.Errorf("key %x: %w", key, err)
		}
		vs = append(vs, v)
		return nil
	})
	if errors.Is(err, stop) {
		err = nil
	}
	return vs, next, err
}
