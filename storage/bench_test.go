package storage

import (
	"context"
	"os"
	"testing"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
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

// BenchmarkManifestAfterFlushes: the MANIFEST a checkpoint carries after
// 3,000 flushes of 20 node versions each, with Pebble's bound (128 MiB,
// never reached: the MANIFEST keeps every edit) and the store's
// (maxManifestBytes, set low here so that 3,000 flushes reach it).
// Reported as manifest-bytes. go test -run '^$' -bench
// BenchmarkManifestAfterFlushes -benchtime 1x ./storage
func BenchmarkManifestAfterFlushes(b *testing.B) {
	for _, c := range []struct {
		name  string
		bound int64
	}{{"pebble-default-128MiB", 128 << 20}, {"bound-100KiB", 100 << 10}} {
		b.Run(c.name, func(b *testing.B) {
			for range b.N {
				dir := b.TempDir()
				s, err := OpenStore(dir, Options{Pebble: func(o *pebble.Options) { o.MaxManifestFileSize = c.bound }})
				if err != nil {
					b.Fatal(err)
				}
				sc := MustScope("t")
				tx := Ts(1)
				for range 3000 {
					batch := s.Engine().NewBatch()
					for range 20 {
						tx++
						v := Version{Kind: KindNode, ID: uuid.New(), Valid: Open(tx), Tx: Open(tx), Props: []byte(`{"n":1}`), Prov: Provenance{DecidedAt: NoTs}}
						AppendVersion(batch, sc, &v)
					}
					if err := batch.Commit(pebble.NoSync); err != nil {
						b.Fatal(err)
					}
					if err := s.DB().Flush(); err != nil {
						b.Fatal(err)
					}
				}
				desc, err := pebble.Peek(dir, vfs.Default)
				if err != nil {
					b.Fatal(err)
				}
				fi, err := os.Stat(desc.ManifestFilename)
				if err != nil {
					b.Fatal(err)
				}
				b.ReportMetric(float64(fi.Size()), "manifest-bytes")
				if err := s.Close(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
