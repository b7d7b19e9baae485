package app

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/telha/telha-cascade/api"
	"github.com/telha/telha-cascade/internal/testnats"
	"github.com/telha/telha-cascade/metrics"
	"github.com/telha/telha-cascade/queue"
	"github.com/telha/telha-cascade/storage"
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

// TestHarmLargeEchoesStillDeadLettered (item 5): an error that echoes a
// 100 KB field (an unknown key, the tenant, the id) or a 100 KB
// (60 KB: the server takes no more) Nats-Msg-Id must not make the dead letter too large to store: every
// header built from input is bounded, the copy is stored and the request
// answered with a small result.
func TestHarmLargeEchoesStillDeadLettered(t *testing.T) {
	ns := testnats.Start(t)
	startWorker(t, ns, t.TempDir(), Options{}, "--max-deliver", "2")
	b := newBus(t, ns)
	big := strings.Repeat("k", 100<<10)
	cases := map[string]struct {
		body  map[string]any
		msgID string
	}{
		"key":    {body: map[string]any{"request_id": "big-key", "op": "put_node", "tenant": "a", "id": uuid.NewString(), big: 1}},
		"tenant": {body: map[string]any{"request_id": "big-tenant", "op": "put_node", "tenant": big, "id": uuid.NewString()}},
		"id":     {body: map[string]any{"request_id": "big-id", "op": "put_node", "tenant": "a", "id": big}},
		"op":     {body: map[string]any{"request_id": "big-op", "op": big, "tenant": "a", "id": uuid.NewString()}},
		"msgid":  {body: map[string]any{"op": "put_node", "tenant": "a", "id": "x"}, msgID: big[:60<<10]}, // the server refuses headers over 64 KB
	}
	for name, c := range cases {
		raw, _ := json.Marshal(c.body)
		b.sendRaw("telha.req.a", raw, c.msgID)
		if rid, ok := c.body["request_id"].(string); ok {
			r := b.wait(rid)
			if r.Status != queue.StatusInvalid {
				t.Errorf("%s: %+v", name, r)
			}
			if enc, _ := json.Marshal(r); len(enc) > 4<<10 {
				t.Errorf("%s: result of %d bytes: %.300s", name, len(enc), enc)
			}
		}
	}
	var dls []dlqMsg
	testnats.Eventually(t, 30*time.Second, "a dead letter per request", func() bool {
		dls = b.deadLetters()
		return len(dls) == len(cases)
	})
	for _, d := range dls {
		size := 0
		for k, vs := range d.Header {
			for _, v := range vs {
				size += len(k) + len(v)
				if len(v) > queue.MaxHeaderBytes {
					t.Errorf("dead letter header %s of %d bytes", k, len(v))
				}
			}
		}
		if size > 8<<10 {
			t.Errorf("dead letter headers of %d bytes", size)
		}
		if d.Header.Get("Telha-Truncated") != "" {
			t.Errorf("dead letter body cut short: %v", d.Header)
		}
	}
}

// TestHarmMetricLabelsComeFromFixedSets (item 2): a rejected request's op
// (or anything else from input) never becomes a label value: every label of
// every telha_* family is from a fixed set, and a flood of long random ops
// does not grow /metrics.
func TestHarmMetricLabelsComeFromFixedSets(t *testing.T) {
	ns := testnats.Start(t)
	w := startWorker(t, ns, t.TempDir(), Options{})
	b := newBus(t, ns)
	mustOK(t, b.wait(b.send("m", node(uuid.NewString()))))
	before := len(scrape(t, w))
	for i := 0; i < 30; i++ {
		op := fmt.Sprintf("op-%d-%s", i, strings.Repeat(uuid.NewString(), 100))
		raw, _ := json.Marshal(map[string]any{"request_id": fmt.Sprintf("flood-%d", i), "op": op, "tenant": "m", "id": uuid.NewString()})
		b.sendRaw("telha.req.m", raw, "")
		// An op that is not a string, and a body that is not JSON at all.
		b.sendRaw("telha.req.m", []byte(fmt.Sprintf(`{"request_id":"flood-x-%d","op":{"%s":1}}`, i, op)), "")
	}
	for i := 0; i < 30; i++ {
		if r := b.wait(fmt.Sprintf("flood-%d", i)); r.Status != queue.StatusInvalid {
			t.Fatalf("flood %d: %+v", i, r)
		}
		b.wait(fmt.Sprintf("flood-x-%d", i))
	}
	text := scrape(t, w)
	if len(text) > before+2048 {
		t.Errorf("/metrics grew from %d to %d bytes with 60 rejected requests", before, len(text))
	}
	var ops []string
	for _, o := range storage.Ops() {
		ops = append(ops, o.String())
	}
	allowed := map[string][]string{
		"op":     append(ops, "unknown"),
		"status": append(queue.Statuses(), "unknown"),
		"reason": append(queue.DeadLetterReasons(), "unauthenticated", "forbidden_tenant", "forbidden_role", "loopback_only", "other"),
		"path":   {"inline", "journaled"},
		"lane":   {"foreground", "background"},
		"result": {"ok", "error", "skipped"},
		"kind":   {metrics.ScrubUploaded, metrics.ScrubDeleted},
	}
	labelRE := regexp.MustCompile(`(\w+)="((?:[^"\\]|\\.)*)"`)
	for _, line := range strings.Split(text, "\n") {
		if !strings.HasPrefix(line, "telha_") || strings.HasPrefix(line, "telha_build_info") {
			continue
		}
		if len(line) > 512 {
			t.Errorf("metric line of %d bytes: %.200s", len(line), line)
			continue
		}
		open := strings.IndexByte(line, '{')
		if open < 0 {
			continue
		}
		for _, m := range labelRE.FindAllStringSubmatch(line[open:], -1) {
			name, value := m[1], m[2]
			if name == "le" {
				continue
			}
			set, ok := allowed[name]
			if !ok {
				t.Errorf("label %q has no fixed set: %s", name, line)
			} else if !slices.Contains(set, value) {
				t.Errorf("label %s=%q is not in its fixed set: %.200s", name, value, line)
			}
		}
	}
}

// TestHarmRejectedRequestHidesNextAnswer (item 8): an invalid request, then
// the fixed request under the same id: the results stream must keep both
// answers, the later one ok; and a replay of the same answer is still
// stored once.
func TestHarmRejectedRequestHidesNextAnswer(t *testing.T) {
	ns := testnats.Start(t)
	startWorker(t, ns, t.TempDir(), Options{})
	b := newBus(t, ns)
	n := uuid.NewString()
	bad, _ := json.Marshal(map[string]any{"request_id": "collide-1", "op": "put_node", "tenant": "c", "id": "not-a-uuid"})
	b.sendRaw("telha.req.c", bad, "")
	if r := b.wait("collide-1"); r.Status != queue.StatusInvalid {
		t.Fatalf("first: %+v", r)
	}
	good, _ := json.Marshal(map[string]any{"request_id": "collide-1", "op": "put_node", "tenant": "c", "id": n})
	b.sendRaw("telha.req.c", good, "")
	mustOK(t, b.waitN("collide-1", 2)[1])
	// A replay of the ok (the same message again): the same answer, not
	// stored a second time.
	b.sendRaw("telha.req.c", good, "")
	b.waitN("collide-1", 3)
	var stored []queue.Result
	testnats.Eventually(t, 10*time.Second, "both answers stored", func() bool {
		stored = b.storedResults("collide-1")
		return len(stored) >= 2
	})
	if len(stored) != 2 || stored[0].Status != queue.StatusInvalid || stored[1].Status != queue.StatusOK {
		t.Fatalf("TELHA_RES holds %+v, want the invalid answer then the ok", stored)
	}
}

// blockResults makes TELHA_RES refuse every new message (max messages at
// what it holds, discard new) and returns the function that lifts it: a
// fault of the real server, not a mock.
func blockResults(t *testing.T, js jetstream.JetStream) func() {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, "TELHA_RES")
	if err != nil {
		t.Fatal(err)
	}
	// A result reaches a core subscriber (b.wait) before the stream
	// has necessarily stored it: wait until the stream holds one.
	var info *jetstream.StreamInfo
	testnats.Eventually(t, 10*time.Second, "TELHA_RES holds a result (blockResults needs one)", func() bool {
		var err error
		info, err = s.Info(ctx)
		return err == nil && info.State.Msgs > 0
	})
	orig := info.Config
	blocked := orig
	blocked.MaxMsgs, blocked.Discard = int64(info.State.Msgs), jetstream.DiscardNew
	if _, err := js.UpdateStream(ctx, blocked); err != nil {
		t.Fatal(err)
	}
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := js.UpdateStream(ctx, orig); err != nil {
			t.Fatal(err)
		}
	}
}

// TestHarmDeadLetterResultNotLost (item 11): when the result of a
// dead-lettered request cannot be stored, the message is kept (nak) and
// answered once the results stream takes it again; its dead letter is
// stored once.
func TestHarmDeadLetterResultNotLost(t *testing.T) {
	ns := testnats.Start(t)
	logs := newLogBuf()
	// 10 deliveries: the results stream is blocked from the first result
	// until the test sees its log and unblocks it (with 3, a loaded
	// machine could spend them all meanwhile, and the last is not answered).
	l := launch(t, slog.New(slog.NewTextHandler(logs, nil)), t.TempDir(), "--nats-url", ns.ClientURL(), "--max-deliver", "10")
	a := l.waitReady()
	b := newBus(t, ns)
	mustOK(t, b.wait(b.send("lost", node(uuid.NewString()))))
	unblock := blockResults(t, b.js)
	raw, _ := json.Marshal(map[string]any{"request_id": "lost-1", "op": "put_node", "tenant": "lost", "id": "not-a-uuid"})
	b.sendRaw("telha.req.lost", raw, "")
	if !logs.waitFor(30*time.Second, l.exited, "result of a dead-lettered request") {
		t.Fatalf("no log of the failed result; logs:\n%s", logs)
	}
	unblock()
	if got := b.storedResults("lost-1"); len(got) != 1 || got[0].Status != queue.StatusInvalid {
		t.Fatalf("TELHA_RES holds %+v for the dead-lettered request, want its invalid answer", got)
	}
	n := 0
	for _, d := range b.deadLetters() {
		if strings.Contains(string(d.Data), "lost-1") {
			n++
		}
	}
	if n != 1 {
		t.Fatalf("%d dead letters of the request, want 1", n)
	}
	if got := testutil.ToFloat64(a.Metrics().DeadLetters.WithLabelValues(queue.ReasonInvalid)); got != 1 {
		t.Fatalf("telha_dead_letters_total{reason=invalid} = %v, want 1", got)
	}
}

// TestHarmDeadLetterResultLostLoudly (item 11): on the last delivery the
// message is terminated anyway, loudly: an error log line and
// telha_dead_letter_result_failures_total.
func TestHarmDeadLetterResultLostLoudly(t *testing.T) {
	ns := testnats.Start(t)
	logs := newLogBuf()
	l := launch(t, slog.New(slog.NewTextHandler(logs, nil)), t.TempDir(), "--nats-url", ns.ClientURL(), "--max-deliver", "2")
	l.waitReady()
	b := newBus(t, ns)
	mustOK(t, b.wait(b.send("lost", node(uuid.NewString()))))
	defer blockResults(t, b.js)()
	raw, _ := json.Marshal(map[string]any{"request_id": "lost-2", "op": "put_node", "tenant": "lost", "id": "not-a-uuid"})
	b.sendRaw("telha.req.lost", raw, "")
	if !logs.waitFor(30*time.Second, l.exited, "level=ERROR", "WITHOUT its result", "lost-2") {
		t.Fatalf("no error log of the lost result; logs:\n%s", logs)
	}
	testnats.Eventually(t, 10*time.Second, "the failure counted", func() bool {
		_, body := httpGet(t, "http://"+l.httpAddr+"/metrics")
		return strings.Contains(body, `telha_dead_letter_result_failures_total{reason="invalid"} 1`)
	})
}

// TestHarmNilUUIDAndUnholdableNumbers (item 23): the nil UUID as an id and
// a props number a double cannot hold are dead-lettered as invalid, with
// a clear reason.
func TestHarmNilUUIDAndUnholdableNumbers(t *testing.T) {
	ns := testnats.Start(t)
	startWorker(t, ns, t.TempDir(), Options{})
	b := newBus(t, ns)
	for rid, c := range map[string]struct{ body, want string }{
		"nil-id":  {`{"request_id":"nil-id","op":"put_node","tenant":"v","id":"00000000-0000-0000-0000-000000000000"}`, "nil UUID"},
		"nil-src": {`{"request_id":"nil-src","op":"put_edge","tenant":"v","id":"` + uuid.NewString() + `","src":"00000000-0000-0000-0000-000000000000","dst":"` + uuid.NewString() + `"}`, "nil UUID"},
		"big-num": {`{"request_id":"big-num","op":"put_node","tenant":"v","id":"` + uuid.NewString() + `","props":{"x":1e400}}`, "range of a double"},
		"big-int": {`{"request_id":"big-int","op":"put_node","tenant":"v","id":"` + uuid.NewString() + `","props":{"x":123456789012345678901234567890}}`, "2^53"},
	} {
		b.sendRaw("telha.req.v", []byte(c.body), "")
		if r := b.wait(rid); r.Status != queue.StatusInvalid || !strings.Contains(r.Error, c.want) {
			t.Errorf("%s: %+v, want invalid (%s)", rid, r, c.want)
		}
	}
	testnats.Eventually(t, 10*time.Second, "four dead letters", func() bool { return len(b.deadLetters()) == 4 })
}
