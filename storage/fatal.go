package storage

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
)

// ErrFatal: Pebble hit an error it cannot continue after (a failed WAL or
// MANIFEST write leaves its commit pipeline unusable). Everything synced
// before it is intact and no write-set is partial (WAL batches are atomic),
// but this process can commit nothing more: the caller must stop and let
// its supervisor restart it. The store never ends the process itself;
// cmd/worker decides the exit status.
var ErrFatal = errors.New("fatal storage error")

// ErrEngine marks a fatal error Pebble itself raised (wrapped with
// ErrFatal): the engine must not be used or closed again, so its
// directory stays locked until the process exits (Store.Parked). A store
// that stopped on its own decision (fenced, Stop) does not carry it.
var ErrEngine = errors.New("pebble failed")

type fatalState struct {
	once   sync.Once
	ch     chan struct{}
	err    error
	parked atomic.Bool // raise parked a goroutine: Pebble itself failed
}

func newFatalState() *fatalState { return &fatalState{ch: make(chan struct{})} }

// raise records the first fatal error and wakes Fatal's waiters. Pebble
// requires its Fatalf not to return, so the calling goroutine (Pebble's,
// or the writer's inside a commit) parks for good: the process is about
// to stop, and nothing that goroutine would do next is safe.
func (f *fatalState) raise(msg string) {
	f.parked.Store(true)
	f.once.Do(func() {
		f.err = fmt.Errorf("%w: %w: %s", ErrFatal, ErrEngine, msg)
		close(f.ch)
	})
	select {}
}

// fail records err as the store's fatal error (if it is the first) and
// returns, unlike raise: the store itself decided to stop (a Durable
// refused or could not confirm a write-set), the caller's goroutine is
// healthy and returns the error to its task.
func (f *fatalState) fail(err error) {
	f.once.Do(func() {
		f.err = err
		close(f.ch)
	})
}

// Fatal returns a channel closed when the store hits a fatal error; FatalErr
// then says which (wrapping ErrFatal).
func (s *Store) Fatal() <-chan struct{} { return s.fatal.ch }

// Parked reports whether Pebble itself failed (its fatal handler parked
// the goroutine that hit it, possibly the writer inside a commit): the
// engine must not be closed or used again, and only the process's exit
// releases its directory. A store that stopped on its own decision (a
// fenced or unconfirmed changelog append, AbortAppends, Stop) is not
// parked: its writer returns, and Close releases the directory, so the
// slot can be opened again in the same process.
func (s *Store) Parked() bool { return s.fatal.parked.Load() }

// FatalErr returns the fatal error, or nil.
func (s *Store) FatalErr() error {
	select {
	case <-s.fatal.ch:
		return s.fatal.err
	default:
		return nil
	}
}

// Stop records err, wrapped in ErrFatal, as the store's fatal error (if it
// is the first): Fatal closes and every later commit is refused, as after
// a fenced Append. It is for a part of the slot outside the store that
// learns the store's copy is no longer the partition's (the change feed,
// asking its changelog before it publishes).
func (s *Store) Stop(err error) {
	if !errors.Is(err, ErrFatal) {
		err = fmt.Errorf("%w: %w", ErrFatal, err)
	}
	_ = s.stop(err)
}
