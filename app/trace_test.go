package app

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/telha/telha-cascade/internal/testnats"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// TestTraceContextAcrossTheQueue: a request's traceparent is the parent of
// every span of its handling (decode, group commit, for a journaled
// cascade the journal and its chunks, result or dead letter) and comes
// back on its result and dead-letter messages; spans go to the provider
// given (here an in-memory exporter).
func TestTraceContextAcrossTheQueue(t *testing.T) {
	ns := testnats.Start(t)
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	startWorker(t, ns, t.TempDir(), Options{TracerProvider: tp}, "--max-batch-ops", "60", "--journal-chunk-ops", "20")
	b := newBus(t, ns)
	const tenant = "traced"

	// The headers of every result and dead letter, by request id.
	var mu sync.Mutex
	headers := map[string][]nats.Header{}
	got := make(chan struct{}, 100)
	sub, err := b.nc.Subscribe("telha.*."+tenant, func(m *nats.Msg) {
		var r struct {
			RequestID string `json:"request_id"`
		}
		_ = json.Unmarshal(m.Data, &r)
		if m.Header.Get("Telha-Reason") != "" { // a dead letter: the original body
			r.RequestID = "dlq:" + m.Header.Get("Telha-Original-Msg-Id")
		}
		mu.Lock()
		headers[r.RequestID] = append(headers[r.RequestID], m.Header)
		mu.Unlock()
		got <- struct{}{}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	waitHeader := func(key string) nats.Header {
		deadline := time.After(30 * time.Second)
		for {
			mu.Lock()
			hs := headers[key]
			mu.Unlock()
			if len(hs) > 0 {
				return hs[0]
			}
			select {
			case <-got:
			case <-deadline:
				t.Fatalf("no message for %s", key)
			}
		}
	}
	traced := func(body map[string]any) (rid, traceID string) {
		rid = uuid.NewString()
		traceID = strings.ReplaceAll(uuid.NewString(), "-", "")
		body["request_id"], body["tenant"] = rid, tenant
		raw, _ := json.Marshal(body)
		m := b.client.RequestMsg(tenant, rid, raw)
		m.Header.Set("traceparent", fmt.Sprintf("00-%s-%s-01", traceID, traceID[:16]))
		if _, err := b.js.PublishMsg(context.Background(), m); err != nil {
			t.Fatal(err)
		}
		return rid, traceID
	}
	spansOf := func(traceID string) map[string]int {
		out := map[string]int{}
		for _, s := range exp.GetSpans() {
			if s.SpanContext.TraceID().String() == traceID {
				out[s.Name]++
			}
		}
		return out
	}
	check := func(what, traceID string, h nats.Header, want ...string) {
		t.Helper()
		if tp := h.Get("traceparent"); !strings.Contains(tp, traceID) {
			t.Errorf("%s: traceparent %q on its message, want trace %s", what, tp, traceID)
		}
		// A span ends a moment after the message it sends: poll.
		deadline := time.Now().Add(10 * time.Second)
		for {
			spans, missing := spansOf(traceID), ""
			for _, name := range want {
				if spans[name] == 0 {
					missing = name
				}
			}
			if missing == "" {
				return
			}
			if time.Now().After(deadline) {
				t.Errorf("%s: no %s span in trace %s (spans: %v)", what, missing, traceID, spans)
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
	}

	// A put: decode, group commit, result.
	hub := uuid.NewString()
	rid, tr := traced(node(hub))
	mustOK(t, b.wait(rid))
	check("put_node", tr, waitHeader(rid), "telha.decode", "telha.group_commit", "telha.result")

	// A journaled cascade: and the journal with its chunks.
	other := uuid.NewString()
	mustOK(t, b.wait(b.send(tenant, node(other))))
	for i := 0; i < 30; i++ {
		mustOK(t, b.wait(b.send(tenant, edge(uuid.NewString(), hub, other))))
	}
	rid, tr = traced(tombNode(hub))
	if r := mustOK(t, b.wait(rid)); !r.Journaled {
		t.Fatalf("tombstone_node of the hub: %+v, want journaled", r)
	}
	check("journaled tombstone_node", tr, waitHeader(rid), "telha.decode", "telha.group_commit", "telha.journal", "telha.journal.chunk")

	// An erase (of the dead hub): and the erase.
	rid, tr = traced(eraseNode(hub, "art. 17"))
	mustOK(t, b.wait(rid))
	check("erase_node", tr, waitHeader(rid), "telha.decode", "telha.group_commit", "telha.erase")

	// An invalid request: decode, dead letter; its dead letter and result
	// carry the trace.
	rid, tr = traced(map[string]any{"op": "put_node", "id": "not-a-uuid"})
	if r := b.wait(rid); r.Status != "invalid" {
		t.Fatalf("invalid request: %+v", r)
	}
	check("invalid request", tr, waitHeader(rid), "telha.decode", "telha.dead_letter")
	check("its dead letter", tr, waitHeader("dlq:"+tenant+"."+rid))
}

// TestTracesURL: --otlp-endpoint is the collector's base URL, as
// OTEL_EXPORTER_OTLP_ENDPOINT is: spans go to its /v1/traces (the exporter
// alone posted to "/", where a collector answers 404); a URL with a path
// of its own is kept.
func TestTracesURL(t *testing.T) {
	for in, want := range map[string]string{
		"http://collector:4318":             "http://collector:4318/v1/traces",
		"http://collector:4318/":            "http://collector:4318/v1/traces",
		"https://otel.example:443":          "https://otel.example:443/v1/traces",
		"http://collector:4318/v1/traces":   "http://collector:4318/v1/traces",
		"http://gateway:8080/tenant/traces": "http://gateway:8080/tenant/traces",
	} {
		if got := tracesURL(in); got != want {
			t.Errorf("tracesURL(%q) = %q, want %q", in, got, want)
		}
	}
}
