package storage

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"
	"github.com/google/uuid"
)

func TestDiskGuardRefusesWritesUnderTheReserve(t *testing.T) {
	var free atomic.Uint64
	free.Store(1 << 30)
	s, err := OpenStore(t.TempDir(), Options{Clock: NewManualClock(t0), MinFreeBytes: 64 << 20, DiskFree: func() (uint64, error) { return free.Load(), nil }})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	sc := MustScope("disk")
	mustNode(t, s, sc, uuid.New())
	free.Store(10 << 20)
	s.diskAt = s.diskAt.Add(-2e9) // the reading is cached for a second
	_, err = s.PutNode(context.Background(), sc, NodeWrite{ID: uuid.New(), ValidFrom: NoTs, ValidTo: NoTs})
	if !errors.Is(err, ErrDiskFull) || !errors.Is(err, ErrStorage) || !IsRetryable(err) {
		t.Fatalf("write under the reserve: %v, want a retryable ErrDiskFull", err)
	}
	if !strings.Contains(err.Error(), "10485760 bytes free") {
		t.Fatalf("error %q does not say how much is free", err)
	}
	if n, last := s.Health(); n != 1 || last == "" {
		t.Fatalf("health after the refusal: %d %q", n, last)
	}
	free.Store(1 << 30)
	s.diskAt = s.diskAt.Add(-2e9)
	mustNode(t, s, sc, uuid.New())
	if n, _ := s.Health(); n != 0 {
		t.Fatal("a success did not reset the failure count")
	}
	if err := Verify(s.Reader()); err != nil {
		t.Fatal(err)
	}
}

// TestFlushAndCompactionErrorsAreSurvived: Pebble retries failed sstable
// writes (flushes, compactions) in the background. With a small memtable
// and a filesystem that fails a third of sstable writes, every commit still
// succeeds, and the reopened store holds all of it, whole.
func TestFlushAndCompactionErrorsAreSurvived(t *testing.T) {
	dir := t.TempDir()
	// Every third sstable Pebble creates fails on every write: the flush
	// or compaction writing it fails and is retried with a new file.
	var (
		on       atomic.Bool
		injected atomic.Int64
		mu       sync.Mutex
		seen     = map[string]bool{}
		bad      = map[string]bool{}
	)
	inj := errorfs.InjectorFunc(func(op errorfs.Op) error {
		if !on.Load() || op.Kind.ReadOrWrite() != errorfs.OpIsWrite || !strings.HasSuffix(op.Path, ".sst") {
			return nil
		}
		mu.Lock()
		defer mu.Unlock()
		if !seen[op.Path] {
			seen[op.Path] = true
			bad[op.Path] = len(seen)%3 == 0
		}
		if bad[op.Path] {
			injected.Add(1)
			return errorfs.ErrInjected
		}
		return nil
	})
	small := func(o *pebble.Options) { o.MemTableSize = 256 << 10 }
	s, err := OpenStore(dir, Options{Clock: NewManualClock(t0), FS: errorfs.Wrap(vfs.Default, inj), Pebble: small, Logger: quietLog})
	if err != nil {
		t.Fatal(err)
	}
	sc := MustScope("flush")
	on.Store(true)
	hub := uuid.New()
	mustNode(t, s, sc, hub)
	const n = 3000
	for i := 0; i < n; i++ {
		err = s.Update(context.Background(), func(tx *Txn) error {
			m := uuid.New()
			if _, err := tx.PutNode(sc, NodeWrite{ID: m, ValidFrom: NoTs, ValidTo: NoTs, Props: []byte(`{"pad":"` + strings.Repeat("x", 200) + `"}`)}); err != nil {
				return err
			}
			_, err := tx.PutEdge(sc, EdgeWrite{ID: uuid.New(), Src: hub, Dst: m, ValidFrom: NoTs, ValidTo: NoTs})
			return err
		})
		if err != nil {
			t.Fatalf("commit %d with failing sstable writes: %v", i, err)
		}
	}
	on.Store(false)
	if injected.Load() == 0 {
		t.Fatal("no sstable write failed: the test exercised nothing")
	}
	t.Logf("%d sstable writes failed and were retried", injected.Load())
	if err := s.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	s2 := openTest(t, dir, nil)
	es, err := s2.EdgesOf(sc, hub, DirOut, OpenEnd-1, OpenEnd-1)
	if err != nil || len(es) != n {
		t.Fatalf("after reopen: %d edges (%v), want %d", len(es), err, n)
	}
	if err := Verify(s2.Reader()); err != nil {
		t.Fatal(err)
	}
}

// TestWALWriteFailureIsFatalAndLeavesNoPartialWriteSet: Pebble cannot
// continue after a failed WAL write (its commit pipeline is unusable), so
// the store raises Fatal (it never ends the process itself); the child,
// like cmd/worker, then exits with status 3 for the supervisor to restart
// it. A child process writes edges (5 puts
// each, one batch per edge) until the filesystem starts failing WAL
// writes; the parent then reopens the directory: every write the child saw
// acknowledged is there, and no write-set is partial.
func TestWALWriteFailureIsFatalAndLeavesNoPartialWriteSet(t *testing.T) {
	if dir := os.Getenv("TELHA_WAL_FAULT_CHILD"); dir != "" {
		walFaultChild(dir)
		return
	}
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^TestWALWriteFailureIsFatalAndLeavesNoPartialWriteSet$")
	cmd.Env = append(os.Environ(), "TELHA_WAL_FAULT_CHILD="+dir)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, _ := cmd.Output()
	if code := cmd.ProcessState.ExitCode(); code != walChildFatalExit {
		t.Fatalf("child exit %d, want %d (fatal storage error)\nstderr:\n%s", code, walChildFatalExit, stderr.String())
	}
	if !strings.Contains(stderr.String(), "fatal storage error") {
		t.Fatalf("no clear fatal error in the log:\n%s", stderr.String())
	}
	var acked []uuid.UUID
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	for sc.Scan() {
		if id, ok := strings.CutPrefix(sc.Text(), "acked "); ok {
			acked = append(acked, uuid.MustParse(id))
		}
	}
	if len(acked) < 20 {
		t.Fatalf("child acknowledged only %d writes before the fault", len(acked))
	}
	s := openTest(t, dir, nil)
	for _, id := range acked {
		if _, ok, err := s.Latest(MustScope("wal"), KindEdge, id); err != nil || !ok {
			t.Fatalf("acknowledged edge %s lost after the fatal error (%v)", id, err)
		}
	}
	if err := Verify(s.Reader()); err != nil {
		t.Fatalf("partial write-set after the fatal error: %v", err)
	}
}

const walChildFatalExit = 3

func walFaultChild(dir string) {
	var armed atomic.Bool
	inj := errorfs.InjectorFunc(func(op errorfs.Op) error {
		if armed.Load() && op.Kind.ReadOrWrite() == errorfs.OpIsWrite && strings.HasSuffix(op.Path, ".log") {
			return errorfs.ErrInjected
		}
		return nil
	})
	s, err := OpenStore(dir, Options{Clock: NewManualClock(t0), FS: errorfs.Wrap(vfs.Default, inj)})
	if err != nil {
		fmt.Fprintln(os.Stderr, "open:", err)
		os.Exit(1)
	}
	go func() {
		<-s.Fatal()
		if !errors.Is(s.FatalErr(), ErrFatal) {
			os.Exit(1)
		}
		fmt.Fprintln(os.Stderr, s.FatalErr())
		os.Exit(walChildFatalExit)
	}()
	sc := MustScope("wal")
	a, b := uuid.New(), uuid.New()
	for _, n := range []uuid.UUID{a, b} {
		if _, err := s.PutNode(context.Background(), sc, NodeWrite{ID: n, ValidFrom: NoTs, ValidTo: NoTs}); err != nil {
			fmt.Fprintln(os.Stderr, "put:", err)
			os.Exit(1)
		}
	}
	for i := 0; ; i++ {
		if i == 40 {
			armed.Store(true)
		}
		id := uuid.New()
		if _, err := s.PutEdge(context.Background(), sc, EdgeWrite{ID: id, Src: a, Dst: b, ValidFrom: NoTs, ValidTo: NoTs}); err != nil {
			fmt.Fprintln(os.Stderr, "put edge returned instead of a fatal exit:", err)
			os.Exit(1)
		}
		fmt.Printf("acked %s\n", id)
	}
}
