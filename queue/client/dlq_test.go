package client_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/telha/telha-cascade/internal/testnats"
	"github.com/telha/telha-cascade/queue/client"
)

// Dead letters (issue 20 items 3 and 4): a page costs O(the page), read by
// subject on the server; retry publishes to the dead letter's own tenant
// only.

type dlqWorld struct {
	t       *testing.T
	ns      *testnats.Server
	js      jetstream.JetStream
	dlq     jetstream.Stream
	req     jetstream.Stream
	res     jetstream.Stream
	counter int
}

func newDLQWorld(t *testing.T) *dlqWorld {
	ns := testnats.Start(t)
	nc := testnats.Connect(t, ns.ClientURL())
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	w := &dlqWorld{t: t, ns: ns, js: js}
	ctx := context.Background()
	mk := func(name, subj string) jetstream.Stream {
		s, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{subj}, Storage: jetstream.FileStorage})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	w.req, w.res, w.dlq = mk("TELHA_REQ", "telha.req.*"), mk("TELHA_RES", "telha.res.*"), mk("TELHA_DLQ", "telha.dlq.*")
	return w
}

// letter stores a dead letter of tenant (a body of size bytes) and returns
// its sequence.
func (w *dlqWorld) letter(tenant, reason string, size int, hdr map[string]string) uint64 {
	w.t.Helper()
	w.counter++
	rid := fmt.Sprintf("r-%d", w.counter)
	m := nats.NewMsg("telha.dlq." + tenant)
	body := fmt.Sprintf(`{"request_id":%q,"op":"put_node","tenant":%q,"pad":%q}`, rid, tenant, make([]byte, 0))
	for len(body) < size {
		body = body[:len(body)-2] + "xxxxxxxxxxxxxxxx\"}"
	}
	m.Data = []byte(body)
	m.Header.Set("Telha-Reason", reason)
	m.Header.Set("Telha-Original-Subject", "telha.req."+tenant)
	m.Header.Set("Telha-Original-Msg-Id", tenant+"."+rid)
	for k, v := range hdr {
		m.Header.Set(k, v)
	}
	ack, err := w.js.PublishMsg(context.Background(), m)
	if err != nil {
		w.t.Fatal(err)
	}
	return ack.Sequence
}

// inMsgs is how many messages a fresh connection received while fn read
// dead letters through it.
func (w *dlqWorld) inMsgs(fn func(s jetstream.Stream)) uint64 {
	w.t.Helper()
	nc := testnats.Connect(w.t, w.ns.ClientURL())
	js, err := jetstream.New(nc)
	if err != nil {
		w.t.Fatal(err)
	}
	s, err := js.Stream(context.Background(), "TELHA_DLQ")
	if err != nil {
		w.t.Fatal(err)
	}
	before := nc.Stats().InMsgs
	fn(s)
	return nc.Stats().InMsgs - before
}

// TestDeadLettersOfATenantReadOnlyThePage: 4 dead letters of tenant a
// among 3,000 of other tenants. Filtered by tenant (or by a token's
// tenants), a page reads a few dozen messages, not the stream; its total
// is the tenant's count, not the stream's.
func TestDeadLettersOfATenantReadOnlyThePage(t *testing.T) {
	w := newDLQWorld(t)
	var mine []uint64
	for i := 0; i < 3000; i++ {
		if i%800 == 5 {
			mine = append(mine, w.letter("a", "invalid", 100, nil))
		}
		w.letter(fmt.Sprintf("other%d", i%7), "invalid", 100, nil)
	}
	if len(mine) != 4 {
		t.Fatalf("%d letters of a", len(mine))
	}
	for _, f := range []client.DeadLetterFilter{{Tenant: "a", Limit: 50, Full: true}, {Tenants: []string{"a"}, Limit: 50, Full: true},
		{Tenants: []string{"a", "nobody"}, Limit: 50}} {
		var got []client.DeadLetter
		var total uint64
		read := w.inMsgs(func(s jetstream.Stream) {
			var err error
			got, total, err = client.ListDeadLetters(context.Background(), s, "telha", f)
			if err != nil {
				t.Fatal(err)
			}
		})
		if len(got) != 4 || got[0].Seq != mine[3] || got[3].Seq != mine[0] {
			t.Fatalf("filter %+v: %d letters, want a's 4 newest first", f, len(got))
		}
		if total != 4 {
			t.Errorf("filter %+v: total %d, want a's 4 (not the stream's count)", f, total)
		}
		if read > 200 {
			t.Errorf("filter %+v: the page read %d messages of a 3,004-message stream, want O(the page)", f, read)
		}
		t.Logf("filter %+v: %d messages read", f, read)
	}
	// A tenant not in a token's list reads nothing.
	got, total, err := client.ListDeadLetters(context.Background(), w.dlq, "telha", client.DeadLetterFilter{Tenant: "other1", Tenants: []string{"a"}})
	if err != nil || len(got) != 0 || total != 0 {
		t.Fatalf("another tenant's letters through a's token: %d (total %d) %v", len(got), total, err)
	}
}

// TestDeadLetterPagesWalkEveryLetter: pages of 50, newest first, with a
// cursor, cover every letter once, for one tenant and for all; a reason
// filter keeps its letters only.
func TestDeadLetterPagesWalkEveryLetter(t *testing.T) {
	w := newDLQWorld(t)
	want := map[string][]uint64{}
	for i := 0; i < 240; i++ {
		tenant, reason := "a", "invalid"
		if i%3 == 0 {
			tenant = "b"
		}
		if i%5 == 0 {
			reason = "failed"
		}
		seq := w.letter(tenant, reason, 50, nil)
		want[tenant] = append(want[tenant], seq)
		want[""] = append(want[""], seq)
		if reason == "failed" {
			want["failed"] = append(want["failed"], seq)
		}
	}
	for name, f := range map[string]client.DeadLetterFilter{"a": {Tenant: "a"}, "b": {Tenants: []string{"b"}}, "": {}, "failed": {Reason: "failed"}} {
		f.Limit = 50
		var seen []uint64
		for pages := 0; ; pages++ {
			if pages > 20 {
				t.Fatalf("%q: more than 20 pages", name)
			}
			p, err := client.ListDeadLetterPage(context.Background(), w.dlq, "telha", f)
			if err != nil {
				t.Fatal(err)
			}
			if len(p.Letters) > 50 {
				t.Fatalf("%q: a page of %d", name, len(p.Letters))
			}
			for _, d := range p.Letters {
				seen = append(seen, d.Seq)
			}
			if p.Next == 0 {
				break
			}
			f.Before = p.Next
		}
		exp := want[name]
		if len(seen) != len(exp) {
			t.Fatalf("%q: %d letters over the pages, want %d", name, len(seen), len(exp))
		}
		for i := range seen {
			if seen[i] != exp[len(exp)-1-i] {
				t.Fatalf("%q: letter %d is seq %d, want %d (newest first, each once)", name, i, seen[i], exp[len(exp)-1-i])
			}
		}
	}
}

// TestRetryPublishesToItsOwnTenantOnly: a dead letter of tenant a whose
// Telha-Original-Subject names tenant b's request subject, or a JetStream
// API subject, is retried to telha.req.a: nothing lands in tenant b and
// the results stream is intact. Nats-* headers are not carried.
func TestRetryPublishesToItsOwnTenantOnly(t *testing.T) {
	w := newDLQWorld(t)
	ctx := context.Background()
	if _, err := w.js.Publish(ctx, "telha.res.b", []byte(`{"request_id":"kept"}`)); err != nil {
		t.Fatal(err)
	}
	for _, hdr := range []map[string]string{{"Telha-Original-Subject": "telha.req.b"}, {"Telha-Original-Subject": "$JS.API.STREAM.PURGE.TELHA_RES"},
		{"Telha-Original-Subject": "telha.res.b"}, {"Telha-Original-Subject": "telha.req.a", "Nats-Expected-Stream": "TELHA_DLQ"}} {
		planted := hdr["Telha-Original-Subject"]
		hdr["X-Kept"] = "yes"
		seq := w.letter("a", "invalid", 10, hdr)
		r, err := client.RetryDeadLetter(ctx, w.js, w.dlq, "telha", seq)
		if err != nil {
			t.Fatalf("retry with Telha-Original-Subject %s: %v", planted, err)
		}
		if r.Subject != "telha.req.a" {
			t.Fatalf("retry with Telha-Original-Subject %s went to %s, want telha.req.a", planted, r.Subject)
		}
		m, err := w.req.GetMsg(ctx, r.RequestStreamSeq)
		if err != nil || m.Subject != "telha.req.a" || m.Header.Get("X-Kept") != "yes" || m.Header.Get("Nats-Expected-Stream") != "" {
			t.Fatalf("republished: %v %+v", err, m)
		}
	}
	if m, err := w.req.GetLastMsgForSubject(ctx, "telha.req.b"); err == nil {
		t.Fatalf("a retry by tenant a landed in tenant b: %s", m.Data)
	}
	info, err := w.res.Info(ctx)
	if err != nil || info.State.Msgs != 1 {
		t.Fatalf("results stream after the retries: %+v %v, want its 1 message", info.State, err)
	}
	// A dead letter on a subject that is not one tenant's is refused.
	m := nats.NewMsg("telha.dlq.a")
	ack, _ := w.js.PublishMsg(ctx, m)
	if _, err := client.RetryDeadLetter(ctx, w.js, w.dlq, "other", ack.Sequence); err == nil {
		t.Fatal("a dead letter outside <prefix>.dlq.<tenant> retried")
	}
}
