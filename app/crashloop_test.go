package app

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/google/uuid"
	"github.com/telha/telha-cascade/internal/testnats"
	"github.com/telha/telha-cascade/queue"
	"github.com/telha/telha-cascade/storage"
)

const killerMark = "kill-me-"

// TestCrashLoopGuard: a request whose handling kills the worker process
// every time (here: its group's commit exits the process) must not be
// redelivered for ever. The test supervises a worker child process,
// restarting it whenever it dies, while 40 ordinary requests and the
// killer are published together. The ordinary ones (even those that shared
// the killer's group and died with it) are applied; the killer, once it has
// killed the worker --max-deaths times from its second delivery on, is
// dead-lettered with reason crash_loop and answered failed, and nothing of
// it is applied.
func TestCrashLoopGuard(t *testing.T) {
	if dir := os.Getenv("TELHA_CRASHLOOP_CHILD"); dir != "" {
		crashLoopChild(dir, os.Getenv("TELHA_CRASHLOOP_NATS"))
		return
	}
	ns := testnats.Start(t)
	dir := t.TempDir()
	b := newBus(t, ns)

	var ids []string
	killer := killerMark + uuid.NewString()
	publish := func() {
		testnats.Eventually(t, 30*time.Second, "the worker's streams", func() bool {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			_, err := b.js.Stream(ctx, "TELHA_RES")
			return err == nil
		})
		for i := 0; i < 40; i++ {
			ids = append(ids, b.send("loop", node(uuid.NewString())))
			if i == 20 {
				ids = append(ids, b.send("loop", map[string]any{"request_id": killer, "op": "put_node", "id": uuid.NewString()}))
			}
		}
	}

	deaths := 0
	deadline := time.Now().Add(90 * time.Second)
	for {
		cmd := exec.Command(os.Args[0], "-test.run=^TestCrashLoopGuard$")
		cmd.Env = append(os.Environ(), "TELHA_CRASHLOOP_CHILD="+dir, "TELHA_CRASHLOOP_NATS="+ns.ClientURL())
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		exited := make(chan error, 1)
		go func() { exited <- cmd.Wait() }()
		if ids == nil {
			publish() // once the first worker has made the streams
		}
		all := func() bool {
			b.mu.Lock()
			defer b.mu.Unlock()
			for _, id := range ids {
				if len(b.results[id]) == 0 {
					return false
				}
			}
			return true
		}
		done := false
		for !done {
			b.mu.Lock()
			ch := b.changed
			b.mu.Unlock()
			if all() {
				_ = cmd.Process.Signal(os.Interrupt)
				<-exited
				done = true
				break
			}
			select {
			case err := <-exited:
				deaths++
				if !strings.Contains(out.String(), "crash-loop child: dying") {
					t.Fatalf("the worker child exited (%v) without the test's death:\n%s", err, out.String())
				}
				if deaths > 10 {
					t.Fatalf("the worker died %d times: the guard did not stop the loop", deaths)
				}
				done = true
			case <-ch:
			case <-time.After(time.Until(deadline)):
				_ = cmd.Process.Kill()
				t.Fatalf("not every request answered within 90s (%d deaths)", deaths)
			}
		}
		if all() {
			break
		}
	}
	t.Logf("the worker died %d times", deaths)
	// The first delivery's death is not counted (first deliveries carry no
	// marker); then --max-deaths (2 here) counted ones.
	if deaths != 3 {
		t.Errorf("%d deaths, want 3 (one uncounted, then --max-deaths 2)", deaths)
	}
	for _, id := range ids {
		if id != killer {
			mustOK(t, b.wait(id))
		}
	}
	checkKiller(t, b, killer)
}

func checkKiller(t *testing.T, b *bus, killer string) {
	t.Helper()
	r := b.wait(killer)
	if r.Status != queue.StatusFailed || !strings.Contains(r.Error, queue.ReasonCrashLoop) {
		t.Fatalf("the killer's result %+v, want failed with reason crash_loop", r)
	}
	found := false
	for _, m := range b.deadLetters() {
		if strings.Contains(string(m.Data), killer) {
			found = true
			if got := m.Header.Get("Telha-Reason"); got != queue.ReasonCrashLoop {
				t.Errorf("dead letter reason %q, want crash_loop", got)
			}
		}
	}
	if !found {
		t.Error("the killer is not in TELHA_DLQ")
	}
}

// crashLoopChild is the supervised worker: any commit whose batch carries
// a killer's request id exits the process before it lands.
func crashLoopChild(dir, natsURL string) {
	cfg, err := ParseFlags([]string{"--data-dir", dir, "--http-addr", "127.0.0.1:0", "--nats-url", natsURL,
		"--ack-wait", "1s", "--max-deaths", "2", "--reaper-schedule", "@every 1h"}, func(string) string { return "" }, io.Discard)
	if err != nil {
		fmt.Println("flags:", err)
		os.Exit(1)
	}
	ctx, stop := signalContext()
	defer stop()
	err = Run(ctx, cfg, testLog, Options{WrapEngine: func(e storage.Engine) storage.Engine {
		f := storage.NewFaultEngine(e)
		f.SetObserve(func(_ int, b *pebble.Batch) {
			if bytes.Contains(b.Repr(), []byte(killerMark)) {
				fmt.Println("crash-loop child: dying")
				os.Exit(9)
			}
		})
		return f
	}})
	if err != nil {
		fmt.Println("run:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

func signalContext() (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(context.Background())
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt)
	go func() {
		select {
		case <-sig:
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, cancel
}
