package app

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/telha/telha-cascade/internal/testnats"
	"github.com/telha/telha-cascade/slot"
	"github.com/telha/telha-cascade/storage"
)

// TestShutdownReleasesWaitingReads (issue 20 item 18): a read waiting for
// a tx ahead of the committed one (?wait=30s) does not hold the shutdown
// for its HTTP bound, and the store is not closed under it: shutdown
// cancels the readers' contexts, the read is answered, and only then does
// the store close.
func TestShutdownReleasesWaitingReads(t *testing.T) {
	ns := testnats.Start(t)
	r := startWorker(t, ns, t.TempDir(), Options{})
	far := time.Now().Add(time.Hour).UTC().Format(storage.TimeLayout)
	wrote := make(chan struct{})
	answered := make(chan int, 1)
	go func() {
		u := r.base + "/v1/tenants/acme/nodes/" + uuid.NewString() + "?wait=30s&tx=" + url.QueryEscape(far)
		req, err := http.NewRequestWithContext(httptrace.WithClientTrace(context.Background(), &httptrace.ClientTrace{
			WroteRequest: func(httptrace.WroteRequestInfo) { close(wrote) },
		}), http.MethodGet, u, nil)
		if err != nil {
			answered <- -1
			return
		}
		// A connection of its own: one kept alive from the readiness polls
		// is idle on the server's side until it reads this request, and
		// the shutdown closes idle connections (the read then gets EOF:
		// the test's race, not the worker's).
		cl := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
		resp, err := cl.Do(req)
		if err != nil {
			t.Logf("the read: %v", err)
			answered <- -1
			return
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		answered <- resp.StatusCode
	}()
	select {
	case <-wrote:
	case <-time.After(20 * time.Second):
		t.Fatal("the read was not sent")
	}
	// Written is not accepted: a connection still in the listener's
	// backlog is reset when the shutdown closes the listener (the read
	// then gets EOF: the test's race, not the worker's). Wait until its
	// handler runs.
	testnats.Eventually(t, 20*time.Second, "the read's handler runs", func() bool { return r.app.InFlight() > 0 })
	start := time.Now()
	r.cancel()
	r.cancel = nil
	select {
	case err := <-r.done:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("the worker did not stop")
	}
	if took := time.Since(start); took > 4*time.Second {
		t.Errorf("shutdown took %s: it waited for a read that was waiting", took.Round(time.Millisecond))
	}
	select {
	case code := <-answered:
		if code <= 0 {
			t.Fatal("the waiting read got no answer")
		}
	case <-time.After(3 * time.Second):
		t.Fatal("Run returned, the store closed, and the read is still waiting")
	}
}

// TestEmbeddedNATSRefusesNonLoopback (issue 20 item 22): the embedded NATS
// server has no authentication, so it listens on loopback only: a
// non-loopback --nats-listen is a bad flag value (usage, exit 2) that
// says why and what to do instead, and Run refuses such a config too.
func TestEmbeddedNATSRefusesNonLoopback(t *testing.T) {
	for _, addr := range []string{"0.0.0.0:0", ":0", "[::]:0", "192.0.2.1:4222", "nats.example:4222"} {
		_, err := ParseFlags([]string{"--data-dir", t.TempDir(), "--http-addr", "127.0.0.1:0", "--nats-listen", addr}, func(string) string { return "" }, io.Discard)
		if err == nil || !strings.Contains(err.Error(), "loopback") {
			t.Errorf("flags --nats-listen %s: %v; want a usage error about loopback", addr, err)
		}
		cfg, err := ParseFlags([]string{"--data-dir", t.TempDir(), "--http-addr", "127.0.0.1:0"}, func(string) string { return "" }, io.Discard)
		if err != nil {
			t.Fatalf("flags: %v", err)
		}
		cfg.NATSListen = addr
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		ready := false
		err = Run(ctx, cfg, testLog, Options{OnReady: func(*slot.Slot) { ready = true; cancel() }})
		cancel()
		if ready || !errors.Is(err, ErrUsage) || !strings.Contains(err.Error(), "loopback") {
			t.Errorf("--nats-listen %s: ready %v, err %v; want a usage error about loopback", addr, ready, err)
		}
	}
	// Loopback still starts.
	free := testnats.FreeAddr(t)
	_, port, _ := strings.Cut(free, ":")
	for _, addr := range []string{free, "localhost:" + port} {
		cfg, err := ParseFlags([]string{"--data-dir", t.TempDir(), "--http-addr", "127.0.0.1:0", "--nats-listen", addr, "--reaper-schedule", "@every 1h"}, func(string) string { return "" }, io.Discard)
		if err != nil {
			t.Fatalf("flags: %v", err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		ready := false
		err = Run(ctx, cfg, testLog, Options{OnReady: func(*slot.Slot) { ready = true; cancel() }})
		cancel()
		if !ready || err != nil {
			t.Errorf("--nats-listen %s: ready %v, err %v; want it to start", addr, ready, err)
		}
	}
}
