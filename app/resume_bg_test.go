package app

import (
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/telha/telha-cascade/api"
	"github.com/telha/telha-cascade/internal/testnats"
	"github.com/telha/telha-cascade/queue"
	"github.com/telha/telha-cascade/reaper"
	"github.com/telha/telha-cascade/storage"
)

// TestRestartResumesJournalsInTheBackground (issue 23 item 17): a worker
// restarted with a journal to resume is ready and consumes at once; the
// journal is resumed in the background and only its fenced node waits.
//
// The first worker stops with a journal half applied (its first chunk
// landed, the rest failed). The second starts with the resumed applier
// held before its first chunk: /readyz is 200 (with a note), requests of
// another tenant and of another node are applied and answered, a write
// onto the fenced node answers cascade_in_flight and a read of it is
// answered below the journal; released, the journal finishes and its
// result is published once.
func TestRestartResumesJournalsInTheBackground(t *testing.T) {
	ns := testnats.Start(t)
	dir := t.TempDir()
	var fault *storage.FaultEngine
	failFrom := make(chan int, 1)
	opts := Options{WrapEngine: func(e storage.Engine) storage.Engine {
		fault = storage.NewFaultEngine(e)
		fault.SetInject(func(n int) error {
			select {
			case at := <-failFrom:
				failFrom <- at
				if n >= at {
					return fmt.Errorf("%w: disk gone at call %d", storage.ErrInjected, n)
				}
			default:
			}
			return nil
		})
		return fault
	}}
	// No change feed: the fault counts durable commits, and the feed's
	// cursor saves would be some of them.
	w := startWorker(t, ns, dir, opts, "--max-batch-ops", "20", "--change-feed=false")
	b := newBus(t, ns)
	hub := uuid.NewString()
	mustOK(t, b.wait(b.send("rb", node(hub))))
	for i := 0; i < 10; i++ {
		m := uuid.NewString()
		mustOK(t, b.wait(b.send("rb", node(m))))
		mustOK(t, b.wait(b.send("rb", edge(uuid.NewString(), hub, m))))
	}
	failFrom <- fault.Calls() + 3 // journal, first chunk land; the rest fail
	id := b.send("rb", tombNode(hub))
	testnats.Eventually(t, 10*time.Second, "journal failing", func() bool {
		var js struct{ Journals []api.Journal }
		w.get("/v1/journals", &js)
		return len(js.Journals) == 1 && js.Journals[0].Failures > 0 && js.Journals[0].EdgesDone > 0 && js.Journals[0].State == string(reaper.StateFailing)
	})
	if err := w.stop(); err != nil {
		t.Fatalf("stop: %v", err)
	}

	// Restart with the resumed applier held before its first chunk.
	hold, opts2 := newChunkHold()
	hold.arm()
	var release sync.Once
	free := func() { release.Do(func() { close(hold.release) }) }
	t.Cleanup(free) // a failing test must not leave the applier held
	var published atomic.Int32
	opts2.ReaperHooks = reaper.Hooks{Published: func(tenant string, rc storage.Receipt) {
		if tenant == "rb" && rc.ID.String() == hub && rc.Journaled {
			published.Add(1)
		}
	}}
	w2 := startWorker(t, ns, dir, opts2, "--max-batch-ops", "20")
	select {
	case <-hold.held:
	case <-time.After(30 * time.Second):
		t.Fatal("the resumed journal was not held")
	}

	var ready struct {
		Status string
		Notes  []string
	}
	if code := w2.get("/readyz", &ready); code != 200 || ready.Status != "ready" {
		t.Fatalf("/readyz while a journal resumes: %d %+v, want 200", code, ready)
	}
	if len(ready.Notes) == 0 || !strings.Contains(strings.Join(ready.Notes, "; "), "resuming 1 journal") {
		t.Errorf("/readyz notes while a journal resumes: %q, want one saying it resumes 1 journal", ready.Notes)
	}
	var js struct{ Journals []api.Journal }
	w2.get("/v1/journals", &js)
	if len(js.Journals) != 1 || js.Journals[0].NodeID != hub || js.Journals[0].State != string(reaper.StateApplying) {
		t.Fatalf("journals while the resume is held: %+v", js.Journals)
	}

	// Another tenant, and another node of the same tenant: applied and
	// answered while the journal is held.
	other, mine := uuid.NewString(), uuid.NewString()
	mustOK(t, b.wait(b.send("rb-other", node(other))))
	mustOK(t, b.wait(b.send("rb", node(mine))))
	if code := w2.get("/v1/tenants/rb-other/nodes/"+other, nil); code != 200 {
		t.Errorf("read of another tenant's new node: %d, want 200", code)
	}
	// A write onto the fenced node: cascade_in_flight.
	if r := b.wait(b.send("rb", edge(uuid.NewString(), mine, hub))); r.Status != queue.StatusCascadeInFlight {
		t.Fatalf("edge write onto the node of a resumed journal: %+v, want cascade_in_flight", r)
	}
	// A read of the fenced node is answered below the journal (alive).
	var rd map[string]any
	if code := w2.get("/v1/tenants/rb/nodes/"+hub, &rd); code != 200 {
		t.Fatalf("read of the fenced node: %d %v, want 200 below the journal", code, rd)
	}
	if inFlight, _ := rd["cascade_in_flight"].(map[string]any); inFlight == nil || inFlight["node_id"] != hub {
		t.Errorf("read of the fenced node: %v, want cascade_in_flight naming it", rd)
	}
	b.mu.Lock()
	early := len(b.results[id])
	b.mu.Unlock()
	if early != 0 {
		t.Fatal("a result was published before the resumed cascade finished")
	}

	free()
	r := mustOK(t, b.wait(id))
	if !r.Journaled || r.EdgesTombstoned != 10 {
		t.Fatalf("resumed result %+v", r)
	}
	testnats.Eventually(t, 10*time.Second, "no journal left", func() bool {
		var js struct{ Journals []api.Journal }
		w2.get("/v1/journals", &js)
		return len(js.Journals) == 0
	})
	testnats.Eventually(t, 10*time.Second, "readyz without the resume note", func() bool {
		var ready struct{ Notes []string }
		return w2.get("/readyz", &ready) == 200 && len(ready.Notes) == 0
	})
	if code := w2.get("/v1/tenants/rb/nodes/"+hub, nil); code != 404 {
		t.Fatalf("hub after the resume: %d, want 404", code)
	}
	if err := w2.stop(); err != nil {
		t.Fatalf("stop: %v", err)
	}
	if n := published.Load(); n != 1 {
		t.Errorf("the resumed journal's result was published %d times by the worker, want 1", n)
	}
	if n := len(b.storedResults(id)); n != 1 {
		t.Fatalf("%d results stored, want exactly 1", n)
	}
}
