package cascade

import (
	"context"
	"io"
	"log/slog"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/telha/telha-cascade/storage"
)

var (
	ctx   = context.Background()
	t0    = time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)
	noLog = slog.New(slog.NewTextHandler(io.Discard, nil))
	anon  = storage.Provenance{Actor: "test", DecidedAt: storage.NoTs}
)

// env is one store + engine opened over a directory, with a frozen clock so
// that two runs of the same history write the same bytes.
type env struct {
	t     testing.TB
	dir   string
	clock *storage.ManualClock
	fault *storage.FaultEngine
	store *storage.Store
	ops   *Ops
	opts  Options
	// onTxnRead is the store's test signal (storage.Options.OnTxnRead).
	onTxnRead atomic.Pointer[func()]
}

func openEnv(t testing.TB, dir string, opts Options) *env {
	t.Helper()
	if dir == "" {
		dir = t.TempDir()
	}
	e := &env{t: t, dir: dir, clock: storage.NewManualClock(t0), opts: opts}
	e.open()
	t.Cleanup(e.close)
	return e
}

func (e *env) open() {
	e.t.Helper()
	s, err := storage.OpenStore(e.dir, storage.Options{
		Clock:  e.clock,
		Logger: noLog,
		WrapEngine: func(inner storage.Engine) storage.Engine {
			e.fault = storage.NewFaultEngine(inner)
			return e.fault
		},
		OnTxnRead: func() {
			if fn := e.onTxnRead.Load(); fn != nil {
				(*fn)()
			}
		},
	})
	if err != nil {
		e.t.Fatalf("open store: %v", err)
	}
	e.store = s
	if e.opts.Logger == nil {
		e.opts.Logger = noLog
	}
	e.ops = New(s, e.opts)
}

func (e *env) close() {
	e.ops = nil
	if e.store != nil {
		_ = e.store.Close()
		e.store = nil
	}
}

// restart simulates a process restart on the same data directory.
func (e *env) restart() {
	e.close()
	e.open()
}

func (e *env) node(sc storage.Scope, id uuid.UUID, from, to storage.Ts) storage.Ts {
	e.t.Helper()
	tx, err := e.ops.PutNode(ctx, sc, storage.NodeWrite{ID: id, ValidFrom: from, ValidTo: to, Prov: anon})
	if err != nil {
		e.t.Fatalf("put node %s: %v", id, err)
	}
	return tx
}

func (e *env) edge(sc storage.Scope, id, src, dst uuid.UUID, from, to storage.Ts) storage.Ts {
	e.t.Helper()
	tx, err := e.ops.PutEdge(ctx, sc, storage.EdgeWrite{ID: id, Src: src, Dst: dst, Label: "rel", ValidFrom: from, ValidTo: to, Prov: anon})
	if err != nil {
		e.t.Fatalf("put edge %s: %v", id, err)
	}
	return tx
}

func detUUID(r *rand.Rand) uuid.UUID {
	var u uuid.UUID
	for i := range u {
		u[i] = byte(r.UintN(256))
	}
	u[6] = (u[6] & 0x0f) | 0x40
	u[8] = (u[8] & 0x3f) | 0x80
	return u
}

func year(y int) storage.Ts {
	return storage.TsFromTime(time.Date(y, 1, 1, 0, 0, 0, 0, time.UTC))
}

// sameContents fails the test unless both stores hold identical bytes.
func sameContents(t testing.TB, a, b *storage.Store) {
	t.Helper()
	diff, err := storage.EqualContents(a.Reader(), b.Reader(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if diff != "" {
		t.Fatalf("store contents differ: %s", diff)
	}
}

func journalRows(t testing.TB, s *storage.Store, sc storage.Scope) int {
	t.Helper()
	n := 0
	for _, st := range []byte{storage.CascadeJournalState, storage.JournalPageState} {
		lo, hi := storage.JobsInState(sc, st)
		if err := storage.Scan(s.Reader(), lo, hi, func(_, _ []byte) error { n++; return nil }); err != nil {
			t.Fatal(err)
		}
	}
	return n
}
