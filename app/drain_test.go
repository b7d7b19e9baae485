package app

import (
	"context"
	"io"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/telha/telha-cascade/internal/testnats"
	"github.com/telha/telha-cascade/slot"
	"github.com/telha/telha-cascade/storage"
)

// drainWorld is a worker whose writer the test holds: a request sent then
// waits in the writer's foreground lane, applied with the worker's context.
type drainWorld struct {
	r       *running
	b       *bus
	dir     string
	release chan struct{}
}

func newDrainWorld(t *testing.T, grace string, opts Options) *drainWorld {
	ns := testnats.Start(t)
	dir := t.TempDir()
	args := []string{"--data-dir", dir, "--http-addr", "127.0.0.1:0", "--nats-url", ns.ClientURL(), "--reaper-schedule", "@every 1h",
		"--shutdown-grace", grace, "--max-batch-ops", "20",
		// The feed saves its cursors through the writer's foreground
		// lane: a save queued while the test holds the writer would count
		// as the request it waits for there (sendQueued).
		"--change-feed=false"}
	cfg, err := ParseFlags(args, func(string) string { return "" }, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	ready := make(chan *slot.Slot, 1)
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{t: t, cancel: cancel, done: make(chan error, 1)}
	opts.OnReady = func(a *slot.Slot) { ready <- a }
	go func() { r.done <- Run(ctx, cfg, testLog, opts) }()
	select {
	case r.app = <-ready:
	case err := <-r.done:
		t.Fatalf("worker exited before ready: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("worker not ready within 30s")
	}
	r.base = "http://" + r.app.HTTPAddr()
	w := &drainWorld{r: r, b: newBus(t, ns), dir: dir, release: make(chan struct{})}
	t.Cleanup(func() {
		select {
		case <-w.release:
		default:
			close(w.release)
		}
		r.stop()
	})
	mustOK(t, w.b.wait(w.b.send("drain", node(uuid.NewString())))) // consuming
	return w
}

// holdWriter occupies the store's writer until w.release is closed.
func (w *drainWorld) holdWriter(t *testing.T) {
	entered := make(chan struct{})
	go func() {
		_ = w.r.app.Store().Update(context.Background(), func(*storage.Txn) error {
			close(entered)
			<-w.release
			return nil
		})
	}()
	select {
	case <-entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the writer was not taken")
	}
}

// sendQueued sends a put_node and waits until its group waits for the
// writer; it returns the node id.
func (w *drainWorld) sendQueued(t *testing.T) uuid.UUID {
	id := uuid.New()
	w.b.send("drain", node(id.String()))
	testnats.Eventually(t, 10*time.Second, "the request's group waits for the writer", func() bool {
		fg, _ := w.r.app.Store().WriterQueue()
		return fg == 1
	})
	return id
}

func (w *drainWorld) runErr(t *testing.T) error {
	select {
	case err := <-w.r.done:
		w.r.cancel = nil
		return err
	case <-time.After(60 * time.Second):
		t.Fatal("Run did not return")
		return nil
	}
}

// stored reports whether node id is in the (closed) worker's store.
func (w *drainWorld) stored(t *testing.T, id uuid.UUID) bool {
	st, err := storage.OpenStore(filepath.Join(w.dir, "pebble"), storage.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	sc, err := storage.NewScope("drain")
	if err != nil {
		t.Fatal(err)
	}
	_, ok, err := st.Latest(sc, storage.KindNode, id)
	if err != nil {
		t.Fatal(err)
	}
	return ok
}

// TestSIGTERMDrainAppliesWhatItHolds: SIGTERM stops fetching but does not
// cancel the group being applied: it is committed, answered and acked,
// and Run returns nil.
func TestSIGTERMDrainAppliesWhatItHolds(t *testing.T) {
	w := newDrainWorld(t, "60s", Options{})
	w.holdWriter(t)
	id := w.sendQueued(t)
	w.r.cancel() // SIGTERM
	close(w.release)
	if err := w.runErr(t); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if !w.stored(t, id) {
		t.Fatal("the request held at SIGTERM was not applied")
	}
}

// TestHardStopCancelsTheDrain (issue 23 item 22): when the drain outlasts
// --shutdown-grace, Run gives up; the group still waiting for the writer
// must not be committed after that (the worker applied with
// context.Background(), so it was, behind the shutdown's back, if the
// writer came free before the store closed). It is left unacked, for the
// next worker.
//
// The window is made wide and certain: a journal applier held before its
// first chunk keeps the shutdown in the reaper's stop (after the grace,
// before the store closes) until the test has freed the writer and seen
// it idle.
func TestHardStopCancelsTheDrain(t *testing.T) {
	hold, opts := newChunkHold()
	w := newDrainWorld(t, "1s", opts)
	hub, other := uuid.NewString(), uuid.NewString()
	mustOK(t, w.b.wait(w.b.send("drain", node(hub))))
	mustOK(t, w.b.wait(w.b.send("drain", node(other))))
	for i := 0; i < 6; i++ {
		mustOK(t, w.b.wait(w.b.send("drain", edge(uuid.NewString(), hub, other))))
	}
	hold.arm()
	w.b.send("drain", tombNode(hub)) // journaled; acked, its result comes later
	select {
	case <-hold.held:
	case <-time.After(30 * time.Second):
		t.Fatal("the journal was not held")
	}
	released := false
	defer func() {
		if !released {
			close(hold.release)
		}
	}()
	w.holdWriter(t)
	id := w.sendQueued(t)
	w.r.cancel() // SIGTERM
	// The grace runs out and Run gives up on the drain: it stops the HTTP
	// server, then waits in the reaper's stop for the held applier.
	testnats.Eventually(t, 30*time.Second, "the HTTP server stops after the grace", func() bool {
		resp, err := http.Get(w.r.base + "/healthz")
		if err != nil {
			return true
		}
		resp.Body.Close()
		return false
	})
	close(w.release)
	select {
	case <-w.r.app.Store().WriterIdle():
	case <-time.After(30 * time.Second):
		t.Fatal("the writer did not come idle")
	}
	close(hold.release)
	released = true
	if err := w.runErr(t); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if w.stored(t, id) {
		t.Fatal("the request held past --shutdown-grace was committed after the worker gave up on it")
	}
}
