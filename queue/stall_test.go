package queue

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/telha/telha-cascade/internal/testnats"
	"github.com/telha/telha-cascade/queue/client"
)

func TestStalledNeedsTwoSilentLooksWithWorkWaiting(t *testing.T) {
	base := stallSample{pending: 3, ackPending: 0, delivered: 10, received: 7}
	moved := base
	moved.delivered, moved.received = 11, 8
	paused := base
	paused.paused = true
	empty := base
	empty.pending = 0
	full := base
	full.ackPending = 4096
	gotOne := base
	gotOne.received = 8 // the callback received one the server counted earlier
	for _, c := range []struct {
		name      string
		prev, cur stallSample
		want      bool
	}{
		{"waiting, nothing delivered in between", base, base, true},
		{"delivered in between", base, moved, false},
		{"received in between", base, gotOne, false},
		{"nothing waiting now", base, empty, false},
		{"nothing waiting before", empty, base, false},
		{"paused", base, paused, false},
		{"paused before", paused, base, false},
		{"ack pending full: the server holds them back", base, full, false},
	} {
		if got := stalled(c.prev, c.cur, 4096); got != c.want {
			t.Errorf("%s: stalled %t, want %t", c.name, got, c.want)
		}
	}
}

// TestStallWatchRestartsASilentPull: the worker's pull subscription is
// stopped behind its back (what nats.go#2063 leaves: a healthy connection,
// requests waiting, nothing delivered). The stall watch notices and
// restarts the pull, and the request published meanwhile is answered. An
// idle worker with nothing waiting is never restarted.
func TestStallWatchRestartsASilentPull(t *testing.T) {
	ns := testnats.Start(t)
	nc := testnats.Connect(t, ns.ClientURL())
	w := newStoreWorker(t, nc, Config{StallCheck: 100 * time.Millisecond})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := w.Provision(ctx); err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(runCtx) }()
	defer func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()

	c, err := client.New(testnats.Connect(t, ns.ClientURL()), client.Config{})
	if err != nil {
		t.Fatal(err)
	}
	answer := func(what string) {
		t.Helper()
		since := time.Now().Add(-time.Second)
		rid := uuid.NewString()
		_, err := c.PublishRequest(ctx, &client.Request{RequestID: rid, Op: "put_node", Tenant: "acme", ID: uuid.NewString(),
			ValidFrom: "2026-01-01T00:00:00Z", Props: json.RawMessage(`{"k":1}`), Provenance: &client.Provenance{Actor: "test", Reason: what}})
		if err != nil {
			t.Fatal(err)
		}
		wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
		defer wcancel()
		got, err := c.Wait(wctx, []string{"acme"}, since, map[string]bool{rid: true})
		if err != nil || got[rid].Status != "ok" {
			t.Fatalf("%s: result %+v, err %v", what, got[rid], err)
		}
	}
	answer("before")
	testnats.Eventually(t, 10*time.Second, "the worker's consume loop", func() bool { return w.loop.Load() != nil })
	loop := w.loop.Load()
	// Idle, nothing waiting, for ten looks: no restart.
	seen := loop.looks.Load()
	testnats.Eventually(t, 20*time.Second, "ten looks of the stall watch while idle", func() bool { return loop.looks.Load() >= seen+10 })
	if n := loop.Restarts(); n != 0 {
		t.Fatalf("an idle worker with nothing waiting restarted its pull %d times", n)
	}
	// Silenced behind the worker's back. Stop unsubscribes in the
	// background: wait for that, then let the server see the UNSUB
	// (Flush), so it drops the pull that was waiting. Otherwise the
	// request published next may go to the dead inbox and come back only
	// after AckWait: lost to this test, and no stall (nothing pending).
	cc := loop.current()
	cc.Stop()
	select {
	case <-cc.Closed():
	case <-time.After(10 * time.Second):
		t.Fatal("the stopped pull subscription did not close within 10s")
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	answer("after the pull went silent")
	if n := loop.Restarts(); n < 1 {
		t.Fatalf("answered without a restart of the pull (%d): the silence was not simulated", n)
	}
}
