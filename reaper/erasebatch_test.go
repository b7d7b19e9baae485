package reaper

import (
	"bytes"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/telha/telha-cascade/cascade"
	"github.com/telha/telha-cascade/storage"
)

// TestErasesWaitingShareOneScrubOfTheDisk: erases that wait for the
// eraser (a backlog) are rewritten one after another and share one scrub
// of the disk: one flush, one compaction of their ranges, one wait for the
// obsolete files. Before, each erase flushed and compacted on its own, so
// a backlog of 800 took minutes. Every erase is answered, and no file of
// the store holds an erased value.
func TestErasesWaitingShareOneScrubOfTheDisk(t *testing.T) {
	const n = 6
	erased := make(chan error, n)
	w := openWorld(t, Config{RetryBackoff: time.Hour, Hooks: Hooks{
		EraseFinished: func(_ *storage.EraseEntry, _ storage.Receipt, err error) { erased <- err },
	}}, cascade.Hooks{})
	scopes := []storage.Scope{sc, storage.MustScope("reap-other")}
	var reqs []cascade.Request
	for i := range n {
		s, id := scopes[i%2], uuid.New()
		if _, err := w.ops.PutNode(ctx, s, storage.NodeWrite{ID: id, ValidFrom: storage.NoTs, ValidTo: storage.NoTs,
			Props: fmt.Appendf(nil, `{"name":"ERASE-ME-%d"}`, i), Prov: prov}); err != nil {
			t.Fatal(err)
		}
		reqs = append(reqs, cascade.Request{Scope: s, Op: storage.OpEraseNode, ID: id, RequestID: fmt.Sprintf("erase-%d", i), ValidEnd: storage.NoTs,
			Prov: storage.Provenance{Actor: "dpo", Reason: "art. 17", DecidedAt: storage.NoTs}})
	}
	// Queued while the eraser is not running yet: a backlog.
	out, _, err := w.ops.Apply(ctx, reqs)
	if err != nil {
		t.Fatal(err)
	}
	for i, o := range out {
		if o.Kind != cascade.Erasing {
			t.Fatalf("erase %d: %+v, want erasing", i, o)
		}
	}
	flushes := w.store.Engine().Metrics().Flush.Count
	w.svc.Start()
	for i := range n {
		select {
		case err := <-erased:
			if err != nil {
				t.Fatalf("erase %d of %d: %v", i+1, n, err)
			}
		case <-time.After(60 * time.Second):
			t.Fatalf("%d of %d erases finished within 60 s", i, n)
		}
	}
	if got := w.store.Engine().Metrics().Flush.Count - flushes; got != 1 {
		t.Errorf("%d flushes for a backlog of %d erases, want 1 (one scrub of the disk for the round)", got, n)
	}
	err = filepath.WalkDir(w.dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if bytes.Contains(b, []byte("ERASE-ME-")) {
			t.Errorf("%s still holds an erased value", path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// BenchmarkEraseBacklog: a backlog of 64 erase_node requests on a store of
// 20,000 nodes with about 1 KB of props each, drained two ways in one run:
// one_scrub_each applies them one after another, each with a scrub of the
// disk of its own (a flush, a compaction, a wait for its obsolete files:
// what the eraser's round did before), and rounds is the eraser (its
// rounds of up to 32 share one scrub). Reported: erases/s.
func BenchmarkEraseBacklog(b *testing.B) {
	const nodes, erases = 20_000, 64
	props := fmt.Appendf(nil, `{"bio":%q}`, bytes.Repeat([]byte("x"), 1000))
	for _, mode := range []string{"one_scrub_each", "rounds"} {
		b.Run(mode, func(b *testing.B) {
			var took time.Duration
			for range b.N {
				b.StopTimer()
				st, err := storage.OpenStore(b.TempDir(), storage.Options{Logger: noLog})
				if err != nil {
					b.Fatal(err)
				}
				finished := make(chan error, erases)
				applier := cascade.NewApplier(st, cascade.Options{Logger: noLog})
				svc, err := New(st, Config{Applier: applier, Publisher: &fakePublisher{}, Logger: noLog,
					RetryBackoff: time.Hour, Hooks: Hooks{EraseFinished: func(_ *storage.EraseEntry, _ storage.Receipt, err error) { finished <- err }}})
				if err != nil {
					b.Fatal(err)
				}
				ops := cascade.New(st, cascade.Options{Logger: noLog, Journals: svc})
				var ids []uuid.UUID
				for i := 0; i < nodes; i += 500 {
					var reqs []cascade.Request
					for range 500 {
						id := uuid.New()
						ids = append(ids, id)
						reqs = append(reqs, cascade.Request{Scope: sc, Op: storage.OpPutNode, ID: id, Props: props,
							ValidFrom: storage.NoTs, ValidTo: storage.NoTs, ValidEnd: storage.NoTs, Prov: prov})
					}
					if _, _, err := ops.Apply(ctx, reqs); err != nil {
						b.Fatal(err)
					}
				}
				var reqs []cascade.Request
				for i := range erases {
					reqs = append(reqs, cascade.Request{Scope: sc, Op: storage.OpEraseNode, ID: ids[i*(nodes/erases)], RequestID: fmt.Sprintf("erase-%d", i),
						ValidEnd: storage.NoTs, Prov: storage.Provenance{Actor: "dpo", Reason: "art. 17", DecidedAt: storage.NoTs}})
				}
				if _, _, err := ops.Apply(ctx, reqs); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
				t0 := time.Now()
				if mode == "rounds" {
					svc.Start()
					for range erases {
						if err := <-finished; err != nil {
							b.Fatal(err)
						}
					}
				} else {
					for _, e := range st.Erases().List() {
						if _, err := applier.ApplyErase(ctx, e, cascade.EraseObserver{}); err != nil {
							b.Fatal(err)
						}
					}
				}
				took += time.Since(t0)
				b.StopTimer()
				svc.Stop()
				_ = st.Close()
			}
			b.ReportMetric(float64(erases*b.N)/took.Seconds(), "erases/s")
		})
	}
}
