package cascade

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/google/uuid"
	"github.com/telha/telha-cascade/internal/diskscan"
	"github.com/telha/telha-cascade/storage"
)

// Erasure (CONTRACT §3, "Erasure"): I4, the disk, and crashes.

var why = storage.Provenance{Actor: "dpo@example", Reason: "GDPR art. 17 request 2026-118", DecidedAt: storage.NoTs}

// eraseGraph is a random history of one tenant: nodes and edges whose
// props carry a marker, some deleted, a hub above MaxBatchOps (its cascade
// journaled), some versions re-put over other valid ranges.
type eraseGraph struct {
	sc     storage.Scope
	nodes  []uuid.UUID
	edges  []uuid.UUID
	hub    uuid.UUID
	marker string
}

func buildEraseGraph(t *testing.T, e *env, rng *rand.Rand, marker string) *eraseGraph {
	t.Helper()
	g := &eraseGraph{sc: storage.MustScope("gdpr"), marker: marker}
	props := func(i int) []byte { return []byte(fmt.Sprintf(`{"name":"%s-%d"}`, marker, i)) }
	put := func(id uuid.UUID, i int) {
		from, to := storage.NoTs, storage.NoTs
		if rng.IntN(3) == 0 {
			from, to = year(2000+rng.IntN(10)), year(2015+rng.IntN(10))
		}
		if _, err := e.ops.PutNode(ctx, g.sc, storage.NodeWrite{ID: id, ValidFrom: from, ValidTo: to, Props: props(i), Prov: storage.Provenance{Actor: marker + "-actor", Reason: marker + "-why", Source: marker + "-src", DecidedAt: storage.NoTs}}); err != nil {
			t.Fatalf("put node: %v", err)
		}
	}
	putEdge := func(id, src, dst uuid.UUID, i int) bool {
		_, err := e.ops.PutEdge(ctx, g.sc, storage.EdgeWrite{ID: id, Src: src, Dst: dst, Label: "knows", ValidFrom: storage.NoTs, ValidTo: storage.NoTs, Props: props(i), Prov: storage.Provenance{Actor: marker + "-actor", DecidedAt: storage.NoTs}})
		return err == nil
	}
	for i := 0; i < 24; i++ {
		id := detUUID(rng)
		g.nodes = append(g.nodes, id)
		put(id, i)
		if rng.IntN(4) == 0 {
			put(id, 100+i) // a second version
		}
	}
	g.hub = g.nodes[0]
	for i := 0; i < 30; i++ { // the hub: 30 edges x 5 puts > MaxBatchOps 60
		id := detUUID(rng)
		if putEdge(id, g.hub, g.nodes[1+rng.IntN(len(g.nodes)-1)], 200+i) {
			g.edges = append(g.edges, id)
		}
	}
	for i := 0; i < 50; i++ {
		id := detUUID(rng)
		if putEdge(id, g.nodes[1+rng.IntN(len(g.nodes)-1)], g.nodes[1+rng.IntN(len(g.nodes)-1)], 300+i) {
			g.edges = append(g.edges, id)
		}
	}
	for i := 0; i < 8; i++ { // some deaths before the erases
		if _, err := e.ops.TombstoneEdge(ctx, g.sc, g.edges[rng.IntN(len(g.edges))], storage.NoTs, anon); err != nil && !errors.Is(err, ErrAlreadyTombstoned) {
			t.Fatalf("tombstone edge: %v", err)
		}
	}
	for i := 0; i < 3; i++ {
		if _, err := e.ops.TombstoneNode(ctx, g.sc, g.nodes[1+rng.IntN(len(g.nodes)-1)], storage.NoTs, anon); err != nil && !errors.Is(err, ErrAlreadyTombstoned) {
			t.Fatalf("tombstone node: %v", err)
		}
	}
	return g
}

// liveness is every liveness answer of the graph at the coordinates, read
// through every read path (point reads, edge walks, the valid-time index,
// history), as text: payloads left out.
func liveness(t *testing.T, s *storage.Store, g *eraseGraph, coords [][2]storage.Ts, upTo storage.Ts) string {
	t.Helper()
	r := s.Reader()
	var b strings.Builder
	shape := func(v *storage.Version) string {
		return fmt.Sprintf("%s %s>%s %s v%v t%v x%v", v.ID, v.Src, v.Dst, v.Label, v.Valid, v.Tx, v.Tombstone)
	}
	for _, c := range coords {
		fmt.Fprintf(&b, "@%v\n", c)
		for _, k := range []storage.Kind{storage.KindNode, storage.KindEdge} {
			ids := g.nodes
			if k == storage.KindEdge {
				ids = g.edges
			}
			for _, id := range ids {
				v, ok, err := storage.AsOf(r, g.sc, k, id, c[0], c[1])
				if err != nil {
					t.Fatal(err)
				}
				if ok {
					fmt.Fprintf(&b, " %s\n", shape(&v))
				}
			}
			live, err := storage.LiveAt(r, g.sc, k, c[0], c[1])
			if err != nil {
				t.Fatal(err)
			}
			for i := range live {
				fmt.Fprintf(&b, " live %s\n", shape(&live[i]))
			}
		}
		for _, n := range g.nodes {
			es, err := storage.EdgesOf(r, g.sc, n, storage.DirBoth, c[0], c[1])
			if err != nil {
				t.Fatal(err)
			}
			for i := range es {
				fmt.Fprintf(&b, " %s~%s\n", n, shape(&es[i]))
			}
		}
	}
	for _, k := range []storage.Kind{storage.KindNode, storage.KindEdge} {
		ids := g.nodes
		if k == storage.KindEdge {
			ids = g.edges
		}
		for _, id := range ids {
			hs, err := storage.History(r, g.sc, k, id)
			if err != nil {
				t.Fatal(err)
			}
			for i := range hs {
				if hs[i].Tx.Start <= upTo { // the erases' own tombstones come later
					fmt.Fprintf(&b, "h %s\n", shape(&hs[i]))
				}
			}
		}
	}
	return b.String()
}

func randomCoords(rng *rand.Rand, s *storage.Store, n int) [][2]storage.Ts {
	last := s.Clock().Last()
	first := storage.TsFromTime(t0)
	out := [][2]storage.Ts{{storage.TsFromTime(t0), last}, {year(2010), last}}
	for len(out) < n {
		v := []storage.Ts{year(1990 + rng.IntN(40)), first + storage.Ts(rng.Int64N(int64(last-first)+1))}[rng.IntN(2)]
		tx := first + storage.Ts(rng.Int64N(int64(last-first)+1))
		out = append(out, [2]storage.Ts{v, tx})
	}
	return out
}

// erase applies one erase request and, since the env has no sinks, the
// erase itself; it returns the receipt.
func (e *env) erase(sc storage.Scope, op storage.Op, id uuid.UUID, rid string) storage.Receipt {
	e.t.Helper()
	out, _, err := e.ops.Apply(ctx, []Request{{Scope: sc, Op: op, ID: id, RequestID: rid, ValidEnd: storage.NoTs, Prov: why}})
	if err != nil {
		e.t.Fatalf("%s %s: %v", op, id, err)
	}
	switch oc := out[0]; oc.Kind {
	case Erasing:
		rc, err := e.ops.ApplyErase(ctx, oc.Erase, EraseObserver{})
		if err != nil {
			e.t.Fatalf("apply %s %s: %v", op, id, err)
		}
		return rc
	case Answered:
		return oc.Receipt
	default:
		e.t.Fatalf("%s %s: outcome %+v", op, id, oc)
	}
	return storage.Receipt{}
}

// markerFiles lists the files under dir that contain marker, byte by byte.
func markerFiles(t *testing.T, dir, marker string) []string {
	t.Helper()
	hits, err := diskscan.FilesContaining(dir, marker)
	if err != nil {
		t.Fatal(err)
	}
	return hits
}

// TestEraseKeepsLiveness is I4 on random graphs: liveness at many random
// coordinates through every read path is identical before and after
// erasing random nodes (live and dead, the journaled hub among them) and
// edges; every version of an erased entity, and of every edge that ever
// touched an erased node, is erased (props {}, actor/reason/source empty)
// and no other version is; a second erase is ok with zero versions; and
// no file under the data directory holds the marker any more.
func TestEraseKeepsLiveness(t *testing.T) {
	for seed := uint64(1); seed <= 4; seed++ {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 15))
			e := openEnv(t, "", Options{MaxBatchOps: 60, ChunkOps: 20})
			marker := fmt.Sprintf("MARKER%016x", rng.Uint64())
			g := buildEraseGraph(t, e, rng, marker)
			coords := randomCoords(rng, e.store, 40)
			upTo := e.store.Clock().Last()
			before := liveness(t, e.store, g, coords, upTo)

			if hits := markerFiles(t, e.dir, marker); len(hits) == 0 {
				t.Fatal("the marker is on no file before the erases: the disk check below would prove nothing")
			}
			erasedNodes := map[uuid.UUID]bool{g.hub: true}
			for len(erasedNodes) < len(g.nodes) {
				erasedNodes[g.nodes[rng.IntN(len(g.nodes))]] = true
				if rng.IntN(3) == 0 {
					break
				}
			}
			erasedEdges := map[uuid.UUID]bool{}
			for i := 0; i < 6; i++ {
				erasedEdges[g.edges[rng.IntN(len(g.edges))]] = true
			}
			var total uint64
			i := 0
			for n := range erasedNodes {
				rc := e.erase(g.sc, storage.OpEraseNode, n, fmt.Sprintf("erase-n-%d", i))
				if rc.Status != storage.StatusOK {
					t.Fatalf("erase_node %s: %s", n, rc.Status)
				}
				total += rc.VersionsErased
				i++
			}
			for ed := range erasedEdges {
				rc := e.erase(g.sc, storage.OpEraseEdge, ed, fmt.Sprintf("erase-e-%d", i))
				if rc.Status != storage.StatusOK {
					t.Fatalf("erase_edge %s: %s", ed, rc.Status)
				}
				total += rc.VersionsErased
				i++
			}
			after := liveness(t, e.store, g, coords, upTo)
			if before != after {
				t.Fatalf("I4: liveness changed by the erases\n%s", firstDiff(before, after))
			}

			// Exactly the right versions are erased.
			touched := map[uuid.UUID]bool{}
			for ed := range erasedEdges {
				touched[ed] = true
			}
			var erased uint64
			for _, k := range []storage.Kind{storage.KindNode, storage.KindEdge} {
				ids := g.nodes
				if k == storage.KindEdge {
					ids = g.edges
				}
				for _, id := range ids {
					hs, err := storage.History(e.store.Reader(), g.sc, k, id)
					if err != nil {
						t.Fatal(err)
					}
					for _, v := range hs {
						want := (k == storage.KindNode && erasedNodes[id]) || (k == storage.KindEdge && (touched[id] || erasedNodes[v.Src] || erasedNodes[v.Dst]))
						if v.Erased != want {
							t.Fatalf("%s %s at tx %s: erased %v, want %v", k, id, v.Tx.Start, v.Erased, want)
						}
						if want {
							erased++
							if string(v.Props) != "{}" || v.Prov.Actor != "" || v.Prov.Reason != "" || v.Prov.Source != "" {
								t.Fatalf("%s %s erased but holds %s %+v", k, id, v.Props, v.Prov)
							}
						} else if !v.Tombstone && !strings.Contains(string(v.Props), marker) {
							t.Fatalf("%s %s not erased but its props are %s", k, id, v.Props)
						}
					}
				}
			}
			// Versions written before the erase count once; tombstones the
			// erases wrote themselves count too.
			if total != erased {
				t.Fatalf("receipts say %d versions erased, the store holds %d erased versions", total, erased)
			}
			if rc := e.erase(g.sc, storage.OpEraseNode, g.hub, "erase-again"); rc.Status != storage.StatusOK || rc.VersionsErased != 0 {
				t.Fatalf("second erase of the hub: %+v, want ok with 0 versions", rc)
			}
			if rec, ok, err := storage.GetErasure(e.store.Reader(), g.sc, "erase-n-0"); err != nil || !ok || rec.Reason != why.Reason || rec.Versions == 0 {
				t.Fatalf("erasure record: %+v %v %v", rec, ok, err)
			}

			// The markers of erased entities left the disk. (Entities not
			// erased still hold it, so look for an erased one's own props.)
			for n := range erasedNodes {
				idx := slices.Index(g.nodes, n)
				own := fmt.Sprintf(`"%s-%d"`, marker, idx)
				if hits := markerFiles(t, e.dir, own); len(hits) > 0 {
					t.Fatalf("erased node %s's props %s still in %v", n, own, hits)
				}
			}
		})
	}
}

func firstDiff(a, b string) string {
	la, lb := strings.Split(a, "\n"), strings.Split(b, "\n")
	for i := range min(len(la), len(lb)) {
		if la[i] != lb[i] {
			return fmt.Sprintf("line %d:\n- %s\n+ %s", i, la[i], lb[i])
		}
	}
	return fmt.Sprintf("lengths %d and %d", len(la), len(lb))
}

// TestEraseCrashAtEveryDurableCall: an erase_node of the journaled hub and
// an erase_edge, crashed after each of their durable calls in turn (the
// group commit with the heads, every chunk of the hub's cascade, every
// chunk of the erase, the finish), then restarted, the requests redelivered
// and the erases resumed: the store converges on the bytes of the run that
// did not crash (receipts, erasure records and their digests included).
func TestEraseCrashAtEveryDurableCall(t *testing.T) {
	opts := Options{MaxBatchOps: 60, ChunkOps: 20}
	run := func(e *env) *eraseGraph {
		g := buildEraseGraph(t, e, rand.New(rand.NewPCG(7, 7)), "CRASHMARK")
		return g
	}
	reqs := func(g *eraseGraph) []Request {
		return []Request{
			{Scope: g.sc, Op: storage.OpEraseNode, ID: g.hub, RequestID: "erase-hub", ValidEnd: storage.NoTs, Prov: why},
			{Scope: g.sc, Op: storage.OpEraseEdge, ID: g.edges[len(g.edges)-1], RequestID: "erase-edge", ValidEnd: storage.NoTs, Prov: why},
		}
	}
	finish := func(e *env, g *eraseGraph) error {
		for _, r := range reqs(g) {
			out, _, err := e.ops.Apply(ctx, []Request{r})
			if err != nil {
				return err
			}
			if out[0].Kind == Erasing {
				if _, err := e.ops.ApplyErase(ctx, out[0].Erase, EraseObserver{}); err != nil {
					return err
				}
			}
		}
		return nil
	}
	ref := openEnv(t, "", opts)
	g := run(ref)
	c0 := ref.fault.Calls()
	if err := finish(ref, g); err != nil {
		t.Fatal(err)
	}
	calls := ref.fault.Calls() - c0
	if calls < 8 {
		t.Fatalf("the erases took %d durable calls; the test wants a journaled cascade and several erase chunks", calls)
	}
	for k := 0; k < calls; k++ {
		e := openEnv(t, "", opts)
		g := run(e)
		e.fault.CrashAfter(e.fault.Calls() + k)
		if err := finish(e, g); !errors.Is(err, storage.ErrInjected) {
			t.Fatalf("crash after call %d of %d: %v, want the injected crash", k, calls, err)
		}
		e.restart()
		if _, err := e.ops.ResumeErases(ctx); err != nil {
			t.Fatalf("crash after call %d: resume: %v", k, err)
		}
		if err := finish(e, g); err != nil { // the queue redelivers both requests
			t.Fatalf("crash after call %d: redelivery: %v", k, err)
		}
		if n := len(e.store.Erases().List()); n != 0 {
			t.Fatalf("crash after call %d: %d erases left in flight", k, n)
		}
		sameContents(t, ref.store, e.store)
		e.close()
	}
	t.Logf("converged after a crash at each of %d durable calls", calls)
}

// slowWALRemoval is the OS filesystem with a slow delete of WAL files, so
// an obsolete WAL outlives the flush that made it obsolete for a while.
type slowWALRemoval struct{ vfs.FS }

func (f slowWALRemoval) Remove(name string) error {
	if strings.HasSuffix(name, ".log") {
		time.Sleep(300 * time.Millisecond)
	}
	return f.FS.Remove(name)
}

// TestEraseLeavesNoTraceOnDisk: erased data is gone from every file the
// moment the erase returns, even when Pebble deletes obsolete WAL files
// slowly (the scrub waits for the files themselves, not a metric), and
// even the provenance of the erased hub's tombstone, which the deleted
// head of its cascade journal held (the scrub compacts the jobs keyspace
// too; small sstables keep those keys apart from the versions).
func TestEraseLeavesNoTraceOnDisk(t *testing.T) {
	dir := t.TempDir()
	st, err := storage.OpenStore(dir, storage.Options{Logger: noLog, FS: slowWALRemoval{vfs.Default}, Pebble: func(o *pebble.Options) {
		o.TargetFileSizes[0] = 4 << 10
		for i := range o.TargetFileSizes {
			o.TargetFileSizes[i] = 4 << 10
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ops := New(st, Options{MaxBatchOps: 60, ChunkOps: 20, Logger: noLog})
	sc := storage.MustScope("gdpr")
	hub, other := uuid.New(), uuid.New()
	const propsMark, reasonMark = "PROPS-OF-JOHN-DOE", "REASON-NAMES-JOHN-DOE"
	if _, err := ops.PutNode(ctx, sc, storage.NodeWrite{ID: hub, ValidFrom: storage.NoTs, ValidTo: storage.NoTs, Props: []byte(`{"n":"` + propsMark + `"}`), Prov: anon}); err != nil {
		t.Fatal(err)
	}
	if _, err := ops.PutNode(ctx, sc, storage.NodeWrite{ID: other, ValidFrom: storage.NoTs, ValidTo: storage.NoTs, Prov: anon}); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 30; i++ {
		if _, err := ops.PutEdge(ctx, sc, storage.EdgeWrite{ID: uuid.New(), Src: hub, Dst: other, Label: "x", ValidFrom: storage.NoTs, ValidTo: storage.NoTs,
			Props: []byte(`{"n":"` + propsMark + `"}`), Prov: anon}); err != nil {
			t.Fatal(err)
		}
	}
	rc, err := ops.TombstoneNode(ctx, sc, hub, storage.NoTs, storage.Provenance{Actor: "ops", Reason: reasonMark, DecidedAt: storage.NoTs})
	if err != nil || !rc.Journaled {
		t.Fatalf("tombstone_node: %+v %v, want journaled", rc, err)
	}
	if len(markerFiles(t, dir, reasonMark)) == 0 || len(markerFiles(t, dir, propsMark)) == 0 {
		t.Fatal("the markers are on no file before the erase: the check below would prove nothing")
	}
	out, _, err := ops.Apply(ctx, []Request{{Scope: sc, Op: storage.OpEraseNode, ID: hub, RequestID: "erase-1", ValidEnd: storage.NoTs, Prov: why}})
	if err != nil || out[0].Kind != Erasing {
		t.Fatalf("erase_node: %+v %v", out[0], err)
	}
	erc, err := ops.ApplyErase(ctx, out[0].Erase, EraseObserver{})
	if err != nil {
		t.Fatal(err)
	}
	if erc.Tx != rc.TxTime {
		t.Errorf("erase of a dead node: receipt tx %s, want its tombstone's %s (no tx of its own)", erc.Tx, rc.TxTime)
	}
	for _, m := range []string{propsMark, reasonMark} {
		if hits := markerFiles(t, dir, m); len(hits) > 0 {
			t.Errorf("%s still on disk when the erase returned: %v", m, hits)
			for _, h := range hits {
				b, _ := os.ReadFile(filepath.Join(dir, h))
				i := bytes.Index(b, []byte(m))
				t.Logf("%s: ...%q...", h, b[max(0, i-120):min(len(b), i+40)])
			}
		}
	}
}

// TestEraseAnswersItsOwnTx: a version written to the erased entity after
// the erase began (a node's cascade narrowing the erased edge's tombstone,
// at a later tx of another request) does not move the erase's answer. A
// black-box probe saw an erase_edge's result and receipt give the
// narrowing cascade's tx while its erasure record, its feed message and
// the tombstone it wrote gave its own; a read one microsecond before the
// result's tx_time then found the edge dead. For an edge erased live and
// one erased already dead, the receipt's tx is the tx at which the edge
// reads dead (CONTRACT §3), the erasure record's too.
func TestEraseAnswersItsOwnTx(t *testing.T) {
	for _, dead := range []bool{false, true} {
		e := openEnv(t, "", Options{})
		sc := storage.MustScope("rx")
		a, b, ed := uuid.New(), uuid.New(), uuid.New()
		e.node(sc, a, year(2010), storage.NoTs)
		e.node(sc, b, year(2010), storage.NoTs)
		e.edge(sc, ed, a, b, year(2010), storage.NoTs)
		if dead {
			if _, _, err := e.ops.Apply(ctx, []Request{{Scope: sc, Op: storage.OpTombstoneEdge, ID: ed, ValidEnd: storage.NoTs, Prov: anon}}); err != nil {
				t.Fatal(err)
			}
		}
		out, _, err := e.ops.Apply(ctx, []Request{{Scope: sc, Op: storage.OpEraseEdge, ID: ed, RequestID: "er1", ValidEnd: storage.NoTs, Prov: why}})
		if err != nil || out[0].Kind != Erasing {
			t.Fatalf("erase_edge: %+v %v", out, err)
		}
		deadAt := out[0].Erase.Job.Tx
		// Another request, committed before the erase finishes: a's
		// cascade with a valid end in the past narrows the edge's
		// tombstone at its own, later tx.
		o2, _, err := e.ops.Apply(ctx, []Request{{Scope: sc, Op: storage.OpTombstoneNode, ID: a, RequestID: "tn1", ValidEnd: year(2020), Prov: anon}})
		if err != nil || o2[0].Receipt.Status != storage.StatusOK {
			t.Fatalf("tombstone_node: %+v %v", o2, err)
		}
		latest, _, err := storage.Latest(e.store.Reader(), sc, storage.KindEdge, ed)
		if err != nil || latest.Tx.Start <= deadAt {
			t.Fatalf("dead %v: the cascade did not write the edge after the erase began (latest tx %s, erase %s, %v)", dead, latest.Tx.Start, deadAt, err)
		}
		rc, err := e.ops.ApplyErase(ctx, out[0].Erase, EraseObserver{})
		if err != nil {
			t.Fatal(err)
		}
		rec, ok, err := storage.GetErasure(e.store.Reader(), sc, "er1")
		if err != nil || !ok {
			t.Fatalf("erasure record: %v %v", ok, err)
		}
		if rc.Tx != deadAt || rec.Tx != deadAt {
			t.Fatalf("dead %v: receipt tx %s, record tx %s, want the erase's own %s (the cascade's was %s)", dead, rc.Tx, rec.Tx, deadAt, latest.Tx.Start)
		}
	}
}
