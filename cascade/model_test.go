package cascade

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"sort"
	"testing"

	"github.com/google/uuid"
	"github.com/telha/telha-cascade/storage"
)

// An independent in-memory reference model of the store and the cascade:
// a flat list of versions per entity, liveness by brute force from the
// rule, and CONTRACT §3's collection rule written out again from the text.

type mv struct {
	kind      storage.Kind
	src, dst  uuid.UUID
	label     string
	valid     storage.Interval
	tx        storage.Ts
	tombstone bool
}

type rmodel struct {
	vers map[uuid.UUID][]mv
	kind map[uuid.UUID]storage.Kind
}

func newRModel() *rmodel {
	return &rmodel{vers: map[uuid.UUID][]mv{}, kind: map[uuid.UUID]storage.Kind{}}
}

func (m *rmodel) add(id uuid.UUID, v mv) {
	m.vers[id] = append(m.vers[id], v)
	m.kind[id] = v.kind
}

func (m *rmodel) latest(id uuid.UUID) (mv, bool) {
	var best mv
	ok := false
	for _, v := range m.vers[id] {
		if !ok || v.tx > best.tx {
			best, ok = v, true
		}
	}
	return best, ok
}

func (m *rmodel) asOf(id uuid.UUID, v, t storage.Ts) (mv, bool) {
	var best mv
	ok := false
	for _, x := range m.vers[id] {
		if x.valid.Contains(v) && x.tx <= t && (!ok || x.tx > best.tx) {
			best, ok = x, true
		}
	}
	if !ok || best.tombstone {
		return mv{}, false
	}
	return best, true
}

func (m *rmodel) all(k storage.Kind) []uuid.UUID {
	var out []uuid.UUID
	for id, kk := range m.kind {
		if kk == k {
			out = append(out, id)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].String() < out[j].String() })
	return out
}

// touching lists every edge ever recorded with node as an endpoint.
func (m *rmodel) touching(node uuid.UUID) []uuid.UUID {
	var out []uuid.UUID
	for _, e := range m.all(storage.KindEdge) {
		l, _ := m.latest(e)
		if l.src == node || l.dst == node {
			out = append(out, e)
		}
	}
	return out
}

// cascadeSet is CONTRACT §3's collection rule, from the text.
func (m *rmodel) cascadeSet(node uuid.UUID, validEnd storage.Ts) []uuid.UUID {
	var out []uuid.UUID
	for _, e := range m.touching(node) {
		l, _ := m.latest(e)
		if !l.tombstone || l.valid.Start > validEnd {
			out = append(out, e)
		}
	}
	return out
}

func (m *rmodel) tombstoneNode(node uuid.UUID, validEnd, tx storage.Ts) int {
	set := m.cascadeSet(node, validEnd)
	for _, e := range set {
		l, _ := m.latest(e)
		m.add(e, mv{kind: storage.KindEdge, src: l.src, dst: l.dst, label: l.label, valid: storage.Open(validEnd), tx: tx, tombstone: true})
	}
	m.add(node, mv{kind: storage.KindNode, valid: storage.Open(validEnd), tx: tx, tombstone: true})
	return len(set)
}

// cascadeRecord remembers a node cascade for the invariant checks.
type cascadeRecord struct {
	node     uuid.UUID
	validEnd storage.Ts
	tx       storage.Ts
	touched  []uuid.UUID
}

// world drives the same random history through the store and the model.
type world struct {
	t        testing.TB
	r        *rand.Rand
	e        *env
	m        *rmodel
	sc       storage.Scope
	nodes    []uuid.UUID
	edges    []uuid.UUID
	txs      []storage.Ts
	cascades []cascadeRecord
	// beforeCascade, when set, runs right before each node cascade.
	beforeCascade func(node uuid.UUID, validEnd storage.Ts)
	afterCascade  func(rec cascadeRecord)
}

func newWorld(t testing.TB, seed uint64, e *env, nNodes, nEdges int) *world {
	r := rand.New(rand.NewPCG(seed, 99))
	w := &world{t: t, r: r, e: e, m: newRModel(), sc: storage.MustScope("w")}
	for i := 0; i < nNodes; i++ {
		w.nodes = append(w.nodes, detUUID(r))
	}
	for i := 0; i < nEdges; i++ {
		w.edges = append(w.edges, detUUID(r))
	}
	return w
}

func (w *world) randTime() storage.Ts {
	switch w.r.IntN(4) {
	case 0:
		return storage.NoTs
	case 1:
		return year(1940 + w.r.IntN(40)) // before 1970
	default:
		return year(2000 + w.r.IntN(40))
	}
}

func (w *world) randInterval() (storage.Ts, storage.Ts) {
	from, to := w.randTime(), w.randTime()
	if to != storage.NoTs && w.r.IntN(2) == 0 {
		to = storage.NoTs
	}
	if from != storage.NoTs && to != storage.NoTs && from >= to {
		from, to = to, from
		if from == to {
			to = storage.NoTs
		}
	}
	if from == storage.NoTs && to != storage.NoTs {
		to = storage.NoTs // a default valid_from is "now", after any fixed valid_to here
	}
	return from, to
}

func kindOf(err error) error {
	for _, k := range []error{ErrNotFound, ErrAlreadyTombstoned, ErrEndpointDead, ErrCascadeInFlight, ErrInvalid} {
		if errors.Is(err, k) {
			return k
		}
	}
	return err
}

func (w *world) expect(name string, got, want error) {
	w.t.Helper()
	if kindOf(got) != want {
		w.t.Fatalf("%s: store says %v, model says %v", name, got, want)
	}
}

func (w *world) putNode(id uuid.UUID) {
	from, to := w.randInterval()
	var want error
	if l, ok := w.m.latest(id); ok && l.tombstone {
		want = ErrAlreadyTombstoned
	}
	tx, err := w.e.ops.PutNode(ctx, w.sc, storage.NodeWrite{ID: id, ValidFrom: from, ValidTo: to, Prov: anon})
	w.expect("put_node", err, want)
	if err == nil {
		valid := storage.Interval{Start: from, End: to}
		if from == storage.NoTs {
			valid.Start = tx
		}
		if to == storage.NoTs {
			valid.End = storage.OpenEnd
		}
		w.m.add(id, mv{kind: storage.KindNode, valid: valid, tx: tx})
		w.txs = append(w.txs, tx)
	}
}

func (w *world) putEdge(id, src, dst uuid.UUID) {
	from, to := w.randInterval()
	var want error
	l, exists := w.m.latest(id)
	switch {
	case exists && (l.src != src || l.dst != dst):
		want = ErrInvalid
	case exists && l.tombstone:
		want = ErrAlreadyTombstoned
	default:
		for _, n := range []uuid.UUID{src, dst} {
			if _, ok := w.m.latest(n); !ok {
				want = ErrNotFound
			}
		}
		if want == nil {
			for _, n := range []uuid.UUID{src, dst} {
				if ln, _ := w.m.latest(n); ln.tombstone {
					want = ErrEndpointDead
				}
			}
		}
	}
	label := fmt.Sprintf("l%d", w.r.IntN(3))
	tx, err := w.e.ops.PutEdge(ctx, w.sc, storage.EdgeWrite{ID: id, Src: src, Dst: dst, Label: label, ValidFrom: from, ValidTo: to, Prov: anon})
	w.expect("put_edge", err, want)
	if err == nil {
		valid := storage.Interval{Start: from, End: to}
		if from == storage.NoTs {
			valid.Start = tx
		}
		if to == storage.NoTs {
			valid.End = storage.OpenEnd
		}
		w.m.add(id, mv{kind: storage.KindEdge, src: src, dst: dst, label: label, valid: valid, tx: tx})
		w.txs = append(w.txs, tx)
	}
}

func (w *world) tombstoneEdge(id uuid.UUID) {
	validEnd := w.randTime()
	var want error
	l, ok := w.m.latest(id)
	switch {
	case !ok:
		want = ErrNotFound
	case l.tombstone:
		want = ErrAlreadyTombstoned
	}
	rc, err := w.e.ops.TombstoneEdge(ctx, w.sc, id, validEnd, anon)
	w.expect("tombstone_edge", err, want)
	if err == nil {
		if validEnd == storage.NoTs {
			validEnd = rc.TxTime
		}
		w.m.add(id, mv{kind: storage.KindEdge, src: l.src, dst: l.dst, label: l.label, valid: storage.Open(validEnd), tx: rc.TxTime, tombstone: true})
		w.txs = append(w.txs, rc.TxTime)
	}
}

func (w *world) tombstoneNode(id uuid.UUID) {
	validEnd := w.randTime()
	var want error
	l, ok := w.m.latest(id)
	switch {
	case !ok:
		want = ErrNotFound
	case l.tombstone:
		want = ErrAlreadyTombstoned
	}
	if want == nil && w.beforeCascade != nil {
		w.beforeCascade(id, validEnd)
	}
	rc, err := w.e.ops.TombstoneNode(ctx, w.sc, id, validEnd, anon)
	w.expect("tombstone_node", err, want)
	if err != nil {
		return
	}
	if validEnd == storage.NoTs {
		validEnd = rc.TxTime
	}
	touched := w.m.touching(id)
	n := w.m.tombstoneNode(id, validEnd, rc.TxTime)
	if uint64(n) != rc.EdgesTombstoned {
		w.t.Fatalf("cascade of %s tombstoned %d edges, model says %d", id, rc.EdgesTombstoned, n)
	}
	if want := 5*n+3 > w.e.ops.MaxBatchOps(); rc.Journaled != want {
		w.t.Fatalf("cascade of %d edges at max_batch_ops %d: journaled=%v", n, w.e.ops.MaxBatchOps(), rc.Journaled)
	}
	w.txs = append(w.txs, rc.TxTime)
	rec := cascadeRecord{node: id, validEnd: validEnd, tx: rc.TxTime, touched: touched}
	w.cascades = append(w.cascades, rec)
	if w.afterCascade != nil {
		w.afterCascade(rec)
	}
}

// step applies one random operation; hubs are made by biasing edges towards
// the first nodes.
func (w *world) step() {
	pickNode := func() uuid.UUID {
		if w.r.IntN(3) == 0 {
			return w.nodes[w.r.IntN(min(2, len(w.nodes)))]
		}
		return w.nodes[w.r.IntN(len(w.nodes))]
	}
	switch op := w.r.IntN(20); {
	case op < 5:
		w.putNode(w.nodes[w.r.IntN(len(w.nodes))])
	case op < 15:
		id := w.edges[w.r.IntN(len(w.edges))]
		src, dst := pickNode(), pickNode()
		if l, ok := w.m.latest(id); ok && w.r.IntN(10) != 0 {
			src, dst = l.src, l.dst
		}
		w.putEdge(id, src, dst)
	case op < 17:
		w.tombstoneEdge(w.edges[w.r.IntN(len(w.edges))])
	default:
		w.tombstoneNode(pickNode())
	}
	w.e.clock.Advance(1000) // 1µs per step keeps tx distinct from the wall clock
}

func (w *world) randCoord() (storage.Ts, storage.Ts) {
	v := w.randTime()
	if v == storage.NoTs {
		v = w.txs[w.r.IntN(len(w.txs))]
	}
	t := w.txs[w.r.IntN(len(w.txs))] + storage.Ts(w.r.IntN(3)-1)
	if w.r.IntN(6) == 0 {
		t = storage.OpenEnd - 1
	}
	return v, t
}

// agree compares every read path of the store with the model at n random
// coordinates.
func (w *world) agree(n int) {
	w.t.Helper()
	r := w.e.store.Reader()
	for i := 0; i < n && len(w.txs) > 0; i++ {
		v, t := w.randCoord()
		for _, k := range []storage.Kind{storage.KindNode, storage.KindEdge} {
			want := map[uuid.UUID]bool{}
			for _, id := range w.m.all(k) {
				mvv, mok := w.m.asOf(id, v, t)
				sv, sok, err := storage.AsOf(r, w.sc, k, id, v, t)
				if err != nil {
					w.t.Fatal(err)
				}
				if mok != sok || (mok && sv.Tx.Start != mvv.tx) {
					w.t.Fatalf("%s %s at (v=%s, t=%s): store live=%v, model live=%v", k, id, v, t, sok, mok)
				}
				if mok {
					want[id] = true
				}
			}
			live, err := storage.LiveAt(r, w.sc, k, v, t)
			if err != nil {
				w.t.Fatal(err)
			}
			if len(live) != len(want) {
				w.t.Fatalf("LiveAt %s (v=%s, t=%s): store %d, model %d", k, v, t, len(live), len(want))
			}
		}
		for _, n := range w.m.all(storage.KindNode) {
			es, err := storage.EdgesOf(r, w.sc, n, storage.DirBoth, v, t)
			if err != nil {
				w.t.Fatal(err)
			}
			want := 0
			for _, e := range w.m.touching(n) {
				if _, ok := w.m.asOf(e, v, t); ok {
					want++
				}
			}
			if len(es) != want {
				w.t.Fatalf("EdgesOf %s (v=%s, t=%s): store %d, model %d", n, v, t, len(es), want)
			}
		}
	}
}
