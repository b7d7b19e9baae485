package cascade

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/google/uuid"
	"github.com/telha/telha-cascade/internal/testnats"
	"github.com/telha/telha-cascade/storage"
)

// TestNothingCommitsBetweenADecisionsReadsAndItsBatch pauses a group at
// each of its reads while a journaled cascade T of the hub it touches is
// released from each of its pauses (before each chunk, before its
// removal). T's next durable step is queued on the writer, and must not
// commit until the group's batch has: the group decides on the state it
// read, and its batch is the very next commit. The group's answer and the
// whole store then equal the serial model (T in flight when the group
// decided).
func TestNothingCommitsBetweenADecisionsReadsAndItsBatch(t *testing.T) {
	requests := map[string]func(g *ilGraph) Request{
		"put_edge onto H": func(g *ilGraph) Request {
			q := g.req(storage.OpPutEdge, uuid.New(), "x-"+uuid.NewString())
			q.Src, q.Dst = g.Y, g.H
			return q
		},
		"inline neighbour M": func(g *ilGraph) Request { return g.req(storage.OpTombstoneNode, g.M, "x-"+uuid.NewString()) },
	}
	for name, mk := range requests {
		for step := 1; step <= 5; step++ {
			for read := 1; ; read++ {
				var finished bool
				t.Run(fmt.Sprintf("%s/step_%d/read_%d", name, step, read), func(t *testing.T) {
					finished = pausedRead(t, mk, step, read)
				})
				if finished || t.Failed() {
					break
				}
			}
		}
	}
}

// pausedRead runs one case; it reports true when the group made fewer than
// read reads (the previous case was its last read).
func pausedRead(t *testing.T, mk func(g *ilGraph) Request, step, read int) bool {
	r := newILRun(t)
	g := &r.g
	held, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	r.mu.Lock()
	r.hold = func(j *storage.JournalEntry, n int) {
		if j.J.NodeID == g.H && n == step {
			once.Do(func() { close(held); <-release })
		}
	}
	r.mu.Unlock()
	out := r.apply(g.req(storage.OpTombstoneNode, g.H, "T"))
	<-held

	x := mk(g)
	var reads atomic.Int64
	paused, resume := make(chan struct{}), make(chan struct{})
	hook := func() {
		if reads.Add(1) == int64(read) {
			close(paused)
			<-resume
		}
	}
	r.e.onTxnRead.Store(&hook)
	var mu sync.Mutex
	var order []string
	r.e.fault.SetObserve(func(_ int, b *pebble.Batch) {
		who := "T"
		if bytes.Contains(b.Repr(), []byte(x.RequestID)) {
			who = "X"
		}
		mu.Lock()
		order = append(order, who)
		mu.Unlock()
	})
	res := make(chan Outcome, 1)
	go func() {
		o, _, err := r.e.ops.Apply(ctx, []Request{x})
		if err != nil {
			t.Error(err)
		}
		res <- o[0]
	}()
	var oc Outcome
	select {
	case <-paused:
	case oc = <-res:
		// Fewer reads than read: nothing to pause. Finish T and stop.
		close(release)
		<-out[0].Journal.Removed()
		r.wait()
		return true
	}
	calls := r.e.fault.Calls()
	close(release) // T's applier queues its next durable step...
	testnats.Eventually(t, 20*time.Second, "T's next step queued on the writer", func() bool {
		fg, bg := r.e.store.WriterQueue()
		return fg+bg > 0
	})
	if got := r.e.fault.Calls(); got != calls {
		t.Fatalf("%d durable calls while the group was between its reads", got-calls)
	}
	close(resume) // ...and commits only after the group's batch.
	oc = <-res
	r.e.onTxnRead.Store(nil)
	<-out[0].Journal.Removed()
	r.wait()
	mu.Lock()
	if len(order) == 0 || order[0] != "X" {
		t.Fatalf("commit order after the pause %v: the group's batch must come first", order)
	}
	mu.Unlock()
	want := r.im.decide(x, oc.Receipt.Tx)
	got := ilWant{kind: oc.Kind, status: oc.Status(), dup: oc.Duplicate, edges: oc.Receipt.EdgesTombstoned, journaled: oc.Receipt.Journaled}
	if got != want {
		t.Fatalf("%s: store %+v (%v), model %+v", x.Op, got, oc.Err, want)
	}
	r.im.end("T")
	r.check()
	return false
}

// TestNoDurableBatchAboveMaxBatchOps counts the puts of every durable batch
// at the engine while groups of mixed requests are applied: puts and
// tombstones, inline cascades right at the threshold (their write-set plus
// receipt exactly max_batch_ops) and just past it (journaled), and requests
// of tenants new to the store (a registry row each). No batch may hold
// more than max_batch_ops (CONTRACT §3: "at or under"), and groups must still
// pack many requests per batch.
func TestNoDurableBatchAboveMaxBatchOps(t *testing.T) {
	for _, max := range []int{7, 23, 53} {
		t.Run(fmt.Sprint("max_batch_ops_", max), func(t *testing.T) {
			e := openEnv(t, "", Options{MaxBatchOps: max})
			var largest, batches atomic.Int64
			e.fault.SetObserve(func(_ int, b *pebble.Batch) {
				batches.Add(1)
				if n := int64(b.Count()); n > largest.Load() {
					largest.Store(n)
				}
				if n := int(b.Count()); n > max {
					t.Errorf("a durable batch of %d ops at max_batch_ops %d", n, max)
				}
			})
			r := rand.New(rand.NewPCG(uint64(max), 3))
			inline := (max - 3 - 1) / 5 // the most edges an inline cascade with a receipt holds
			var reqs []Request
			rid := 0
			req := func(sc storage.Scope, op storage.Op, id uuid.UUID) Request {
				rid++
				return Request{Scope: sc, Op: op, RequestID: fmt.Sprint("q", rid), ID: id, Label: "rel",
					ValidFrom: storage.NoTs, ValidTo: storage.NoTs, ValidEnd: storage.NoTs, Prov: anon}
			}
			var hubs []Request
			for round := 0; round < 6; round++ {
				sc := storage.MustScope(fmt.Sprintf("t%d", round)) // a new tenant per round
				var nodes []uuid.UUID
				for i := 0; i < 30; i++ {
					n := uuid.New()
					nodes = append(nodes, n)
					reqs = append(reqs, req(sc, storage.OpPutNode, n))
				}
				// Hubs with inline, inline+1 and 3*inline+2 edges.
				for h, k := range []int{inline, inline + 1, 3*inline + 2} {
					for i := 0; i < k; i++ {
						q := req(sc, storage.OpPutEdge, uuid.New())
						q.Src, q.Dst = nodes[h], nodes[3+r.IntN(27)]
						reqs = append(reqs, q)
					}
					hubs = append(hubs, req(sc, storage.OpTombstoneNode, nodes[h]))
				}
				for i := 0; i < 20; i++ {
					q := req(sc, storage.OpPutEdge, uuid.New())
					q.Src, q.Dst = nodes[3+r.IntN(27)], nodes[3+r.IntN(27)]
					reqs = append(reqs, q)
				}
			}
			out, _, err := e.ops.Apply(ctx, reqs)
			if err != nil {
				t.Fatal(err)
			}
			for i, oc := range out {
				if oc.Kind != Answered || oc.Err != nil {
					t.Fatalf("setup request %d: %+v", i, oc)
				}
			}
			r.Shuffle(len(hubs), func(i, j int) { hubs[i], hubs[j] = hubs[j], hubs[i] })
			out, _, err = e.ops.Apply(ctx, hubs)
			if err != nil {
				t.Fatal(err)
			}
			inlined, journaled := 0, 0
			for _, oc := range out {
				switch oc.Kind {
				case Journaled:
					journaled++
					if _, err := e.ops.ApplyJournal(ctx, oc.Journal, JournalObserver{}); err != nil {
						t.Fatal(err)
					}
				case Answered:
					if oc.Err != nil {
						t.Fatal(oc.Err)
					}
					inlined++
				}
			}
			if inline > 0 && (inlined == 0 || journaled == 0) {
				t.Fatalf("%d inline and %d journaled cascades: the threshold was not exercised", inlined, journaled)
			}
			if want := int64(max - 1); largest.Load() < want {
				t.Fatalf("largest batch %d ops: groups did not fill up to max_batch_ops %d", largest.Load(), max)
			}
			t.Logf("max_batch_ops %d: %d batches, the largest %d ops; %d inline and %d journaled cascades", max, batches.Load(), largest.Load(), inlined, journaled)
		})
	}
}
