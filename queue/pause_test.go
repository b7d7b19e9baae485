package queue

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/telha/telha-cascade/internal/testnats"
	"github.com/telha/telha-cascade/queue/client"
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
