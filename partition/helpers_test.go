package partition

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/telha/telha-cascade/internal/testnats"
)

// testCtx is a context that ends with the test, bounded so a hang fails.
func testCtx(t testing.TB, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func connectJS(t testing.TB, url string, opts ...nats.Option) jetstream.JetStream {
	t.Helper()
	nc := testnats.Connect(t, url, opts...)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js
}

// startJS starts an embedded single server and returns a JetStream client.
func startJS(t testing.TB) jetstream.JetStream {
	t.Helper()
	srv := testnats.Start(t)
	return connectJS(t, srv.ClientURL())
}

// startBucket starts an embedded single server (its store directory is
// srv.Opts.StoreDir, for scans of what it wrote) and opens the checkpoint
// bucket on it (a *Bucket: it seals what it stores).
func startBucket(t *testing.T) (context.Context, *testnats.Server, jetstream.JetStream, jetstream.ObjectStore) {
	t.Helper()
	ctx := testCtx(t, time.Minute)
	srv := testnats.Start(t)
	js := connectJS(t, srv.ClientURL())
	obs, err := OpenCheckpoints(ctx, js, CheckpointConfig{})
	if err != nil {
		t.Fatal(err)
	}
	return ctx, srv, js, obs
}

func openDB(t testing.TB, dir string) *pebble.DB {
	t.Helper()
	if dir == "" {
		dir = t.TempDir()
	}
	db, err := pebble.Open(dir, &pebble.Options{Logger: quietLogger{}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// owner is the write path the integration will have: build a batch, append
// its repr, mark it applied, commit it locally without fsync.
type owner struct {
	t   testing.TB
	cl  *Changelog
	db  *pebble.DB
	rng *rand.Rand
	n   int // keys written so far
}

func newOwner(t testing.TB, cl *Changelog, db *pebble.DB, seed uint64) *owner {
	return &owner{t: t, cl: cl, db: db, rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))}
}

// batch builds a random write-set: puts of small values in keyspace 0x01,
// some deletes and a range delete of earlier keys, and, if big > 0, one
// value of big bytes.
func (o *owner) batch(big int) *pebble.Batch {
	b := o.db.NewBatch()
	puts := 1 + o.rng.IntN(12)
	for range puts {
		v := make([]byte, 1+o.rng.IntN(200))
		for i := range v {
			v[i] = byte(o.rng.Uint32())
		}
		if err := b.Set(o.key(o.n), v, nil); err != nil {
			o.t.Fatal(err)
		}
		o.n++
	}
	if o.n > 10 && o.rng.IntN(3) == 0 {
		if err := b.Delete(o.key(o.rng.IntN(o.n)), nil); err != nil {
			o.t.Fatal(err)
		}
	}
	if o.n > 50 && o.rng.IntN(10) == 0 {
		lo := o.rng.IntN(o.n - 5)
		if err := b.DeleteRange(o.key(lo), o.key(lo+3), nil); err != nil {
			o.t.Fatal(err)
		}
	}
	if big > 0 {
		v := make([]byte, big)
		for i := range v {
			v[i] = byte(o.rng.Uint32())
		}
		if err := b.Set(o.key(o.n), v, nil); err != nil {
			o.t.Fatal(err)
		}
		o.n++
	}
	return b
}

func (o *owner) key(i int) []byte { return fmt.Appendf([]byte{0x01}, "k%08d", i) }

// commit appends b's write-set and, on success, commits b locally with its
// applied sequence. On an append error b is dropped (never applied).
func (o *owner) commit(ctx context.Context, b *pebble.Batch) (uint64, error) {
	defer b.Close()
	seq, err := o.cl.Append(ctx, b.Repr())
	if err != nil {
		return 0, err
	}
	if err := MarkApplied(b, seq); err != nil {
		return 0, err
	}
	if err := b.Commit(pebble.NoSync); err != nil {
		return 0, err
	}
	return seq, nil
}

func (o *owner) mustCommit(ctx context.Context, big int) uint64 {
	o.t.Helper()
	seq, err := o.commit(ctx, o.batch(big))
	if err != nil {
		o.t.Fatalf("append: %v", err)
	}
	return seq
}

// applyAll returns an ApplyFunc that applies to db and counts.
func applyAll(db *pebble.DB, count *int) ApplyFunc {
	return func(seq uint64, ws []byte) error {
		*count++
		return ApplyTo(db, seq, ws, false)
	}
}

// assertSameStore compares two stores key by key, value by value.
func assertSameStore(t testing.TB, want, got *pebble.DB) {
	t.Helper()
	wi, err := want.NewIter(nil)
	if err != nil {
		t.Fatal(err)
	}
	defer wi.Close()
	gi, err := got.NewIter(nil)
	if err != nil {
		t.Fatal(err)
	}
	defer gi.Close()
	n := 0
	wok, gok := wi.First(), gi.First()
	for ; wok && gok; wok, gok = wi.Next(), gi.Next() {
		if !bytes.Equal(wi.Key(), gi.Key()) {
			t.Fatalf("key %d: want %x, got %x", n, wi.Key(), gi.Key())
		}
		if !bytes.Equal(wi.Value(), gi.Value()) {
			t.Fatalf("key %x: values differ (%d vs %d bytes)", wi.Key(), len(wi.Value()), len(gi.Value()))
		}
		n++
	}
	if wok || gok {
		t.Fatalf("after %d equal keys: want has more=%t, got has more=%t", n, wok, gok)
	}
	if n == 0 {
		t.Fatal("compared two empty stores")
	}
}

func streamState(t testing.TB, cl *Changelog) jetstream.StreamState {
	t.Helper()
	info, err := cl.stream.Info(testCtx(t, 10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	return info.State
}

var (
	memDBOnce sync.Once
	memDB     *pebble.DB
)

// batchRepr returns the repr of a batch holding one put of value under a
// key in keyspace 0x01.
func batchRepr(t testing.TB, value string) []byte {
	t.Helper()
	memDBOnce.Do(func() {
		var err error
		memDB, err = pebble.Open("", &pebble.Options{FS: vfs.NewMem(), Logger: quietLogger{}})
		if err != nil {
			panic(err)
		}
	})
	b := memDB.NewBatch()
	if err := b.Set([]byte{0x01, 'v'}, []byte(value), nil); err != nil {
		t.Fatal(err)
	}
	return bytes.Clone(b.Repr())
}

// batchValue returns the value of the first record of a write-set.
func batchValue(t testing.TB, ws []byte) string {
	t.Helper()
	if err := ValidateWriteSet(ws); err != nil {
		t.Fatal(err)
	}
	_, rest, err := readStr(ws[batchHeaderLen+1:])
	if err != nil {
		t.Fatal(err)
	}
	v, _, err := readStr(rest)
	if err != nil {
		t.Fatal(err)
	}
	return string(v)
}
