package partition

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/cockroachdb/pebble/v2"
	"github.com/telha/telha-cascade/internal/scrubmark"
)

// Erase markers in the changelog (issue 29, items 4 and 6).
//
// An erase rewrites versions in place and then commits a marker
// write-set: a LogData record whose payload is a scrubmark marker naming
// the key ranges to compact. Every copy that applies the marker (a
// standby's tail, a catch-up's replay) must then compact those ranges so
// the old values leave its files.
//
// Invariant (a marker is compacted even across a crash): ApplyTo writes,
// in the marker's own batch, a pending-scrub record at
// pendingScrubKey(seq) holding the ranges; ScrubPending compacts and then
// deletes it. A copy that stops between the two finds the record at its
// next start (or its next ScrubPending) and compacts again. The record is
// local: it lives in the reserved keyspace, which write-sets may not touch,
// and it is never appended to a changelog.
//
// Only LogData records are read for the marker: a tenant's data reaches a
// write-set as keys and values of sets and deletes, never as log data, so
// no tenant can make a copy compact (FuzzNoForgedMarker).

// pendingScrubPrefix holds the pending-scrub records: 0xF0 0x03 and the
// marker's sequence (8 bytes, big-endian).
var pendingScrubPrefix = []byte{0xF0, 0x03}

func pendingScrubKey(seq uint64) []byte {
	return binary.BigEndian.AppendUint64(bytes.Clone(pendingScrubPrefix), seq)
}

// legacyMarker is the marker of releases before the typed one: log data
// with this exact payload. It still compacts every key (as those releases'
// standbys did), so a changelog written by them keeps its meaning.
var legacyMarker = []byte("telha erase: scrub of the copies")

// everything is the range a legacy marker compacts: every key below the
// reserved keyspace.
var everything = scrubmark.Range{Start: []byte{0x00}, End: bytes.Clone(reservedStart)}

// FindScrubMarker returns the ranges of the erase marker in write-set ws,
// and false when ws holds none. ws must be valid (ValidateWriteSet).
func FindScrubMarker(ws []byte) ([]scrubmark.Range, bool, error) {
	var out []scrubmark.Range
	found := false
	err := eachRecord(ws, func(kind pebble.InternalKeyKind, key, _ []byte) error {
		if kind != pebble.InternalKeyKindLogData {
			return nil
		}
		if bytes.Equal(key, legacyMarker) {
			found = true
			out = append(out, everything)
			return nil
		}
		rs, ok, err := scrubmark.Decode(key)
		if err != nil {
			return fmt.Errorf("%w: %w", ErrCorrupt, err)
		}
		if ok {
			found = true
			out = append(out, rs...)
		}
		return nil
	})
	if err != nil {
		return nil, false, err
	}
	return out, found, nil
}

// eachRecord calls fn for every record of a write-set, in order, and
// refuses (ErrCorrupt) a record it cannot read or of a kind a write-set may
// not carry. Record layout (pebble batchrepr): kind byte, uvarint32 key
// length, key, and for kinds with a value, uvarint32 value length, value;
// log data has a key (its payload) and no value.
func eachRecord(ws []byte, fn func(kind pebble.InternalKeyKind, key, value []byte) error) error {
	if len(ws) < batchHeaderLen {
		return fmt.Errorf("%w: batch of %d bytes is shorter than its header", ErrCorrupt, len(ws))
	}
	n := 0
	for r := ws[batchHeaderLen:]; len(r) > 0; n++ {
		kind := pebble.InternalKeyKind(r[0])
		key, rest, err := readStr(r[1:])
		if err != nil {
			return fmt.Errorf("%w: record %d key: %w", ErrCorrupt, n, err)
		}
		r = rest
		var value []byte
		switch kind {
		case pebble.InternalKeyKindSet, pebble.InternalKeyKindRangeDelete, pebble.InternalKeyKindDeleteSized:
			value, r, err = readStr(r)
			if err != nil {
				return fmt.Errorf("%w: record %d value: %w", ErrCorrupt, n, err)
			}
		case pebble.InternalKeyKindDelete, pebble.InternalKeyKindSingleDelete, pebble.InternalKeyKindLogData:
		default:
			return fmt.Errorf("%w: record %d has kind %d, which a write-set may not carry", ErrCorrupt, n, kind)
		}
		if err := fn(kind, key, value); err != nil {
			return err
		}
	}
	return nil
}

// markPendingScrub adds to b, the batch that applies the write-set at seq,
// the pending-scrub record of its marker (when it has one).
func markPendingScrub(b *pebble.Batch, seq uint64, ws []byte) error {
	rs, ok, err := FindScrubMarker(ws)
	if err != nil || !ok {
		return err
	}
	rs = scrubmark.Coalesce(rs, scrubmark.MaxRanges)
	v, err := scrubmark.Encode(rs)
	if err != nil {
		return fmt.Errorf("partition: pending scrub at %d: %w", seq, err)
	}
	return b.Set(pendingScrubKey(seq), v, nil)
}

// ScrubPending compacts the ranges of every pending-scrub record in db
// (markers applied since the last call, or left by a copy that stopped
// before compacting) and deletes each record once its ranges are
// compacted. It flushes first: the old values may still be in the
// memtable's WAL only. It returns how many records it settled.
func ScrubPending(ctx context.Context, db *pebble.DB) (int, error) {
	type pending struct {
		key    []byte
		ranges []scrubmark.Range
	}
	var todo []pending
	it, err := db.NewIter(&pebble.IterOptions{LowerBound: pendingScrubPrefix, UpperBound: []byte{0xF0, 0x04}})
	if err != nil {
		return 0, fmt.Errorf("partition: pending scrubs: %w", err)
	}
	for ok := it.First(); ok; ok = it.Next() {
		rs, isMarker, derr := scrubmark.Decode(it.Value())
		if derr != nil || !isMarker {
			// A record we wrote ourselves that does not decode: compact
			// everything rather than keep a copy we cannot prove clean.
			rs = []scrubmark.Range{everything}
		}
		todo = append(todo, pending{key: bytes.Clone(it.Key()), ranges: rs})
	}
	if err := errors.Join(it.Error(), it.Close()); err != nil {
		return 0, fmt.Errorf("partition: pending scrubs: %w", err)
	}
	if len(todo) == 0 {
		return 0, nil
	}
	if err := db.Flush(); err != nil {
		return 0, fmt.Errorf("partition: flush before an erase's compaction: %w", err)
	}
	var all []scrubmark.Range
	for _, p := range todo {
		all = append(all, p.ranges...)
	}
	for _, r := range scrubmark.Coalesce(all, scrubmark.MaxRanges) {
		if err := db.Compact(ctx, r.Start, r.End, true); err != nil {
			return 0, fmt.Errorf("partition: an erase's compaction of [%x, %x): %w", r.Start, r.End, err)
		}
	}
	b := db.NewBatch()
	defer b.Close()
	for _, p := range todo {
		if err := b.Delete(p.key, nil); err != nil {
			return 0, err
		}
	}
	if err := b.Commit(pebble.Sync); err != nil {
		return 0, fmt.Errorf("partition: settle pending scrubs: %w", err)
	}
	return len(todo), nil
}
