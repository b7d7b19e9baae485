package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/telha/telha-cascade/internal/testnats"
)

// TestEnqueuePauseResume (issue 23 item 12): enqueue pause --replica 0
// pauses the worker's consumer: a request published then stays in the
// stream, undelivered; enqueue resume --all resumes it and the request is
// consumed. Without --replica or --all, pause is a usage error (exit 2).
func TestEnqueuePauseResume(t *testing.T) {
	ns := testnats.Start(t)
	url := ns.ClientURL()
	startWorker(t, url)
	js, err := jetstream.New(testnats.Connect(t, url))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	info := func() *jetstream.ConsumerInfo {
		t.Helper()
		c, err := js.Consumer(ctx, "TELHA_REQ", "telha-worker-0")
		if err != nil {
			t.Fatal(err)
		}
		i, err := c.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return i
	}

	if code, _, errOut := enqueue(t, "pause", "--nats-url", url); code != 2 || !strings.Contains(errOut, "--replica") {
		t.Fatalf("pause without --replica: exit %d %q, want 2", code, errOut)
	}
	if code, _, errOut := enqueue(t, "pause", "--nats-url", url, "--replica", "0", "--all"); code != 2 {
		t.Fatalf("pause --replica 0 --all: exit %d %q, want 2", code, errOut)
	}
	// --slot is --replica (a slot of dynamic/N is replica i/N's consumer).
	code, out, errOut := enqueue(t, "pause", "--nats-url", url, "--slot", "0")
	if code != 0 || !strings.Contains(out, `"consumer":"telha-worker-0"`) || !strings.Contains(out, `"paused":true`) || !strings.Contains(out, "until resumed") {
		t.Fatalf("pause --slot 0: %d %q %q", code, out, errOut)
	}
	if i := info(); !i.Paused {
		t.Fatalf("after enqueue pause: consumer %+v not paused", i)
	}
	if code, out, errOut := enqueue(t, "put-node", "--nats-url", url, "--tenant", "acme", "--id", uuid.NewString(), "--request-id", "while-paused"); code != 0 {
		t.Fatalf("publish while paused: %d %q %q", code, out, errOut)
	}
	testnats.Eventually(t, 10*time.Second, "the request waiting, undelivered", func() bool {
		i := info()
		return i.NumPending == 1 && i.NumAckPending == 0 && i.Delivered.Consumer == 0
	})

	code, out, errOut = enqueue(t, "resume", "--nats-url", url, "--all")
	if code != 0 || !strings.Contains(out, `"consumer":"telha-worker-0"`) || !strings.Contains(out, `"paused":false`) {
		t.Fatalf("resume --all: %d %q %q", code, out, errOut)
	}
	if code, out, errOut := enqueue(t, "put-node", "--nats-url", url, "--wait", "--tenant", "acme", "--id", uuid.NewString(), "--request-id", "after-resume"); code != 0 || !strings.Contains(out, `"status":"ok"`) {
		t.Fatalf("publish after resume: %d %q %q", code, out, errOut)
	}
	testnats.Eventually(t, 10*time.Second, "both requests consumed", func() bool {
		i := info()
		return !i.Paused && i.NumPending == 0 && i.NumAckPending == 0 && i.Delivered.Consumer >= 2
	})
}
