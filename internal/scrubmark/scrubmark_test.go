package scrubmark

import (
	"bytes"
	"errors"
	"testing"
)

func TestEncodeDecodeRoundTrip(t *testing.T) {
	in := []Range{{Start: []byte{1, 2}, End: []byte{1, 3}}, {Start: []byte{5}, End: []byte{6, 0, 0}}}
	p, err := Encode(in)
	if err != nil {
		t.Fatal(err)
	}
	got, ok, err := Decode(p)
	if err != nil || !ok {
		t.Fatalf("Decode: ok %v err %v", ok, err)
	}
	if len(got) != 2 || !bytes.Equal(got[0].Start, in[0].Start) || !bytes.Equal(got[1].End, in[1].End) {
		t.Fatalf("round trip: %x", got)
	}
}

func TestDecodeIgnoresOtherLogData(t *testing.T) {
	for _, p := range [][]byte{nil, []byte("telha claim host=x pid=1"), []byte("telha erase: scrub of the copies"), Magic[:len(Magic)-1]} {
		if _, ok, err := Decode(p); ok || err != nil {
			t.Fatalf("Decode(%q) = ok %v, err %v; want not a marker", p, ok, err)
		}
	}
}

func TestDecodeRefusesCorrupt(t *testing.T) {
	good, _ := Encode([]Range{{Start: []byte{1}, End: []byte{2}}})
	for name, p := range map[string][]byte{
		"truncated": good[:len(good)-1],
		"trailing":  append(bytes.Clone(good), 0),
		"empty":     append(bytes.Clone(Magic), 1, 1, 2, 1, 2),
		"too many":  append(bytes.Clone(Magic), 0xff, 0xff, 0x03),
	} {
		if _, ok, err := Decode(p); !ok || !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: ok %v err %v; want ErrCorrupt", name, ok, err)
		}
	}
}

func TestEncodeRefuses(t *testing.T) {
	if _, err := Encode([]Range{{Start: []byte{2}, End: []byte{1}}}); err == nil {
		t.Fatal("an inverted range was encoded")
	}
	if _, err := Encode(make([]Range, MaxRanges+1)); err == nil {
		t.Fatal("too many ranges were encoded")
	}
}

func TestCoalesce(t *testing.T) {
	r := func(a, b byte) Range { return Range{Start: []byte{a}, End: []byte{b}} }
	got := Coalesce([]Range{r(5, 7), r(1, 3), r(2, 4), r(7, 8), r(20, 21)}, 0)
	want := []Range{r(1, 4), r(5, 8), r(20, 21)}
	if len(got) != len(want) {
		t.Fatalf("got %v", got)
	}
	for i := range want {
		if !bytes.Equal(got[i].Start, want[i].Start) || !bytes.Equal(got[i].End, want[i].End) {
			t.Fatalf("got %v, want %v", got, want)
		}
	}
	got = Coalesce([]Range{r(1, 2), r(3, 4), r(9, 10)}, 1)
	if len(got) != 1 || got[0].Start[0] != 1 || got[0].End[0] != 10 {
		t.Fatalf("capped to one: %v", got)
	}
	// Every input key stays covered whatever the cap.
	in := []Range{r(1, 2), r(30, 31), r(3, 4), r(200, 201), r(90, 95)}
	for max := 1; max <= len(in); max++ {
		out := Coalesce(in, max)
		if len(out) > max {
			t.Fatalf("cap %d: %d ranges", max, len(out))
		}
		for _, x := range in {
			covered := false
			for _, o := range out {
				if bytes.Compare(o.Start, x.Start) <= 0 && bytes.Compare(x.End, o.End) <= 0 {
					covered = true
				}
			}
			if !covered {
				t.Fatalf("cap %d: %v not covered by %v", max, x, out)
			}
		}
	}
}

// FuzzDecode: no input panics, and a decoded marker encodes back to the
// same payload.
func FuzzDecode(f *testing.F) {
	good, _ := Encode([]Range{{Start: []byte{1}, End: []byte{2}}})
	f.Add(good)
	f.Add([]byte("telha erase: scrub of the copies"))
	f.Add(append(bytes.Clone(Magic), 0))
	f.Fuzz(func(t *testing.T, p []byte) {
		rs, ok, err := Decode(p)
		if !ok || err != nil {
			return
		}
		again, err := Encode(rs)
		if err != nil {
			t.Fatalf("a decoded marker does not encode: %v", err)
		}
		if !bytes.Equal(again, p) {
			t.Fatalf("re-encoded %x, was %x", again, p)
		}
	})
}
