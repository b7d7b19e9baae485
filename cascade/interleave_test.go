package cascade

import (
	"fmt"
	"sort"
	"sync"
	"testing"

	"github.com/google/uuid"
	"github.com/telha/telha-cascade/storage"
)

// The interleaving tests of the one-writer rule. A journaled cascade T of a
// hub H is paused at each of its durable steps (before its group, in its
// group on either side of the other request, after its head before each
// chunk, before its removal, after it), and at each pause one request X
// that touches H is applied: a put_edge onto H and one from H, a put_node
// of H, a second tombstone_node of H, a tombstone_edge of a journaled edge,
// an inline and a journaled neighbour cascade sharing an edge with H, and a
// redelivery of T. Every outcome, and the whole store afterwards, must be
// what a serial reference model gives for the serial order that pause
// stands for; no ghost at any coordinate.

const ilMaxBatchOps = 23 // with a receipt, more than 3 edges is journaled

// ilGraph is the test graph: H has 6 edges (journaled), among them eS to M
// (3 edges, inline) and eJ from J (5 edges, journaled), and a self-loop.
type ilGraph struct {
	sc            storage.Scope
	H, M, J, K, Y uuid.UUID
	e1, eS, eJ    uuid.UUID
	nodes, edges  []uuid.UUID
}

// ilModel is the serial reference: rmodel's versions and collection rule,
// plus receipts and the journals in flight (their fences).
type ilModel struct {
	m        *rmodel
	receipts map[string]storage.Receipt
	inflight map[uuid.UUID]*ilJournal
	journals map[string]*ilJournal // by request id
}

type ilJournal struct {
	node          uuid.UUID
	validEnd, tx  storage.Ts
	rid           string
	done          bool
	edges         int
	receiptStored storage.Receipt
}

// ilWant is what the model says a request comes to.
type ilWant struct {
	kind      Kind
	status    storage.Status
	dup       bool
	edges     uint64
	journaled bool
}

func newILModel() *ilModel {
	return &ilModel{m: newRModel(), receipts: map[string]storage.Receipt{}, inflight: map[uuid.UUID]*ilJournal{}, journals: map[string]*ilJournal{}}
}

func (im *ilModel) fenced(n uuid.UUID) bool { return im.inflight[n] != nil }

// decide applies r at the model's current point with the store's tx (used
// only when the model says ok).
func (im *ilModel) decide(r Request, tx storage.Ts) ilWant {
	if rc, ok := im.receipts[r.RequestID]; ok && r.RequestID != "" {
		return ilWant{kind: Answered, status: rc.Status, dup: true, edges: rc.EdgesTombstoned, journaled: rc.Journaled}
	}
	if j := im.journals[r.RequestID]; j != nil && !j.done {
		return ilWant{kind: Journaled, status: storage.StatusOK, dup: true}
	}
	m := im.m
	refuse := func(st storage.Status) ilWant {
		im.receipts[r.RequestID] = storage.Receipt{Op: r.Op, ID: r.ID, Status: st}
		return ilWant{kind: Answered, status: st}
	}
	ok := func(edges int) ilWant {
		im.receipts[r.RequestID] = storage.Receipt{Op: r.Op, ID: r.ID, Status: storage.StatusOK, Tx: tx, EdgesTombstoned: uint64(edges)}
		return ilWant{kind: Answered, status: storage.StatusOK, edges: uint64(edges)}
	}
	switch r.Op {
	case storage.OpPutNode:
		if im.fenced(r.ID) {
			return refuse(storage.StatusCascadeInFlight)
		}
		if l, ok := m.latest(r.ID); ok && l.tombstone {
			return refuse(storage.StatusAlreadyTombstoned)
		}
		m.add(r.ID, mv{kind: storage.KindNode, valid: storage.Open(tx), tx: tx})
		return ok(0)
	case storage.OpPutEdge:
		for _, n := range []uuid.UUID{r.Src, r.Dst} {
			if _, ok := m.latest(n); !ok {
				return refuse(storage.StatusNotFound)
			}
		}
		if im.fenced(r.Src) || im.fenced(r.Dst) {
			return refuse(storage.StatusCascadeInFlight)
		}
		if l, ok := m.latest(r.ID); ok && l.tombstone {
			return refuse(storage.StatusAlreadyTombstoned)
		}
		for _, n := range []uuid.UUID{r.Src, r.Dst} {
			if l, _ := m.latest(n); l.tombstone {
				return refuse(storage.StatusEndpointDead)
			}
		}
		m.add(r.ID, mv{kind: storage.KindEdge, src: r.Src, dst: r.Dst, label: r.Label, valid: storage.Open(tx), tx: tx})
		return ok(0)
	case storage.OpTombstoneEdge:
		l, found := m.latest(r.ID)
		switch {
		case !found:
			return refuse(storage.StatusNotFound)
		case im.fenced(l.src) || im.fenced(l.dst):
			return refuse(storage.StatusCascadeInFlight)
		case l.tombstone:
			return refuse(storage.StatusAlreadyTombstoned)
		}
		m.add(r.ID, mv{kind: storage.KindEdge, src: l.src, dst: l.dst, label: l.label, valid: storage.Open(tx), tx: tx, tombstone: true})
		return ok(0)
	case storage.OpTombstoneNode:
		l, found := m.latest(r.ID)
		switch {
		case !found:
			return refuse(storage.StatusNotFound)
		case im.fenced(r.ID):
			return refuse(storage.StatusCascadeInFlight)
		case l.tombstone:
			return refuse(storage.StatusAlreadyTombstoned)
		}
		set := m.cascadeSet(r.ID, tx)
		if 5*len(set)+3+1 <= ilMaxBatchOps {
			for _, e := range m.touching(r.ID) { // every neighbour, taken or not
				le, _ := m.latest(e)
				if o := other(le, r.ID); o != r.ID && im.fenced(o) {
					return refuse(storage.StatusCascadeInFlight)
				}
			}
			return ok(m.tombstoneNode(r.ID, tx, tx))
		}
		j := &ilJournal{node: r.ID, validEnd: tx, tx: tx, rid: r.RequestID}
		im.inflight[r.ID] = j
		im.journals[r.RequestID] = j
		return ilWant{kind: Journaled, status: storage.StatusOK}
	}
	panic("op")
}

func other(v mv, n uuid.UUID) uuid.UUID {
	if v.src == n {
		return v.dst
	}
	return v.src
}

// end finishes a journal in the model (its cascade, at its tx).
func (im *ilModel) end(rid string) {
	j := im.journals[rid]
	j.edges = im.m.tombstoneNode(j.node, j.validEnd, j.tx)
	j.done = true
	delete(im.inflight, j.node)
	rc := storage.Receipt{Op: storage.OpTombstoneNode, ID: j.node, Status: storage.StatusOK, Tx: j.tx, EdgesTombstoned: uint64(j.edges), Journaled: true}
	im.receipts[rid] = rc
	j.receiptStored = rc
}

// ilRun is one store under test, mirrored into the model.
type ilRun struct {
	t     *testing.T
	e     *env
	g     ilGraph
	im    *ilModel
	hold  func(j *storage.JournalEntry, n int)
	mu    sync.Mutex
	runs  sync.WaitGroup
	fails []string
}

func newILRun(t *testing.T) *ilRun {
	r := &ilRun{t: t, im: newILModel()}
	r.e = openEnv(t, "", Options{MaxBatchOps: ilMaxBatchOps, ChunkOps: 10, Hooks: Hooks{JournalStep: func(j *storage.JournalEntry, n int) {
		r.mu.Lock()
		h := r.hold
		r.mu.Unlock()
		if h != nil {
			h(j, n)
		}
	}}})
	r.build()
	return r
}

var ilSeq int

func (r *ilRun) rid() string { ilSeq++; return fmt.Sprintf("r%d", ilSeq) }

// apply applies reqs as one group, checks each outcome against the model
// (decided in that order), and starts an applier for each journal.
func (r *ilRun) apply(reqs ...Request) []Outcome {
	r.t.Helper()
	out, _, err := r.e.ops.Apply(ctx, reqs)
	if err != nil {
		r.t.Fatal(err)
	}
	for i, req := range reqs {
		oc := out[i]
		tx := oc.Receipt.Tx
		if oc.Kind == Journaled {
			tx = oc.Journal.J.Tx
		}
		want := r.im.decide(req, tx)
		got := ilWant{kind: oc.Kind, status: oc.Status(), dup: oc.Duplicate, edges: oc.Receipt.EdgesTombstoned, journaled: oc.Receipt.Journaled}
		if got != want {
			r.t.Fatalf("%s %s (request %s): store %+v (err %v), model %+v", req.Op, r.name(req.ID), req.RequestID, got, oc.Err, want)
		}
		if oc.Kind == Journaled && !oc.Duplicate {
			r.runs.Add(1)
			go func(e *storage.JournalEntry) {
				defer r.runs.Done()
				if _, err := r.e.ops.ApplyJournal(ctx, e, JournalObserver{}); err != nil {
					r.mu.Lock()
					r.fails = append(r.fails, err.Error())
					r.mu.Unlock()
				}
			}(oc.Journal)
		}
	}
	return out
}

// wait waits for every applier started so far.
func (r *ilRun) wait() {
	r.t.Helper()
	r.runs.Wait()
	if len(r.fails) > 0 {
		r.t.Fatalf("appliers failed: %v", r.fails)
	}
}

func (r *ilRun) name(id uuid.UUID) string {
	g := r.g
	for n, x := range map[string]uuid.UUID{"H": g.H, "M": g.M, "J": g.J, "K": g.K, "Y": g.Y, "e1": g.e1, "eS": g.eS, "eJ": g.eJ} {
		if x == id {
			return n
		}
	}
	return id.String()[:8]
}

func (r *ilRun) build() {
	g := &r.g
	g.sc = storage.MustScope("il")
	n := func() uuid.UUID {
		id := uuid.New()
		g.nodes = append(g.nodes, id)
		r.apply(Request{Scope: g.sc, Op: storage.OpPutNode, RequestID: r.rid(), ID: id, ValidFrom: storage.NoTs, ValidTo: storage.NoTs, ValidEnd: storage.NoTs, Prov: anon})
		return id
	}
	ed := func(src, dst uuid.UUID) uuid.UUID {
		id := uuid.New()
		g.edges = append(g.edges, id)
		r.apply(Request{Scope: g.sc, Op: storage.OpPutEdge, RequestID: r.rid(), ID: id, Src: src, Dst: dst, Label: "rel", ValidFrom: storage.NoTs, ValidTo: storage.NoTs, ValidEnd: storage.NoTs, Prov: anon})
		return id
	}
	g.H, g.M, g.J, g.K, g.Y = n(), n(), n(), n(), n()
	l1, l2 := n(), n()
	g.e1 = ed(g.H, l1)
	ed(g.H, l2)
	ed(g.H, g.H) // a self-loop, counted once
	ed(g.H, g.K)
	g.eS = ed(g.H, g.M)
	g.eJ = ed(g.J, g.H)
	ed(g.M, g.K)
	ed(g.K, g.M)
	for i := 0; i < 4; i++ {
		ed(g.J, g.K)
	}
}

func (g *ilGraph) req(op storage.Op, id uuid.UUID, rid string) Request {
	return Request{Scope: g.sc, Op: op, RequestID: rid, ID: id, Label: "rel", ValidFrom: storage.NoTs, ValidTo: storage.NoTs, ValidEnd: storage.NoTs, Prov: anon}
}

// ilRequests are the requests X raced against T.
func ilRequests(g *ilGraph, t Request) map[string]func() Request {
	edge := func(src, dst uuid.UUID) func() Request {
		return func() Request {
			q := g.req(storage.OpPutEdge, uuid.New(), "x-"+uuid.NewString())
			q.Src, q.Dst = src, dst
			return q
		}
	}
	return map[string]func() Request{
		"put_edge onto H":       edge(g.Y, g.H),
		"put_edge from H":       edge(g.H, g.Y),
		"put_node H":            func() Request { return g.req(storage.OpPutNode, g.H, "x-"+uuid.NewString()) },
		"second tombstone_node": func() Request { return g.req(storage.OpTombstoneNode, g.H, "x-"+uuid.NewString()) },
		"tombstone_edge e1":     func() Request { return g.req(storage.OpTombstoneEdge, g.e1, "x-"+uuid.NewString()) },
		"inline neighbour M":    func() Request { return g.req(storage.OpTombstoneNode, g.M, "x-"+uuid.NewString()) },
		"journaled neighbour J": func() Request { return g.req(storage.OpTombstoneNode, g.J, "x-"+uuid.NewString()) },
		"redelivery of T":       func() Request { return t },
	}
}

// TestInterleavings runs every request X at every pause of T.
func TestInterleavings(t *testing.T) {
	positions := []string{"before", "same group, X first", "same group, T first", "before chunk 1", "before chunk 2", "before chunk 3", "before chunk 4", "before removal", "after"}
	names := []string{"put_edge onto H", "put_edge from H", "put_node H", "second tombstone_node", "tombstone_edge e1", "inline neighbour M", "journaled neighbour J", "redelivery of T"}
	for _, pos := range positions {
		for _, name := range names {
			if name == "redelivery of T" && pos == "before" {
				continue // a redelivery comes after its first delivery
			}
			t.Run(pos+"/"+name, func(t *testing.T) {
				r := newILRun(t)
				g := &r.g
				tReq := g.req(storage.OpTombstoneNode, g.H, "T")
				x := ilRequests(g, tReq)[name]()
				r.interleave(pos, tReq, x)
				r.check()
			})
		}
	}
}

// interleave runs T and X in the order pos names, deciding and ending the
// model's journals in the same order.
func (r *ilRun) interleave(pos string, tReq, x Request) {
	t := r.t
	endJournals := func(rids ...string) {
		r.wait()
		for _, rid := range rids {
			if j := r.im.journals[rid]; j != nil && !j.done {
				r.im.end(rid)
			}
		}
	}
	switch pos {
	case "before":
		r.apply(x)
		endJournals(x.RequestID)
		r.apply(tReq)
		endJournals("T")
	case "same group, X first":
		r.apply(x, tReq)
		endJournals(x.RequestID, "T") // in commit order: an earlier journal ends first
	case "same group, T first":
		r.apply(tReq, x)
		endJournals("T", x.RequestID)
	case "after":
		r.apply(tReq)
		endJournals("T")
		r.apply(x)
		endJournals(x.RequestID)
	default:
		step := map[string]int{"before chunk 1": 1, "before chunk 2": 2, "before chunk 3": 3, "before chunk 4": 4, "before removal": 5}[pos]
		held, release := make(chan struct{}), make(chan struct{})
		var once sync.Once
		r.mu.Lock()
		r.hold = func(j *storage.JournalEntry, n int) {
			if j.J.NodeID == r.g.H && n == step {
				once.Do(func() { close(held); <-release })
			}
		}
		r.mu.Unlock()
		out := r.apply(tReq)
		<-held
		r.apply(x)
		close(release)
		if e := out[0].Journal; e != nil {
			<-e.Removed()
		}
		endJournals("T", x.RequestID)
	}
	_ = t
}

// check compares the whole store with the model: every entity's history
// (tx, valid interval, tombstone) and every journaled request's receipt;
// no journal left; no ghost.
func (r *ilRun) check() {
	t := r.t
	r.wait()
	if n := r.e.store.Journals().Len(); n != 0 {
		t.Fatalf("%d journals left", n)
	}
	for rid, j := range r.im.journals {
		rc, ok, err := storage.GetReceipt(r.e.store.Reader(), r.g.sc, rid)
		rc.Fingerprint = storage.Fingerprint{} // the model has none
		if err != nil || !ok || rc != j.receiptStored {
			t.Fatalf("receipt of journaled %s: store %+v (%v %v), model %+v", rid, rc, ok, err, j.receiptStored)
		}
	}
	ids := append(append([]uuid.UUID(nil), r.g.nodes...), r.im.m.all(storage.KindEdge)...)
	for _, id := range ids {
		k := r.im.m.kind[id]
		h, err := r.e.store.History(r.g.sc, k, id)
		if err != nil {
			t.Fatal(err)
		}
		want := append([]mv(nil), r.im.m.vers[id]...)
		sort.SliceStable(want, func(i, j int) bool { return want[i].tx < want[j].tx })
		if len(h) != len(want) {
			t.Fatalf("%s %s: %d versions in the store, %d in the model", k, r.name(id), len(h), len(want))
		}
		for i := range h {
			if h[i].Tx.Start != want[i].tx || h[i].Valid != want[i].valid || h[i].Tombstone != want[i].tombstone {
				t.Fatalf("%s %s version %d: store tx %s valid %s tomb %v, model tx %s valid %s tomb %v", k, r.name(id), i,
					h[i].Tx.Start, h[i].Valid, h[i].Tombstone, want[i].tx, want[i].valid, want[i].tombstone)
			}
		}
	}
	checkNoGhostsNoDoubles(t, r.e.store, r.g.sc, r.g.nodes, r.im.m.all(storage.KindEdge))
}
