package app

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/telha/telha-cascade/cascade"
	"github.com/telha/telha-cascade/internal/testnats"
	"github.com/telha/telha-cascade/queue"
	"github.com/telha/telha-cascade/slot"
	"github.com/telha/telha-cascade/storage"
)

var testLog = func() *slog.Logger {
	if os.Getenv("TELHA_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}()

// keptLog is a logger for one member of a test that keeps the member's
// last lines in memory and prints them when the test fails, so a failure
// on a loaded CI says what the member was doing (testLog discards it).
func keptLog(t *testing.T, name string) *slog.Logger {
	if os.Getenv("TELHA_TEST_LOG") != "" {
		return testLog
	}
	w := &tailBuffer{}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("the last lines of member %s's log:\n%s", name, w.tail(150))
		}
	})
	return slog.New(slog.NewTextHandler(w, nil))
}

// tailBuffer keeps about the last 1 MiB written to it.
type tailBuffer struct {
	mu sync.Mutex
	b  []byte
}

func (w *tailBuffer) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.b = append(w.b, p...)
	if len(w.b) > 2<<20 {
		w.b = append([]byte(nil), w.b[len(w.b)-1<<20:]...)
	}
	return len(p), nil
}

func (w *tailBuffer) tail(lines int) string {
	w.mu.Lock()
	defer w.mu.Unlock()
	ls := strings.Split(strings.TrimRight(string(w.b), "\n"), "\n")
	return strings.Join(ls[max(0, len(ls)-lines):], "\n")
}

// moduleGoroutines is the stacks of the goroutines that run this module's
// code (the tests' own aside): what a member that does not stop waits on.
func moduleGoroutines() string {
	buf := make([]byte, 16<<20)
	buf = buf[:runtime.Stack(buf, true)]
	var out []string
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "telha-cascade/") && !strings.Contains(g, "testing.tRunner") {
			out = append(out, g)
		}
	}
	return strings.Join(out, "\n\n")
}

// running is one in-process worker.
type running struct {
	t      testing.TB
	app    *slot.Slot
	cancel context.CancelFunc
	done   chan error
	base   string // http://host:port
}

// startWorker runs app.Run on dir against the test NATS server, with the
// given extra flags, and waits until it is ready.
func startWorker(t testing.TB, ns *testnats.Server, dir string, opts Options, flags ...string) *running {
	t.Helper()
	args := append([]string{"--data-dir", dir, "--http-addr", "127.0.0.1:0", "--nats-url", ns.ClientURL(), "--reaper-schedule", "@every 1h"}, flags...)
	cfg, err := ParseFlags(args, func(string) string { return "" }, io.Discard)
	if err != nil {
		t.Fatalf("flags: %v", err)
	}
	ready := make(chan *slot.Slot, 1)
	userReady := opts.OnReady
	opts.OnReady = func(a *slot.Slot) {
		if userReady != nil {
			userReady(a)
		}
		ready <- a
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{t: t, cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- Run(ctx, cfg, testLog, opts) }()
	select {
	case r.app = <-ready:
	case err := <-r.done:
		cancel()
		t.Fatalf("worker exited before ready: %v", err)
	case <-time.After(30 * time.Second):
		cancel()
		t.Fatal("worker not ready within 30s")
	}
	r.base = "http://" + r.app.HTTPAddr()
	t.Cleanup(func() { r.stop() })
	return r
}

// stop shuts the worker down (as SIGTERM does) and returns Run's error.
func (r *running) stop() error {
	if r.cancel == nil {
		return nil
	}
	r.cancel()
	r.cancel = nil
	select {
	case err := <-r.done:
		return err
	case <-time.After(60 * time.Second):
		r.t.Fatal("worker did not stop within 60s")
		return nil
	}
}

// get fetches a path of the worker's HTTP API and decodes JSON into out.
func (r *running) get(path string, out any) int {
	r.t.Helper()
	resp, err := http.Get(r.base + path)
	if err != nil {
		r.t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if out != nil {
		if err := json.Unmarshal(body, out); err != nil {
			r.t.Fatalf("GET %s: %d %q: %v", path, resp.StatusCode, body, err)
		}
	}
	return resp.StatusCode
}

// bus is the upstream side: publishes requests and follows every result.
type bus struct {
	t      testing.TB
	nc     *nats.Conn
	js     jetstream.JetStream
	client *queue.Client

	mu      sync.Mutex
	results map[string][]queue.Result
	changed chan struct{}
	sub     *nats.Subscription
}

func newBus(t testing.TB, ns *testnats.Server) *bus {
	t.Helper()
	return newBusWith(t, ns.ClientURL())
}

// newBusWith is newBus for a server that needs client options (auth, TLS).
func newBusWith(t testing.TB, url string, opts ...nats.Option) *bus {
	t.Helper()
	nc := testnats.Connect(t, url, opts...)
	c, err := queue.NewClient(nc, queue.Config{})
	if err != nil {
		t.Fatal(err)
	}
	b := &bus{t: t, nc: nc, js: c.JetStream(), client: c, results: map[string][]queue.Result{}, changed: make(chan struct{})}
	b.sub, err = nc.Subscribe("telha.res.*", func(m *nats.Msg) {
		var r queue.Result
		if err := json.Unmarshal(m.Data, &r); err != nil {
			t.Errorf("undecodable result %q", m.Data)
			return
		}
		b.mu.Lock()
		b.results[r.RequestID] = append(b.results[r.RequestID], r)
		close(b.changed)
		b.changed = make(chan struct{})
		b.mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return b
}

// send publishes a request body (a map; request_id and tenant are filled
// in when absent) and returns its request id.
func (b *bus) send(tenant string, body map[string]any) string {
	b.t.Helper()
	if _, ok := body["request_id"]; !ok {
		body["request_id"] = uuid.NewString()
	}
	if _, ok := body["tenant"]; !ok {
		body["tenant"] = tenant
	}
	raw, _ := json.Marshal(body)
	id, _ := body["request_id"].(string)
	if _, err := b.client.Publish(context.Background(), tenant, id, raw); err != nil {
		b.t.Fatalf("publish: %v", err)
	}
	return id
}

// sendRaw publishes raw bytes with an optional Nats-Msg-Id.
func (b *bus) sendRaw(subject string, data []byte, msgID string) {
	b.t.Helper()
	m := nats.NewMsg(subject)
	m.Data = data
	if msgID != "" {
		m.Header.Set(jetstream.MsgIDHeader, msgID)
	}
	if _, err := b.js.PublishMsg(context.Background(), m); err != nil {
		b.t.Fatalf("publish raw to %s: %v", subject, err)
	}
}

// wait returns the first result of a request id, waiting for it.
func (b *bus) wait(id string) queue.Result {
	b.t.Helper()
	return b.waitN(id, 1)[0]
}

// waitN waits until a request id has at least n results.
func (b *bus) waitN(id string, n int) []queue.Result {
	b.t.Helper()
	deadline := time.After(30 * time.Second)
	for {
		b.mu.Lock()
		rs, ch := b.results[id], b.changed
		b.mu.Unlock()
		if len(rs) >= n {
			return rs
		}
		select {
		case <-ch:
		case <-deadline:
			b.t.Fatalf("request %s: %d results within 30s, want %d", id, len(rs), n)
		}
	}
}

// storedResults reads every result of a request id from TELHA_RES (what
// the stream kept, after Nats-Msg-Id deduplication).
// A subscriber sees a result a moment before the stream has stored it, so
// this waits (up to 10 s) for at least one stored result.
func (b *bus) storedResults(id string) []queue.Result {
	b.t.Helper()
	return b.storedResultsN(id, 1)
}

// storedResultsN is storedResults waiting for at least n results (up to
// 10 s): the stream stores a result after the server has routed it to
// the bus's subscription, so a result seen there may not be stored yet.
func (b *bus) storedResultsN(id string, n int) []queue.Result {
	b.t.Helper()
	var out []queue.Result
	deadline := time.Now().Add(10 * time.Second)
	for {
		out = readStream[queue.Result](b.t, b.js, "TELHA_RES", func(r queue.Result) bool { return r.RequestID == id })
		if len(out) >= n || time.Now().After(deadline) {
			return out
		}
		time.Sleep(10 * time.Millisecond)
	}
}

type dlqMsg struct {
	Subject string
	Data    []byte
	Header  nats.Header
}

// deadLetters reads every message of TELHA_DLQ.
func (b *bus) deadLetters() []dlqMsg {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := b.js.Stream(ctx, "TELHA_DLQ")
	if err != nil {
		b.t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		b.t.Fatal(err)
	}
	var out []dlqMsg
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && info.State.Msgs > 0; seq++ {
		m, err := s.GetMsg(ctx, seq)
		if err != nil {
			continue
		}
		out = append(out, dlqMsg{Subject: m.Subject, Data: m.Data, Header: m.Header})
	}
	return out
}

func readStream[T any](t testing.TB, js jetstream.JetStream, stream string, keep func(T) bool) []T {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, stream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var out []T
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && info.State.Msgs > 0; seq++ {
		m, err := s.GetMsg(ctx, seq)
		if err != nil {
			continue
		}
		var v T
		if err := json.Unmarshal(m.Data, &v); err != nil {
			t.Fatalf("stream %s seq %d: %v", stream, seq, err)
		}
		if keep(v) {
			out = append(out, v)
		}
	}
	return out
}

func node(id string) map[string]any { return map[string]any{"op": "put_node", "id": id} }

func edge(id, src, dst string) map[string]any {
	return map[string]any{"op": "put_edge", "id": id, "src": src, "dst": dst, "label": "rel"}
}

func tombNode(id string) map[string]any { return map[string]any{"op": "tombstone_node", "id": id} }

func tombEdge(id string) map[string]any { return map[string]any{"op": "tombstone_edge", "id": id} }

func mustOK(t testing.TB, r queue.Result) queue.Result {
	t.Helper()
	if r.Status != queue.StatusOK {
		t.Fatalf("request %s (%s): status %s: %s", r.RequestID, r.Op, r.Status, r.Error)
	}
	if _, err := time.Parse("2006-01-02T15:04:05.000000Z", r.TxTime); err != nil {
		t.Fatalf("tx_time %q is not RFC 3339 UTC with 6 fractional digits", r.TxTime)
	}
	return r
}

func ids(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = uuid.NewString()
	}
	return out
}

func asOf(tx string) string { return fmt.Sprintf("?tx=%s", tx) }

// chunkHold holds a journaled cascade between its commit point and its
// first chunk (the applier waits; the writer and every other request go
// on): arm it, publish the cascade, wait on held, look, release.
type chunkHold struct {
	armed   atomic.Bool
	once    sync.Once
	held    chan struct{}
	release chan struct{}
}

// newChunkHold returns the hold and the worker Options that install it.
func newChunkHold() (*chunkHold, Options) {
	h := &chunkHold{held: make(chan struct{}), release: make(chan struct{})}
	return h, Options{CascadeHooks: cascade.Hooks{JournalStep: func(_ *storage.JournalEntry, n int) {
		if n == 1 && h.armed.Load() {
			h.once.Do(func() {
				close(h.held)
				<-h.release
			})
		}
	}}}
}

// arm holds the next journal before its first chunk.
func (h *chunkHold) arm() { h.armed.Store(true) }
