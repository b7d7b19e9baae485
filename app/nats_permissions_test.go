package app

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/telha/telha-cascade/internal/testnats"
	"github.com/telha/telha-cascade/queue"
	"github.com/telha/telha-cascade/queue/client"
)

// TestNATSPermissionsIsolateTenants starts a real server with the users and
// permissions of docs/examples/nats-tenants.conf (the file itself, so the
// documented example is what is tested) and the worker as telha-worker, and
// checks the threat model's promises (docs/RELIABILITY.md): a tenant's
// publisher is applied and answered on its own subjects, and it cannot
// publish for another tenant, read another tenant's results (live, from the
// stream, or through the inboxes of stream acks), nor use the JetStream API
// beyond a consumer of its own results (no purge, no stream info).
func TestNATSPermissionsIsolateTenants(t *testing.T) {
	conf, err := server.ProcessConfigFile("../docs/examples/nats-tenants.conf")
	if err != nil {
		t.Fatalf("the documented example does not parse: %v", err)
	}
	pw := map[string]string{}
	for _, u := range conf.Users {
		pw[u.Username] = u.Password
	}
	for _, u := range []string{"telha-worker", "tenant-acme", "tenant-globex"} {
		if _, ok := pw[u]; !ok {
			t.Fatalf("docs/examples/nats-tenants.conf has no user %s", u)
		}
	}
	ns := testnats.Start(t, func(o *server.Options) { o.Users = conf.Users })
	url := ns.ClientURL()

	startWorker(t, ns, t.TempDir(), Options{}, "--nats-user", "telha-worker", "--nats-password", pw["telha-worker"])

	// A tenant's connection, with its own inbox prefix, recording the
	// permission violations the server reports asynchronously.
	type tenantConn struct {
		nc         *nats.Conn
		js         jetstream.JetStream
		mu         sync.Mutex
		violations []string
	}
	connect := func(tenant string) *tenantConn {
		tc := &tenantConn{}
		tc.nc = testnats.Connect(t, url, nats.UserInfo("tenant-"+tenant, pw["tenant-"+tenant]), nats.CustomInboxPrefix("_INBOX_"+tenant),
			nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
				tc.mu.Lock()
				tc.violations = append(tc.violations, err.Error())
				tc.mu.Unlock()
			}))
		tc.js, err = jetstream.New(tc.nc)
		if err != nil {
			t.Fatal(err)
		}
		return tc
	}
	violated := func(tc *tenantConn, what string) bool {
		tc.mu.Lock()
		defer tc.mu.Unlock()
		for _, v := range tc.violations {
			if strings.Contains(v, "ermissions violation") && strings.Contains(v, what) {
				return true
			}
		}
		return false
	}
	acme, globex := connect("acme"), connect("globex")

	// Each tenant subscribes to its own results, live.
	results := func(tc *tenantConn, tenant string) chan queue.Result {
		ch := make(chan queue.Result, 16)
		if _, err := tc.nc.Subscribe("telha.res."+tenant, func(m *nats.Msg) {
			var r queue.Result
			if json.Unmarshal(m.Data, &r) == nil {
				ch <- r
			}
		}); err != nil {
			t.Fatal(err)
		}
		if err := tc.nc.Flush(); err != nil {
			t.Fatal(err)
		}
		return ch
	}
	acmeRes, globexRes := results(acme, "acme"), results(globex, "globex")
	waitResult := func(ch chan queue.Result, id string) queue.Result {
		t.Helper()
		deadline := time.After(30 * time.Second)
		for {
			select {
			case r := <-ch:
				if r.RequestID == id {
					return r
				}
			case <-deadline:
				t.Fatalf("no result for %s within 30s", id)
			}
		}
	}
	publish := func(tc *tenantConn, subject, tenant, reqID, msgID string) (*jetstream.PubAck, error) {
		body := fmt.Sprintf(`{"request_id":%q,"op":"put_node","tenant":%q,"id":%q}`, reqID, tenant, uuid.NewString())
		m := nats.NewMsg(subject)
		m.Data = []byte(body)
		if msgID != "" {
			m.Header.Set(jetstream.MsgIDHeader, msgID)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		return tc.js.PublishMsg(ctx, m)
	}

	// 1. A tenant's own request: stored (with a stream ack on its own
	// inbox), applied, answered on its own subject.
	if _, err := publish(acme, "telha.req.acme", "acme", "acme-1", "acme.acme-1"); err != nil {
		t.Fatalf("acme's own request: %v", err)
	}
	if r := waitResult(acmeRes, "acme-1"); r.Status != "ok" {
		t.Fatalf("acme-1: %+v", r)
	}

	// 2. Publishing for another tenant is refused by the server: no stream
	// ack, a permissions violation, and nothing reaches globex.
	if _, err := publish(acme, "telha.req.globex", "globex", "planted-1", "globex.planted-1"); err == nil {
		t.Fatal("acme published a request for globex and got a stream ack")
	}
	testnats.Eventually(t, 10*time.Second, "a publish violation for telha.req.globex", func() bool { return violated(acme, "telha.req.globex") })

	// 3. A message id of another tenant's request cannot suppress it (the
	// request stream keeps no duplicate window shared across tenants).
	if _, err := publish(acme, "telha.req.acme", "acme", "acme-2", "globex.victim-1"); err != nil {
		t.Fatalf("acme's request with a crafted msg id: %v", err)
	}
	if r := waitResult(acmeRes, "acme-2"); r.Status != "ok" {
		t.Fatalf("acme-2: %+v", r)
	}
	ack, err := publish(globex, "telha.req.globex", "globex", "victim-1", "globex.victim-1")
	if err != nil {
		t.Fatalf("globex's request: %v", err)
	}
	if ack.Duplicate {
		t.Fatal("globex's request was dropped as a duplicate of acme's crafted message id")
	}
	if r := waitResult(globexRes, "victim-1"); r.Status != "ok" {
		t.Fatalf("victim-1: %+v", r)
	}

	// 4. Reading another tenant's results: live, the inboxes that carry
	// its stream acks, or everything.
	for _, subj := range []string{"telha.res.globex", "telha.res.*", "_INBOX_globex.>", "_INBOX.>", ">"} {
		if _, err := acme.nc.SubscribeSync(subj); err != nil {
			t.Fatalf("subscribe %s: %v", subj, err)
		}
		_ = acme.nc.Flush()
		testnats.Eventually(t, 10*time.Second, "a subscribe violation for "+subj, func() bool { return violated(acme, subj) })
	}

	// 5. Results from the stream: a consumer filtered to its own subject
	// works; one on another tenant's subject, or unfiltered, is refused.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	own, err := acme.js.OrderedConsumer(ctx, "TELHA_RES", jetstream.OrderedConsumerConfig{FilterSubjects: []string{"telha.res.acme"}})
	if err != nil {
		t.Fatalf("acme's consumer of its own results: %v", err)
	}
	batch, err := own.Fetch(10, jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		t.Fatalf("fetch acme's results: %v", err)
	}
	got := 0
	for m := range batch.Messages() {
		if m.Subject() != "telha.res.acme" {
			t.Fatalf("acme's consumer delivered %s", m.Subject())
		}
		got++
	}
	if got < 2 {
		t.Fatalf("acme's consumer fetched %d results, want its 2", got)
	}
	for _, filter := range [][]string{{"telha.res.globex"}, {"telha.res.*"}, nil} {
		cctx, ccancel := context.WithTimeout(ctx, 3*time.Second)
		_, err := acme.js.CreateConsumer(cctx, "TELHA_RES", jetstream.ConsumerConfig{FilterSubjects: filter, AckPolicy: jetstream.AckNonePolicy})
		ccancel()
		if err == nil {
			t.Fatalf("acme created a consumer of TELHA_RES filtered to %v", filter)
		}
	}

	// 6. The JetStream API beyond that: stream info, purge, delete.
	for _, subj := range []string{"$JS.API.STREAM.PURGE.TELHA_RES", "$JS.API.STREAM.INFO.TELHA_REQ", "$JS.API.STREAM.DELETE.TELHA_DLQ"} {
		_, err := acme.nc.Request(subj, nil, 2*time.Second)
		if err == nil {
			t.Fatalf("acme's request to %s was answered", subj)
		}
		if !errors.Is(err, nats.ErrTimeout) && !errors.Is(err, nats.ErrNoResponders) && !strings.Contains(err.Error(), "ermissions violation") {
			t.Fatalf("acme's request to %s: %v", subj, err)
		}
		testnats.Eventually(t, 10*time.Second, "a publish violation for "+subj, func() bool { return violated(acme, subj) })
	}

	// 7. The change feed: acme reads its own (a consumer filtered to
	// telha.chg.acme.>, acked); one of globex's, or of every tenant's, is
	// refused.
	ctx, cancel = context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	feed, err := client.New(acme.nc, client.Config{})
	if err != nil {
		t.Fatal(err)
	}
	ch, err := feed.OpenChanges(ctx, client.ChangesConfig{Tenant: "acme", Durable: "acme-indexer"})
	if err != nil {
		t.Fatalf("acme's reader of its own feed: %v", err)
	}
	for i := 0; i < 2; i++ { // acme-1 and acme-2 each put a node
		m, err := ch.Next(ctx)
		if err != nil {
			t.Fatalf("acme's feed: %v", err)
		}
		if m.Tenant != "acme" || m.Op != client.ChangePut {
			t.Fatalf("acme's feed delivered %+v", m.Change)
		}
		if err := m.Ack(); err != nil {
			t.Fatal(err)
		}
	}
	ch.Close()
	for _, filter := range []string{"telha.chg.globex.>", "telha.chg.>", ""} {
		cctx, ccancel := context.WithTimeout(ctx, 3*time.Second)
		_, err := acme.js.CreateConsumer(cctx, "TELHA_CHG", jetstream.ConsumerConfig{FilterSubject: filter, AckPolicy: jetstream.AckNonePolicy})
		ccancel()
		if err == nil {
			t.Fatalf("acme created a consumer of TELHA_CHG filtered to %q", filter)
		}
	}

	// Nothing of acme's attempts reached globex: globex's only request and
	// result are its own.
	select {
	case r := <-globexRes:
		t.Fatalf("globex got a result it did not ask for: %+v", r)
	default:
	}
}
