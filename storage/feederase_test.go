package storage

import (
	"context"
	"testing"

	"github.com/google/uuid"
)

// An erase's feed row waits (FeedErasePending) until SaveFeed marks it
// scrubbed; FeedErasesToScrub lists it until then; the mark survives a
// reopen; and a row both marked and published in one save is gone.
func TestFeedEraseScrubbedMark(t *testing.T) {
	dir := t.TempDir()
	s, err := OpenStore(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	sc := MustScope("gdpr")
	put := func(rid string, op Op) {
		t.Helper()
		e := &EraseEntry{Scope: sc, Job: EraseJob{Op: op, ID: uuid.New(), Tx: 7, Prov: Provenance{RequestID: rid}}}
		if err := s.Update(ctx, func(t *Txn) error { t.putFeedErase(e, 3); return nil }); err != nil {
			t.Fatal(err)
		}
	}
	put("r1", OpEraseNode)
	put("r2", OpEraseEdge)
	pending := func(rid string) bool {
		t.Helper()
		p, err := s.FeedErasePending(sc, rid)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	todo, err := s.FeedErasesToScrub(sc)
	if err != nil || len(todo) != 2 || !pending("r1") || !pending("r2") || todo[0].Scrubbed {
		t.Fatalf("before: %d to scrub (%v), pending %v %v", len(todo), err, pending("r1"), pending("r2"))
	}
	var r1 *Change
	for i := range todo {
		if todo[i].V.Prov.RequestID == "r1" {
			r1 = &todo[i]
		}
	}
	if err := s.SaveFeed(ctx, nil, nil, r1); err != nil {
		t.Fatal(err)
	}
	if pending("r1") || !pending("r2") {
		t.Fatalf("after r1's mark: pending %v %v, want false true", pending("r1"), pending("r2"))
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if s, err = OpenStore(dir, Options{}); err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	todo, err = s.FeedErasesToScrub(sc)
	if err != nil || len(todo) != 1 || todo[0].V.Prov.RequestID != "r2" || todo[0].V.Kind != KindEdge || todo[0].VersionsErased != 3 {
		t.Fatalf("after a reopen: %+v (%v), want r2 alone", todo, err)
	}
	// r1, marked, reads as scrubbed on the feed too.
	var seen []Change
	if _, err := s.ReadFeed(ctx, FeedRead{Scope: sc, UpTo: 1000, Max: 10}, func(c *Change) error {
		seen = append(seen, *c)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	marked := 0
	for _, c := range seen {
		if c.Op == FeedErase && c.Scrubbed != (c.V.Prov.RequestID == "r1") {
			t.Fatalf("erase %s on the feed: scrubbed %v", c.V.Prov.RequestID, c.Scrubbed)
		}
		if c.Scrubbed {
			marked++
			// The mark keeps the row as it was written.
			if c.V.Kind != KindNode || c.VersionsErased != 3 || c.V.Tx.Start != 7 || c.erase.Op != OpEraseNode {
				t.Fatalf("the marked row reads back as %+v", c)
			}
		}
	}
	if marked != 1 {
		t.Fatalf("%d scrubbed erases on the feed, want 1 (of %d changes)", marked, len(seen))
	}
	if err := s.SaveFeed(ctx, nil, [][]byte{todo[0].EraseKey}, &todo[0]); err != nil {
		t.Fatal(err)
	}
	if pending("r2") {
		t.Fatal("a row marked and published in one save is still there")
	}
	if todo, _ = s.FeedErasesToScrub(sc); len(todo) != 0 {
		t.Fatalf("%d to scrub after all, want 0", len(todo))
	}
}
