package cascade

import (
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
// valid_end must tombstone (CONTRACT §3):
//
//   - every edge touching node whose latest-recorded version is not a
//     tombstone;
//   - every edge whose latest-recorded version is a tombstone that starts
//     after validEnd (it would otherwise read live in [validEnd, its start)
//     beside the dead node: a forward ghost). Its new tombstone
//     [validEnd, open) narrows its life; it does not resurrect it.
//
// Edges whose latest tombstone starts at or before validEnd are skipped:
// fn sees them with take false (the inline decision checks their
// neighbours' fences too). Out rows come first, then in rows; a self-loop
// (found in both) once. It reads only node's adjacency rows, sequentially:
// adjacency rows carry the other endpoint, label, intervals and tombstone
// flag, so no per-edge point read is needed.
func collect(r pebble.Reader, sc storage.Scope, node uuid.UUID, validEnd storage.Ts, fn func(c collected, take bool) error) error {
	for _, out := range []bool{true, false} {
		err := storage.ScanAdjLatest(r, sc, out, node, func(e storage.AdjEdge) error {
			if !out && e.Row.Other == node {
				return nil // self-loop, already collected from the out rows
			}
			c := collected{id: e.ID, src: node, dst: e.Row.Other, label: e.Row.Label}
			if !out {
				c.src, c.dst = e.Row.Other, node
			}
			return fn(c, takes(e.Row, validEnd))
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// takes is the collection rule for one edge, given its latest-recorded
// adjacency row: a cascade with valid_end takes every edge whose latest
// version is not a tombstone, and every edge whose latest tombstone starts
// after valid_end (narrowed to [valid_end, open)).
func takes(row storage.AdjRow, validEnd storage.Ts) bool {
	return !row.Tombstone || row.Valid.Start > validEnd
}

// other is the endpoint of c that is not node (node itself for a
// self-loop).
func (c collected) other(node uuid.UUID) uuid.UUID {
	if c.src == node {
		return c.dst
	}
	return c.src
}

// errTooBig stops an inline collection that outgrew its budget.
var errTooBig = errors.New("cascade too big to commit inline")

// nodeDecision is a tombstone_node decided inside its group: either inline
// (edges, all of them) or journaled.
type nodeDecision struct {
	fits      bool
	journaled bool
	tx        storage.Ts
	validEnd  storage.Ts
	edges     []collected
	start     time.Time
	// fingerprint of the request, kept with its journal (conflict checks
	// while it runs, and its receipt when it ends)
	fingerprint storage.Fingerprint
}

// decideNode is phases 1-3 of the seed's algorithm, on the writer: the
// refusals, then a collection bounded by what an inline cascade may hold.
// The transaction's reader is the snapshot: nothing commits until the
// group's batch does (storage/writer.go).
//
// Inline when the write-set (edges*5 + 3) plus the request's receipt fits
// max_batch_ops: the edges are collected whole and the cascade joins the
// group's batch (or starts the next group when the rest of this one is too
// small). Otherwise it is journaled: the collection stops at the first edge
// past the inline budget, so the writer is never held for a super-node's
// scan; the journal's applier reads the edges later, from the frozen
// neighbourhood (storage.JournalEntry).
func (o *Ops) decideNode(t *storage.Txn, r *Request, b budget) (nodeDecision, error) {
	d := nodeDecision{start: time.Now()}
	sc, node := r.Scope, r.ID
	fence := t.Fenced(sc, node) // before the reads it guards
	latest, ok, err := t.Latest(sc, storage.KindNode, node)
	if err != nil {
		return d, err
	}
	if !ok {
		return d, fmt.Errorf("%w: node %s", ErrNotFound, node)
	}
	if fence != nil {
		// Before already_tombstoned: the node's own tombstone may be what
		// the journal has just written (storage.ErrCascadeInFlight).
		return d, fmt.Errorf("%w: node %s is being tombstoned (journal tx %s)", ErrCascadeInFlight, node, fence.J.Tx)
	}
	if latest.Tombstone {
		return d, fmt.Errorf("%w: node %s was tombstoned at tx %s", ErrAlreadyTombstoned, node, latest.Tx.Start)
	}
	d.tx = t.NextTx()
	d.validEnd = r.ValidEnd
	if d.validEnd == storage.NoTs {
		d.validEnd = d.tx
	}
	limit := (o.maxBatchOps - storage.OpsPerNodeVersion - b.overhead(r)) / storage.OpsPerEdgeVersion
	var neighbour *storage.JournalEntry
	var neighbourID uuid.UUID
	err = collect(t.Reader(), sc, node, d.validEnd, func(c collected, take bool) error {
		if take && len(d.edges) >= limit {
			return errTooBig
		}
		// Every edge's neighbour, taken or not: an in-flight journal of the
		// neighbour may have written this edge already (half of it would
		// be read) or may still write it.
		if other := c.other(node); other != node && neighbour == nil {
			if e := t.Fenced(sc, other); e != nil {
				neighbour, neighbourID = e, other
			}
		}
		if take {
			d.edges = append(d.edges, c)
		}
		return nil
	})
	switch {
	case errors.Is(err, errTooBig):
		d.journaled, d.edges = true, nil
		d.fits = b.fitsJournal(r)
		return d, nil
	case err != nil:
		return d, err
	}
	if neighbour != nil {
		// An inline cascade cannot wait: refuse, as for any write touching
		// a fenced node (the neighbour's journal may tombstone the shared
		// edge itself).
		return d, fmt.Errorf("%w: neighbour node %s is being tombstoned (journal tx %s)", ErrCascadeInFlight, neighbourID, neighbour.J.Tx)
	}
	d.fits = b.fits(r, len(d.edges)*storage.OpsPerEdgeVersion+storage.OpsPerNodeVersion)
	return d, nil
}

// writeNode writes a decided cascade into the group's batch: inline, the
// edges' tombstones then the node's (node last); journaled, the journal
// head, which fences the node and hands the journal to the sink once the
// batch has committed. It returns the journal, or nil when inline.
func (o *Ops) writeNode(t *storage.Txn, r *Request, d nodeDecision) *storage.JournalEntry {
	sc, node := r.Scope, r.ID
	if d.journaled {
		e := t.BeginJournal(sc, node, d.validEnd, d.tx, r.Prov, d.fingerprint)
		e.SetTraceparent(r.Traceparent)
		if o.sink != nil {
			t.AfterCommit(func() { o.sink.Begin(e) })
		}
		return e
	}
	for _, c := range d.edges {
		v := edgeTombstone(c.id, c.src, c.dst, c.label, d.validEnd, d.tx, r.Prov)
		t.WriteVersion(sc, &v)
	}
	nv := nodeTombstone(node, d.validEnd, d.tx, r.Prov)
	t.WriteVersion(sc, &nv)
	n := uint64(len(d.edges))
	t.AfterCommit(func() {
		if o.hooks.CascadeFinished != nil {
			o.hooks.CascadeFinished(PathInline, n, time.Since(d.start))
		}
	})
	return nil
}
