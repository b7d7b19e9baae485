package scrubmark

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
)

// Magic starts every marker payload. The leading 0xF0 byte is the
// changelog's reserved byte (partition/applied.go): no printable log data
// starts with it.
var Magic = []byte("\xF0telha-erase-scrub/1\x00")

// MaxRanges bounds the ranges of one marker, so a corrupt marker cannot
// make a copy run millions of compactions; an encoder with more merges
// them (Coalesce).
const MaxRanges = 256

// maxKey bounds one range bound.
const maxKey = 4096

// ErrCorrupt: a payload starts with Magic but does not decode.
var ErrCorrupt = errors.New("scrubmark: corrupt erase marker")

// Range is a key range [Start, End) to compact.
type Range struct {
	Start, End []byte
}

// Encode returns the LogData payload of a marker for ranges (at most
// MaxRanges, each Start < End, each bound at most 4 KiB).
func Encode(ranges []Range) ([]byte, error) {
	if len(ranges) > MaxRanges {
		return nil, fmt.Errorf("scrubmark: %d ranges, at most %d", len(ranges), MaxRanges)
	}
	b := bytes.Clone(Magic)
	b = binary.AppendUvarint(b, uint64(len(ranges)))
	for _, r := range ranges {
		if len(r.Start) > maxKey || len(r.End) > maxKey {
			return nil, fmt.Errorf("scrubmark: a range bound above %d bytes", maxKey)
		}
		if bytes.Compare(r.Start, r.End) >= 0 {
			return nil, fmt.Errorf("scrubmark: empty range [%x, %x)", r.Start, r.End)
		}
		b = binary.AppendUvarint(b, uint64(len(r.Start)))
		b = append(b, r.Start...)
		b = binary.AppendUvarint(b, uint64(len(r.End)))
		b = append(b, r.End...)
	}
	return b, nil
}

// Decode decodes a LogData payload: ok is false (and err nil) for log data
// that is not a marker; err wraps ErrCorrupt for a marker that does not
// decode. The ranges do not alias payload.
func Decode(payload []byte) (ranges []Range, ok bool, err error) {
	rest, found := bytes.CutPrefix(payload, Magic)
	if !found {
		return nil, false, nil
	}
	n, k := binary.Uvarint(rest)
	if k <= 0 || n > MaxRanges {
		return nil, true, fmt.Errorf("%w: range count", ErrCorrupt)
	}
	rest = rest[k:]
	str := func() ([]byte, error) {
		l, k := binary.Uvarint(rest)
		if k <= 0 || l > maxKey || l > uint64(len(rest)-k) {
			return nil, fmt.Errorf("%w: range bound", ErrCorrupt)
		}
		s := bytes.Clone(rest[k : k+int(l)])
		rest = rest[k+int(l):]
		return s, nil
	}
	ranges = make([]Range, 0, n)
	for range n {
		s, err := str()
		if err != nil {
			return nil, true, err
		}
		e, err := str()
		if err != nil {
			return nil, true, err
		}
		if bytes.Compare(s, e) >= 0 {
			return nil, true, fmt.Errorf("%w: empty range [%x, %x)", ErrCorrupt, s, e)
		}
		ranges = append(ranges, Range{Start: s, End: e})
	}
	if len(rest) != 0 {
		return nil, true, fmt.Errorf("%w: %d bytes after the ranges", ErrCorrupt, len(rest))
	}
	return ranges, true, nil
}

// Coalesce sorts ranges, merges the overlapping and adjacent ones, and
// then, while more than max remain, merges the two neighbours whose gap
// is smallest in the key order (their union covers the gap: compacting a
// little more, never less). The result shares its bounds with the input.
func Coalesce(ranges []Range, max int) []Range {
	if len(ranges) == 0 {
		return nil
	}
	rs := make([]Range, len(ranges))
	copy(rs, ranges)
	sortRanges(rs)
	out := rs[:1]
	for _, r := range rs[1:] {
		last := &out[len(out)-1]
		if bytes.Compare(r.Start, last.End) <= 0 {
			if bytes.Compare(r.End, last.End) > 0 {
				last.End = r.End
			}
			continue
		}
		out = append(out, r)
	}
	for max > 0 && len(out) > max {
		// Merge the pair with the smallest gap, measured by the length of
		// the common prefix of one's end and the next's start (longer:
		// closer in the key order).
		best, bestCommon := 0, -1
		for i := 0; i+1 < len(out); i++ {
			if c := commonPrefix(out[i].End, out[i+1].Start); c > bestCommon {
				best, bestCommon = i, c
			}
		}
		out[best].End = out[best+1].End
		out = append(out[:best+1], out[best+2:]...)
	}
	return out
}

func commonPrefix(a, b []byte) int {
	n := 0
	for n < len(a) && n < len(b) && a[n] == b[n] {
		n++
	}
	return n
}

func sortRanges(rs []Range) {
	slices.SortFunc(rs, func(a, b Range) int { return bytes.Compare(a.Start, b.Start) })
}
