package reaper

import (
	"testing"
	"time"

	"github.com/telha/telha-cascade/cascade"
	"github.com/telha/telha-cascade/internal/testnats"
	"github.com/telha/telha-cascade/storage"
)

// TestStartResumeRunsInTheBackgroundAndStopPausesIt (issue 23 item 17):
// StartResume returns at once while the startup pass resumes a journal a
// previous process left; Stop during it pauses the applier between chunks
// (the journal stays registered, its node alive) and waits for the pass;
// StartResume after Stop runs nothing; the next start finishes the journal.
// (Its result's single publication is app's
// TestRestartResumesJournalsInTheBackground: an orphan here has no request.)
func TestStartResumeRunsInTheBackgroundAndStopPausesIt(t *testing.T) {
	w := newWorld(t, Config{})
	h := w.orphan(30)
	held, release := make(chan struct{}), make(chan struct{})
	w.hooks = cascade.Hooks{JournalStep: func(_ *storage.JournalEntry, n int) {
		if n == 1 {
			close(held)
			<-release
		}
	}}
	w.restart()
	released := false
	defer func() {
		if !released {
			close(release)
		}
	}()
	w.svc.Start()
	results := make(chan RunResult, 1)
	if !w.svc.StartResume(func(res RunResult) { results <- res }) {
		t.Fatal("StartResume refused on a running service")
	}
	select { // StartResume returned before the applier got past its hold
	case <-held:
	case <-time.After(30 * time.Second):
		t.Fatal("the orphaned journal was not resumed")
	}
	if st := w.svc.Journals(); len(st) != 1 || st[0].NodeID != h || st[0].State != StateApplying {
		t.Fatalf("journals while the startup pass is held: %+v, want one applying", st)
	}
	if w.store.Journals().Fenced(sc, h) == nil {
		t.Fatal("the resumed journal's node is not fenced")
	}
	stopped := make(chan struct{})
	go func() { w.svc.Stop(); close(stopped) }()
	testnats.Eventually(t, 10*time.Second, "Stop cancels the appliers", func() bool { return w.svc.ctx.Err() != nil })
	select {
	case <-stopped:
		t.Fatal("Stop returned while the startup pass's applier was still held")
	default:
	}
	close(release)
	released = true
	select {
	case <-stopped:
	case <-time.After(30 * time.Second):
		t.Fatal("Stop did not return")
	}
	select {
	case res := <-results:
		if res.Resumed != 0 || res.Err == nil {
			t.Errorf("startup pass stopped by Stop: %+v, want nothing resumed and an error", res)
		}
	default:
		t.Fatal("Stop returned before the startup pass ended")
	}
	if w.store.Journals().Len() != 1 || w.dead(h) {
		t.Fatalf("after Stop mid-resume: %d journals, node dead %v; want the journal paused, the node alive", w.store.Journals().Len(), w.dead(h))
	}
	if w.svc.StartResume(nil) {
		t.Error("StartResume ran a pass after Stop")
	}

	w.hooks = cascade.Hooks{}
	w.restart()
	w.svc.Start()
	if !w.svc.StartResume(func(res RunResult) { results <- res }) {
		t.Fatal("StartResume refused after the restart")
	}
	select {
	case res := <-results:
		if res.Err != nil || res.Resumed != 1 {
			t.Fatalf("startup pass after the restart: %+v, want 1 resumed", res)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the startup pass did not finish")
	}
	if !w.dead(h) || w.store.Journals().Len() != 0 {
		t.Fatal("the journal was not finished by the next start")
	}
}
