package storage

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/batchrepr"
	"github.com/google/uuid"
)

// logDurable is a Durable that keeps write-sets in memory, as a changelog
// would, or refuses them once fail is set. It is the seam's other side,
// not a mock of NATS: package partition's tests cover JetStream.
type logDurable struct {
	mu   sync.Mutex
	sets [][]byte
	fail error
}

func (d *logDurable) Append(_ context.Context, ws []byte) (uint64, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.fail != nil {
		return 0, d.fail
	}
	d.sets = append(d.sets, bytes.Clone(ws))
	return uint64(len(d.sets)), nil
}

func (d *logDurable) len() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.sets)
}

// syncCounter counts the engine's fsynced and unsynced commits.
type syncCounter struct {
	Engine
	synced, unsynced atomic.Int64
}

func (e *syncCounter) Commit(b *pebble.Batch) error {
	e.synced.Add(1)
	return e.Engine.Commit(b)
}

func (e *syncCounter) CommitNoSync(b *pebble.Batch) error {
	e.unsynced.Add(1)
	return e.Engine.CommitNoSync(b)
}

func openDurable(t *testing.T, dir string, d Durable) (*Store, *syncCounter) {
	t.Helper()
	var ec *syncCounter
	s, err := OpenStore(dir, Options{Clock: NewManualClock(t0), Logger: quietLog, Durable: d,
		WrapEngine: func(e Engine) Engine { ec = &syncCounter{Engine: e}; return ec }})
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s, ec
}

func appliedIn(t *testing.T, r pebble.Reader) (uint64, bool) {
	t.Helper()
	v, ok, err := getValue(r, AppliedSeqKey())
	if err != nil {
		t.Fatal(err)
	}
	if !ok {
		return 0, false
	}
	if len(v) != 8 {
		t.Fatalf("applied sequence of %d bytes", len(v))
	}
	return binary.BigEndian.Uint64(v), true
}

// TestDurableCommitAppendsFirstAndSkipsFsync: with a Durable, every batch
// (the format key at open, puts) goes to it first, the applied sequence
// lands in the same local batch, the local commit is not fsynced, the
// write-sets never carry the marker, and replaying them on an empty Pebble
// rebuilds the same keys.
func TestDurableCommitAppendsFirstAndSkipsFsync(t *testing.T) {
	d := &logDurable{}
	s, ec := openDurable(t, t.TempDir(), d)
	sc := MustScope("acme")
	a, b := uuid.New(), uuid.New()
	mustNode(t, s, sc, a)
	mustNode(t, s, sc, b)
	mustEdge(t, s, sc, uuid.New(), a, b)

	if ec.synced.Load() != 0 {
		t.Fatalf("%d fsynced commits with a Durable set, want 0", ec.synced.Load())
	}
	if n := d.len(); n < 4 || ec.unsynced.Load() != int64(n) {
		t.Fatalf("%d write-sets appended, %d unsynced local commits: want one each, at least 4 (format key, 3 puts)", n, ec.unsynced.Load())
	}
	if seq, ok := appliedIn(t, s.Reader()); !ok || seq != uint64(d.len()) {
		t.Fatalf("applied sequence %d (present %t), want %d", seq, ok, d.len())
	}
	replica, err := pebble.Open(t.TempDir(), &pebble.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer replica.Close()
	for i, ws := range d.sets {
		r := batchrepr.Read(ws)
		for {
			_, k, _, ok, err := r.Next()
			if err != nil {
				t.Fatal(err)
			}
			if !ok {
				break
			}
			if bytes.Equal(k, AppliedSeqKey()) {
				t.Fatalf("write-set %d carries the applied marker", i+1)
			}
		}
		b := replica.NewBatch()
		if err := b.SetRepr(bytes.Clone(ws)); err != nil {
			t.Fatal(err)
		}
		if err := b.Commit(pebble.NoSync); err != nil {
			t.Fatal(err)
		}
	}
	if got, want := dump(t, replica), dump(t, s.Reader()); got != want {
		t.Fatalf("the write-sets replayed do not rebuild the store:\nreplayed %s\nstore    %s", got, want)
	}
}

// dump renders every key and value outside the partition keyspace.
func dump(t *testing.T, r pebble.Reader) string {
	t.Helper()
	var buf bytes.Buffer
	if err := scan(r, []byte{0x00}, []byte{ksPartition}, func(k, v []byte) error {
		buf.WriteString(string(k) + "=" + string(v) + ";")
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return buf.String()
}

// TestDurableFailureStopsTheStore: an Append that fails leaves nothing
// committed locally, fails the store (Fatal, an error wrapping ErrFatal and
// ErrStorage) and refuses every later write without asking the Durable.
func TestDurableFailureStopsTheStore(t *testing.T) {
	d := &logDurable{}
	s, ec := openDurable(t, t.TempDir(), d)
	sc := MustScope("acme")
	mustNode(t, s, sc, uuid.New())
	commits, appended := ec.unsynced.Load(), d.len()

	fenced := errors.New("fenced: another writer appended")
	d.mu.Lock()
	d.fail = fenced
	d.mu.Unlock()
	lost := uuid.New()
	_, err := s.PutNode(context.Background(), sc, NodeWrite{ID: lost, ValidFrom: NoTs, ValidTo: NoTs})
	if !errors.Is(err, ErrFatal) || !errors.Is(err, ErrStorage) || !errors.Is(err, fenced) {
		t.Fatalf("put after a refused append: %v, want ErrFatal, ErrStorage and the Durable's error", err)
	}
	select {
	case <-s.Fatal():
	default:
		t.Fatal("store not failed after a refused append")
	}
	if !errors.Is(s.FatalErr(), fenced) {
		t.Fatalf("FatalErr %v", s.FatalErr())
	}
	if _, ok, err := s.Latest(sc, KindNode, lost); err != nil || ok {
		t.Fatalf("the refused node reads back (ok %t, err %v): it was committed locally", ok, err)
	}
	if ec.unsynced.Load() != commits || ec.synced.Load() != 0 {
		t.Fatalf("local commits %d/%d after the refusal, want %d/0", ec.unsynced.Load(), ec.synced.Load(), commits)
	}

	d.mu.Lock()
	d.fail = nil
	d.mu.Unlock()
	_, err = s.PutNode(context.Background(), sc, NodeWrite{ID: uuid.New(), ValidFrom: NoTs, ValidTo: NoTs})
	if !errors.Is(err, ErrStorage) {
		t.Fatalf("put on a stopped store: %v, want a refusal", err)
	}
	if d.len() != appended || ec.unsynced.Load() != commits {
		t.Fatalf("a stopped store appended (%d -> %d) or committed (%d -> %d)", appended, d.len(), commits, ec.unsynced.Load())
	}
}

// TestNoDurableFsyncsAndWritesNoMarker: without a Durable the store is
// what it was: every commit fsynced, no applied sequence.
func TestNoDurableFsyncsAndWritesNoMarker(t *testing.T) {
	s, ec := openDurable(t, t.TempDir(), nil)
	mustNode(t, s, MustScope("acme"), uuid.New())
	if ec.synced.Load() < 2 || ec.unsynced.Load() != 0 {
		t.Fatalf("%d fsynced and %d unsynced commits, want every one fsynced", ec.synced.Load(), ec.unsynced.Load())
	}
	if _, ok := appliedIn(t, s.Reader()); ok {
		t.Fatal("applied sequence written without a Durable")
	}
}

// stuckDurable is a changelog that takes appends and never answers (its
// NATS server cut off or paused): each Append waits for its context.
type stuckDurable struct{ logDurable }

func (d *stuckDurable) Append(ctx context.Context, ws []byte) (uint64, error) {
	if d.len() == 0 { // the format key at open goes through
		return d.logDurable.Append(ctx, ws)
	}
	<-ctx.Done()
	return 0, ctx.Err()
}

// TestAbortAppendsEndsAnAppendInFlight: a slot leaving while its changelog
// cannot answer ends the append in flight (and the writes queued behind
// it) at once, rather than each waiting out its 20 s bound inside Close:
// the write fails as a refused append does, the store stops, and Close
// returns.
func TestAbortAppendsEndsAnAppendInFlight(t *testing.T) {
	s, _ := openDurable(t, t.TempDir(), &stuckDurable{})
	sc := MustScope("acme")
	errs := make(chan error, 2)
	for range 2 {
		go func() {
			_, err := s.PutNode(context.Background(), sc, NodeWrite{ID: uuid.New(), ValidFrom: NoTs, ValidTo: NoTs})
			errs <- err
		}()
	}
	s.AbortAppends()
	for range 2 {
		if err := <-errs; !errors.Is(err, ErrStorage) {
			t.Fatalf("a put whose append was aborted: %v, want ErrStorage", err)
		}
	}
	if err := s.FatalErr(); !errors.Is(err, ErrFatal) || !errors.Is(err, context.Canceled) {
		t.Fatalf("the store's fatal error after an aborted append: %v", err)
	}
	closed := make(chan error, 1)
	go func() { closed <- s.Close() }()
	select {
	case err := <-closed:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(DefaultDurableTimeout / 2):
		t.Fatal("Close still waits for an aborted append")
	}
}
