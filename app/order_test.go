package app

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/telha/telha-cascade/internal/testnats"
	"github.com/telha/telha-cascade/queue/client"
	"github.com/telha/telha-cascade/storage"
)

// slowCommits is a disk whose durable commits take d longer.
type slowCommits struct {
	storage.Engine
	d time.Duration
}

func (s slowCommits) Commit(b *pebble.Batch) error {
	time.Sleep(s.d)
	return s.Engine.Commit(b)
}

// Requests apply in the order the stream delivers them, within a group and
// from one group to the next: for many nodes at once, a node's put, a put
// of an edge to it and its tombstone are published back to back
// (asynchronously, so hundreds wait at a time) to a worker whose commits
// are slow, so they arrive while groups are in the writer. Out of order,
// an edge's put would meet a missing or dead endpoint, or a tombstone
// would miss its edge (swapping two requests of a group fails it).
func TestGroupsKeepArrivalOrder(t *testing.T) {
	ns := testnats.Start(t)
	opts := Options{WrapEngine: func(e storage.Engine) storage.Engine { return slowCommits{e, 2 * time.Millisecond} }}
	startWorker(t, ns, t.TempDir(), opts)
	b := newBus(t, ns)
	const tenant = "order"
	hub := uuid.NewString()
	mustOK(t, b.wait(b.send(tenant, node(hub))))
	pub := func(body map[string]any) string {
		id := uuid.NewString()
		body["request_id"], body["tenant"] = id, tenant
		raw, _ := json.Marshal(body)
		m := nats.NewMsg("telha.req." + tenant)
		m.Data = raw
		m.Header.Set(jetstream.MsgIDHeader, client.RequestMsgID(tenant, id))
		if _, err := b.js.PublishMsgAsync(m); err != nil {
			t.Fatalf("publish: %v", err)
		}
		return id
	}
	const n = 500
	var puts, edges, tombs []string
	for i := 0; i < n; i++ {
		x := uuid.NewString()
		puts = append(puts, pub(node(x)))
		edges = append(edges, pub(edge(uuid.NewString(), x, hub)))
		tombs = append(tombs, pub(tombNode(x)))
	}
	select {
	case <-b.js.PublishAsyncComplete():
	case <-time.After(30 * time.Second):
		t.Fatal("publishes not acknowledged within 30s")
	}
	for i := range tombs {
		mustOK(t, b.wait(puts[i]))
		mustOK(t, b.wait(edges[i]))
		if r := mustOK(t, b.wait(tombs[i])); r.EdgesTombstoned != 1 {
			t.Fatalf("tombstone %d of %d tombstoned %d edges, want its node's one edge: applied out of order", i, n, r.EdgesTombstoned)
		}
	}
}
