package client_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/telha/telha-cascade/queue/client"
)

// TestResultPagesWalkEveryResult: the results stream read a page at a
// time, newest first, with a cursor, covers every result of the filter
// once: one tenant, a token's tenants, all, a status filter (read in
// bounded scans, so a page may end short with a Next), and a body that is
// not a result (kept, marked unreadable; a status filter drops it).
func TestResultPagesWalkEveryResult(t *testing.T) {
	w := newDLQWorld(t)
	ctx := context.Background()
	want := map[string][]uint64{}
	unreadable := map[uint64]bool{}
	for i := 0; i < 300; i++ {
		tenant, status := "a", client.StatusOK
		if i%3 == 0 {
			tenant = "b"
		}
		if i%7 == 0 {
			status = client.StatusInvalid
		}
		if i%97 == 1 {
			status = client.StatusFailed // rare: pages end at the scan bound
		}
		body := fmt.Sprintf(`{"request_id":"r-%d","op":"put_node","tenant":%q,"id":"x","status":%q}`, i, tenant, status)
		if i == 250 {
			body = "not json"
		}
		ack, err := w.js.Publish(ctx, "telha.res."+tenant, []byte(body))
		if err != nil {
			t.Fatal(err)
		}
		if i == 250 {
			unreadable[ack.Sequence] = true
		}
		want[tenant] = append(want[tenant], ack.Sequence)
		want[""] = append(want[""], ack.Sequence)
		if i < 40 {
			want["a,b<40"] = append(want["a,b<40"], ack.Sequence)
		}
		if status == client.StatusInvalid && i != 250 {
			want["invalid"] = append(want["invalid"], ack.Sequence)
		}
		if status == client.StatusFailed {
			want["failed"] = append(want["failed"], ack.Sequence)
		}
	}
	// Unrelated messages in the stream, which a page never returns.
	for i := 0; i < 50; i++ {
		if _, err := w.js.Publish(ctx, "telha.res.c", []byte(`{"status":"ok"}`)); err != nil {
			t.Fatal(err)
		}
	}
	rs := client.ResultStream{JS: w.js, Stream: "TELHA_RES", Prefix: "telha"}
	filters := map[string]client.ResultFilter{
		"a":       {Tenant: "a"},
		"b":       {Tenants: []string{"b", "b", "bad.token"}},
		"":        {Tenants: []string{"a", "b"}},
		"invalid": {Status: client.StatusInvalid, Tenants: []string{"a", "b"}},
		"failed":  {Status: client.StatusFailed},
		"a,b<40":  {Tenants: []string{"a", "b"}, Before: want[""][40]},
		"none":    {Tenant: "c", Tenants: []string{"a"}},
	}
	for name, f := range filters {
		f.Limit = 20
		var seen []uint64
		empty, pages := 0, 0
		for ; ; pages++ {
			if pages > 40 {
				t.Fatalf("%q: more than 40 pages", name)
			}
			p, err := rs.List(ctx, f)
			if err != nil {
				t.Fatal(err)
			}
			if len(p.Results) > 20 {
				t.Fatalf("%q: a page of %d", name, len(p.Results))
			}
			if len(p.Results) == 0 {
				empty++
			}
			for _, r := range p.Results {
				if r.Unreadable != unreadable[r.Seq] {
					t.Fatalf("%q: seq %d unreadable %v", name, r.Seq, r.Unreadable)
				}
				if !r.Unreadable && (name == "a" || name == "b") && r.Tenant != name {
					t.Fatalf("%q: seq %d of tenant %q", name, r.Seq, r.Tenant)
				}
				seen = append(seen, r.Seq)
			}
			if p.Next == 0 {
				break
			}
			f.Before = p.Next
		}
		exp := want[name]
		if len(seen) != len(exp) {
			t.Fatalf("%q: %d results over the pages, want %d", name, len(seen), len(exp))
		}
		for i := range seen {
			if seen[i] != exp[len(exp)-1-i] {
				t.Fatalf("%q: result %d is seq %d, want %d (newest first, each once)", name, i, seen[i], exp[len(exp)-1-i])
			}
		}
		if name == "failed" && pages == 0 {
			t.Errorf("%q: %d results in one page: it did not end at the scan bound", name, len(seen))
		}
		t.Logf("%q: %d results, %d pages after the first, %d empty", name, len(seen), pages, empty)
	}
	// A default page is 50.
	p, err := rs.List(ctx, client.ResultFilter{})
	if err != nil || len(p.Results) != 50 || p.Next != p.Results[49].Seq {
		t.Fatalf("default page: %d results, next %d, %v", len(p.Results), p.Next, err)
	}
}
