package partition

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/cockroachdb/pebble/v2"
)

// appliedKey is where a partition's Pebble records the changelog sequence
// it reflects. See the package doc: 0xF0 is reserved for this package.
var appliedKey = []byte{0xF0, 0x01}

// The reserved keyspace [reservedStart, reservedEnd): write-sets may not
// touch it.
var (
	reservedStart = []byte{0xF0}
	reservedEnd   = []byte{0xF1}
)

// AppliedKey returns a copy of the reserved key that holds the applied
// sequence (for tests and tools that scan a store).
func AppliedKey() []byte { return bytes.Clone(appliedKey) }

// MarkApplied adds the applied sequence to b, the owner's own batch, after
// Append returned seq for b.Repr() and before b is committed: the local
// store then reflects seq exactly when it holds b. Take b.Repr() for Append
// BEFORE calling MarkApplied; the changelog must not carry the marker.
func MarkApplied(b *pebble.Batch, seq uint64) error {
	if err := b.Set(appliedKey, binary.BigEndian.AppendUint64(nil, seq), nil); err != nil {
		return fmt.Errorf("partition: mark applied %d: %w", seq, err)
	}
	return nil
}

// ApplyTo applies one write-set read from the changelog to db, together
// with its sequence as the applied position, in ONE Pebble batch: a crash
// leaves db either before or after the write-set, and AppliedSeq says
// which. sync false is enough when the changelog holds the write (a lost
// tail is replayed again on restart).
//
// It refuses (ErrCorrupt) a write-set that ValidateWriteSet refuses (not a
// well-formed Pebble batch, an operation the product never writes, or a
// touch of the reserved keyspace), and a seq not above db's applied sequence
// (replaying an old write-set would move the store back in time).
func ApplyTo(db *pebble.DB, seq uint64, writeSet []byte, sync bool) error {
	sized, logData, err := checkWriteSet(writeSet)
	if err != nil {
		return fmt.Errorf("partition: write-set at %d: %w", seq, err)
	}
	// Pebble panics on a batch that needs a newer format than the store's
	// (found by FuzzValidateWriteSet); refuse it as an error instead.
	if sized && db.FormatMajorVersion() < pebble.FormatDeleteSizedAndObsolete {
		return fmt.Errorf("partition: write-set at %d holds a sized delete, which needs Pebble format %d; this store is at %d",
			seq, pebble.FormatDeleteSizedAndObsolete, db.FormatMajorVersion())
	}
	applied, err := AppliedSeq(db)
	if err != nil {
		return err
	}
	if seq <= applied {
		return fmt.Errorf("partition: write-set at %d is not above the applied sequence %d", seq, applied)
	}
	// The batch takes ownership of its repr and appends the marker to it,
	// so give it a copy with room: writeSet may be a reader's buffer.
	repr := make([]byte, len(writeSet), len(writeSet)+len(appliedKey)+16)
	copy(repr, writeSet)
	b := db.NewBatch()
	defer b.Close()
	if err := b.SetRepr(repr); err != nil {
		return fmt.Errorf("partition: write-set at %d: %w: %w", seq, ErrCorrupt, err)
	}
	if err := MarkApplied(b, seq); err != nil {
		return err
	}
	if logData {
		if err := markPendingScrub(b, seq, writeSet); err != nil {
			return err
		}
	}
	opts := pebble.NoSync
	if sync {
		opts = pebble.Sync
	}
	if err := db.Apply(b, opts); err != nil {
		return fmt.Errorf("partition: apply write-set at %d: %w", seq, err)
	}
	return nil
}

// AppliedSeq returns the changelog sequence db reflects; 0 for a store that
// has applied nothing (replay from 1).
func AppliedSeq(db *pebble.DB) (uint64, error) {
	v, closer, err := db.Get(appliedKey)
	if errors.Is(err, pebble.ErrNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("partition: read applied sequence: %w", err)
	}
	defer closer.Close()
	if len(v) != 8 {
		return 0, fmt.Errorf("%w: applied sequence of %d bytes", ErrCorrupt, len(v))
	}
	return binary.BigEndian.Uint64(v), nil
}

// batchHeaderLen is a Pebble batch repr's header: an 8-byte sequence
// number and a 4-byte little-endian count.
const batchHeaderLen = 12

// ValidateWriteSet checks that ws is a well-formed Pebble batch repr whose
// every record is a set, delete, single delete, sized delete, range delete
// or log data (what the product's batches hold; merges, range keys,
// ingests and excises are refused rather than trusted), and that none
// touches the reserved keyspace. Pebble's own batch reader trusts its input
// (it may read past the end of a truncated varint), so a write-set from the
// wire is checked here first.
//
// Record layout (pebble batchrepr): kind byte, uvarint32 key length, key,
// and for kinds with a value, uvarint32 value length, value.
func ValidateWriteSet(ws []byte) error {
	_, _, err := checkWriteSet(ws)
	return err
}

// checkWriteSet is ValidateWriteSet, also reporting whether ws holds a
// sized delete (which needs a newer Pebble format to apply) and whether it
// holds log data (only then can it carry an erase marker, which ApplyTo
// then looks for).
func checkWriteSet(ws []byte) (sized, logData bool, err error) {
	if len(ws) < batchHeaderLen {
		return false, false, fmt.Errorf("%w: batch of %d bytes is shorter than its header", ErrCorrupt, len(ws))
	}
	want := binary.LittleEndian.Uint32(ws[8:batchHeaderLen])
	var count uint32 // records in the header's count: all but log data
	err = eachRecord(ws, func(kind pebble.InternalKeyKind, key, value []byte) error {
		if kind != pebble.InternalKeyKindLogData {
			count++
		} else {
			logData = true
		}
		switch kind {
		case pebble.InternalKeyKindLogData:
			// Not a key: log data is never applied to the keyspace.
		case pebble.InternalKeyKindRangeDelete:
			// [key, value) must not overlap [reservedStart, reservedEnd).
			if bytes.Compare(key, reservedEnd) < 0 && bytes.Compare(value, reservedStart) > 0 {
				return fmt.Errorf("%w: record %d range-deletes [%x, %x), which overlaps the reserved keyspace 0xF0", ErrCorrupt, count, key, value)
			}
		default:
			if bytes.HasPrefix(key, reservedStart) {
				return fmt.Errorf("%w: record %d writes key %x in the reserved keyspace 0xF0", ErrCorrupt, count, key)
			}
		}
		if kind == pebble.InternalKeyKindDeleteSized {
			sized = true
			// Compactions decode this value; a bad one would fail them
			// later, far from the write-set that carried it.
			if _, k := binary.Uvarint(value); k != len(value) || k == 0 {
				return fmt.Errorf("%w: record %d: delete-sized value %x is not one uvarint", ErrCorrupt, count, value)
			}
		}
		return nil
	})
	if err != nil {
		return false, false, err
	}
	if count != want {
		return false, false, fmt.Errorf("%w: batch header counts %d records, body holds %d", ErrCorrupt, want, count)
	}
	return sized, logData, nil
}

// readStr reads a uvarint32 length and that many bytes.
func readStr(b []byte) (s, rest []byte, err error) {
	n, k := binary.Uvarint(b)
	if k <= 0 || n > 1<<32-1 {
		return nil, nil, errors.New("bad length varint")
	}
	b = b[k:]
	if n > uint64(len(b)) {
		return nil, nil, fmt.Errorf("length %d beyond the %d bytes left", n, len(b))
	}
	return b[:n], b[n:], nil
}
