package sealed

import (
	"context"
	"crypto/aes"
	"crypto/cipher"
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"github.com/nats-io/nats.go/jetstream"
)

// Meta is the object metadata that marks a sealed object, and V1 the
// only format: AES-256-GCM over segments of SegmentSize bytes of
// plaintext, segment i's nonce the 12-byte big-endian i, its additional
// data one byte (1 on the last segment, 0 before). Every segment but the
// last holds exactly SegmentSize bytes and the last less (possibly
// nothing), so a stream cut at a segment's end does not open.
const (
	Meta        = "telha-seal"
	V1          = "aes-256-gcm/64k/1"
	SegmentSize = 64 << 10
)

// ErrCorrupt: a sealed stream was altered, reordered, truncated or
// extended, or opened with another key.
var ErrCorrupt = errors.New("sealed: corrupt sealed data")

// ErrKeyDestroyed: a sealed object's data key is gone (its delete was cut
// short, or it was erased): the object can never be read again.
var ErrKeyDestroyed = errors.New("sealed: the object's data key is destroyed")

// KeysBucket is the KV bucket that holds the data keys of bucket's sealed
// objects, keyed by object name.
func KeysBucket(bucket string) string { return bucket + "_KEYS" }

// Key returns object name's data key from the key bucket kv, or an error
// wrapping ErrKeyDestroyed.
func Key(ctx context.Context, kv jetstream.KeyValue, name string) ([]byte, error) {
	e, err := kv.Get(ctx, name)
	if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
		return nil, fmt.Errorf("%s: %w", name, ErrKeyDestroyed)
	}
	if err != nil {
		return nil, fmt.Errorf("sealed: the data key of %s: %w", name, err)
	}
	if len(e.Value()) != 32 {
		return nil, fmt.Errorf("%w: the data key of %s has %d bytes", ErrCorrupt, name, len(e.Value()))
	}
	return e.Value(), nil
}

// Open returns the plaintext of object name, stored in format (its Meta)
// and read from r, its key read from kv.
func Open(ctx context.Context, kv jetstream.KeyValue, name, format string, r io.Reader) (io.Reader, error) {
	if format != V1 {
		return nil, fmt.Errorf("%w: %s is sealed in an unknown format %q", ErrCorrupt, name, format)
	}
	key, err := Key(ctx, kv, name)
	if err != nil {
		return nil, err
	}
	return NewOpenReader(r, key)
}

func newAEAD(key []byte) (cipher.AEAD, error) {
	blk, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	return cipher.NewGCM(blk)
}

// segmentNonce is segment i's nonce. Each object has a key of its own, so
// a counter never repeats under one key.
func segmentNonce(i uint64) []byte {
	n := make([]byte, 12)
	binary.BigEndian.PutUint64(n[4:], i)
	return n
}

// segmentAD binds a segment's place: whether it is the last one.
func segmentAD(last bool) []byte {
	if last {
		return []byte{1}
	}
	return []byte{0}
}

// sealReader seals what it reads from src, segment by segment.
type sealReader struct {
	src  io.Reader
	aead cipher.AEAD
	i    uint64
	pt   []byte
	buf  []byte // the sealed segment
	out  []byte // what of buf is not yet read
	done bool
}

// NewSealReader returns a reader of src sealed with key.
func NewSealReader(src io.Reader, key []byte) (io.Reader, error) {
	aead, err := newAEAD(key)
	if err != nil {
		return nil, err
	}
	return &sealReader{src: src, aead: aead, pt: make([]byte, SegmentSize), buf: make([]byte, 0, SegmentSize+aead.Overhead())}, nil
}

func (s *sealReader) Read(p []byte) (int, error) {
	for len(s.out) == 0 {
		if s.done {
			return 0, io.EOF
		}
		n, err := io.ReadFull(s.src, s.pt)
		last := false
		switch {
		case errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF):
			last = true
		case err != nil:
			return 0, err
		}
		s.buf = s.aead.Seal(s.buf[:0], segmentNonce(s.i), s.pt[:n], segmentAD(last))
		s.out = s.buf
		s.i++
		s.done = last
	}
	n := copy(p, s.out)
	s.out = s.out[n:]
	return n, nil
}

// openReader opens a sealed stream read from src.
type openReader struct {
	src  io.Reader
	aead cipher.AEAD
	i    uint64
	ct   []byte
	out  []byte
	done bool
}

// NewOpenReader returns a reader of the plaintext of the sealed stream
// src. A stream altered, truncated at any point, or extended past its
// last segment fails with ErrCorrupt.
func NewOpenReader(src io.Reader, key []byte) (io.Reader, error) {
	aead, err := newAEAD(key)
	if err != nil {
		return nil, err
	}
	return &openReader{src: src, aead: aead, ct: make([]byte, SegmentSize+aead.Overhead())}, nil
}

func (o *openReader) Read(p []byte) (int, error) {
	for len(o.out) == 0 {
		if o.done {
			return 0, io.EOF
		}
		full := SegmentSize + o.aead.Overhead()
		n, err := io.ReadFull(o.src, o.ct[:full])
		last := false
		switch {
		case errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF):
			last = true
		case err != nil:
			return 0, err
		}
		if last && n < o.aead.Overhead() {
			return 0, fmt.Errorf("%w: a sealed stream cut short (segment %d of %d bytes)", ErrCorrupt, o.i, n)
		}
		pt, err := o.aead.Open(o.ct[:0], segmentNonce(o.i), o.ct[:n], segmentAD(last))
		if err != nil {
			return 0, fmt.Errorf("%w: sealed segment %d does not open (altered, reordered or cut short)", ErrCorrupt, o.i)
		}
		o.i++
		o.out = pt
		o.done = last
	}
	n := copy(p, o.out)
	o.out = o.out[n:]
	return n, nil
}
