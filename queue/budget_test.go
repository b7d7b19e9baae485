package queue

import (
	"testing"
	"time"
)

// TestByteBudget: the worker's bound on bytes held. What fits is taken at
// once; what does not waits for a release; one message larger than the
// whole budget is taken when nothing is held, so it cannot wedge the worker.
func TestByteBudget(t *testing.T) {
	b := newByteBudget(100)
	b.acquire(60)
	b.acquire(40) // exactly full

	got := make(chan struct{})
	go func() { b.acquire(10); close(got) }()
	select {
	case <-got:
		t.Fatal("acquired 10 bytes over a full budget of 100")
	case <-time.After(50 * time.Millisecond): // proving a wait: nothing may arrive
	}
	b.release(60)
	select {
	case <-got:
	case <-time.After(10 * time.Second):
		t.Fatal("a release of 60 did not let 10 bytes in")
	}
	b.release(40)
	b.release(10)

	done := make(chan struct{})
	go func() { b.acquire(1000); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("a message larger than the budget was not taken by an empty budget")
	}
	b.release(1000)
	if b.used != 0 {
		t.Fatalf("used %d after every release", b.used)
	}
}
