package partition

import (
	"bytes"
	"errors"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
)

func TestPartHeaderRoundTrip(t *testing.T) {
	for _, c := range []struct {
		i, n  int
		first uint64
	}{{1, 1, 1}, {1, 3, 10}, {3, 3, 10}, {65536, 65536, 1<<64 - 1}} {
		i, n, first, err := ParsePart(FormatPart(c.i, c.n, c.first))
		if err != nil || i != c.i || n != c.n || first != c.first {
			t.Fatalf("round trip %+v = %d %d %d %v", c, i, n, first, err)
		}
	}
	for _, bad := range []string{"", "1/2", "1/2/3/4", "0/1/1", "2/1/5", "1/65537/1", "01/2/3", "1/2/0",
		"+1/2/3", "1/2/-3", " 1/2/3", "1/2/18446744073709551616", "a/b/c"} {
		if _, _, _, err := ParsePart(bad); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("ParsePart(%q) = %v, want ErrCorrupt", bad, err)
		}
	}
}

func FuzzParsePart(f *testing.F) {
	for _, s := range []string{"1/2/10", "2/2/10", "0/1/1", "2/1/5", "1/65537/1", "01/2/3", "", "1/1/18446744073709551615", "/ /"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		i, n, first, err := ParsePart(s)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("error %v is not ErrCorrupt", err)
			}
			return
		}
		if i < 1 || i > n || n > maxParts || first < 1 {
			t.Fatalf("accepted out-of-range %d/%d/%d", i, n, first)
		}
		if FormatPart(i, n, first) != s {
			t.Fatalf("accepted non-canonical %q", s)
		}
	})
}

// The assembler's rules on a hand-written story: whole, split, torn then
// whole, torn then split, and corruption.
func TestAssembler(t *testing.T) {
	type msg struct {
		seq  uint64
		hdr  string
		data string
	}
	var a assembler
	feed := func(m msg) (string, bool, error) {
		ws, done, err := a.feed(m.seq, m.hdr, []byte(m.data))
		return string(ws), done, err
	}
	story := []struct {
		m    msg
		want string // "" when nothing completes
	}{
		{msg{1, "", "w1"}, "w1"},
		{msg{2, "1/2/2", "a"}, ""},
		{msg{3, "2/2/2", "b"}, "ab"},
		{msg{4, "1/3/4", "t1"}, ""}, // torn: no 3/3
		{msg{5, "2/3/4", "t2"}, ""},
		{msg{6, "", "w6"}, "w6"},
		{msg{7, "1/2/7", "t"}, ""}, // torn again, then a split one
		{msg{8, "1/2/8", "c"}, ""},
		{msg{9, "2/2/8", "d"}, "cd"},
		{msg{10, "1/1/10", "e"}, "e"},
	}
	for _, s := range story {
		got, done, err := feed(s.m)
		if err != nil || done != (s.want != "") || got != s.want && done {
			t.Fatalf("seq %d: %q %t %v, want %q", s.m.seq, got, done, err, s.want)
		}
	}
	if a.torn != 2 {
		t.Fatalf("torn = %d, want 2", a.torn)
	}
	for _, bad := range [][]msg{
		{{1, "2/2/1", "x"}},                    // a later part without its first
		{{5, "1/2/4", "x"}},                    // part 1 naming another first
		{{1, "1/3/1", "x"}, {2, "3/3/1", "y"}}, // a skipped part
		{{1, "1/3/1", "x"}, {3, "2/3/1", "y"}}, // a gap in sequence
		{{1, "1/3/1", "x"}, {2, "2/2/1", "y"}}, // n changes
		{{1, "garbage", "x"}},
	} {
		a = assembler{}
		var err error
		for _, m := range bad {
			_, _, err = feed(m)
		}
		if !errors.Is(err, ErrCorrupt) {
			t.Fatalf("%v: %v, want ErrCorrupt", bad, err)
		}
	}
}

// FuzzAssembler feeds messages derived from the input: never a panic, and a
// write-set completed from parts is exactly its parts' data in order.
func FuzzAssembler(f *testing.F) {
	f.Add([]byte{0, 0, 0, 1, 1, 2, 1, 2, 2})
	f.Add([]byte{1, 0, 3, 1, 1, 3, 0, 0, 0, 1, 0, 1})
	f.Add([]byte{2, 'x', '/', 1, 5, 2})
	f.Fuzz(func(t *testing.T, in []byte) {
		var a assembler
		var parts [][]byte // data of the pending write-set's parts
		for k := 0; k+3 <= len(in); k += 3 {
			seq := uint64(k/3 + 1)
			c0, c1, c2 := in[k], in[k+1], in[k+2]
			data := []byte{c0, c1, c2, byte(seq)}
			var hdr string
			switch c0 % 4 {
			case 0:
			case 1, 2:
				n := int(c2%4) + 1
				i := min(int(c1%4)+1, n)
				first := seq - uint64(i-1)
				if first < 1 || c0%4 == 2 {
					first = uint64(c1) + 1
				}
				hdr = FormatPart(i, n, first)
			case 3:
				hdr = string(in[k+1 : k+3])
			}
			ws, done, err := a.feed(seq, hdr, data)
			if err != nil {
				if !errors.Is(err, ErrCorrupt) {
					t.Fatalf("error %v is not ErrCorrupt", err)
				}
				return // a reader stops at corruption
			}
			i, n, _, perr := ParsePart(hdr)
			switch {
			case hdr == "" || perr == nil && n == 1:
				parts = nil
				if !done || !bytes.Equal(ws, data) {
					t.Fatalf("seq %d: whole write-set not returned as is", seq)
				}
			case i == 1:
				parts = [][]byte{data}
				if done {
					t.Fatalf("seq %d: part 1/%d completed a write-set", seq, n)
				}
			default:
				parts = append(parts, data)
				if done != (i == n) {
					t.Fatalf("seq %d: part %d/%d done=%t", seq, i, n, done)
				}
				if done && !bytes.Equal(ws, bytes.Join(parts, nil)) {
					t.Fatalf("seq %d: assembled %x, want %x", seq, ws, bytes.Join(parts, nil))
				}
			}
		}
	})
}

func TestApplyToRefusesBadWriteSets(t *testing.T) {
	db := openDB(t, "")
	mk := func(f func(b *pebble.Batch) error) []byte {
		b := db.NewBatch()
		defer b.Close()
		if err := f(b); err != nil {
			t.Fatal(err)
		}
		return bytes.Clone(b.Repr())
	}
	good := mk(func(b *pebble.Batch) error { return b.Set([]byte{0x01, 'a'}, []byte("v"), nil) })
	for name, ws := range map[string][]byte{
		"short":           good[:5],
		"truncated":       good[:len(good)-1],
		"count too high":  append(append([]byte{}, good[:8]...), append([]byte{2, 0, 0, 0}, good[12:]...)...),
		"reserved put":    mk(func(b *pebble.Batch) error { return b.Set([]byte{0xF0, 0x01}, []byte("x"), nil) }),
		"reserved delete": mk(func(b *pebble.Batch) error { return b.Delete([]byte{0xF0, 0x01}, nil) }),
		"range over reserved": mk(func(b *pebble.Batch) error {
			return b.DeleteRange([]byte{0x01}, []byte{0xFF}, nil)
		}),
		"merge":     mk(func(b *pebble.Batch) error { return b.Merge([]byte{0x01}, []byte("m"), nil) }),
		"range key": mk(func(b *pebble.Batch) error { return b.RangeKeySet([]byte{0x01}, []byte{0x02}, nil, []byte("v"), nil) }),
		"bad kind":  append(bytes.Clone(good[:12]), 0x7F, 1, 'k'),
	} {
		if err := ApplyTo(db, 1, ws, false); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("%s: %v, want ErrCorrupt", name, err)
		}
	}
	// A sized delete on a store whose format predates it: an error, where
	// Pebble itself would panic.
	sized := mk(func(b *pebble.Batch) error { return b.DeleteSized([]byte{0x01, 'a'}, 3, nil) })
	if db.FormatMajorVersion() >= pebble.FormatDeleteSizedAndObsolete {
		t.Fatalf("test store format %d already supports sized deletes", db.FormatMajorVersion())
	}
	if err := ApplyTo(db, 1, sized, false); err == nil {
		t.Fatal("sized delete applied to a store whose format predates it")
	}
	if a, _ := AppliedSeq(db); a != 0 {
		t.Fatalf("a refused write-set moved the applied seq to %d", a)
	}
	ok := mk(func(b *pebble.Batch) error {
		if err := b.DeleteRange([]byte{0x01}, []byte{0xF0}, nil); err != nil { // ends where the reserved space starts
			return err
		}
		if err := b.LogData([]byte("note"), nil); err != nil {
			return err
		}
		return b.Set([]byte{0x01, 'a'}, []byte("v"), nil)
	})
	if err := ApplyTo(db, 5, ok, true); err != nil {
		t.Fatal(err)
	}
	if a, err := AppliedSeq(db); err != nil || a != 5 {
		t.Fatalf("applied = %d, %v; want 5", a, err)
	}
	if err := ApplyTo(db, 5, good, false); err == nil {
		t.Fatal("a write-set at the applied sequence was applied again")
	}
}

var (
	fuzzDBOnce sync.Once
	fuzzDB     *pebble.DB
	fuzzSeq    atomic.Uint64
)

// FuzzValidateWriteSet: whatever bytes arrive, ValidateWriteSet answers
// without a panic, and a write-set it accepts applies to a real Pebble.
func FuzzValidateWriteSet(f *testing.F) {
	fuzzDBOnce.Do(func() {
		var err error
		fuzzDB, err = pebble.Open("", &pebble.Options{FS: vfs.NewMem(), Logger: quietLogger{}, FormatMajorVersion: pebble.FormatNewest})
		if err != nil {
			panic(err)
		}
	})
	b := fuzzDB.NewBatch()
	_ = b.Set([]byte{0x01, 'a'}, []byte("v"), nil)
	_ = b.Delete([]byte{0x01, 'b'}, nil)
	_ = b.DeleteRange([]byte{0x02}, []byte{0x03}, nil)
	_ = b.LogData([]byte("log"), nil)
	_ = b.DeleteSized([]byte{0x01, 'c'}, 10, nil)
	_ = b.SingleDelete([]byte{0x01, 'd'}, nil)
	f.Add(bytes.Clone(b.Repr()))
	f.Add(b.Repr()[:20])
	f.Add([]byte{})
	f.Add(append(make([]byte, 8), 1, 0, 0, 0, 1, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF))
	f.Fuzz(func(t *testing.T, ws []byte) {
		if err := ValidateWriteSet(ws); err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("error %v is not ErrCorrupt", err)
			}
			return
		}
		if err := ApplyTo(fuzzDB, fuzzSeq.Add(1), ws, false); err != nil {
			t.Fatalf("validated write-set %x does not apply: %v", ws, err)
		}
	})
}

// FuzzDecodeTail: a tail checkpoint read from the bucket never panics
// the restore, and what it accepts is what restoreTail relies on: its
// write-sets valid, free of log data, strictly increasing from above the
// base to exactly the end.
func FuzzDecodeTail(f *testing.F) {
	ws := batchRepr(f, "v")
	valid := encodeTail(4, 9, []TailEntry{{Seq: 6, WriteSet: ws}, {Seq: 9, WriteSet: ws}})
	f.Add(valid)
	f.Add(valid[:len(valid)-1])
	f.Add(append(bytes.Clone(valid), 0))
	f.Add(encodeTail(9, 9, []TailEntry{{Seq: 9, WriteSet: ws}}))
	f.Add(encodeTail(4, 9, []TailEntry{{Seq: 9, WriteSet: ws}, {Seq: 9, WriteSet: ws}}))
	f.Add(encodeTail(4, 9, []TailEntry{{Seq: 9, WriteSet: []byte("not a batch")}}))
	f.Add(append(bytes.Clone(tailMagic), 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, raw []byte) {
		base, end, es, err := decodeTail(raw)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("error %v is not ErrCorrupt", err)
			}
			return
		}
		if len(es) == 0 || base >= end || es[len(es)-1].Seq != end {
			t.Fatalf("accepted base %d, end %d, %d write-sets", base, end, len(es))
		}
		prev := base
		for _, e := range es {
			if e.Seq <= prev {
				t.Fatalf("accepted write-set at %d after %d", e.Seq, prev)
			}
			if _, logData, err := checkWriteSet(e.WriteSet); err != nil || logData {
				t.Fatalf("accepted write-set at %d: log data %t, %v", e.Seq, logData, err)
			}
			prev = e.Seq
		}
	})
}
