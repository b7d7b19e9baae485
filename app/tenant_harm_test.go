package app

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/google/uuid"
	"github.com/telha/telha-cascade/api"
	"github.com/telha/telha-cascade/internal/testnats"
	"github.com/telha/telha-cascade/queue"
)

// Issue 20: what one tenant's publisher could do to another tenant, or to
// the worker, through the queue.

// TestHarmDedupeSuppressesAnotherTenant (item 1): a publisher on
// telha.req.a sending Nats-Msg-Id "b.victim-1" must not make tenant b's
// real request with that id a silent duplicate. The request stream keeps
// no duplicate window; exactly-once rests on the receipts.
func TestHarmDedupeSuppressesAnotherTenant(t *testing.T) {
	ns := testnats.Start(t)
	w := startWorker(t, ns, t.TempDir(), Options{})
	b := newBus(t, ns)
	const rid = "victim-1"
	msgID := queue.RequestMsgID("b", rid) // what tenant b's client sends: "b.victim-1"
	// The attacker's message: its own tenant, b's message id.
	evil, _ := json.Marshal(map[string]any{"request_id": "evil-1", "op": "put_node", "tenant": "a", "id": uuid.NewString()})
	b.sendRaw("telha.req.a", evil, msgID)
	mustOK(t, b.wait("evil-1"))
	// Tenant b's real request, with the message id its client always uses.
	n := uuid.NewString()
	raw, _ := json.Marshal(map[string]any{"request_id": rid, "op": "put_node", "tenant": "b", "id": n})
	ack, err := b.client.Publish(context.Background(), "b", rid, raw)
	if err != nil {
		t.Fatal(err)
	}
	if ack.Duplicate {
		t.Fatalf("tenant b's request was dropped by the request stream as a duplicate of tenant a's message")
	}
	mustOK(t, b.wait(rid))
	if code := w.get("/v1/tenants/b/nodes/"+n, nil); code != 200 {
		t.Fatalf("tenant b's node: %d", code)
	}
}

// TestHarmRetriedPublishAppliedOnce (item 1): without the stream's window,
// a publisher's retry (the same message twice) reaches the worker twice;
// the receipt answers it: the same answer, one effect, one stored result.
func TestHarmRetriedPublishAppliedOnce(t *testing.T) {
	ns := testnats.Start(t)
	w := startWorker(t, ns, t.TempDir(), Options{})
	b := newBus(t, ns)
	n := uuid.NewString()
	rid := uuid.NewString()
	raw, _ := json.Marshal(map[string]any{"request_id": rid, "op": "put_node", "tenant": "retry", "id": n, "props": map[string]any{"k": 1}})
	for i := 0; i < 2; i++ {
		if _, err := b.client.Publish(context.Background(), "retry", rid, raw); err != nil {
			t.Fatal(err)
		}
	}
	rs := b.waitN(rid, 2)
	mustOK(t, rs[0])
	if rs[1].Status != queue.StatusOK || rs[1].TxTime != rs[0].TxTime {
		t.Fatalf("retried publish answered %+v, want the first answer %+v", rs[1], rs[0])
	}
	var h struct{ Versions []api.Version }
	w.get("/v1/tenants/retry/nodes/"+n+"/history", &h)
	if len(h.Versions) != 1 {
		t.Fatalf("%d versions after a retried publish, want 1 (one effect)", len(h.Versions))
	}
	if got := b.storedResults(rid); len(got) != 1 {
		t.Fatalf("TELHA_RES holds %d results of one request answered twice the same, want 1: %+v", len(got), got)
	}
}
