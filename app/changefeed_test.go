package app

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/telha/telha-cascade/internal/testnats"
	"github.com/telha/telha-cascade/queue/client"
)

// readChanges reads tenant's feed from its start until done says so (or
// the deadline), acking each change.
func readChanges(t *testing.T, b *bus, tenant string, done func([]client.Change) bool) []client.Change {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := client.New(b.nc, client.Config{})
	if err != nil {
		t.Fatal(err)
	}
	r, err := c.OpenChanges(ctx, client.ChangesConfig{Tenant: tenant})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	var out []client.Change
	for !done(out) {
		m, err := r.Next(ctx)
		if err != nil {
			t.Fatalf("after %d changes: %v", len(out), err)
		}
		out = append(out, m.Change)
		if err := m.Ack(); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

// A journaled cascade on the feed: every edge's put, then every edge's
// tombstone with the hub as cause, the hub's tombstone last, each exactly
// once, in tx order; props ride on puts; an erase comes after the
// changes it followed and carries no props.
func TestChangeFeedOfAJournaledCascade(t *testing.T) {
	ns := testnats.Start(t)
	startWorker(t, ns, t.TempDir(), Options{}, "--max-batch-ops", "64", "--journal-chunk-ops", "64")
	b := newBus(t, ns)
	const tenant, n = "feed", 300
	hub := uuid.NewString()
	mustOK(t, b.wait(b.send(tenant, map[string]any{"op": "put_node", "id": hub, "props": map[string]any{"name": "hub"}})))
	var reqs []string
	for i := 0; i < n; i++ {
		x := uuid.NewString()
		reqs = append(reqs, b.send(tenant, node(x)), b.send(tenant, edge(uuid.NewString(), x, hub)))
	}
	for _, id := range reqs {
		mustOK(t, b.wait(id))
	}
	tomb := b.send(tenant, tombNode(hub))
	if r := mustOK(t, b.wait(tomb)); !r.Journaled || r.EdgesTombstoned != n {
		t.Fatalf("tombstone of the hub: %+v, want journaled with %d edges", r, n)
	}
	other := uuid.NewString()
	mustOK(t, b.wait(b.send(tenant, map[string]any{"op": "put_node", "id": other, "props": map[string]any{"email": "x@example.com"}})))
	erase := b.send(tenant, map[string]any{"op": "erase_node", "id": other, "provenance": map[string]any{"reason": "gdpr"}})
	mustOK(t, b.wait(erase))

	got := readChanges(t, b, tenant, func(cs []client.Change) bool {
		return len(cs) > 0 && cs[len(cs)-1].Op == client.ChangeErase
	})
	seen := map[string]bool{}
	var last string
	tombs, hubTomb := 0, -1
	for i, c := range got {
		key := fmt.Sprintf("%s/%s/%s/%s", c.Kind, c.Op, c.ID, c.TxTime)
		if seen[key] {
			t.Fatalf("change %d %s twice", i, key)
		}
		seen[key] = true
		if c.Tenant != tenant || c.RequestID == "" {
			t.Fatalf("change %d: %+v", i, c)
		}
		if c.Op != client.ChangeErase {
			if c.TxTime < last {
				t.Fatalf("change %d at %s after one at %s", i, c.TxTime, last)
			}
			last = c.TxTime
		}
		switch {
		case c.Kind == client.KindEdge && c.Op == client.ChangeTombstone:
			tombs++
			if c.Cause != hub || c.RequestID != tomb || c.Src == "" || c.Dst != hub {
				t.Fatalf("edge tombstone %d: %+v, want cause %s and request %s", i, c, hub, tomb)
			}
			if hubTomb >= 0 {
				t.Fatalf("edge tombstone %d after the hub's", i)
			}
		case c.Kind == client.KindNode && c.Op == client.ChangeTombstone && c.ID == hub:
			hubTomb = i
		case c.Op == client.ChangePut && c.ID == hub:
			if string(c.Props) != `{"name":"hub"}` {
				t.Fatalf("the hub's put carries props %s", c.Props)
			}
		}
	}
	if tombs != n || hubTomb < 0 {
		t.Fatalf("%d edge tombstones (want %d), hub tombstone at %d", tombs, n, hubTomb)
	}
	if want := 1 + 2*n + n + 1 + 1 + 1 + 1; len(got) != want { // puts, tombstones, the other's put, tombstone and erase
		t.Fatalf("%d changes, want %d", len(got), want)
	}
	e := got[len(got)-1]
	if e.ID != other || e.RequestID != erase || e.Props != nil || e.VersionsErased == nil {
		t.Fatalf("erase change: %+v", e)
	}
}
