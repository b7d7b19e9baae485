package queue

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/telha/telha-cascade/cascade"
	"github.com/telha/telha-cascade/internal/testnats"
	"github.com/telha/telha-cascade/queue/client"
	"github.com/telha/telha-cascade/storage"
)

// TestPauseSurvivesProvision (issue 23 item 12): a replica's consumer
// paused (until resumed, or until a deadline) stays paused when the worker
// provisions it again, as it does at every start; a resume resumes it,
// and the next provision keeps it consuming. client.ConsumerName names
// the same consumer as Config.ConsumerName.
func TestPauseSurvivesProvision(t *testing.T) {
	ns := testnats.Start(t)
	js, err := jetstream.New(testnats.Connect(t, ns.ClientURL()))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c := Config{Partitions: 4, Owner: Owner{Index: 1, Count: 2}}.Defaults()
	if got := client.ConsumerName(1); got != c.ConsumerName() {
		t.Fatalf("client.ConsumerName(1) %q, Config.ConsumerName %q", got, c.ConsumerName())
	}
	if _, err := Provision(ctx, js, c); err != nil {
		t.Fatal(err)
	}
	pause := func() client.PauseState {
		t.Helper()
		st, err := client.ConsumerPause(ctx, js, c.ReqStream, c.ConsumerName())
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	for _, until := range []time.Time{{}, time.Now().Add(time.Hour)} {
		st, err := client.PauseConsumer(ctx, js, c.ReqStream, c.ConsumerName(), until)
		if err != nil || !st.Paused {
			t.Fatalf("pause until %v: %+v %v", until, st, err)
		}
		if _, err := Provision(ctx, js, c); err != nil {
			t.Fatal(err)
		}
		if st := pause(); !st.Paused || st.Forever() != until.IsZero() {
			t.Fatalf("paused until %v, provisioned again: %+v (%s)", until, st, st)
		}
		if _, err := client.ResumeConsumer(ctx, js, c.ReqStream, c.ConsumerName()); err != nil {
			t.Fatal(err)
		}
		if _, err := Provision(ctx, js, c); err != nil {
			t.Fatal(err)
		}
		if st := pause(); st.Paused {
			t.Fatalf("resumed, provisioned again: %+v", st)
		}
	}
	if _, err := client.PauseConsumer(ctx, js, c.ReqStream, "telha-worker-9", time.Time{}); err == nil {
		t.Fatal("pausing a consumer that does not exist: no error")
	}
}

// TestRefreshNeverUndoesAResume: the stats refresh reads the consumer's
// pause from the server; one that read it before a Resume (or Pause)
// reached the server and noted it after must not put the old state back
// (the status page showed "paused" right after its resume said
// "consuming"). Refreshes race each Pause and Resume; once both are done,
// the state is the last call's.
func TestRefreshNeverUndoesAResume(t *testing.T) {
	ns := testnats.Start(t)
	w := newStoreWorker(t, testnats.Connect(t, ns.ClientURL()), Config{})
	var err error
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := w.Provision(ctx); err != nil {
		t.Fatal(err)
	}
	for i := range 100 {
		stop := make(chan struct{})
		done := make(chan struct{})
		go func() {
			defer close(done)
			for {
				select {
				case <-stop:
					return
				default:
				}
				if err := w.RefreshStats(ctx); err != nil {
					t.Errorf("refresh: %v", err)
					return
				}
			}
		}()
		pause := i%2 == 0
		if pause {
			_, err = w.Pause(ctx, time.Time{}, "test")
		} else {
			_, err = w.Resume(ctx, "test")
		}
		close(stop)
		<-done
		if err != nil {
			t.Fatal(err)
		}
		if got := w.PauseState().Paused; got != pause {
			t.Fatalf("round %d: after %s and the refreshes beside it, paused %t", i, map[bool]string{true: "Pause", false: "Resume"}[pause], got)
		}
	}
}

// newStoreWorker is a worker on nc and a store of its own, neither
// provisioned nor running.
func newStoreWorker(t *testing.T, nc *nats.Conn, cfg Config) *Worker {
	t.Helper()
	st, err := storage.OpenStore(t.TempDir(), storage.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	w, err := New(nc, cascade.New(st, cascade.Options{}), cfg, Hooks{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return w
}
