package storage

import (
	"context"
	"testing"

	"github.com/google/uuid"
)

func BenchmarkPutEdge(b *testing.B) {
	s := openTest(b, "", SystemClock{})
	sc := MustScope("bench")
	x, y := uuid.New(), uuid.New()
	mustNode(b, s, sc, x)
	mustNode(b, s, sc, y)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := s.PutEdge(context.Background(), sc, EdgeWrite{ID: uuid.New(), Src: x, Dst: y, Label: "l", ValidFrom: NoTs, ValidTo: NoTs}); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkNodeAsOf1000Versions(b *testing.B) {
	s := openTest(b, "", SystemClock{})
	sc := MustScope("bench")
	id := uuid.New()
	var mid Ts
	for i := 0; i < 1000; i++ {
		v := mustNode(b, s, sc, id)
		if i == 500 {
			mid = v.Tx.Start
		}
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		// As of the middle of the history: half the versions are skipped by
		// the tx upper bound, the rest walked newest first.
		if _, ok, err := s.NodeAsOf(sc, id, mid, mid); err != nil || !ok {
			b.Fatal(ok, err)
		}
	}
}

func BenchmarkEdgesOf10000(b *testing.B) {
	s := openTest(b, "", SystemClock{})
	sc := MustScope("bench")
	hub := uuid.New()
	mustNode(b, s, sc, hub)
	var now Ts
	err := s.Update(context.Background(), func(tx *Txn) error {
		for i := 0; i < 10000; i++ {
			n := uuid.New()
			if _, err := tx.PutNode(sc, NodeWrite{ID: n, ValidFrom: NoTs, ValidTo: NoTs}); err != nil {
				return err
			}
			v, err := tx.PutEdge(sc, EdgeWrite{ID: uuid.New(), Src: hub, Dst: n, Label: "l", ValidFrom: NoTs, ValidTo: NoTs})
			if err != nil {
				return err
			}
			now = v.Tx.Start
		}
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		es, err := s.EdgesOf(sc, hub, DirBoth, now, now)
		if err != nil || len(es) != 10000 {
			b.Fatal(len(es), err)
		}
	}
}
