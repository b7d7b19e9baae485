package partition

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"

	"github.com/cockroachdb/pebble/v2"
	"github.com/nats-io/nats.go/jetstream"
)

// Tail checkpoints (issue 29, DECISIONS 88).
//
// An erase's scrub saves the store once beside the writer (a whole
// checkpoint, its base), then holds the writer to purge the changelog
// whole. What committed between the two is not in the base, and the purge
// removes it from the log, so it must be stored first. A second whole save
// under the writer hard-links every table of the store and uploads its
// MANIFEST: its cost grows with the store (about 50 ms at 1 GB). A tail
// checkpoint stores only those write-sets instead:
//
//	seq-S.tar      whole checkpoint (format 2) at S      the base
//	seq-L.tar      tail checkpoint at L: base S, the write-sets (S, L]
//
// Restoring the tail restores its base, applies the write-sets in order
// (ApplyTo, as a replay would) and checks that the store reflects L. A
// tail's base is always whole; a kept tail keeps its base (PruneWith, and
// the scrub's own deletes), and the table lists of the base keep its
// tables (CollectTables). A tail holds no erase marker: a write-set with
// log data is refused (ErrNoTail), and the scrub saves whole instead, so
// the bytes an erase removed are in no checkpoint it leaves.

// formatTail is the object format of a tail checkpoint (metaFormat), and
// metaBase names its base checkpoint.
const (
	formatTail = "telha-checkpoint-tail/1"
	metaBase   = "telha-base"
)

// ErrNoTail: the write-sets cannot be stored as a tail (one holds log data
// such as an erase marker, they do not run consecutively from the base to
// the end, or the base is itself a tail). The caller saves a whole
// checkpoint instead.
var ErrNoTail = errors.New("partition: not a tail")

// TailEntry is one whole write-set and the sequence of its last message.
type TailEntry struct {
	Seq      uint64
	WriteSet []byte
}

// tailMagic starts a tail object. The encoding (all integers uvarints):
//
//	magic | base seq | end seq | count | count x (seq | len | write-set)
var tailMagic = []byte("telha-tail/1\n")

// maxTailEntries bounds what a decoder allocates for a hostile count, and
// maxTailBytes what a restore reads of a tail (the slot records at most
// 64 MiB of write-sets for one).
const (
	maxTailEntries = 1 << 20
	maxTailBytes   = 256 << 20
)

func encodeTail(base, end uint64, es []TailEntry) []byte {
	n := len(tailMagic) + 3*binary.MaxVarintLen64
	for _, e := range es {
		n += 2*binary.MaxVarintLen64 + len(e.WriteSet)
	}
	b := make([]byte, 0, n)
	b = append(b, tailMagic...)
	b = binary.AppendUvarint(b, base)
	b = binary.AppendUvarint(b, end)
	b = binary.AppendUvarint(b, uint64(len(es)))
	for _, e := range es {
		b = binary.AppendUvarint(b, e.Seq)
		b = binary.AppendUvarint(b, uint64(len(e.WriteSet)))
		b = append(b, e.WriteSet...)
	}
	return b
}

// decodeTail inverts encodeTail and checks what a restore relies on:
// sequences strictly increasing from above base to exactly end (an empty
// tail is refused: it would be its base), every write-set valid and free
// of log data, nothing after the last one. The write-sets alias raw.
func decodeTail(raw []byte) (base, end uint64, es []TailEntry, err error) {
	bad := func(format string, args ...any) (uint64, uint64, []TailEntry, error) {
		return 0, 0, nil, fmt.Errorf("%w: tail checkpoint: %s", ErrCorrupt, fmt.Sprintf(format, args...))
	}
	rest, ok := bytes.CutPrefix(raw, tailMagic)
	if !ok {
		return bad("no tail header")
	}
	var vals [3]uint64
	for i := range vals {
		v, n := binary.Uvarint(rest)
		if n <= 0 {
			return bad("truncated header")
		}
		vals[i], rest = v, rest[n:]
	}
	base, end, count := vals[0], vals[1], vals[2]
	if count == 0 || count > maxTailEntries || base >= end {
		return bad("base %d, end %d, %d write-sets", base, end, count)
	}
	es = make([]TailEntry, 0, min(count, uint64(len(rest)/2)))
	for i := range count {
		seq, n := binary.Uvarint(rest)
		if n <= 0 {
			return bad("write-set %d: truncated sequence", i)
		}
		rest = rest[n:]
		size, n := binary.Uvarint(rest)
		if n <= 0 || size > uint64(len(rest)-n) {
			return bad("write-set %d: truncated", i)
		}
		rest = rest[n:]
		es = append(es, TailEntry{Seq: seq, WriteSet: rest[:size:size]})
		rest = rest[size:]
	}
	if len(rest) != 0 {
		return bad("%d bytes after the last write-set", len(rest))
	}
	if err := checkTail(base, end, es); err != nil {
		return bad("%v", err)
	}
	return base, end, es, nil
}

// checkTail checks what a restore of a tail relies on: at least one
// write-set, sequences strictly increasing from above base to exactly end,
// every write-set valid and free of log data (an erase marker).
func checkTail(base, end uint64, es []TailEntry) error {
	prev := base
	for _, e := range es {
		if e.Seq <= prev || e.Seq > end {
			return fmt.Errorf("write-set at %d after %d (base %d, end %d)", e.Seq, prev, base, end)
		}
		_, logData, err := checkWriteSet(e.WriteSet)
		if err != nil {
			return fmt.Errorf("write-set at %d: %w", e.Seq, err)
		}
		if logData {
			return fmt.Errorf("write-set at %d holds log data (an erase marker)", e.Seq)
		}
		prev = e.Seq
	}
	if prev != end || len(es) == 0 {
		return fmt.Errorf("the write-sets end at %d, not %d", prev, end)
	}
	return nil
}

// SaveTail stores checkpoint CheckpointName(p, end) as a tail of base (a
// whole checkpoint of partition p, stored): es are the changelog's whole
// write-sets after base.Seq through end, in order, the last at end. It
// reads nothing of the store and links no table, so it costs what
// committed since base, not what the store holds. ErrNoTail when es cannot
// be a tail (the package comment); the caller then saves whole.
func SaveTail(ctx context.Context, obs jetstream.ObjectStore, p int, base CheckpointInfo, end uint64, es []TailEntry, chunk uint32) (CheckpointInfo, error) {
	if base.Base != "" || base.Name != CheckpointName(p, base.Seq) {
		return CheckpointInfo{}, fmt.Errorf("%w: base %s of partition %d is not a whole checkpoint", ErrNoTail, base.Name, p)
	}
	if err := checkTail(base.Seq, end, es); err != nil {
		return CheckpointInfo{}, fmt.Errorf("%w: %w", ErrNoTail, err)
	}
	name := CheckpointName(p, end)
	if old, ok, err := storedAt(ctx, obs, p, end); ok || err != nil {
		return old, err
	}
	if chunk == 0 {
		chunk = DefaultChunkSize
	}
	raw := encodeTail(base.Seq, end, es)
	uctx, done := uploadContext(ctx)
	defer done()
	info, err := putObject(uctx, obs, jetstream.ObjectMeta{
		Name:        name,
		Description: fmt.Sprintf("partition %d at changelog sequence %d: %s and %d write-sets", p, end, base.Name, len(es)),
		Metadata: map[string]string{
			metaPartition: strconv.Itoa(p),
			metaSeq:       strconv.FormatUint(end, 10),
			metaFormat:    formatTail,
			metaBase:      base.Name,
		},
		Opts: &jetstream.ObjectMetaOptions{ChunkSize: chunk},
	}, bytes.NewReader(raw))
	if err != nil {
		return CheckpointInfo{}, fmt.Errorf("partition %d: upload tail checkpoint %s: %w", p, name, err)
	}
	return CheckpointInfo{Partition: p, Seq: end, Name: name, Size: info.Size, Modified: info.ModTime,
		BytesUploaded: info.Size, Base: base.Name, TailWriteSets: len(es)}, nil
}

// restoreTail restores tail checkpoint cp into dstDir (restoreOne's
// contract): its base into a staging directory, then its write-sets.
func restoreTail(ctx context.Context, obs jetstream.ObjectStore, p int, cp CheckpointInfo, dstDir string) (uint64, error) {
	bp, bseq, ok := parseCheckpointName(cp.Base)
	if !ok || bp != p || bseq >= cp.Seq {
		return 0, fmt.Errorf("%w: partition %d: tail checkpoint %s names base %q", ErrCorrupt, p, cp.Name, cp.Base)
	}
	if cp.Size > maxTailBytes {
		return 0, fmt.Errorf("%w: partition %d: tail checkpoint %s of %d bytes, above %d", ErrCorrupt, p, cp.Name, cp.Size, maxTailBytes)
	}
	raw, err := ReadObject(ctx, obs, cp.Name)
	if err != nil {
		return 0, fmt.Errorf("partition %d: restore %s: %w", p, cp.Name, err)
	}
	base, end, es, err := decodeTail(raw)
	if err != nil {
		return 0, fmt.Errorf("partition %d: restore %s: %w", p, cp.Name, err)
	}
	if base != bseq || end != cp.Seq {
		return 0, fmt.Errorf("%w: partition %d: tail checkpoint %s holds %d..%d, its name and base say %d..%d", ErrCorrupt, p, cp.Name, base, end, bseq, cp.Seq)
	}
	binfo, err := obs.GetInfo(ctx, cp.Base)
	if err != nil {
		return 0, fmt.Errorf("partition %d: restore %s: base %s: %w", p, cp.Name, cp.Base, err)
	}
	if binfo.Metadata[metaFormat] == formatTail {
		return 0, fmt.Errorf("%w: partition %d: tail checkpoint %s has a tail for its base", ErrCorrupt, p, cp.Name)
	}
	return stageRestore(p, cp, dstDir, func(dir string) error {
		if _, err := restoreOne(ctx, obs, p, CheckpointInfo{Partition: p, Seq: bseq, Name: cp.Base}, dir); err != nil {
			return err
		}
		return applyTail(dir, es)
	})
}

// applyTail applies es to the store in dir, the last one synced.
func applyTail(dir string, es []TailEntry) (err error) {
	db, err := pebble.Open(dir, &pebble.Options{Logger: quietLogger{}, Cleaner: noRecycle{}})
	if err != nil {
		return fmt.Errorf("open %s: %w", dir, err)
	}
	defer func() {
		if cerr := db.Close(); err == nil && cerr != nil {
			err = cerr
		}
	}()
	for i, e := range es {
		if err := ApplyTo(db, e.Seq, e.WriteSet, i == len(es)-1); err != nil {
			return err
		}
	}
	return nil
}

// noRecycle deletes obsolete files like Pebble's default cleaner and turns
// off WAL recycling, as the store does (storage's noRecycleCleaner says
// why): Pebble recycles a cleaner's logs only when the cleaner does not
// need their contents, which the ArchiveCleaner one level down declares.
type noRecycle struct {
	pebble.DeleteCleaner
	needsContents
}

type needsContents struct{ pebble.ArchiveCleaner }
