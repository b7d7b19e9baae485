package storage

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// The one writer.
//
// Invariant (one writer): every durable commit of the store runs on one
// goroutine, the writer, one task at a time; a task's reads start on that
// goroutine after the previous task's commit, and its own batch commits
// before the next task starts. So nothing commits between a decision's
// reads and its batch: whatever a task read is still the committed state
// when its batch lands. The journal registry (the fences) changes only on
// the writer too, in the task whose commit makes the change true (a
// journal head's commit registers its fence, the journal's removal
// unregisters it), so a task that checks a fence and then reads sees both
// as of the same point of the commit order.
//
// Nothing outside this file calls Engine.Commit, except checkFormat at open
// (before the writer starts).
//
// Tasks come in two lanes. Foreground: groups of requests (Update), journal
// heads and removals, outbox deletes, the snapshots journal appliers start
// from (Exclusive). Background: the chunks of journaled cascades
// (CommitBatch). When both lanes have work the writer alternates between
// them, so a request waits for at most one chunk, never for a whole
// super-node cascade, and a cascade still progresses under a steady stream
// of requests.
//
//	foreground  G1 G2       G3 G4
//	background     C1 C2 C3
//	writer      G1 C1 G2 C2 G3 C3 G4
//
// A task must not submit another task and wait for it (the writer would
// wait for itself). Reads that need no decision (the HTTP API, journal
// appliers' scans of their own snapshot) never go through the writer.

// Lane is a queue of the writer.
type Lane uint8

// String names the lane (metrics labels).
func (l Lane) String() string {
	if l == Background {
		return "background"
	}
	return "foreground"
}

const (
	// Foreground: requests and journal bookkeeping.
	Foreground Lane = iota
	// Background: journal chunks.
	Background
)

type task struct {
	lane Lane
	at   time.Time // queued
	ctx  context.Context
	run  func() error
	done chan taskResult
}

type taskResult struct {
	err   error
	panic any
}

type writer struct {
	mu      sync.Mutex
	lanes   [2][]*task
	last    Lane
	wake    chan struct{}
	closed  bool
	stopped chan struct{}
	busy    bool // a task is running (tests and Idle)
	idle    []chan struct{}
	// observe, when set, sees each task's wait in its lane and run time.
	observe func(lane Lane, wait, run time.Duration)
	// ended, when set, runs after every task, on the writer. The store
	// sets none: it records its committed tx in the task itself, before
	// the task's result is delivered (Store.update, safetime.go).
	ended func()
}

func newWriter(observe func(lane Lane, wait, run time.Duration), ended func()) *writer {
	w := &writer{wake: make(chan struct{}, 1), stopped: make(chan struct{}), last: Background, observe: observe, ended: ended}
	go w.loop()
	return w
}

func (w *writer) submit(ctx context.Context, lane Lane, run func() error) <-chan taskResult {
	t := &task{lane: lane, at: time.Now(), ctx: ctx, run: run, done: make(chan taskResult, 1)}
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		t.done <- taskResult{err: fmt.Errorf("%w: store closed", ErrStorage)}
		return t.done
	}
	w.lanes[lane] = append(w.lanes[lane], t)
	w.mu.Unlock()
	select {
	case w.wake <- struct{}{}:
	default:
	}
	return t.done
}

// do runs fn on the writer and waits for it. A panic in fn is re-raised in
// the caller's goroutine, so a bug fails where it was asked for and the
// writer lives on.
func (w *writer) do(ctx context.Context, lane Lane, fn func() error) error {
	return wait(w.submit(ctx, lane, fn))
}

func wait(ch <-chan taskResult) error {
	r := <-ch
	if r.panic != nil {
		panic(r.panic)
	}
	return r.err
}

// next takes the next task: the other lane's when both have work.
func (w *writer) next() (*task, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for {
		f, b := len(w.lanes[Foreground]) > 0, len(w.lanes[Background]) > 0
		var l Lane
		switch {
		case f && b:
			l = 1 - w.last
		case f:
			l = Foreground
		case b:
			l = Background
		default:
			w.busy = false
			for _, ch := range w.idle {
				close(ch)
			}
			w.idle = nil
			if w.closed {
				return nil, false
			}
			w.mu.Unlock()
			<-w.wake
			w.mu.Lock()
			continue
		}
		t := w.lanes[l][0]
		w.lanes[l][0] = nil
		w.lanes[l] = w.lanes[l][1:]
		w.last = l
		w.busy = true
		return t, true
	}
}

func (w *writer) loop() {
	defer close(w.stopped)
	for {
		t, ok := w.next()
		if !ok {
			return
		}
		if err := t.ctx.Err(); err != nil {
			t.done <- taskResult{err: err}
			continue
		}
		start := time.Now()
		r := runTask(t.run)
		if w.ended != nil {
			w.ended()
		}
		if w.observe != nil {
			w.observe(t.lane, start.Sub(t.at), time.Since(start))
		}
		t.done <- r
	}
}

func runTask(fn func() error) (r taskResult) {
	defer func() {
		if p := recover(); p != nil {
			r = taskResult{panic: p}
		}
	}()
	return taskResult{err: fn()}
}

// close refuses new tasks, lets the queued ones run, and waits for the
// writer to stop.
func (w *writer) close() {
	w.mu.Lock()
	w.closed = true
	w.mu.Unlock()
	select {
	case w.wake <- struct{}{}:
	default:
	}
	<-w.stopped
}

// whenIdle returns a channel closed the next time the writer has nothing to
// do (tests: "every queued task ran").
func (w *writer) whenIdle() <-chan struct{} {
	ch := make(chan struct{})
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.busy && len(w.lanes[0]) == 0 && len(w.lanes[1]) == 0 {
		close(ch)
		return ch
	}
	w.idle = append(w.idle, ch)
	return ch
}

func (w *writer) queued() (foreground, background int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.lanes[Foreground]), len(w.lanes[Background])
}
