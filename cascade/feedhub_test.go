package cascade

import (
	"runtime"
	"testing"

	"github.com/telha/telha-cascade/storage"
)

// TestFeedOfAJournaledHub (issue 31): a journaled hub of 200,000 edges
// (20,000 under -race) on the feed: every edge's tombstone once, each with
// the hub as cause, then the hub's tombstone, the last of its tx; read
// 1,024 changes at a time, as the publisher reads, so the reader holds one
// batch, never the hub.
func TestFeedOfAJournaledHub(t *testing.T) {
	n := 200_000
	if raceOn || testing.Short() {
		n = 20_000
	}
	e := openEnv(t, "", Options{})
	sc := storage.MustScope("hubfeed")
	hub := buildHub(t, e.ops, sc, n)
	st := e.store
	var pos storage.FeedPos
	drain := func(fn func(c *storage.Change)) int {
		total := 0
		for {
			got := 0
			next, err := st.ReadFeed(ctx, storage.FeedRead{Scope: sc, From: pos, UpTo: st.FeedHorizon(sc), Max: 1024}, func(c *storage.Change) error {
				got++
				if fn != nil {
					fn(c)
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			pos = next
			total += got
			if got == 0 {
				return total
			}
		}
	}
	if built := drain(nil); built != 2*n+1 {
		t.Fatalf("the hub's build is %d changes on the feed, want %d", built, 2*n+1)
	}
	rc, err := e.ops.TombstoneNode(ctx, sc, hub, storage.NoTs, anon)
	if err != nil {
		t.Fatal(err)
	}
	if !rc.Journaled || rc.EdgesTombstoned != uint64(n) {
		t.Fatalf("tombstone of the hub: %+v, want journaled with %d edges", rc, n)
	}
	var ms runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms)
	base := ms.HeapInuse
	edges, last, peak := 0, "", uint64(0)
	seen := map[[16]byte]bool{}
	got := drain(func(c *storage.Change) {
		switch {
		case c.V.Kind == storage.KindEdge && c.Op == storage.FeedTombstone && c.Cause == hub && c.V.Tx.Start == rc.TxTime:
			if seen[c.V.ID] {
				t.Fatalf("edge %s twice", c.V.ID)
			}
			seen[c.V.ID] = true
			edges++
			if last != "" {
				t.Fatalf("edge tombstone after the hub's")
			}
		case c.V.Kind == storage.KindNode && c.V.ID == hub && c.Op == storage.FeedTombstone:
			last = "hub"
		default:
			t.Fatalf("unexpected change %+v", c)
		}
		if edges%20_000 == 0 {
			runtime.ReadMemStats(&ms)
			peak = max(peak, ms.HeapInuse)
		}
	})
	if edges != n || last != "hub" || got != n+1 {
		t.Fatalf("%d changes: %d edge tombstones caused by the hub (want %d), hub last: %v", got, edges, n, last == "hub")
	}
	t.Logf("%d edge tombstones and the hub's, read 1,024 at a time; heap in use %.1f MB before, %.1f MB at most while reading (the test's own set of %d ids included)",
		n, float64(base)/(1<<20), float64(peak)/(1<<20), n)
}
