package sealed

import (
	"bytes"
	"crypto/rand"
	"errors"
	"io"
	"testing"
)

// TestSealRoundTripAndTampering: every length around the segment size
// opens to what was sealed; a stream cut at any byte, extended, or with a
// byte flipped does not open (ErrCorrupt), and neither does another key.
func TestSealRoundTripAndTampering(t *testing.T) {
	key := make([]byte, 32)
	_, _ = rand.Read(key)
	for _, n := range []int{0, 1, 100, SegmentSize - 1, SegmentSize, SegmentSize + 1, 2 * SegmentSize, 3*SegmentSize + 7} {
		pt := make([]byte, n)
		_, _ = rand.Read(pt)
		sr, err := NewSealReader(bytes.NewReader(pt), key)
		if err != nil {
			t.Fatal(err)
		}
		ct, err := io.ReadAll(iotestHalfReader{sr})
		if err != nil {
			t.Fatal(err)
		}
		if bytes.Contains(ct, pt[:min(n, 64)]) && n >= 16 {
			t.Fatalf("%d bytes: the sealed stream holds the plaintext", n)
		}
		got, err := openAll(ct, key)
		if err != nil || !bytes.Equal(got, pt) {
			t.Fatalf("%d bytes: opened %d bytes, %v", n, len(got), err)
		}
		for _, cut := range []int{0, len(ct) - 1, len(ct) - 16, len(ct) - 17, SegmentSize + 16} {
			if cut < 0 || cut >= len(ct) {
				continue
			}
			if _, err := openAll(ct[:cut], key); !errors.Is(err, ErrCorrupt) {
				t.Fatalf("%d bytes cut to %d: %v, want ErrCorrupt", n, cut, err)
			}
		}
		if _, err := openAll(append(bytes.Clone(ct), 0), key); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("%d bytes extended by one: %v, want ErrCorrupt", n, err)
		}
		flip := bytes.Clone(ct)
		flip[len(flip)/2] ^= 1
		if _, err := openAll(flip, key); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("%d bytes, a byte flipped: %v, want ErrCorrupt", n, err)
		}
		other := bytes.Clone(key)
		other[0] ^= 1
		if _, err := openAll(ct, other); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("%d bytes under another key: %v, want ErrCorrupt", n, err)
		}
	}
}

// iotestHalfReader reads at most half of what is asked (odd read sizes).
type iotestHalfReader struct{ r io.Reader }

func (h iotestHalfReader) Read(p []byte) (int, error) { return h.r.Read(p[:max(1, len(p)/2)]) }

func openAll(ct, key []byte) ([]byte, error) {
	r, err := NewOpenReader(bytes.NewReader(ct), key)
	if err != nil {
		return nil, err
	}
	return io.ReadAll(r)
}

// FuzzOpenSealed: no input makes the opener panic, and whatever opens
// under the fuzzer's key was sealed under it (it seals the input and
// checks the round trip too).
func FuzzOpenSealed(f *testing.F) {
	key := bytes.Repeat([]byte{7}, 32)
	for _, n := range []int{0, 5, SegmentSize + 3} {
		sr, _ := NewSealReader(bytes.NewReader(make([]byte, n)), key)
		ct, _ := io.ReadAll(sr)
		f.Add(ct)
	}
	f.Add([]byte("not sealed"))
	f.Fuzz(func(t *testing.T, data []byte) {
		if _, err := openAll(data, key); err != nil && !errors.Is(err, ErrCorrupt) {
			t.Fatalf("an error that is not ErrCorrupt: %v", err)
		}
		sr, err := NewSealReader(bytes.NewReader(data), key)
		if err != nil {
			t.Fatal(err)
		}
		ct, err := io.ReadAll(sr)
		if err != nil {
			t.Fatal(err)
		}
		if got, err := openAll(ct, key); err != nil || !bytes.Equal(got, data) {
			t.Fatalf("round trip of %d bytes: %d bytes, %v", len(data), len(got), err)
		}
	})
}
