package partition

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// ApplyFunc receives one whole write-set and the sequence of its last
// message (the applied sequence to record with it). writeSet is only valid
// during the call: ApplyTo copies it.
type ApplyFunc func(seq uint64, writeSet []byte) error

// Replay calls fn, in order, for every whole write-set whose last message
// is at a sequence >= fromSeq and <= the stream's last sequence when Replay
// starts, then returns nil. A torn write-set (parts without their last part,
// left by an owner that died between parts) is skipped. fromSeq is a
// reader's applied sequence + 1 (1 for an empty store); if the changelog was
// purged above it, Replay returns ErrTruncated: restore a checkpoint first.
// An error from fn stops the replay and is returned.
func (c *Changelog) Replay(ctx context.Context, fromSeq uint64, fn ApplyFunc) error {
	info, err := c.stream.Info(ctx)
	if err != nil {
		return fmt.Errorf("partition %d: changelog info: %w", c.cfg.Partition, err)
	}
	fromSeq = max(fromSeq, 1)
	if err := c.checkHeld(fromSeq, info.State); err != nil {
		return err
	}
	if fromSeq > info.State.LastSeq {
		return nil
	}
	return c.read(ctx, fromSeq, info.State.LastSeq, fn)
}

// ReadRange calls fn, in order, for every whole write-set whose last
// message is in [fromSeq, through] (through must be stored), and
// ErrTruncated when the log was purged above fromSeq.
func (c *Changelog) ReadRange(ctx context.Context, fromSeq, through uint64, fn ApplyFunc) error {
	fromSeq = max(fromSeq, 1)
	if through < fromSeq {
		return nil
	}
	info, err := c.stream.Info(ctx)
	if err != nil {
		return fmt.Errorf("partition %d: changelog info: %w", c.cfg.Partition, err)
	}
	if err := c.checkHeld(fromSeq, info.State); err != nil {
		return err
	}
	if through > info.State.LastSeq {
		return fmt.Errorf("partition %d: read through %d, the log ends at %d", c.cfg.Partition, through, info.State.LastSeq)
	}
	return c.read(ctx, fromSeq, through, fn)
}

// Tail is Replay that does not stop at the end: it keeps following the
// changelog (a warm standby's loop) until ctx ends, and then returns
// ctx.Err(), or until fn or the changelog fails.
func (c *Changelog) Tail(ctx context.Context, fromSeq uint64, fn ApplyFunc) error {
	info, err := c.stream.Info(ctx)
	if err != nil {
		return fmt.Errorf("partition %d: changelog info: %w", c.cfg.Partition, err)
	}
	fromSeq = max(fromSeq, 1)
	if err := c.checkHeld(fromSeq, info.State); err != nil {
		return err
	}
	c.noteRead(fromSeq - 1) // the caller holds every write-set below fromSeq
	return c.read(ctx, fromSeq, 0, fn)
}

// noteRead raises ReadThrough to seq.
func (c *Changelog) noteRead(seq uint64) {
	for {
		cur := c.readThrough.Load()
		if seq <= cur || c.readThrough.CompareAndSwap(cur, seq) {
			return
		}
	}
}

// checkHeld refuses a start below the stream's first sequence once the
// stream has been purged (FirstSeq > 1): those write-sets are gone. After a
// purge of everything, FirstSeq is LastSeq + 1.
func (c *Changelog) checkHeld(fromSeq uint64, st jetstream.StreamState) error {
	if st.FirstSeq > 1 && fromSeq < st.FirstSeq {
		return fmt.Errorf("%w: partition %d: need sequence %d, log starts at %d", ErrTruncated, c.cfg.Partition, fromSeq, st.FirstSeq)
	}
	return nil
}

// read delivers messages fromSeq.. through an ordered consumer (ephemeral,
// flow-controlled, restarted by the client on a gap in delivery) until the
// message at end (end 0: until ctx ends).
//
// Invariant: the messages a reader sees are consecutive. The stream denies
// interior deletes and is only purged below positions nobody needs, so a
// jump in sequence means a purge overtook this reader: ErrTruncated, never
// a silent skip.
func (c *Changelog) read(ctx context.Context, fromSeq, end uint64, fn ApplyFunc) error {
	cons, err := c.stream.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{
		DeliverPolicy: jetstream.DeliverByStartSequencePolicy,
		OptStartSeq:   fromSeq,
		// The client recreates an ordered consumer after a gap or a lost
		// server, retrying without end by default, inside Next and
		// deaf to its context. Bounded, Next fails and our caller
		// starts again from what it applied.
		MaxResetAttempts: 3,
	})
	if err != nil {
		return fmt.Errorf("partition %d: changelog reader: %w", c.cfg.Partition, err)
	}
	// Bound what the client buffers: a few parts of the largest size.
	maxBytes := max(8<<20, 4*int(c.js.Conn().MaxPayload()))
	it, err := cons.Messages(jetstream.PullMaxMessagesWithBytesLimit(512, maxBytes))
	if err != nil {
		return fmt.Errorf("partition %d: changelog reader: %w", c.cfg.Partition, err)
	}
	// Next runs in its own goroutine so that read returns as soon as ctx
	// ends, even while the client recreates its consumer (above): a
	// standby being promoted must not wait for a NATS call to give up.
	// The goroutine ends when Next returns (MaxResetAttempts bounds it).
	type delivery struct {
		msg jetstream.Msg
		err error
	}
	deliveries := make(chan delivery)
	rctx, stopReader := context.WithCancel(ctx) // ends with read
	defer stopReader()
	go func() {
		defer it.Stop()
		for {
			msg, err := it.Next(jetstream.NextContext(rctx))
			select {
			case deliveries <- delivery{msg, err}:
			case <-rctx.Done():
				return
			}
			if err != nil {
				return
			}
		}
	}()
	var asm assembler
	next := fromSeq
	// A purge can overtake an idle reader: with nothing delivered, it
	// would wait for the next append to see the gap, its copy meanwhile
	// holding what an erase's purge removed (issue 29 item 3). So a reader
	// idle for IdleCheck asks the stream where it starts.
	idle := time.NewTimer(c.cfg.IdleCheck)
	defer idle.Stop()
	for {
		var d delivery
		select {
		case d = <-deliveries:
		case <-ctx.Done():
			return ctx.Err()
		case <-idle.C:
			// Idle only if nothing waits: the timer may have fired while
			// fn ran (a long compaction), with a delivery ready behind it.
			select {
			case d = <-deliveries:
			default:
				if err := c.checkNotOvertaken(ctx, next); err != nil {
					return err
				}
				idle.Reset(c.cfg.IdleCheck)
				continue
			}
		}
		msg, err := d.msg, d.err
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("partition %d: changelog read at %d: %w", c.cfg.Partition, next, err)
		}
		meta, err := msg.Metadata()
		if err != nil {
			return fmt.Errorf("partition %d: changelog read at %d: %w", c.cfg.Partition, next, err)
		}
		seq := meta.Sequence.Stream
		if seq != next {
			return fmt.Errorf("%w: partition %d: expected sequence %d, read %d", ErrTruncated, c.cfg.Partition, next, seq)
		}
		next++
		ws, done, err := asm.feed(seq, msg.Headers().Get(PartHeader), msg.Data())
		if err != nil {
			return fmt.Errorf("partition %d: %w", c.cfg.Partition, err)
		}
		if done {
			if err := fn(seq, ws); err != nil {
				return err
			}
		}
		c.noteRead(seq)
		// The reader is idle from now, not from the delivery's arrival.
		if !idle.Stop() {
			select {
			case <-idle.C:
			default:
			}
		}
		idle.Reset(c.cfg.IdleCheck)
		if end != 0 && seq >= end {
			return nil
		}
	}
}

// assembler joins the parts of a write-set. The rule it keeps:
//
//	seq:   10      11      12      13      14
//	       1/3/10  2/3/10  1/2/12  2/2/12  (none)
//	       └── torn ───┘   └── whole ──┘   whole
//
// A write-set is whole when parts 1..n arrive at first, first+1, ...,
// first+n-1, each naming first. A part 1 (or an unsplit message) arriving
// while a write-set is incomplete means that write-set's owner died between
// parts and a new owner wrote after it (each part is fenced on the one
// before it, so nothing else can come between): the incomplete one is torn
// and dropped. Anything else out of order is corruption.
type assembler struct {
	first uint64 // sequence of the pending write-set's part 1; 0: none pending
	n     int    // its number of parts
	next  int    // the part expected next
	buf   []byte
	torn  int // torn write-sets dropped so far
}

// feed takes the message at seq with part header value hdr (empty: a whole
// write-set) and returns a whole write-set when one is complete. The
// returned slice is valid until the next call.
func (a *assembler) feed(seq uint64, hdr string, data []byte) (ws []byte, done bool, err error) {
	if hdr == "" {
		a.dropTorn()
		return data, true, nil
	}
	i, n, first, err := ParsePart(hdr)
	if err != nil {
		return nil, false, fmt.Errorf("sequence %d: %w", seq, err)
	}
	if i == 1 {
		if first != seq {
			return nil, false, fmt.Errorf("%w: sequence %d: part 1/%d names first sequence %d", ErrCorrupt, seq, n, first)
		}
		a.dropTorn()
		if n == 1 {
			return data, true, nil
		}
		a.first, a.n, a.next = seq, n, 2
		a.buf = append(a.buf[:0], data...)
		return nil, false, nil
	}
	if a.first == 0 || first != a.first || n != a.n || i != a.next || seq != first+uint64(i-1) {
		return nil, false, fmt.Errorf("%w: sequence %d: part %d/%d of the write-set at %d is out of order (pending: part %d/%d of %d)",
			ErrCorrupt, seq, i, n, first, a.next, a.n, a.first)
	}
	a.buf = append(a.buf, data...)
	a.next++
	if i < n {
		return nil, false, nil
	}
	a.first, a.n, a.next = 0, 0, 0
	return a.buf, true, nil
}

func (a *assembler) dropTorn() {
	if a.first != 0 {
		a.torn++
		a.first, a.n, a.next = 0, 0, 0
		a.buf = a.buf[:0]
	}
}

// checkNotOvertaken returns ErrTruncated when the stream now starts above
// next, the sequence this reader needs: a purge removed what it had not
// read yet.
func (c *Changelog) checkNotOvertaken(ctx context.Context, next uint64) error {
	ictx, cancel := c.apiContext(ctx)
	defer cancel()
	info, err := c.stream.Info(ictx)
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return nil // the delivery path reports a lost stream; this check only looks for purges
	}
	if info.State.FirstSeq > next {
		return fmt.Errorf("%w: partition %d: need sequence %d, a purge moved the log's start to %d while this reader was idle",
			ErrTruncated, c.cfg.Partition, next, info.State.FirstSeq)
	}
	return nil
}
