package cascade

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/google/uuid"
	"github.com/telha/telha-cascade/storage"
)

// collected is one edge a cascade must tombstone, with what its tombstone
// needs from the edge's latest-recorded version.
type collected struct {
	id, src, dst uuid.UUID
	label        string
}

// collect streams, in write-set order, the edges a cascade of node with
// valid_end must tombstone (DESIGN §3):
//
//   - every edge touching node whose latest-recorded version is not a
//     tombstone;
//   - every edge whose latest-recorded version is a tombstone that starts
//     after validEnd (it would otherwise read live in [validEnd, its start)
//     beside the dead node: a forward ghost). Its new tombstone
//     [validEnd, open) narrows its life; it does not resurrect it.
//
// Edges whose latest tombstone starts at or before validEnd are skipped.
// Out rows come first, then in rows; a self-loop (found in both) once.
// It reads only node's adjacency rows, sequentially: adjacency rows carry
// the other endpoint, label, intervals and tombstone flag, so no per-edge
// point read is needed.
func collect(r pebble.Reader, sc storage.Scope, node uuid.UUID, validEnd storage.Ts, fn func(collected) error) error {
	for _, out := range []bool{true, false} {
		err := storage.ScanAdjLatest(r, sc, out, node, func(e storage.AdjEdge) error {
			if !out && e.Row.Other == node {
				return nil // self-loop, already collected from the out rows
			}
			if e.Row.Tombstone && e.Row.Valid.Start <= validEnd {
				return nil
			}
			c := collected{id: e.ID, src: node, dst: e.Row.Other, label: e.Row.Label}
			if !out {
				c.src, c.dst = e.Row.Other, node
			}
			return fn(c)
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// errRefused carries a refusal out of a collect callback.
type errRefused struct{ err error }

func (e errRefused) Error() string { return e.err.Error() }
func (e errRefused) Unwrap() error { return e.err }

// tombstoneNode is phase 1-3 of the seed's algorithm inside the group's
// transaction: snapshot read (the transaction's reader: committed state
// plus the group's own earlier writes, stable because Updates are
// serialised), build, and either write inline or write the journal (the
// commit point) and hand the chunks to an applier after commit.
func (o *Ops) tombstoneNode(t *storage.Txn, r *Request) (Outcome, error) {
	sc, node := r.Scope, r.ID
	latest, ok, err := t.Latest(sc, storage.KindNode, node)
	if err != nil {
		return Outcome{}, err
	}
	if !ok {
		return Outcome{}, fmt.Errorf("%w: node %s", ErrNotFound, node)
	}
	if latest.Tombstone {
		return Outcome{}, fmt.Errorf("%w: node %s was tombstoned at tx %s", ErrAlreadyTombstoned, node, latest.Tx.Start)
	}
	if o.store.Journals().Fenced(sc, node) != nil {
		return Outcome{}, fmt.Errorf("%w: node %s is being tombstoned", ErrCascadeInFlight, node)
	}
	tx := t.NextTx()
	validEnd := r.ValidEnd
	if validEnd == storage.NoTs {
		validEnd = tx
	}
	prov := r.Prov

	// Inline when edges*5 + 3 <= max_batch_ops. Up to that many edges are
	// kept whole; past it only their ids (the journal's list, the one
	// per-edge memory of a super-node cascade).
	inlineEdges := (o.maxBatchOps - storage.OpsPerNodeVersion) / storage.OpsPerEdgeVersion
	var (
		edges []collected
		ids   []uuid.UUID
	)
	err = collect(t.Reader(), sc, node, validEnd, func(c collected) error {
		other := c.dst
		if other == node {
			other = c.src
		}
		if other != node && o.store.Journals().Fenced(sc, other) != nil {
			return errRefused{fmt.Errorf("%w: neighbour node %s (edge %s) is being tombstoned", ErrCascadeInFlight, other, c.id)}
		}
		if ids != nil {
			ids = append(ids, c.id)
			return nil
		}
		edges = append(edges, c)
		if len(edges) > inlineEdges {
			ids = make([]uuid.UUID, 0, 2*len(edges))
			for _, e := range edges {
				ids = append(ids, e.id)
			}
			edges = nil
		}
		return nil
	})
	var refused errRefused
	if errors.As(err, &refused) {
		return Outcome{}, refused.err
	}
	if err != nil {
		return Outcome{}, err
	}
	start := time.Now()

	if ids == nil {
		// Inline: one durable batch (the group's), edges first, node last.
		for _, c := range edges {
			v := edgeTombstone(c.id, c.src, c.dst, c.label, validEnd, tx, prov)
			t.WriteVersion(sc, &v)
		}
		nv := nodeTombstone(node, validEnd, tx, prov)
		t.WriteVersion(sc, &nv)
		n := uint64(len(edges))
		t.AfterCommit(func() {
			if o.hooks.CascadeStarted != nil {
				o.hooks.CascadeStarted(PathInline)
			}
			if o.hooks.CascadeFinished != nil {
				o.hooks.CascadeFinished(PathInline, n, time.Since(start))
			}
		})
		return Outcome{Receipt: storage.Receipt{Op: storage.OpTombstoneNode, Status: storage.StatusOK, ID: node, Tx: tx, EdgesTombstoned: n}, Final: true}, nil
	}

	// Journaled: the journal (head + edge-id pages) joins the group's batch;
	// its durable commit is the cascade's commit point. The node is fenced
	// from here on (and for the rest of this transaction).
	jw := t.BeginJournal(sc, node, validEnd, tx, prov)
	for _, id := range ids {
		jw.Add(id)
	}
	token := storage.NewLeaseToken()
	entry := jw.Finish(token)
	done := make(chan error, 1)
	t.AfterCommit(func() {
		if o.hooks.CascadeStarted != nil {
			o.hooks.CascadeStarted(PathJournaled)
		}
		// Taken while Updates are still serialised: exactly the state the
		// journal was collected from.
		snap := o.store.NewSnapshot()
		o.wg.Add(1)
		go func() {
			defer o.wg.Done()
			defer snap.Close()
			err := o.run(o.ctx, entry, token, snap, start)
			entry.Release(token)
			done <- err
		}()
	})
	return Outcome{Journal: entry, Done: done}, nil
}

// run applies a journal's write-set in chunks and removes the journal. With
// a snapshot it is the first pass (edges streamed from the snapshot's
// adjacency rows); without, a resume (edges from the journal's pages, each
// looked up to skip the ones whose tombstone with the journal's tx landed).
func (o *Ops) run(ctx context.Context, e *storage.JournalEntry, token uint64, snap pebble.Reader, start time.Time) error {
	err := o.apply(ctx, e, token, snap, start)
	if err != nil && ctx.Err() != nil {
		o.log.Info("cascade journal paused by shutdown; the next start resumes it", "tenant", e.Scope.Tenant(), "node", e.J.NodeID, "edges_done", e.EdgesDone())
		return err
	}
	if err != nil {
		n := e.RecordFailure(err, o.store.Clock().Wall().Now())
		o.log.Error("cascade journal not finished; it stays for the reaper", "tenant", e.Scope.Tenant(), "node", e.J.NodeID,
			"journal", fmt.Sprintf("%x", e.HeadKey), "attempt", n, "err", err)
		if o.hooks.JournalFailed != nil {
			o.hooks.JournalFailed(e, err)
		}
	}
	return err
}

func (o *Ops) apply(ctx context.Context, e *storage.JournalEntry, token uint64, snap pebble.Reader, start time.Time) error {
	sc, j := e.Scope, e.J
	// One batch for every chunk, sized for a full chunk and reset after
	// each commit (about 100 bytes a put), instead of a new buffer grown
	// from empty per chunk.
	size := o.maxBatchOps * 100
	ch := &chunker{o: o, ctx: ctx, e: e, token: token,
		b: o.store.NewBatch(pebble.WithInitialSizeBytes(min(size, 64<<20)), pebble.WithMaxRetainedSizeBytes(size+size/2))}
	defer func() { ch.b.Close() }()
	if snap != nil {
		err := collect(snap, sc, j.NodeID, j.ValidEnd, func(c collected) error {
			v := edgeTombstone(c.id, c.src, c.dst, c.label, j.ValidEnd, j.Tx, j.Prov)
			return ch.add(&v, storage.OpsPerEdgeVersion, 1)
		})
		if err != nil {
			return err
		}
		if uint64(ch.edges+ch.queued) != j.Edges {
			return fmt.Errorf("%w: journal of node %s lists %d edges, snapshot yields %d", ErrDecode, j.NodeID, j.Edges, ch.edges+ch.queued)
		}
	} else {
		reader := o.store.Reader()
		err := storage.JournalPages(reader, e, func(ids []uuid.UUID) error {
			for _, id := range ids {
				latest, ok, err := storage.Latest(reader, sc, storage.KindEdge, id)
				if err != nil {
					return err
				}
				if !ok {
					return fmt.Errorf("%w: journaled edge %s has no version", ErrDecode, id)
				}
				if latest.Tombstone && latest.Tx.Start == j.Tx {
					ch.edges++ // this edge's chunk landed before the crash
					continue
				}
				v := edgeTombstone(id, latest.Src, latest.Dst, latest.Label, j.ValidEnd, j.Tx, j.Prov)
				if err := ch.add(&v, storage.OpsPerEdgeVersion, 1); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return err
		}
	}
	// The node's tombstone goes last: in the last chunk, after every edge.
	landed := false
	if snap == nil {
		latest, ok, err := storage.Latest(o.store.Reader(), sc, storage.KindNode, j.NodeID)
		if err != nil {
			return err
		}
		landed = ok && latest.Tombstone && latest.Tx.Start == j.Tx
	}
	if !landed {
		nv := nodeTombstone(j.NodeID, j.ValidEnd, j.Tx, j.Prov)
		if err := ch.add(&nv, storage.OpsPerNodeVersion, 0); err != nil {
			return err
		}
	}
	if err := ch.flush(); err != nil {
		return err
	}
	rc := storage.Receipt{Op: storage.OpTombstoneNode, Status: storage.StatusOK, ID: j.NodeID, Tx: j.Tx, EdgesTombstoned: j.Edges, Journaled: true}
	err := e.WithLease(token, o.store.Clock().Wall().Now, func() error { return o.store.RemoveJournal(e, &rc) })
	if err != nil {
		return err
	}
	if o.hooks.CascadeFinished != nil {
		o.hooks.CascadeFinished(PathJournaled, j.Edges, time.Since(start))
	}
	if o.hooks.JournalDone != nil {
		o.hooks.JournalDone(e, rc)
	}
	return nil
}

// chunker packs whole version groups into durable chunks of at most
// max_batch_ops puts, in the order they are added.
type chunker struct {
	o      *Ops
	ctx    context.Context
	e      *storage.JournalEntry
	token  uint64
	b      *pebble.Batch
	w      storage.VersionWriter
	ops    int
	edges  int64 // journaled edges done (landed now or before)
	queued int64 // edges in the pending chunk
}

func (c *chunker) add(v *storage.Version, ops int, edges int64) error {
	if c.ops > 0 && c.ops+ops > c.o.maxBatchOps {
		if err := c.flush(); err != nil {
			return err
		}
	}
	c.w.Append(c.b, c.e.Scope, v)
	c.ops += ops
	c.queued += edges
	return nil
}

// flush commits the pending chunk under the journal's lease.
func (c *chunker) flush() error {
	if c.ops == 0 {
		return nil
	}
	if err := c.ctx.Err(); err != nil {
		return fmt.Errorf("journal of node %s interrupted: %w", c.e.J.NodeID, err)
	}
	err := c.e.WithLease(c.token, c.o.store.Clock().Wall().Now, func() error { return c.o.store.CommitDurable(c.b) })
	if err != nil {
		return err
	}
	c.b.Reset()
	c.edges += c.queued
	c.e.SetEdgesDone(c.edges)
	if c.o.hooks.ChunkApplied != nil {
		c.o.hooks.ChunkApplied(c.ops)
	}
	c.ops, c.queued = 0, 0
	return nil
}

// ErrLeaseHeld: the journal is held by a live applier; it is not an orphan.
var ErrLeaseHeld = errors.New("journal held by a live applier")

// Resume applies one orphaned journal to completion. It returns
// ErrLeaseHeld, without touching anything, when a live applier holds it.
func (o *Ops) Resume(ctx context.Context, e *storage.JournalEntry) error {
	token := storage.NewLeaseToken()
	if !e.TryAcquire(token, o.store.Clock().Wall().Now(), o.leaseTTL) {
		return ErrLeaseHeld
	}
	defer e.Release(token)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(o.ctx, cancel)
	defer stop()
	if o.hooks.JournalResumed != nil {
		o.hooks.JournalResumed(e)
	}
	o.log.Info("resuming cascade journal", "tenant", e.Scope.Tenant(), "node", e.J.NodeID, "edges", e.J.Edges, "tx", e.J.Tx.String())
	return o.run(ctx, e, token, nil, time.Now())
}

// ResumeJournals resumes every orphaned journal of a tenant (those no live
// applier holds), oldest first, and returns how many it completed. It
// rebuilds each write-set from the journal alone (its tx and edge ids, never
// a fresh clock read or adjacency scan), so it is idempotent: a second call
// resumes zero.
func (o *Ops) ResumeJournals(ctx context.Context, sc storage.Scope) (int, error) {
	if err := o.store.LoadJournals(sc); err != nil {
		return 0, err
	}
	var errs []error
	n := 0
	for _, e := range o.store.Journals().List() {
		if e.Scope != sc {
			continue
		}
		switch err := o.Resume(ctx, e); {
		case err == nil:
			n++
		case errors.Is(err, ErrLeaseHeld):
		default:
			errs = append(errs, err)
		}
	}
	return n, errors.Join(errs...)
}
