package cascade

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/google/uuid"
	"github.com/telha/telha-cascade/storage"
)

// The journaled path, after the commit point.
//
// A journal head lands in its group's batch and fences its node. From then
// on the node's neighbourhood is frozen (storage.JournalEntry): the only
// versions written of edges touching it are this journal's tombstones and
// those of journals committed before it. So the write-set is re-derived
// from the node's adjacency rows whenever it is needed, first pass and
// resume alike, and always comes out the same:
//
//	edge whose latest row has the journal's tx   landed: counted, not rewritten
//	edge the collection rule takes               pending: tombstone at the journal's tx
//	edge the rule skips                          nothing
//	the node                                     last, unless its tombstone landed
//
// Same-tx replay is byte-identical (same tx, valid_end and provenance), so
// a chunk that landed before a crash is never needed again, and one that
// did not is written exactly as the first pass would have.
//
// An earlier journal M that shares an edge with this one (N) may still
// tombstone it: N's applier sees M's fence in the view it took with its
// snapshot, waits until M is removed, and scans again. Waits only ever go
// from a later journal to an earlier one, so they cannot form a cycle.

// JournalScan is what one pass over a journaled node's adjacency found.
type JournalScan struct {
	Landed     int64 // edges whose tombstone at the journal's tx is durable
	Pending    int64 // edges still to tombstone (streamed, when a stream was asked for)
	NodeLanded bool  // the node's tombstone at the journal's tx is durable
	// Blocker, when set, is an earlier journal fencing BlockedOn, the other
	// endpoint of an edge this journal would tombstone: the scan stopped
	// there, and must be redone once Blocker is removed.
	Blocker   *storage.JournalEntry
	BlockedOn uuid.UUID
}

var errBlocked = errors.New("blocked by an earlier journal")

// ErrFrozenBroken: a version newer than a journal was found among the
// edges its fence freezes. It means a write path skipped a fence check: a
// bug, reported instead of being applied over.
var ErrFrozenBroken = fmt.Errorf("%w: journal's neighbourhood changed under its fence", ErrDecode)

// ScanJournal streams what is left of journal e's write-set as read from r,
// edges first and the node last, to fn (nil: count only). earlier holds the
// nodes fenced by journals committed before e, read together with r
// (Store.Exclusive); an edge to one of them stops the scan (see
// JournalScan.Blocker).
func ScanJournal(r pebble.Reader, e *storage.JournalEntry, earlier map[uuid.UUID]*storage.JournalEntry, fn func(*storage.Version) error) (JournalScan, error) {
	return scanJournal(r, e, earlier, fn, nil)
}

// scanJournal is ScanJournal calling tick with the rows read so far every
// yieldEvery adjacency rows.
func scanJournal(r pebble.Reader, e *storage.JournalEntry, earlier map[uuid.UUID]*storage.JournalEntry, fn func(*storage.Version) error, tick func(rows int)) (JournalScan, error) {
	j, sc, node := e.J, e.Scope, e.J.NodeID
	var s JournalScan
	rows := 0
	for _, out := range []bool{true, false} {
		err := storage.ScanAdjLatest(r, sc, out, node, func(a storage.AdjEdge) error {
			if rows++; rows%yieldEvery == 0 {
				// A super-node's scan is CPU-bound: let the goroutines of
				// small requests run (the writer, the consumer, the result
				// publisher) instead of waiting out the scheduler's 10 ms
				// time slice behind it.
				runtime.Gosched()
				if tick != nil {
					tick(rows)
				}
			}
			row := a.Row
			if !out && row.Other == node {
				return nil // self-loop, already seen in the out rows
			}
			switch {
			case row.Tx.Start > j.Tx:
				return fmt.Errorf("%w: edge %s of node %s has a version at tx %s, after the journal's %s", ErrFrozenBroken, a.ID, node, row.Tx.Start, j.Tx)
			case row.Tx.Start == j.Tx:
				if !row.Tombstone {
					return fmt.Errorf("%w: edge %s of node %s has a live version at the journal's tx %s", ErrFrozenBroken, a.ID, node, j.Tx)
				}
				s.Landed++
				return nil
			case !takes(row, j.ValidEnd):
				return nil
			}
			if row.Other != node {
				if b := earlier[row.Other]; b != nil {
					s.Blocker, s.BlockedOn = b, row.Other
					return errBlocked
				}
			}
			s.Pending++
			if fn == nil {
				return nil
			}
			src, dst := node, row.Other
			if !out {
				src, dst = row.Other, node
			}
			v := edgeTombstone(a.ID, src, dst, row.Label, j.ValidEnd, j.Tx, j.Prov)
			return fn(&v)
		})
		if errors.Is(err, errBlocked) {
			return s, nil
		}
		if err != nil {
			return s, err
		}
	}
	latest, ok, err := storage.Latest(r, sc, storage.KindNode, node)
	if err != nil {
		return s, err
	}
	switch {
	case !ok:
		return s, fmt.Errorf("%w: journaled node %s has no version", ErrDecode, node)
	case latest.Tx.Start > j.Tx || (latest.Tombstone && latest.Tx.Start != j.Tx):
		return s, fmt.Errorf("%w: node %s has a version at tx %s under its journal of tx %s", ErrFrozenBroken, node, latest.Tx.Start, j.Tx)
	case latest.Tombstone:
		s.NodeLanded = true
		return s, nil
	}
	if fn != nil {
		v := nodeTombstone(node, j.ValidEnd, j.Tx, j.Prov)
		return s, fn(&v)
	}
	return s, nil
}

// Applier applies journals after their commit point. Package reaper
// holds one; Ops holds its own for TombstoneNode and ResumeJournals.
type Applier struct {
	store    *storage.Store
	chunkOps int
	hooks    Hooks
	log      *slog.Logger
}

// NewApplier returns an applier with opts' MaxBatchOps, ChunkOps, Hooks and
// Logger (Journals is not used).
func NewApplier(store *storage.Store, opts Options) *Applier {
	opts = opts.withDefaults()
	return &Applier{store: store, chunkOps: opts.ChunkOps, hooks: opts.Hooks, log: opts.Logger}
}

// ChunkOps returns the largest chunk, in puts.
func (o *Applier) ChunkOps() int { return o.chunkOps }

// JournalObserver receives a journal applier's progress. Every field is
// optional; none may block for long.
type JournalObserver struct {
	// Scanned: the applier's scan of the neighbourhood has read rows
	// adjacency rows so far (every few hundred rows: a super-node's scan,
	// before its count or between two chunks, is progress too).
	Scanned func(rows int64)
	// Counted: the write-set holds total edges (those landed before
	// included).
	Counted func(total int64)
	// Applied: done edges are durable (after each chunk).
	Applied func(done int64)
	// Waiting: an earlier journal shares an edge with this one; the applier
	// waits for its removal.
	Waiting func(on *storage.JournalEntry)
	// Wait, when set, does that waiting (an owner that bounds its appliers
	// gives up its slot meanwhile); nil waits for on.Removed() or ctx.
	Wait func(ctx context.Context, on *storage.JournalEntry) error
}

// ApplyJournal applies what is left of journal e, in chunks of at most
// ChunkOps puts through the writer's background lane (edges first, node
// last), then removes the journal, storing its request's receipt and result
// outbox row in the same batch. It is the first pass and the resume alike
// (the write-set is re-derived; see the top of this file). It returns the
// request's receipt. If the journal is no longer registered it returns
// storage.ErrJournalGone: someone else finished it.
//
// One applier per journal at a time is the caller's rule (package reaper
// keeps it); two would write the same bytes and one removal would fail
// with ErrJournalGone.
func (o *Applier) ApplyJournal(ctx context.Context, e *storage.JournalEntry, obs JournalObserver) (storage.Receipt, error) {
	start := time.Now()
	j := e.J
	var total int64
	steps := 0
	for {
		done, err := o.applyPass(ctx, e, obs, &total, &steps)
		if err != nil {
			return storage.Receipt{}, err
		}
		if done {
			break
		}
	}
	rc := storage.Receipt{Op: storage.OpTombstoneNode, Status: storage.StatusOK, ID: j.NodeID, Tx: j.Tx, EdgesTombstoned: uint64(total), Journaled: true,
		Fingerprint: j.Fingerprint}
	o.step(e, steps+1)
	if err := o.store.Update(ctx, func(t *storage.Txn) error { return t.RemoveJournal(e, &rc) }); err != nil {
		return storage.Receipt{}, err
	}
	if o.hooks.CascadeFinished != nil {
		o.hooks.CascadeFinished(PathJournaled, rc.EdgesTombstoned, time.Since(start))
	}
	return rc, nil
}

// applyPass is one pass of ApplyJournal over a fresh snapshot: it counts
// the write-set and applies it (done), or finds an earlier journal sharing
// an edge and waits for it (not done: the caller takes a new snapshot).
// The snapshot and the chunk buffers are released on every path, a panic
// included: an open snapshot would keep every later erase from scrubbing.
func (o *Applier) applyPass(ctx context.Context, e *storage.JournalEntry, obs JournalObserver, total *int64, steps *int) (bool, error) {
	j := e.J
	var (
		snap    *pebble.Snapshot
		earlier map[uuid.UUID]*storage.JournalEntry
	)
	err := o.store.Exclusive(ctx, func() error {
		if !o.store.Journals().Registered(e) {
			return fmt.Errorf("%w: %x", storage.ErrJournalGone, e.HeadKey)
		}
		snap = o.store.NewSnapshot()
		earlier = o.store.Journals().FencesBefore(e.Scope, j.Tx)
		return nil
	})
	if err != nil {
		return false, err
	}
	open := true
	release := func() {
		if open {
			open = false
			_ = snap.Close()
		}
	}
	defer release()
	tick := func(rows int) {
		if obs.Scanned != nil {
			obs.Scanned(int64(rows))
		}
		if o.hooks.JournalScanned != nil {
			o.hooks.JournalScanned(e, rows)
		}
	}
	sum, err := scanJournal(snap, e, earlier, nil, tick)
	if err != nil {
		return false, err
	}
	if sum.Blocker != nil {
		release() // not held while waiting
		o.log.Info("cascade journal waits for an earlier journal that shares an edge", "tenant", e.Scope.Tenant(),
			"node", j.NodeID, "tx", j.Tx.String(), "neighbour", sum.BlockedOn, "neighbour_tx", sum.Blocker.J.Tx.String())
		if obs.Waiting != nil {
			obs.Waiting(sum.Blocker)
		}
		wait := obs.Wait
		if wait == nil {
			wait = waitRemoved
		}
		if err := wait(ctx, sum.Blocker); err != nil {
			return false, fmt.Errorf("journal of node %s interrupted: %w", j.NodeID, err)
		}
		return false, nil
	}
	*total = sum.Landed + sum.Pending
	if obs.Counted != nil {
		obs.Counted(*total)
	}
	if obs.Applied != nil {
		obs.Applied(sum.Landed)
	}
	ch := o.newChunker(ctx, e, obs)
	defer ch.close()
	ch.done = sum.Landed
	_, err = scanJournal(snap, e, earlier, ch.add, tick)
	if err == nil {
		err = ch.finish()
	}
	*steps = ch.steps
	return err == nil, err
}

func (o *Applier) step(e *storage.JournalEntry, n int) {
	if o.hooks.JournalStep != nil {
		o.hooks.JournalStep(e, n)
	}
}

func waitRemoved(ctx context.Context, on *storage.JournalEntry) error {
	select {
	case <-on.Removed():
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// chunker packs whole version groups into chunks of at most chunkOps puts,
// in the order they are added, and commits them through the writer. Two
// batches alternate: the next chunk is built while the last one commits.
type chunker struct {
	o       *Applier
	ctx     context.Context
	e       *storage.JournalEntry
	obs     JournalObserver
	check   func() error
	cur     *pebble.Batch
	spare   *pebble.Batch
	w       storage.VersionWriter
	ops     int   // puts in cur
	queued  int64 // edges in cur
	pending *storage.PendingCommit
	pendOps int
	pendN   int64
	done    int64 // edges durable
	steps   int   // chunks queued
}

// yieldEvery is how many adjacency rows a scan reads between yields.
const yieldEvery = 256

func (o *Applier) newChunker(ctx context.Context, e *storage.JournalEntry, obs JournalObserver) *chunker {
	// Sized for a full chunk (about 100 bytes a put) and reused, instead of
	// a buffer grown from empty per chunk.
	size := o.chunkOps * 100
	nb := func() *pebble.Batch {
		return o.store.NewBatch(pebble.WithInitialSizeBytes(min(size, 64<<20)), pebble.WithMaxRetainedSizeBytes(size+size/2))
	}
	c := &chunker{o: o, ctx: ctx, e: e, obs: obs, cur: nb(), spare: nb()}
	c.check = func() error {
		if !o.store.Journals().Registered(e) {
			return fmt.Errorf("%w: %x", storage.ErrJournalGone, e.HeadKey)
		}
		return nil
	}
	return c
}

func (c *chunker) add(v *storage.Version) error {
	ops, edges := storage.OpsPerNodeVersion, int64(0)
	if v.Kind == storage.KindEdge {
		ops, edges = storage.OpsPerEdgeVersion, 1
	}
	if c.ops > 0 && c.ops+ops > c.o.chunkOps {
		if err := c.ship(); err != nil {
			return err
		}
	}
	c.w.Append(c.cur, c.e.Scope, v)
	c.ops += ops
	c.queued += edges
	return nil
}

// ship waits for the chunk in flight, then queues the current one.
func (c *chunker) ship() error {
	if err := c.wait(); err != nil {
		return err
	}
	c.steps++
	c.o.step(c.e, c.steps)
	if err := c.ctx.Err(); err != nil {
		return fmt.Errorf("journal of node %s interrupted: %w", c.e.J.NodeID, err)
	}
	p := c.o.store.CommitBatchAsync(c.ctx, c.cur, c.check)
	c.pending, c.pendOps, c.pendN = &p, c.ops, c.queued
	c.cur, c.spare = c.spare, c.cur
	c.ops, c.queued = 0, 0
	return nil
}

func (c *chunker) wait() error {
	if c.pending == nil {
		return nil
	}
	err := c.pending.Wait()
	c.pending = nil
	c.spare.Reset()
	if err != nil {
		return err
	}
	c.done += c.pendN
	if c.obs.Applied != nil {
		c.obs.Applied(c.done)
	}
	if c.o.hooks.ChunkApplied != nil {
		c.o.hooks.ChunkApplied(c.pendOps)
	}
	return nil
}

// finish ships the last chunk and waits for it.
func (c *chunker) finish() error {
	if c.ops > 0 {
		if err := c.ship(); err != nil {
			return err
		}
	}
	return c.wait()
}

// close releases the batches (after waiting for a chunk still in flight).
func (c *chunker) close() {
	if c.pending != nil {
		_ = c.pending.Wait()
		c.pending = nil
	}
	_ = c.cur.Close()
	_ = c.spare.Close()
}

// ResumeJournals applies every journal of a tenant, in commit order, and
// returns how many it completed. Each write-set is re-derived from the
// journal's tx and the frozen neighbourhood (never a fresh clock read), so
// it is idempotent: a second call resumes zero. Package reaper does this in
// production, one applier per journal; this is for tests and tools.
func (o *Applier) ResumeJournals(ctx context.Context, sc storage.Scope) (int, error) {
	var errs []error
	n := 0
	for _, e := range o.store.Journals().List() {
		if e.Scope != sc {
			continue
		}
		switch _, err := o.ApplyJournal(ctx, e, JournalObserver{}); {
		case err == nil:
			n++
		case errors.Is(err, storage.ErrJournalGone):
		default:
			errs = append(errs, err)
		}
	}
	return n, errors.Join(errs...)
}

// landedEdges counts the edge versions a finished journal wrote (every
// version at its tx but the node's).
func (o *Ops) landedEdges(e *storage.JournalEntry) (uint64, error) {
	var n uint64
	err := storage.ScanIndex(o.store.Reader(), e.Scope, false, e.J.Tx, e.J.Tx+1, func(ie storage.IndexEntry) error {
		if ie.Kind == storage.KindEdge {
			n++
		}
		return nil
	})
	return n, err
}
