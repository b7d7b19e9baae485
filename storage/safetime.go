package storage

import (
	"context"
	"sync"

	"github.com/google/uuid"
)

// Safe time: what a repeatable read may be answered at.
//
// Two things could make a read at (v, t) answer differently later:
//
//  1. A tx handed out but not committed yet. Every tx is allocated inside a
//     writer task, strictly increasing, and lands in that task's batch (or
//     never: a failed commit, a request refused after taking one). When a
//     batch has committed, the committed tx (Committed) advances to the
//     highest tx the batch wrote under (Txn.written), before the task's
//     result is delivered: no later task will write at or below it. Txs
//     taken and never written do not advance it, so it is always the tx of
//     a durable record, and a restart (which derives the clock's mark from
//     durable records) starts it where it was. Reads above it are not
//     repeatable yet.
//  2. A journal in flight. Its chunks land at its own, older tx J, but only
//     on its frozen neighbourhood (JournalEntry): its node and the edges
//     touching it. A read that touches none of those is repeatable at any
//     t <= Committed; one that touches one is repeatable only at t < J,
//     until the journal is removed (then every chunk has landed).
//
// So a read is answered at min(t, Committed) and, if it touches a node
// fenced by a journal with tx J <= that, at J-1 (or it waits for the
// journal). Neither check scans journals: Committed is one atomic load, a
// fence one map lookup per node the read touches.

type committed struct {
	mu     sync.Mutex
	tx     Ts
	wakeup chan struct{} // closed and replaced when tx advances
}

func newCommitted(tx Ts) *committed { return &committed{tx: tx, wakeup: make(chan struct{})} }

// advance records that every tx up to tx is committed (or will never be).
func (c *committed) advance(tx Ts) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if tx <= c.tx {
		return
	}
	c.tx = tx
	close(c.wakeup)
	c.wakeup = make(chan struct{})
}

// poke wakes the waiters without advancing: a batch committed that wrote
// no tx (a journal's or an erase's end), which may move the feed's horizon.
func (c *committed) poke() {
	c.mu.Lock()
	defer c.mu.Unlock()
	close(c.wakeup)
	c.wakeup = make(chan struct{})
}

// Changed returns a channel closed at the next commit of the writer's
// foreground lane (Update): what the change feed waits on.
func (s *Store) Changed() <-chan struct{} {
	_, ch := s.committed.get()
	return ch
}

func (c *committed) get() (Ts, <-chan struct{}) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.tx, c.wakeup
}

// Committed returns the highest tx below which nothing will ever be
// written again but by journals in flight (see above): the safe tx of
// every read that touches no fenced node.
func (s *Store) Committed() Ts {
	tx, _ := s.committed.get()
	return tx
}

// WaitCommitted waits until Committed reaches tx or ctx is done, and
// returns Committed then.
func (s *Store) WaitCommitted(ctx context.Context, tx Ts) Ts {
	for {
		c, wake := s.committed.get()
		if c >= tx {
			return c
		}
		select {
		case <-wake:
		case <-ctx.Done():
			return c
		}
	}
}

// SafeAt returns the tx a read of the given nodes' neighbourhoods, asked at
// t, can be answered at: t itself when no node is fenced by a journal with
// tx <= t, else just below the oldest such journal, which it returns too
// (nil when none). Call it with t <= Committed.
func (s *Store) SafeAt(sc Scope, t Ts, nodes ...uuid.UUID) (Ts, *JournalEntry) {
	var by *JournalEntry
	for _, n := range nodes {
		if e := s.journals.Fenced(sc, n); e != nil && e.J.Tx <= t {
			t, by = e.J.Tx-1, e
		}
	}
	return t, by
}
