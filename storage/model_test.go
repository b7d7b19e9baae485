package storage

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sort"
	"testing"
	"time"

	"github.com/google/uuid"
)

// A small in-memory reference model of the store: every version ever
// written, and liveness computed by brute force straight from the rule's
// definition. The model-based tests apply random operation sequences to both
// and compare every read path at many random coordinates.

type mVersion struct {
	kind      Kind
	id        uuid.UUID
	src, dst  uuid.UUID
	label     string
	valid     Interval
	tx        Ts
	tombstone bool
}

type model struct {
	versions map[uuid.UUID][]mVersion // by entity id (node and edge ids never collide here)
	kinds    map[uuid.UUID]Kind
}

func newModel() *model {
	return &model{versions: map[uuid.UUID][]mVersion{}, kinds: map[uuid.UUID]Kind{}}
}

func (m *model) add(v mVersion) {
	m.versions[v.id] = append(m.versions[v.id], v)
	m.kinds[v.id] = v.kind
}

func (m *model) latest(id uuid.UUID) (mVersion, bool) {
	vs := m.versions[id]
	if len(vs) == 0 {
		return mVersion{}, false
	}
	best := vs[0]
	for _, v := range vs[1:] {
		if v.tx > best.tx {
			best = v
		}
	}
	return best, true
}

// asOf is the rule, verbatim.
func (m *model) asOf(id uuid.UUID, v, t Ts) (mVersion, bool) {
	var best mVersion
	found := false
	for _, x := range m.versions[id] {
		if x.valid.Contains(v) && Open(x.tx).Contains(t) && (!found || x.tx > best.tx) {
			best, found = x, true
		}
	}
	if !found || best.tombstone {
		return mVersion{}, false
	}
	return best, true
}

func (m *model) ids(k Kind) []uuid.UUID {
	var out []uuid.UUID
	for id, kk := range m.kinds {
		if kk == k {
			out = append(out, id)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].String() < out[j].String() })
	return out
}

func (m *model) edgesOf(node uuid.UUID, dir Direction, v, t Ts) map[uuid.UUID]Ts {
	out := map[uuid.UUID]Ts{}
	for _, e := range m.ids(KindEdge) {
		x, ok := m.asOf(e, v, t)
		if !ok {
			continue
		}
		if (dir&DirOut != 0 && x.src == node) || (dir&DirIn != 0 && x.dst == node) {
			out[e] = x.tx
		}
	}
	return out
}

type modelRun struct {
	t     *testing.T
	r     *rand.Rand
	s     *Store
	m     *model
	sc    Scope
	clock *ManualClock
	txs   []Ts
}

func (mr *modelRun) randValid() (Ts, Ts) {
	pick := func() Ts {
		switch mr.r.IntN(5) {
		case 0:
			return NoTs
		case 1:
			return Ts(mr.r.Int64N(4000) - 3000) // around and before 1970
		default:
			return Ts(mr.r.Int64N(2000) - 1000)
		}
	}
	from, to := pick(), pick()
	if from != NoTs && to != NoTs && from >= to && mr.r.IntN(4) != 0 {
		from, to = to, from
	}
	return from, to
}

func errKind(err error) error {
	for _, k := range []error{ErrNotFound, ErrAlreadyTombstoned, ErrEndpointDead, ErrCascadeInFlight, ErrInvalid} {
		if errors.Is(err, k) {
			return k
		}
	}
	return err
}

// expectPut mirrors the write-path rules of the store in the model.
func (mr *modelRun) expectNode(id uuid.UUID, from, to Ts) error {
	if from != NoTs && to != NoTs && from >= to {
		return ErrInvalid
	}
	if l, ok := mr.m.latest(id); ok && l.tombstone {
		return ErrAlreadyTombstoned
	}
	return mr.expectDefaultInterval(from, to)
}

// expectDefaultInterval: an omitted valid_from means the request's own tx,
// which is max(now, last+1); with an explicit valid_to at or before it the
// interval is empty.
func (mr *modelRun) expectDefaultInterval(from, to Ts) error {
	tx := max(TsFromTime(mr.clock.Now()), mr.s.Clock().Last()+1)
	if from == NoTs && to != NoTs && tx >= to {
		return ErrInvalid
	}
	return nil
}

func (mr *modelRun) expectEdge(id, src, dst uuid.UUID, from, to Ts) error {
	if from != NoTs && to != NoTs && from >= to {
		return ErrInvalid
	}
	if l, ok := mr.m.latest(id); ok {
		if l.src != src || l.dst != dst {
			return ErrInvalid
		}
		if l.tombstone {
			return ErrAlreadyTombstoned
		}
	}
	for _, n := range []uuid.UUID{src, dst} {
		if _, ok := mr.m.latest(n); !ok {
			return ErrNotFound
		}
	}
	for _, n := range []uuid.UUID{src, dst} {
		if l, _ := mr.m.latest(n); l.tombstone {
			return ErrEndpointDead
		}
	}
	return mr.expectDefaultInterval(from, to)
}

func (mr *modelRun) step(nodes, edges []uuid.UUID) {
	ctx := context.Background()
	// The wall clock mostly advances, sometimes steps back.
	if mr.r.IntN(10) == 0 {
		mr.clock.Advance(-time.Duration(mr.r.IntN(1000)) * time.Microsecond)
	} else {
		mr.clock.Advance(time.Duration(mr.r.IntN(50)) * time.Microsecond)
	}
	switch op := mr.r.IntN(10); {
	case op < 4:
		id := nodes[mr.r.IntN(len(nodes))]
		from, to := mr.randValid()
		want := mr.expectNode(id, from, to)
		v, err := mr.s.PutNode(ctx, mr.sc, NodeWrite{ID: id, ValidFrom: from, ValidTo: to, Props: []byte(`{"n":1}`)})
		if errKind(err) != want {
			mr.t.Fatalf("put_node %s [%v,%v): err %v, model says %v", id, from, to, err, want)
		}
		if err == nil {
			mr.m.add(mVersion{kind: KindNode, id: id, valid: v.Valid, tx: v.Tx.Start})
			mr.txs = append(mr.txs, v.Tx.Start)
		}
	case op < 9:
		i := mr.r.IntN(len(edges))
		id := edges[i]
		src, dst := nodes[mr.r.IntN(len(nodes))], nodes[mr.r.IntN(len(nodes))]
		if l, ok := mr.m.latest(id); ok && mr.r.IntN(8) != 0 {
			src, dst = l.src, l.dst // usually keep the (immutable) endpoints
		}
		from, to := mr.randValid()
		want := mr.expectEdge(id, src, dst, from, to)
		label := fmt.Sprintf("l%d", mr.r.IntN(3))
		v, err := mr.s.PutEdge(ctx, mr.sc, EdgeWrite{ID: id, Src: src, Dst: dst, Label: label, ValidFrom: from, ValidTo: to})
		if errKind(err) != want {
			mr.t.Fatalf("put_edge %s %s->%s: err %v, model says %v", id, src, dst, err, want)
		}
		if err == nil {
			mr.m.add(mVersion{kind: KindEdge, id: id, src: src, dst: dst, label: label, valid: v.Valid, tx: v.Tx.Start})
			mr.txs = append(mr.txs, v.Tx.Start)
		}
	default:
		var pool []uuid.UUID
		if mr.r.IntN(2) == 0 {
			pool = nodes
		} else {
			pool = edges
		}
		id := pool[mr.r.IntN(len(pool))]
		l, ok := mr.m.latest(id)
		if !ok || l.tombstone {
			return
		}
		v := tombstone(mr.t, mr.s, mr.sc, l.kind, id, Ts(mr.r.Int64N(2000)-1000))
		mr.m.add(mVersion{kind: l.kind, id: id, src: l.src, dst: l.dst, label: l.label, valid: v.Valid, tx: v.Tx.Start, tombstone: true})
		mr.txs = append(mr.txs, v.Tx.Start)
	}
}

func (mr *modelRun) randCoord() (Ts, Ts) {
	var v Ts
	if mr.r.IntN(2) == 0 || len(mr.txs) == 0 {
		v = Ts(mr.r.Int64N(4400) - 3200)
	} else {
		v = mr.txs[mr.r.IntN(len(mr.txs))] + Ts(mr.r.Int64N(5)-2)
	}
	var t Ts
	switch {
	case len(mr.txs) == 0 || mr.r.IntN(8) == 0:
		t = Ts(mr.clock.Now().UnixMicro()) + 1000
	default:
		t = mr.txs[mr.r.IntN(len(mr.txs))] + Ts(mr.r.Int64N(3)-1)
	}
	return v, t
}

func (mr *modelRun) check(nodes, edges []uuid.UUID, coords int) {
	for c := 0; c < coords; c++ {
		v, t := mr.randCoord()
		for _, pair := range []struct {
			k   Kind
			ids []uuid.UUID
		}{{KindNode, nodes}, {KindEdge, edges}} {
			liveWant := map[uuid.UUID]bool{}
			for _, id := range pair.ids {
				want, wok := mr.m.asOf(id, v, t)
				got, gok, err := AsOf(mr.s.Reader(), mr.sc, pair.k, id, v, t)
				if err != nil {
					mr.t.Fatal(err)
				}
				if wok != gok || (wok && (got.Tx.Start != want.tx || got.Valid != want.valid || got.Label != want.label)) {
					mr.t.Fatalf("AsOf(%s %s, v=%d, t=%d): store (%v %+v), model (%v %+v)", pair.k, id, v, t, gok, got, wok, want)
				}
				if wok {
					liveWant[id] = true
				}
			}
			live, err := LiveAt(mr.s.Reader(), mr.sc, pair.k, v, t)
			if err != nil {
				mr.t.Fatal(err)
			}
			if len(live) != len(liveWant) {
				mr.t.Fatalf("LiveAt(%s, %d, %d): %d live, model %d", pair.k, v, t, len(live), len(liveWant))
			}
			for _, x := range live {
				if !liveWant[x.ID] {
					mr.t.Fatalf("LiveAt: %s live in store only", x.ID)
				}
			}
		}
		for _, n := range nodes {
			for _, dir := range []Direction{DirOut, DirIn, DirBoth} {
				want := mr.m.edgesOf(n, dir, v, t)
				got, err := EdgesOf(mr.s.Reader(), mr.sc, n, dir, v, t)
				if err != nil {
					mr.t.Fatal(err)
				}
				if len(got) != len(want) {
					mr.t.Fatalf("EdgesOf(%s, dir %d, v=%d, t=%d): store %d edges, model %d", n, dir, v, t, len(got), len(want))
				}
				for _, e := range got {
					if tx, ok := want[e.ID]; !ok || tx != e.Tx.Start {
						mr.t.Fatalf("EdgesOf: edge %s (tx %d) not in model (%v)", e.ID, e.Tx.Start, want)
					}
				}
			}
		}
	}
	// Histories: every version, tx ascending, tombstones included.
	for id, vs := range mr.m.versions {
		h, err := History(mr.s.Reader(), mr.sc, mr.m.kinds[id], id)
		if err != nil {
			mr.t.Fatal(err)
		}
		if len(h) != len(vs) {
			mr.t.Fatalf("history of %s: %d versions, model %d", id, len(h), len(vs))
		}
		for i := range h {
			if h[i].Tx.Start != vs[i].tx || h[i].Tombstone != vs[i].tombstone || (i > 0 && h[i].Tx.Start <= h[i-1].Tx.Start) {
				mr.t.Fatalf("history of %s differs at %d", id, i)
			}
		}
	}
	// Index scans over random tx ranges: "what changed between t1 and t2".
	for c := 0; c < 20 && len(mr.txs) > 1; c++ {
		a, b := mr.txs[mr.r.IntN(len(mr.txs))], mr.txs[mr.r.IntN(len(mr.txs))]
		if a > b {
			a, b = b, a
		}
		want := 0
		for _, vs := range mr.m.versions {
			for _, x := range vs {
				if x.tx >= a && x.tx < b {
					want++
				}
			}
		}
		got := 0
		if err := ScanIndex(mr.s.Reader(), mr.sc, false, a, b, func(IndexEntry) error { got++; return nil }); err != nil {
			mr.t.Fatal(err)
		}
		if got != want {
			mr.t.Fatalf("tx index [%d,%d): %d entries, model %d", a, b, got, want)
		}
	}
}

func TestModelRandomHistories(t *testing.T) {
	seeds := 12
	if testing.Short() {
		seeds = 3
	}
	for seed := 0; seed < seeds; seed++ {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			clock := NewManualClock(t0)
			mr := &modelRun{t: t, r: rand.New(rand.NewPCG(uint64(seed), 7)), s: openTest(t, "", clock), m: newModel(), sc: MustScope("model"), clock: clock}
			var nodes, edges []uuid.UUID
			for i := 0; i < 10; i++ {
				nodes = append(nodes, uuid.New())
			}
			for i := 0; i < 10; i++ {
				edges = append(edges, uuid.New())
			}
			for round := 0; round < 6; round++ {
				for i := 0; i < 40; i++ {
					mr.step(nodes, edges)
				}
				mr.check(nodes, edges, 25)
			}
			if len(mr.txs) < 40 {
				t.Fatalf("only %d versions written: the sequence exercised too little", len(mr.txs))
			}
		})
	}
}
