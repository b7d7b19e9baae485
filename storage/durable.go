package storage

import (
	"context"
	"encoding/binary"
	"fmt"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/telha/telha-cascade/internal/scrubmark"
)

// Durable makes a write-set durable somewhere other than this disk: a
// replicated changelog (package partition implements it on JetStream;
// storage never imports partition, nor NATS).
//
// When Options.Durable is set, the one place batches become durable
// (Store.commit, on the writer) does, for every batch b:
//
//	seq, err := Append(ctx, b.Repr())    the write-set, without the marker
//	b.Set(AppliedSeqKey(), seq)          the position, in the same batch
//	commit b locally, without fsync      the changelog holds it
//
// Invariant (log first): no batch is visible in this store, so no result
// built from it is published and no request acked (those happen after
// commit returns: Update's and CommitBatch's callers), before its
// write-set is in the changelog. A crash after Append and before the local
// commit loses nothing: the next start replays the changelog from the
// store's applied sequence.
//
// Invariant (a failed Append is terminal): an Append error means another
// writer owns the changelog (fenced) or that the write-set may or may not
// be in it (unknown outcome). Either way this store's state may differ from
// the log's, so it stops: the batch is not committed, the error (wrapping
// ErrFatal and ErrStorage) is recorded as the store's fatal error (Fatal
// closes), and every later commit is refused. The worker exits on it and
// its supervisor restarts it; the next start replays the log, which settles
// an unknown outcome. A local commit that fails after a successful Append is
// terminal for the same reason: the log holds a write-set this store does
// not, and a retry would compute a second, different one.
type Durable interface {
	// Append makes writeSet durable and returns the sequence to record with
	// it. It must not keep writeSet after returning.
	Append(ctx context.Context, writeSet []byte) (seq uint64, err error)
}

// CopyScrubber makes erased bytes leave the durable copies of a store
// that live outside its disk: with a changelog, its stream's files, the
// checkpoints and the standbys' copies (slot/changelog.go implements it;
// storage never imports NATS).
//
// # Erasure and the copies
//
// Invariant (an erase reaches every copy before its result): Scrub, after
// it has made the erased bytes leave the local disk, and before the erase's
// finishing batch (receipt, result outbox row, erasure record) can commit,
// does:
//
//	on the writer: commit a marker write-set    its sequence S is the
//	  (log data only: the erase's key ranges,   first the copies may hold
//	  internal/scrubmark)                       without the erased bytes
//	ScrubCopies(ctx, S, onWriter)               the copies below S hold no
//	                                            erased byte once it returns
//
// Every write-set up to S is in the local store, which the scrub just made
// free of the erased bytes, so a checkpoint taken from S on holds none of
// them. The writer is NOT held while the copies are scrubbed (issue 29):
// other groups commit meanwhile; ScrubCopies runs the short steps that
// need the log to stand still (its final purge) through onWriter. A copy
// that applies the marker (a standby, a replay) compacts its ranges
// (partition.ScrubPending). An error fails the erase's attempt: its result
// is not stored (nor published), and the reaper retries it after a
// backoff.
type CopyScrubber interface {
	ScrubCopies(ctx context.Context, marker uint64, onWriter func(context.Context, func() error) error) error
}

// commitMarker commits an erase's marker (ranges: the key ranges the
// erase compacted) on the writer and returns its sequence.
func (s *Store) commitMarker(ctx context.Context, ranges []scrubmark.Range) (uint64, error) {
	payload, err := scrubmark.Encode(scrubmark.Coalesce(ranges, scrubmark.MaxRanges))
	if err != nil {
		return 0, fmt.Errorf("%w: erase marker: %w", ErrStorage, err)
	}
	var marker uint64
	err = s.w.do(ctx, Foreground, func() error {
		b := s.eng.NewBatch()
		defer b.Close()
		if err := b.LogData(payload, nil); err != nil {
			return fmt.Errorf("%w: erase marker: %w", ErrStorage, err)
		}
		if err := s.commit(b); err != nil {
			return err
		}
		marker = s.appended.Load()
		return nil
	})
	return marker, err
}

// DefaultDurableTimeout bounds one Append when Options.DurableTimeout is 0:
// above a JetStream leader election (a few seconds), below the consumer's
// AckWait (30 s), so a stalled changelog ends the process (and its
// in-flight requests are redelivered) rather than stalling the writer.
const DefaultDurableTimeout = 20 * time.Second

// commitDurable is commit's path when a Durable is set. Its errors other
// than a refused Append before anything was sent are all terminal.
func (s *Store) commitDurable(b *pebble.Batch) error {
	if err := s.FatalErr(); err != nil {
		return fmt.Errorf("%w: store stopped: %w", ErrStorage, err)
	}
	ctx, cancel := context.WithTimeout(s.appends, s.durableTimeout)
	// The repr is taken before the applied marker is added: the changelog
	// carries the write-set only; a reader adds its own marker (ApplyTo).
	seq, err := s.durable.Append(ctx, b.Repr())
	cancel()
	if err != nil {
		return s.stop(fmt.Errorf("%w: %w: changelog append of %d ops refused or unconfirmed; this store stops answering: %w",
			ErrFatal, ErrStorage, b.Count(), err))
	}
	s.appended.Store(seq)
	if err := b.Set(AppliedSeqKey(), binary.BigEndian.AppendUint64(nil, seq), nil); err != nil {
		return s.stop(fmt.Errorf("%w: %w: mark applied sequence %d: %w", ErrFatal, ErrStorage, seq, err))
	}
	if err := s.eng.CommitNoSync(b); err != nil {
		return s.stop(fmt.Errorf("%w: %w: local commit of changelog sequence %d (%d ops) failed after the changelog stored it: %w",
			ErrFatal, ErrStorage, seq, b.Count(), err))
	}
	return nil
}

// AbortAppends ends the changelog appends in flight at once, unconfirmed,
// and every later one before it is sent: the store stops (its fatal
// error; a restart replays the changelog, which may hold them or not).
// For a slot leaving while its changelog cannot answer (cut off from
// NATS, or past its drain's grace with work in flight): Close runs the
// writes queued, and each would wait out the append's bound (20 s).
func (s *Store) AbortAppends() { s.abortAppends() }

// stop records err as the store's fatal error and returns it.
func (s *Store) stop(err error) error {
	s.log.Error("store stopped: a restart replays the changelog", "err", err)
	s.fatal.fail(err)
	return err
}

// DB returns the Pebble database under the store (checkpoints), or nil
// for a store opened over another engine (OpenEngine).
func (s *Store) DB() *pebble.DB { return s.db }

// Durable reports whether the store commits through a Durable.
func (s *Store) Durable() bool { return s.durable != nil }
