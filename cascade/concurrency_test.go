package cascade

import (
	"errors"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/telha/telha-cascade/internal/testnats"
	"github.com/telha/telha-cascade/storage"
)

// TestJournalFencesItsNode holds a journaled cascade between its commit
// point and its first chunk, and checks that every write touching the node
// is refused with the retryable ErrCascadeInFlight meanwhile, while a
// journaled neighbour cascade sharing an edge waits for it and then sees
// the shared edge dead (it does not tombstone it again).
func TestJournalFencesItsNode(t *testing.T) {
	hold, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	var hub storage.Ts
	e := openEnv(t, "", Options{MaxBatchOps: 23, Hooks: Hooks{JournalStep: func(j *storage.JournalEntry, n int) {
		if n == 1 && j.J.Tx == hub { // the hub's first chunk, after its journal landed
			once.Do(func() { close(hold); <-release })
		}
	}}}) // more than 4 edges is journaled
	sc := storage.MustScope("fence")
	n, m, k, p := uuid.New(), uuid.New(), uuid.New(), uuid.New()
	for _, x := range []uuid.UUID{n, m, k, p} {
		e.node(sc, x, storage.NoTs, storage.NoTs)
	}
	e1, e2, np := uuid.New(), uuid.New(), uuid.New()
	e.edge(sc, e1, n, m, storage.NoTs, storage.NoTs)
	e.edge(sc, e2, m, n, storage.NoTs, storage.NoTs)
	e.edge(sc, np, n, p, storage.NoTs, storage.NoTs)
	for i := 0; i < 3; i++ {
		e.edge(sc, uuid.New(), n, k, storage.NoTs, storage.NoTs)
	}
	e.edge(sc, uuid.New(), m, k, storage.NoTs, storage.NoTs)
	for i := 0; i < 5; i++ { // p: journaled too, and shares np with n
		e.edge(sc, uuid.New(), p, k, storage.NoTs, storage.NoTs)
	}
	hub = e.store.Clock().Last() + 1

	res := make(chan error, 1)
	go func() {
		_, err := e.ops.TombstoneNode(ctx, sc, n, storage.NoTs, anon)
		res <- err
	}()
	<-hold
	if j := e.store.Journals().Fenced(sc, n); j == nil || j.J.Tx != hub {
		t.Fatal("no fence while the journal is in flight")
	}
	refused := func(name string, err error) {
		t.Helper()
		if !errors.Is(err, ErrCascadeInFlight) || !storage.IsRetryable(err) {
			t.Errorf("%s during the cascade: %v, want retryable cascade_in_flight", name, err)
		}
	}
	_, err := e.ops.PutEdge(ctx, sc, storage.EdgeWrite{ID: uuid.New(), Src: k, Dst: n, ValidFrom: storage.NoTs, ValidTo: storage.NoTs})
	refused("put_edge onto the node", err)
	_, err = e.ops.PutEdge(ctx, sc, storage.EdgeWrite{ID: e1, Src: n, Dst: m, Label: "new", ValidFrom: storage.NoTs, ValidTo: storage.NoTs})
	refused("put_edge of a journaled edge", err)
	_, err = e.ops.PutNode(ctx, sc, storage.NodeWrite{ID: n, ValidFrom: storage.NoTs, ValidTo: storage.NoTs})
	refused("put_node of the node", err)
	_, err = e.ops.TombstoneEdge(ctx, sc, e2, storage.NoTs, anon)
	refused("tombstone_edge of a journaled edge", err)
	_, err = e.ops.TombstoneNode(ctx, sc, m, storage.NoTs, anon)
	refused("inline cascade of a neighbour", err)
	_, err = e.ops.TombstoneNode(ctx, sc, n, storage.NoTs, anon)
	refused("second cascade of the node", err)
	if _, err := e.ops.PutEdge(ctx, sc, storage.EdgeWrite{ID: uuid.New(), Src: m, Dst: k, ValidFrom: storage.NoTs, ValidTo: storage.NoTs}); err != nil {
		t.Errorf("unrelated write refused: %v", err)
	}
	// A journaled neighbour cascade is accepted (its journal commits), and
	// its applier waits for the earlier journal that shares np.
	pres := make(chan CascadeReceipt, 1)
	go func() {
		rc, err := e.ops.TombstoneNode(ctx, sc, p, storage.NoTs, anon)
		if err != nil {
			t.Errorf("journaled neighbour cascade: %v", err)
		}
		pres <- rc
	}()
	testnats.Eventually(t, 20*time.Second, "the neighbour's journal", func() bool { return e.store.Journals().Fenced(sc, p) != nil })
	close(release)
	if err := <-res; err != nil {
		t.Fatal(err)
	}
	if rc := <-pres; !rc.Journaled || rc.EdgesTombstoned != 5 {
		t.Fatalf("neighbour receipt %+v: want journaled, 5 edges (np was the hub's)", rc)
	}
	if e.store.Journals().Len() != 0 {
		t.Fatal("fences outlived their journals")
	}
	if h, _ := e.store.History(sc, storage.KindEdge, np); len(h) != 2 || !h[1].Tombstone || h[1].Tx.Start != hub {
		t.Fatalf("shared edge history %+v: want one tombstone, the hub's", h)
	}
	if _, err := e.ops.TombstoneNode(ctx, sc, m, storage.NoTs, anon); err != nil {
		t.Fatalf("neighbour cascade after the journal: %v", err)
	}
}

// TestConcurrentWritesAndCascadesLeaveNoGhosts: many goroutines mix edge
// writes, edge tombstones and node cascades (inline and journaled) on a
// small dense graph. Afterwards: zero ghost edges and zero redundant double
// tombstones.
func TestConcurrentWritesAndCascadesLeaveNoGhosts(t *testing.T) {
	e := openEnv(t, "", Options{MaxBatchOps: 23}) // more than 4 edges is journaled
	sc := storage.MustScope("stress")
	var nodes []uuid.UUID
	for i := 0; i < 40; i++ {
		n := uuid.New()
		nodes = append(nodes, n)
		e.node(sc, n, year(2000), storage.NoTs)
	}
	var (
		mu    sync.Mutex
		edges []uuid.UUID
	)
	workers, steps := 8, 250
	if testing.Short() {
		steps = 50
	}
	var wg sync.WaitGroup
	var cascades, journaled, inFlight int64
	var cmu sync.Mutex
	for g := 0; g < workers; g++ {
		wg.Add(1)
		go func(seed uint64) {
			defer wg.Done()
			r := rand.New(rand.NewPCG(seed, 1))
			for i := 0; i < steps; i++ {
				var err error
				pick := func() uuid.UUID {
					if r.IntN(2) == 0 {
						return nodes[r.IntN(6)] // hubs: big enough to be journaled
					}
					return nodes[r.IntN(len(nodes))]
				}
				switch op := r.IntN(40); {
				case op < 28:
					id := uuid.New()
					_, err = e.ops.PutEdge(ctx, sc, storage.EdgeWrite{ID: id, Src: pick(), Dst: pick(), ValidFrom: year(2001), ValidTo: storage.NoTs})
					if err == nil {
						mu.Lock()
						edges = append(edges, id)
						mu.Unlock()
					}
				case op < 32:
					mu.Lock()
					var id uuid.UUID
					if len(edges) > 0 {
						id = edges[r.IntN(len(edges))]
					}
					mu.Unlock()
					_, err = e.ops.TombstoneEdge(ctx, sc, id, year(2010+r.IntN(30)), anon)
				case op < 37:
					_, err = e.ops.PutNode(ctx, sc, storage.NodeWrite{ID: nodes[r.IntN(len(nodes))], ValidFrom: year(2000), ValidTo: storage.NoTs})
				default:
					var rc CascadeReceipt
					rc, err = e.ops.TombstoneNode(ctx, sc, pick(), year(2010+r.IntN(30)), anon)
					if err == nil {
						cmu.Lock()
						cascades++
						if rc.Journaled {
							journaled++
						}
						cmu.Unlock()
					}
				}
				if errors.Is(err, ErrCascadeInFlight) {
					cmu.Lock()
					inFlight++
					cmu.Unlock()
				}
				if err != nil && !errors.Is(err, ErrNotFound) && !errors.Is(err, ErrAlreadyTombstoned) &&
					!errors.Is(err, ErrEndpointDead) && !errors.Is(err, ErrCascadeInFlight) {
					t.Errorf("unexpected error: %v", err)
					return
				}
			}
		}(uint64(g))
	}
	wg.Wait()
	t.Logf("%d cascades (%d journaled), %d cascade_in_flight refusals, %d edges", cascades, journaled, inFlight, len(edges))
	if cascades == 0 || journaled == 0 {
		t.Fatal("no journaled cascade succeeded: the stress exercised too little")
	}
	checkNoGhostsNoDoubles(t, e.store, sc, nodes, edges)
}

func checkNoGhostsNoDoubles(t *testing.T, s *storage.Store, sc storage.Scope, nodes, edges []uuid.UUID) {
	t.Helper()
	now := s.Clock().Last() + 1
	dead := map[uuid.UUID]storage.Version{}
	for _, n := range nodes {
		h, err := s.History(sc, storage.KindNode, n)
		if err != nil {
			t.Fatal(err)
		}
		tombs := 0
		for _, v := range h {
			if v.Tombstone {
				tombs++
				dead[n] = v
			}
		}
		if tombs > 1 {
			t.Errorf("node %s has %d tombstone versions", n, tombs)
		}
	}
	for _, id := range edges {
		h, err := s.History(sc, storage.KindEdge, id)
		if err != nil {
			t.Fatal(err)
		}
		var prev *storage.Version
		for i := range h {
			if !h[i].Tombstone {
				continue
			}
			if prev != nil && h[i].Valid.Start >= prev.Valid.Start {
				t.Errorf("edge %s tombstoned twice without narrowing: %s then %s", id, prev.Valid.Start, h[i].Valid.Start)
			}
			prev = &h[i]
		}
		last := h[len(h)-1]
		for _, n := range []uuid.UUID{last.Src, last.Dst} {
			nt, ok := dead[n]
			if !ok {
				continue
			}
			for _, v := range []storage.Ts{nt.Valid.Start, nt.Valid.Start + 1, year(2100)} {
				if _, live, _ := s.EdgeAsOf(sc, id, v, now); live {
					t.Errorf("ghost: edge %s reads live at %s beside node %s dead since %s", id, v, n, nt.Valid.Start)
				}
			}
		}
	}
}
