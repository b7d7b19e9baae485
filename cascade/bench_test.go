package cascade

import (
	"testing"

	"github.com/google/uuid"
	"github.com/telha/telha-cascade/storage"
)

// buildHub writes a node with n out-edges to n fresh neighbours, in
// transactions of 10k edges.
func buildHub(b testing.TB, o *Ops, sc storage.Scope, n int) uuid.UUID {
	b.Helper()
	hub := uuid.New()
	if _, err := o.PutNode(ctx, sc, storage.NodeWrite{ID: hub, ValidFrom: storage.NoTs, ValidTo: storage.NoTs}); err != nil {
		b.Fatal(err)
	}
	for done := 0; done < n; {
		step := min(10_000, n-done)
		err := o.store.Update(ctx, func(t *storage.Txn) error {
			for i := 0; i < step; i++ {
				m := uuid.New()
				if _, err := t.PutNode(sc, storage.NodeWrite{ID: m, ValidFrom: storage.NoTs, ValidTo: storage.NoTs}); err != nil {
					return err
				}
				if _, err := t.PutEdge(sc, storage.EdgeWrite{ID: uuid.New(), Src: hub, Dst: m, Label: "rel", ValidFrom: storage.NoTs, ValidTo: storage.NoTs}); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			b.Fatal(err)
		}
		done += step
	}
	return hub
}

func benchCascade(b *testing.B, edges, maxBatch int) {
	s, err := storage.OpenStore(b.TempDir(), storage.Options{Logger: noLog})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	o := New(s, Options{MaxBatchOps: maxBatch, Logger: noLog})
	sc := storage.MustScope("bench")
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		hub := buildHub(b, o, sc, edges)
		b.StartTimer()
		rc, err := o.TombstoneNode(ctx, sc, hub, storage.NoTs, anon)
		if err != nil || rc.EdgesTombstoned != uint64(edges) {
			b.Fatal(rc, err)
		}
	}
	b.ReportMetric(float64(edges*b.N)/b.Elapsed().Seconds(), "edges/s")
}

func BenchmarkCascadeSmall8Edges(b *testing.B) { benchCascade(b, 8, DefaultMaxBatchOps) }
func BenchmarkCascadeHub10k(b *testing.B)      { benchCascade(b, 10_000, DefaultMaxBatchOps) }
func BenchmarkCascadeHub10kJournaled(b *testing.B) {
	benchCascade(b, 10_000, 5_000)
}
func BenchmarkCascadeHub100kJournaled(b *testing.B) { benchCascade(b, 100_000, DefaultMaxBatchOps) }
