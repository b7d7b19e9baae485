package app

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

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

// TestHarmWildcardSubjectsAreDeadLettered (item 6): messages published to
// the literal subjects telha.req.* and telha.req.> are consumed,
// dead-lettered and answered, not kept in the request stream for ever.
func TestHarmWildcardSubjectsAreDeadLettered(t *testing.T) {
	ns := testnats.Start(t)
	startWorker(t, ns, t.TempDir(), Options{}, "--partitions", "3")
	b := newBus(t, ns)
	for i, subj := range []string{"telha.req.*", "telha.req.>"} {
		rid := fmt.Sprintf("wild-%d", i)
		raw, _ := json.Marshal(map[string]any{"request_id": rid, "op": "put_node", "tenant": "a", "id": uuid.NewString(),
			"props": map[string]any{"secret": "erase-me"}})
		b.sendRaw(subj, raw, "")
		r := b.wait(rid)
		if r.Status != queue.StatusInvalid || !strings.Contains(r.Error, "wildcard") {
			t.Fatalf("%s: result %+v, want invalid (a wildcard subject)", subj, r)
		}
	}
	var found []string
	for _, d := range b.deadLetters() {
		found = append(found, d.Header.Get("Telha-Original-Subject"))
		if d.Header.Get("Telha-Reason") != queue.ReasonInvalid || d.Subject != "telha.dlq._" {
			t.Errorf("dead letter %s reason %q", d.Subject, d.Header.Get("Telha-Reason"))
		}
	}
	slices.Sort(found)
	if !slices.Equal(found, []string{"telha.req.*", "telha.req.>"}) {
		t.Fatalf("dead letters' original subjects %q", found)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := b.js.Stream(ctx, "TELHA_REQ")
	if err != nil {
		t.Fatal(err)
	}
	testnats.Eventually(t, 10*time.Second, "TELHA_REQ empty", func() bool {
		info, err := s.Info(ctx)
		return err == nil && info.State.Msgs == 0
	})
}

// TestHarmUnreadableTenantAnsweredOnItsSubject (item 9): a request on
// telha.req.Acme (not a tenant name) is answered on telha.res.Acme, where
// its publisher listens, and its dead letter keeps the subject it came on.
func TestHarmUnreadableTenantAnsweredOnItsSubject(t *testing.T) {
	ns := testnats.Start(t)
	startWorker(t, ns, t.TempDir(), Options{})
	b := newBus(t, ns)
	sub, err := b.nc.SubscribeSync("telha.res.Acme")
	if err != nil {
		t.Fatal(err)
	}
	if err := b.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	raw, _ := json.Marshal(map[string]any{"request_id": "upper-1", "op": "put_node", "tenant": "Acme", "id": uuid.NewString()})
	b.sendRaw("telha.req.Acme", raw, "")
	m, err := sub.NextMsg(30 * time.Second)
	if err != nil {
		t.Fatalf("no answer on telha.res.Acme: %v", err)
	}
	var r queue.Result
	if err := json.Unmarshal(m.Data, &r); err != nil || r.RequestID != "upper-1" || r.Status != queue.StatusInvalid {
		t.Fatalf("answer on telha.res.Acme: %s (%v)", m.Data, err)
	}
	if got := b.storedResults("upper-1"); len(got) != 1 {
		t.Fatalf("TELHA_RES holds %d answers", len(got))
	}
	dls := b.deadLetters()
	if len(dls) != 1 || dls[0].Subject != "telha.dlq.Acme" || dls[0].Header.Get("Telha-Original-Subject") != "telha.req.Acme" {
		t.Fatalf("dead letters %+v, want one on telha.dlq.Acme from telha.req.Acme", dls)
	}
}
