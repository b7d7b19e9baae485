package app

import (
	"context"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/telha/telha-cascade/api"
	"github.com/telha/telha-cascade/internal/testnats"
	"github.com/telha/telha-cascade/queue"
	"github.com/telha/telha-cascade/reaper"
	"github.com/telha/telha-cascade/storage"
)

func TestE2EPutsAndTombstones(t *testing.T) {
	ns := testnats.Start(t)
	w := startWorker(t, ns, t.TempDir(), Options{})
	b := newBus(t, ns)
	const tn = "acme"
	n := ids(3)
	for _, id := range n {
		mustOK(t, b.wait(b.send(tn, node(id))))
	}
	e := ids(3)
	mustOK(t, b.wait(b.send(tn, edge(e[0], n[0], n[1]))))
	mustOK(t, b.wait(b.send(tn, edge(e[1], n[1], n[2]))))
	mustOK(t, b.wait(b.send(tn, edge(e[2], n[2], n[0]))))

	te := mustOK(t, b.wait(b.send(tn, tombEdge(e[2]))))
	if te.EdgesTombstoned != 0 || te.Journaled {
		t.Fatalf("tombstone_edge result %+v: edges_tombstoned and journaled belong to tombstone_node", te)
	}
	before := w.app.Store().Clock().Last()
	rc := mustOK(t, b.wait(b.send(tn, tombNode(n[1]))))
	if rc.EdgesTombstoned != 2 || rc.Journaled {
		t.Fatalf("cascade result %+v: want 2 edges inline", rc)
	}
	var v api.Version
	if code := w.get("/v1/tenants/acme/nodes/"+n[1], nil); code != 404 {
		t.Fatalf("deleted node now: %d, want 404", code)
	}
	beforeTx := before.Time().Format(time.RFC3339Nano)
	if code := w.get("/v1/tenants/acme/nodes/"+n[1]+asOf(beforeTx), &v); code != 200 || v.ID != n[1] || v.Tombstone {
		t.Fatalf("deleted node as of before: %d %+v", code, v)
	}
	var es struct{ Edges []api.Version }
	w.get("/v1/tenants/acme/nodes/"+n[0]+"/edges?dir=both", &es)
	if len(es.Edges) != 0 {
		t.Fatalf("node 0 still has %d live edges (ghosts)", len(es.Edges))
	}
	w.get("/v1/tenants/acme/nodes/"+n[0]+"/edges?dir=out&tx="+beforeTx, &es)
	if len(es.Edges) != 1 || es.Edges[0].ID != e[0] {
		t.Fatalf("out edges of node 0 as of before: %+v", es.Edges)
	}
	var h struct{ Versions []api.Version }
	w.get("/v1/tenants/acme/nodes/"+n[1]+"/history", &h)
	if len(h.Versions) != 2 || !h.Versions[1].Tombstone || *h.Versions[1].TxFrom != rc.TxTime {
		t.Fatalf("history %+v", h.Versions)
	}
	// Refusals by the rules of CONTRACT §5.
	if r := b.wait(b.send(tn, tombNode(n[1]))); r.Status != queue.StatusAlreadyTombstoned || r.TxTime != "" {
		t.Fatalf("second cascade: %+v", r)
	}
	if r := b.wait(b.send(tn, tombNode(uuid.NewString()))); r.Status != queue.StatusNotFound {
		t.Fatalf("unknown node: %+v", r)
	}
	if r := b.wait(b.send(tn, edge(uuid.NewString(), n[0], n[1]))); r.Status != queue.StatusEndpointDead {
		t.Fatalf("edge onto a dead node: %+v", r)
	}
	if r := b.wait(b.send(tn, edge(uuid.NewString(), n[0], uuid.NewString()))); r.Status != queue.StatusNotFound {
		t.Fatalf("edge onto an unknown node: %+v", r)
	}
	if r := b.wait(b.send(tn, node(n[1]))); r.Status != queue.StatusAlreadyTombstoned {
		t.Fatalf("resurrection: %+v", r)
	}
	if r := b.wait(b.send(tn, edge(e[0], n[2], n[0]))); r.Status != queue.StatusInvalid {
		t.Fatalf("changed endpoints: %+v", r)
	}
}

func TestE2EJournaledCascade(t *testing.T) {
	ns := testnats.Start(t)
	w := startWorker(t, ns, t.TempDir(), Options{}, "--max-batch-ops", "20")
	b := newBus(t, ns)
	hub := uuid.NewString()
	mustOK(t, b.wait(b.send("j", node(hub))))
	for i := 0; i < 12; i++ {
		m := uuid.NewString()
		mustOK(t, b.wait(b.send("j", node(m))))
		mustOK(t, b.wait(b.send("j", edge(uuid.NewString(), hub, m))))
	}
	id := b.send("j", tombNode(hub))
	r := mustOK(t, b.wait(id))
	// The result is published after the node tombstone landed and the
	// journal was removed.
	var js struct{ Journals []api.Journal }
	w.get("/v1/journals", &js)
	if !r.Journaled || r.EdgesTombstoned != 12 || len(js.Journals) != 0 {
		t.Fatalf("journaled result %+v, journals left %+v", r, js.Journals)
	}
	if code := w.get("/v1/tenants/j/nodes/"+hub, nil); code != 404 {
		t.Fatalf("hub after journaled cascade: %d", code)
	}
	if got := len(b.storedResults(id)); got != 1 {
		t.Fatalf("%d results stored for the journaled request, want 1", got)
	}
}

func TestE2EDuplicateRequestID(t *testing.T) {
	ns := testnats.Start(t)
	w := startWorker(t, ns, t.TempDir(), Options{})
	b := newBus(t, ns)
	n, m := uuid.NewString(), uuid.NewString()
	mustOK(t, b.wait(b.send("dup", node(m))))
	body := node(n)
	id := b.send("dup", body)
	first := mustOK(t, b.wait(id))
	// A publisher retry after the stream's duplicate window: the same
	// request id arrives again (here: with another Nats-Msg-Id so the
	// stream does not drop it).
	raw := fmt.Sprintf(`{"request_id":%q,"op":"put_node","tenant":"dup","id":%q}`, id, n)
	b.sendRaw("telha.req.dup", []byte(raw), "retry-"+id)
	rs := b.waitN(id, 2)
	if rs[1].Status != queue.StatusOK || rs[1].TxTime != first.TxTime {
		t.Fatalf("duplicate: %+v, want the stored receipt %+v", rs[1], first)
	}
	var h struct{ Versions []api.Version }
	w.get("/v1/tenants/dup/nodes/"+n+"/history", &h)
	if len(h.Versions) != 1 {
		t.Fatalf("%d versions after a duplicate, want 1 (one effect)", len(h.Versions))
	}
	// The same for a cascade: never reported as already_tombstoned.
	tid := b.send("dup", tombNode(m))
	tfirst := mustOK(t, b.wait(tid))
	raw = fmt.Sprintf(`{"request_id":%q,"op":"tombstone_node","tenant":"dup","id":%q}`, tid, m)
	b.sendRaw("telha.req.dup", []byte(raw), "retry-"+tid)
	trs := b.waitN(tid, 2)
	if trs[1].Status != queue.StatusOK || trs[1].TxTime != tfirst.TxTime {
		t.Fatalf("duplicate cascade: %+v, want %+v", trs[1], tfirst)
	}
	// The request stream keeps no duplicate window (issue 20 item 1): a
	// retry with the same Nats-Msg-Id reaches the worker too, and its
	// receipt answers it.
	ack, err := b.client.Publish(context.Background(), "dup", tid, []byte(raw))
	if err != nil || ack.Duplicate {
		t.Fatalf("publisher retry: ack %+v err %v, want it stored", ack, err)
	}
	if trs = b.waitN(tid, 3); trs[2].Status != queue.StatusOK || trs[2].TxTime != tfirst.TxTime {
		t.Fatalf("retry with the same Nats-Msg-Id: %+v, want %+v", trs[2], tfirst)
	}
}

func TestE2EMalformedInputIsDeadLettered(t *testing.T) {
	ns := testnats.Start(t)
	w := startWorker(t, ns, t.TempDir(), Options{})
	b := newBus(t, ns)
	good := uuid.NewString()
	deep := `{"request_id":"deep","op":"put_node","tenant":"bad","id":"` + good + `","props":` + strings.Repeat(`{"a":`, 100) + "1" + strings.Repeat("}", 100) + "}"
	cases := []struct {
		name, subject, body, reason, reqID string
	}{
		{"not json", "telha.req.bad", `hello`, queue.ReasonDecode, ""},
		{"array", "telha.req.bad", `[1,2]`, queue.ReasonDecode, ""},
		{"two objects", "telha.req.bad", `{"request_id":"x"}{}`, queue.ReasonDecode, ""},
		{"invalid utf-8", "telha.req.bad", "{\"request_id\":\"u\xff\"}", queue.ReasonDecode, ""},
		{"wrong type", "telha.req.bad", `{"request_id":"wt","op":"put_node","tenant":"bad","id":42}`, queue.ReasonDecode, ""},
		{"unknown field", "telha.req.bad", `{"request_id":"uf","op":"put_node","tenant":"bad","id":"` + good + `","valid_ned":"2020-01-01T00:00:00Z"}`, queue.ReasonDecode, ""},
		{"unknown op", "telha.req.bad", `{"request_id":"op1","op":"drop_table","tenant":"bad","id":"` + good + `"}`, queue.ReasonInvalid, "op1"},
		{"bad uuid", "telha.req.bad", `{"request_id":"uu","op":"put_node","tenant":"bad","id":"not-a-uuid"}`, queue.ReasonInvalid, "uu"},
		{"bad time", "telha.req.bad", `{"request_id":"tm","op":"tombstone_node","tenant":"bad","id":"` + good + `","valid_end":"yesterday"}`, queue.ReasonInvalid, "tm"},
		{"far future", "telha.req.bad", `{"request_id":"ff","op":"tombstone_node","tenant":"bad","id":"` + good + `","valid_end":"10000-01-01T00:00:00Z"}`, queue.ReasonInvalid, "ff"},
		{"missing request id", "telha.req.bad", `{"op":"put_node","tenant":"bad","id":"` + good + `"}`, queue.ReasonInvalid, ""},
		{"tenant mismatch", "telha.req.bad", `{"request_id":"tmm","op":"put_node","tenant":"other","id":"` + good + `"}`, queue.ReasonTenantMismatch, "tmm"},
		{"bad tenant token", "telha.req.BAD", `{"request_id":"bt","op":"put_node","tenant":"BAD","id":"` + good + `"}`, queue.ReasonInvalid, "bt"},
		{"field of another op", "telha.req.bad", `{"request_id":"fo","op":"put_node","tenant":"bad","id":"` + good + `","valid_end":"2020-01-01T00:00:00Z"}`, queue.ReasonInvalid, "fo"},
		{"props not an object", "telha.req.bad", `{"request_id":"po","op":"put_node","tenant":"bad","id":"` + good + `","props":[1]}`, queue.ReasonInvalid, "po"},
		{"deep props", "telha.req.bad", deep, queue.ReasonInvalid, "deep"},
		{"huge", "telha.req.bad", `{"request_id":"huge","op":"put_node","tenant":"bad","id":"` + good + `","props":{"x":"` + strings.Repeat("a", 300<<10) + `"}}`, queue.ReasonTooLarge, ""},
		{"empty interval", "telha.req.bad", `{"request_id":"ei","op":"put_node","tenant":"bad","id":"` + good + `","valid_from":"2021-01-01T00:00:00Z","valid_to":"2020-01-01T00:00:00Z"}`, queue.ReasonInvalid, "ei"},
	}
	for i, c := range cases {
		b.sendRaw(c.subject, []byte(c.body), fmt.Sprintf("bad-%d", i))
	}
	// The worker keeps going: a good request after all of them applies.
	mustOK(t, b.wait(b.send("bad", node(good))))
	for _, c := range cases {
		if c.reqID == "" {
			continue
		}
		r := b.wait(c.reqID)
		if r.Status != queue.StatusInvalid || !strings.Contains(r.Error, c.reason) {
			t.Errorf("%s: result %+v, want invalid (%s)", c.name, r, c.reason)
		}
	}
	var dl []dlqMsg
	testnats.Eventually(t, 10*time.Second, "every malformed message dead-lettered", func() bool {
		dl = b.deadLetters()
		return len(dl) >= len(cases)
	})
	byBody := map[string]dlqMsg{}
	for _, d := range dl {
		byBody[string(d.Data)] = d
	}
	for _, c := range cases {
		d, ok := byBody[c.body]
		if !ok {
			t.Errorf("%s: no dead letter with the original payload", c.name)
			continue
		}
		if d.Header.Get("Telha-Reason") != c.reason || d.Header.Get("Telha-Error") == "" {
			t.Errorf("%s: dead letter headers %v, want reason %s", c.name, d.Header, c.reason)
		}
		if d.Header.Get("Telha-Deliveries") != "1" || d.Header.Get("Telha-Original-Subject") == "" {
			t.Errorf("%s: dead letter headers %v", c.name, d.Header)
		}
		wantSubj := "telha.dlq.bad"
		if c.subject == "telha.req.BAD" {
			wantSubj = "telha.dlq.BAD" // the token its publisher used (issue 20 item 9)
		}
		if d.Subject != wantSubj {
			t.Errorf("%s: dead letter on %s, want %s", c.name, d.Subject, wantSubj)
		}
	}
	// Nothing malformed stays in the request stream.
	testnats.Eventually(t, 10*time.Second, "request stream empty", func() bool {
		s, err := b.js.Stream(context.Background(), "TELHA_REQ")
		if err != nil {
			return false
		}
		info, err := s.Info(context.Background())
		return err == nil && info.State.Msgs == 0
	})
	want := map[string]float64{}
	for _, c := range cases {
		want[c.reason]++
	}
	for reason, n := range want {
		if got := testutil.ToFloat64(w.app.Metrics().DeadLetters.WithLabelValues(reason)); got != n {
			t.Errorf("telha_dead_letters_total{reason=%q} = %v, want %v", reason, got, n)
		}
	}
}

// TestE2EWrongPartitionIsDeadLettered: a replica handed a message of a
// partition it does not own (a misconfigured consumer) dead-letters it and
// never applies it.
func TestE2EWrongPartitionIsDeadLettered(t *testing.T) {
	ns := testnats.Start(t)
	w := startWorker(t, ns, t.TempDir(), Options{}, "--partitions", "4", "--partition-owner", "0/2")
	b := newBus(t, ns)
	foreign := ""
	for i := 0; foreign == ""; i++ {
		tn := fmt.Sprintf("t%d", i)
		if !queue.Owner(w.app.Config().Owner).Owns(queue.Partition(tn, 4)) {
			foreign = tn
		}
	}
	// Widen the replica's consumer to every partition behind its back.
	_, err := b.js.UpdateConsumer(context.Background(), "TELHA_REQ", jetstream.ConsumerConfig{
		Durable: "telha-worker-0", FilterSubjects: []string{"telha.req.>"}, AckPolicy: jetstream.AckExplicitPolicy,
		AckWait: 30 * time.Second, MaxDeliver: -1, MaxAckPending: 4096,
	})
	if err != nil {
		t.Fatal(err)
	}
	n := uuid.NewString()
	id := b.send(foreign, node(n))
	r := b.wait(id)
	if r.Status != queue.StatusInvalid || !strings.Contains(r.Error, queue.ReasonWrongPartition) {
		t.Fatalf("foreign partition: %+v", r)
	}
	if code := w.get("/v1/tenants/"+foreign+"/nodes/"+n, nil); code != 404 {
		t.Fatalf("a foreign partition's request was applied (%d)", code)
	}
}

// TestE2ECascadeInFlight holds a journaled cascade between its commit point
// and its first chunk: an edge write onto the node is answered
// cascade_in_flight; the cascade then completes.
func TestE2ECascadeInFlight(t *testing.T) {
	ns := testnats.Start(t)
	hold, opts := newChunkHold()
	w := startWorker(t, ns, t.TempDir(), opts, "--max-batch-ops", "20")
	b := newBus(t, ns)
	hub, other := uuid.NewString(), uuid.NewString()
	mustOK(t, b.wait(b.send("fl", node(hub))))
	mustOK(t, b.wait(b.send("fl", node(other))))
	for i := 0; i < 6; i++ {
		mustOK(t, b.wait(b.send("fl", edge(uuid.NewString(), hub, other))))
	}
	hold.arm() // the journal lands; its first chunk waits
	id := b.send("fl", tombNode(hub))
	<-hold.held
	var js struct{ Journals []api.Journal }
	w.get("/v1/journals", &js)
	if len(js.Journals) != 1 || js.Journals[0].NodeID != hub || js.Journals[0].State != string(reaper.StateApplying) || js.Journals[0].EdgesTotal != 6 {
		t.Fatalf("journals while applying: %+v", js.Journals)
	}
	r := b.wait(b.send("fl", edge(uuid.NewString(), other, hub)))
	if r.Status != queue.StatusCascadeInFlight || r.TxTime != "" {
		t.Fatalf("edge write onto a node under an in-flight journal: %+v", r)
	}
	close(hold.release)
	mustOK(t, b.wait(id))
}

// TestE2ERestartMidJournal: the worker stops with a journal half applied;
// a new worker on the same data dir resumes it at startup, publishes the
// request's result once, and leaves no journal.
func TestE2ERestartMidJournal(t *testing.T) {
	ns := testnats.Start(t)
	dir := t.TempDir()
	var fault *storage.FaultEngine
	failFrom := make(chan int, 1)
	opts := Options{WrapEngine: func(e storage.Engine) storage.Engine {
		fault = storage.NewFaultEngine(e)
		fault.SetInject(func(n int) error {
			select {
			case at := <-failFrom:
				failFrom <- at
				if n >= at {
					return fmt.Errorf("%w: disk gone at call %d", storage.ErrInjected, n)
				}
			default:
			}
			return nil
		})
		return fault
	}}
	// No change feed: the fault counts durable commits, and the feed's
	// cursor saves would be some of them.
	w := startWorker(t, ns, dir, opts, "--max-batch-ops", "20", "--change-feed=false")
	b := newBus(t, ns)
	hub := uuid.NewString()
	mustOK(t, b.wait(b.send("rs", node(hub))))
	for i := 0; i < 10; i++ {
		m := uuid.NewString()
		mustOK(t, b.wait(b.send("rs", node(m))))
		mustOK(t, b.wait(b.send("rs", edge(uuid.NewString(), hub, m))))
	}
	failFrom <- fault.Calls() + 3 // journal, first chunk land; the rest fail
	id := b.send("rs", tombNode(hub))
	testnats.Eventually(t, 10*time.Second, "journal failing", func() bool {
		var js struct{ Journals []api.Journal }
		w.get("/v1/journals", &js)
		return len(js.Journals) == 1 && js.Journals[0].Failures > 0 && js.Journals[0].EdgesDone > 0 && js.Journals[0].State == string(reaper.StateFailing)
	})
	if err := w.stop(); err != nil {
		t.Fatalf("stop: %v", err)
	}
	b.mu.Lock()
	early := len(b.results[id])
	b.mu.Unlock()
	if early != 0 {
		t.Fatal("a result was published before the cascade finished")
	}
	w2 := startWorker(t, ns, dir, Options{}, "--max-batch-ops", "20")
	r := mustOK(t, b.wait(id))
	if !r.Journaled || r.EdgesTombstoned != 10 {
		t.Fatalf("resumed result %+v", r)
	}
	var js struct{ Journals []api.Journal }
	w2.get("/v1/journals", &js)
	if len(js.Journals) != 0 {
		t.Fatalf("journals left: %+v", js.Journals)
	}
	if n := len(b.storedResults(id)); n != 1 {
		t.Fatalf("%d results stored, want exactly 1", n)
	}
	if code := w2.get("/v1/tenants/rs/nodes/"+hub, nil); code != 404 {
		t.Fatalf("hub after resume: %d", code)
	}
}

func TestE2EReadAPIBadParameters(t *testing.T) {
	ns := testnats.Start(t)
	w := startWorker(t, ns, t.TempDir(), Options{})
	id := uuid.NewString()
	for _, p := range []string{
		"/v1/tenants/BAD/nodes/" + id,
		"/v1/tenants/ok/nodes/not-a-uuid",
		"/v1/tenants/ok/nodes/" + id + "?valid=tomorrow",
		"/v1/tenants/ok/nodes/" + id + "?tx=2026-13-01T00:00:00Z",
		"/v1/tenants/ok/nodes/" + id + "/edges?dir=sideways",
		"/v1/tenants/ok/edges/" + id + "?valid=1&valid=2",
	} {
		var e struct{ Error string }
		if code := w.get(p, &e); code != 400 || e.Error == "" {
			t.Errorf("GET %s: %d %q, want 400 with an error", p, code, e.Error)
		}
	}
	var es struct{ Edges []api.Version }
	if code := w.get("/v1/tenants/ok/nodes/"+id+"/edges", &es); code != 200 || es.Edges == nil || len(es.Edges) != 0 {
		t.Errorf("edges of an unknown node: %d %+v, want 200 with an empty list", code, es)
	}
	var js struct{ Journals []api.Journal }
	if code := w.get("/v1/journals", &js); code != 200 || js.Journals == nil {
		t.Errorf("journals: %d %+v, want an empty list", code, js)
	}
	if code := w.get("/v1/tenants/ok/nodes/"+id+"?valid=2020-01-01T00:00:00Z&tx="+url.QueryEscape("2020-01-01T00:00:00.5+02:00"), nil); code != 404 {
		t.Errorf("valid times with offsets and fractions: %d, want 404", code)
	}
	if code := w.get("/healthz", nil); code != 200 {
		t.Errorf("healthz %d", code)
	}
	if code := w.get("/readyz", nil); code != 200 {
		t.Errorf("readyz %d", code)
	}
}
