package client_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/telha/telha-cascade/internal/testnats"
	"github.com/telha/telha-cascade/queue/client"
)

// TestResultTxTimeIsNullUnlessOK (issue 23 item 16): a result that is not
// ok has no tx_time, written null (the request lookup's spelling), not "".
// Results stored before, with "", still decode; so does null.
func TestResultTxTimeIsNullUnlessOK(t *testing.T) {
	notOK := client.Result{RequestID: "r1", Op: "tombstone_node", Tenant: "acme", ID: "x", Status: client.StatusNotFound, Error: "not_found"}
	b, err := json.Marshal(notOK)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `"tx_time":null`) {
		t.Fatalf("a not-ok result marshals as %s, want \"tx_time\":null", b)
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(b, &fields); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"request_id", "op", "tenant", "id", "status", "error", "tx_time", "edges_tombstoned", "journaled"} {
		if _, ok := fields[k]; !ok {
			t.Errorf("field %q missing from %s", k, b)
		}
	}
	ok := client.Result{RequestID: "r2", Op: "put_node", Tenant: "acme", ID: "x", Status: client.StatusOK, TxTime: "2026-01-02T03:04:05.000006Z"}
	b, err = json.Marshal(ok)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `"tx_time":"2026-01-02T03:04:05.000006Z"`) {
		t.Fatalf("an ok result marshals as %s", b)
	}
	var back client.Result
	if err := json.Unmarshal(b, &back); err != nil || back != ok {
		t.Fatalf("round trip: %+v, %v; want %+v", back, err, ok)
	}
	for _, old := range []string{`{"status":"not_found","tx_time":""}`, `{"status":"not_found","tx_time":null}`, `{"status":"not_found"}`} {
		var r client.Result
		if err := json.Unmarshal([]byte(old), &r); err != nil || r.TxTime != "" || r.Status != client.StatusNotFound {
			t.Fatalf("%s decodes as %+v, %v", old, r, err)
		}
	}
}

// TestWaitKeepsTheLatestAnswer: a request id may have several answers (an
// invalid request fixed and sent again under its id; CONTRACT §5: the
// latest stored answer is the id's answer). Wait used to keep the first
// one it read; it keeps the latest stored when it returns.
func TestWaitKeepsTheLatestAnswer(t *testing.T) {
	ns := testnats.Start(t)
	nc := testnats.Connect(t, ns.ClientURL())
	c, err := client.New(nc, client.Config{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := c.JetStream().CreateStream(ctx, jetstream.StreamConfig{Name: "TELHA_RES", Subjects: []string{"telha.res.*"}}); err != nil {
		t.Fatal(err)
	}
	since := time.Now().Add(-time.Second)
	publish := func(r client.Result) {
		t.Helper()
		b, _ := json.Marshal(r)
		if _, err := c.JetStream().Publish(ctx, "telha.res."+r.Tenant, b); err != nil {
			t.Fatal(err)
		}
	}
	publish(client.Result{RequestID: "fixed", Tenant: "acme", Op: "put_node", Status: client.StatusInvalid, Error: "invalid: bad id"})
	publish(client.Result{RequestID: "other", Tenant: "acme", Op: "put_node", Status: client.StatusOK, TxTime: "2026-01-02T03:04:05.000001Z"})
	publish(client.Result{RequestID: "fixed", Tenant: "acme", Op: "put_node", Status: client.StatusOK, TxTime: "2026-01-02T03:04:05.000002Z"})
	got, err := c.Wait(ctx, []string{"acme"}, since, map[string]bool{"fixed": true, "other": true})
	if err != nil {
		t.Fatal(err)
	}
	if got["fixed"].Status != client.StatusOK || got["fixed"].TxTime != "2026-01-02T03:04:05.000002Z" {
		t.Fatalf("Wait kept %+v for the fixed request, want its latest answer (ok)", got["fixed"])
	}
	if got["other"].Status != client.StatusOK {
		t.Fatalf("other: %+v", got["other"])
	}
	// An answer not stored yet when Wait is called is still waited for.
	done := make(chan map[string]client.Result, 1)
	go func() {
		got, err := c.Wait(ctx, []string{"acme"}, since, map[string]bool{"late": true})
		if err != nil {
			t.Error(err)
		}
		done <- got
	}()
	publish(client.Result{RequestID: "late", Tenant: "acme", Op: "put_node", Status: client.StatusOK, TxTime: "2026-01-02T03:04:05.000003Z"})
	select {
	case got := <-done:
		if got["late"].Status != client.StatusOK {
			t.Fatalf("late: %+v", got["late"])
		}
	case <-ctx.Done():
		t.Fatal("Wait did not return the answer published after it started")
	}
}
