package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/telha/telha-cascade/queue/client"
	"github.com/telha/telha-cascade/slot"

	"github.com/google/uuid"
	"github.com/telha/telha-cascade/app"
	"github.com/telha/telha-cascade/internal/testnats"
)

// startWorker runs the real worker in-process against ns.
func startWorker(t *testing.T, url string) {
	t.Helper()
	cfg, err := app.ParseFlags([]string{"--data-dir", t.TempDir(), "--http-addr", "127.0.0.1:0", "--nats-url", url},
		func(string) string { return "" }, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	ready := make(chan struct{})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- app.Run(ctx, cfg, slog.New(slog.NewTextHandler(io.Discard, nil)), app.Options{OnReady: func(*slot.Slot) { close(ready) }})
	}()
	select {
	case <-ready:
	case err := <-done:
		t.Fatalf("worker: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("worker not ready")
	}
	t.Cleanup(func() { cancel(); <-done })
}

func enqueue(t *testing.T, args ...string) (code int, out, errOut string) {
	t.Helper()
	var o, e bytes.Buffer
	code = run(args, &o, &e)
	return code, o.String(), e.String()
}

// TestEnqueueAsAUserWouldRunIt: flags after the command, -h of a command,
// a bad tenant or id refused before anything is published, a duplicate
// publish reported, the dead-letter commands and owner.
func TestEnqueueAsAUserWouldRunIt(t *testing.T) {
	ns := testnats.Start(t)
	url := ns.ClientURL()
	startWorker(t, url)

	n := uuid.NewString()
	code, out, errOut := enqueue(t, "put-node", "--nats-url", url, "--wait", "--tenant", "acme", "--id", n, "--request-id", "r-1")
	if code != 0 || !strings.Contains(out, `"status":"ok"`) {
		t.Fatalf("put-node with flags after the command: %d %s %s", code, out, errOut)
	}
	if code, _, _ := enqueue(t, "put-node", "-h"); code != 0 {
		t.Errorf("put-node -h exits %d, want 0", code)
	}
	for _, bad := range [][]string{{"--tenant", "Acme"}, {"--tenant", "acme", "--id", "nope"}, {"--tenant", "acme", "--valid-from", "tomorrow"}} {
		code, _, errOut := enqueue(t, append([]string{"put-node", "--nats-url", url, "--wait", "--timeout", "2s"}, bad...)...)
		if code != 2 || errOut == "" {
			t.Errorf("put-node %v: exit %d (%s), want 2 at once", bad, code, errOut)
		}
	}
	// The same request again: the request stream keeps no duplicate
	// window (CONTRACT §5), so it is delivered again and answered from its
	// receipt: the same ok, the same tx_time, applied once.
	var first, replay client.Result
	_ = json.Unmarshal([]byte(strings.SplitN(out, "\n", 2)[0]), &first)
	code, out, errOut = enqueue(t, "put-node", "--nats-url", url, "--wait", "--tenant", "acme", "--id", n, "--request-id", "r-1")
	if code != 0 || json.Unmarshal([]byte(strings.SplitN(out, "\n", 2)[0]), &replay) != nil || replay.Status != "ok" || replay.TxTime != first.TxTime {
		t.Fatalf("the same request published again: %d %q %q; want ok at tx %s", code, out, errOut, first.TxTime)
	}

	// A dead letter: an invalid request published by hand.
	nc := testnats.Connect(t, url)
	if _, err := nc.Request("telha.req.acme", []byte(`{"request_id":"broken-1","op":"put_node","tenant":"acme","id":"nope"}`), 5*time.Second); err != nil {
		t.Fatal(err)
	}
	var dl client.DeadLetter
	testnats.Eventually(t, 20*time.Second, "the dead letter", func() bool {
		code, out, _ := enqueue(t, "dlq", "list", "--nats-url", url, "--tenant", "acme")
		return code == 0 && json.Unmarshal([]byte(strings.SplitN(out, "\n", 2)[0]), &dl) == nil && dl.RequestID == "broken-1"
	})
	if dl.Reason != "invalid" || dl.OriginalSubject != "telha.req.acme" {
		t.Fatalf("dlq list: %+v", dl)
	}
	seq := strconv.FormatUint(dl.Seq, 10)
	code, out, _ = enqueue(t, "dlq", "show", seq, "--nats-url", url)
	if code != 0 || !strings.Contains(out, `"body":{"request_id":"broken-1"`) || !strings.Contains(out, "Telha-Reason") {
		t.Fatalf("dlq show: %d %s", code, out)
	}
	// Refused as invalid: a retry as it is would fail again at once, so it
	// needs --force (issue 32 item 7).
	code, _, errOut = enqueue(t, "dlq", "retry", seq, "--nats-url", url)
	if code != 2 || !strings.Contains(errOut, "--force") || !strings.Contains(errOut, "invalid") {
		t.Fatalf("dlq retry of an invalid dead letter: %d %q, want exit 2 asking for --force", code, errOut)
	}
	code, out, errOut = enqueue(t, "dlq", "retry", seq, "--force", "--nats-url", url)
	if code != 0 || !strings.Contains(out, `"retried":`+seq) {
		t.Fatalf("dlq retry --force: %d %s %s", code, out, errOut)
	}
	// Retried, still invalid: dead-lettered again under a new seq; the old one is gone.
	var last string
	defer func() {
		if t.Failed() {
			t.Logf("last dlq list: %s", last)
		}
	}()
	testnats.Eventually(t, 20*time.Second, "the retried request dead-lettered again", func() bool {
		_, out, _ := enqueue(t, "dlq", "list", "--nats-url", url, "--tenant", "acme")
		last = out
		var first client.DeadLetter
		return json.Unmarshal([]byte(strings.SplitN(out, "\n", 2)[0]), &first) == nil && first.Seq > dl.Seq && first.RequestID == "broken-1" &&
			strings.Count(out, `"request_id":"broken-1"`) == 1
	})
	_, out, _ = enqueue(t, "dlq", "list", "--nats-url", url)
	var again client.DeadLetter
	_ = json.Unmarshal([]byte(strings.SplitN(out, "\n", 2)[0]), &again)
	code, out, _ = enqueue(t, "dlq", "discard", strconv.FormatUint(again.Seq, 10), "--nats-url", url)
	if code != 0 || !strings.Contains(out, "discarded") {
		t.Fatalf("dlq discard: %d %s", code, out)
	}
	if _, out, _ := enqueue(t, "dlq", "list", "--nats-url", url); strings.Contains(out, `"request_id":"broken-1"`) {
		t.Fatalf("the discarded dead letter is still listed: %s", out)
	}
	for _, sub := range []string{"show", "retry", "discard"} {
		code, out, errOut := enqueue(t, "dlq", sub, "999999", "--nats-url", url)
		if code != 1 || !strings.Contains(errOut, "dead letter 999999 is not in TELHA_DLQ") {
			t.Errorf("dlq %s of a missing seq: exit %d, %q %q; want 1 and words, not a raw server error", sub, code, out, errOut)
		}
	}
	code, out, _ = enqueue(t, "dlq", "list", "--format", "table", "--nats-url", url)
	if code != 0 || !strings.HasPrefix(out, "SEQ ") || !strings.Contains(out, "REASON") {
		t.Errorf("dlq list --format table: %d %q", code, out)
	}

	code, out, _ = enqueue(t, "owner", "--tenant", "acme", "--nats-url", url)
	var own struct {
		Partitions, Partition, Replicas, Replica int
		Consumer                                 string
	}
	if code != 0 || json.Unmarshal([]byte(out), &own) != nil || own.Partitions != 1 || own.Replicas != 1 || own.Consumer != "telha-worker-0" {
		t.Fatalf("owner: %d %s", code, out)
	}
}

// TestEnqueueHelpAndErase: help that lists a command's own flags, dlq -h,
// erase-node and erase-edge (with the reason they require).
func TestEnqueueHelpAndErase(t *testing.T) {
	code, _, errOut := enqueue(t, "dlq", "-h")
	if code != 0 || !strings.Contains(errOut, "retry SEQ") {
		t.Errorf("dlq -h: exit %d, %q", code, errOut)
	}
	code, _, errOut = enqueue(t, "owner", "-h")
	if code != 0 || !strings.Contains(errOut, "-tenant") || strings.Contains(errOut, "-nats-tls-key") || strings.Contains(errOut, "  -wait") {
		t.Errorf("owner -h: exit %d; want its own flags only: %q", code, errOut)
	}
	if code, _, _ := enqueue(t, "owner", "--wait", "--tenant", "acme"); code != 2 {
		t.Errorf("owner --wait: exit %d, want 2 (owner publishes nothing)", code)
	}
	// A wildcard would read every tenant's feed (a probe printed them all
	// with --tenant '*').
	for _, tenant := range []string{"*", "acme.node", ">"} {
		if code, _, errOut := enqueue(t, "changes", "--tenant", tenant); code != 2 || !strings.Contains(errOut, "no wildcard") {
			t.Errorf("changes --tenant %q: exit %d %q, want 2", tenant, code, errOut)
		}
	}
	// Values that contradict or cannot be, refused before connecting (a
	// black-box probe found them accepted).
	for _, args := range [][]string{
		{"changes", "--tenant", "acme", "--from", "2026-12-05T10:00:00Z", "--from-seq", "5"},
		{"checkpoints", "--slots", "1", "--slot", "3"},
		{"checkpoints", "--slots", "2", "--slot", "-2"},
		{"dlq", "list", "--limit", "-1"},
		{"dlq", "list", "--tenant", "BAD"},
	} {
		if code, _, errOut := enqueue(t, args...); code != 2 {
			t.Errorf("%v: exit %d %q, want 2", args, code, errOut)
		}
	}
	code, _, errOut = enqueue(t, "put-node", "-h")
	if code != 0 || !strings.Contains(errOut, "-props") || strings.Contains(errOut, "-nats-creds") {
		t.Errorf("put-node -h: exit %d; want its own flags only: %q", code, errOut)
	}
	code, _, errOut = enqueue(t, "erase-node", "--tenant", "acme", "--id", uuid.NewString())
	if code != 2 || !strings.Contains(errOut, "--reason") {
		t.Errorf("erase-node without --reason: exit %d %q, want 2 before publishing", code, errOut)
	}

	ns := testnats.Start(t)
	url := ns.ClientURL()
	startWorker(t, url)
	a, b, e := uuid.NewString(), uuid.NewString(), uuid.NewString()
	for _, args := range [][]string{
		{"put-node", "--id", a, "--props", `{"name":"Ada"}`},
		{"put-node", "--id", b},
		{"put-edge", "--id", e, "--src", a, "--dst", b, "--label", "knows"},
		{"erase-edge", "--id", e, "--reason", "ticket 7"},
		{"erase-node", "--id", a, "--reason", "GDPR request 7"},
	} {
		code, out, errOut := enqueue(t, append(args, "--nats-url", url, "--wait", "--tenant", "acme")...)
		if code != 0 || !strings.Contains(out, `"status":"ok"`) {
			t.Fatalf("%v: exit %d %s %s", args, code, out, errOut)
		}
		if strings.HasPrefix(args[0], "erase-") && !strings.Contains(out, `"versions_erased":`) {
			t.Errorf("%s result has no versions_erased: %s", args[0], out)
		}
	}
}
