package member

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/telha/telha-cascade/internal/testnats"
)

func openRegistry(t *testing.T, url string, cfg Config) *Registry {
	t.Helper()
	nc := testnats.Connect(t, url)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r, err := Open(ctx, js, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// TestRegistryOneLeaderWritesOnePlan: five members step at once, many
// rounds, on a real JetStream KV: the assignment converges to one balanced
// plan, and every write that lost a compare-and-set was re-read, never
// overwritten (the epochs grow by one per change of owner).
func TestRegistryOneLeaderWritesOnePlan(t *testing.T) {
	srv := testnats.Start(t)
	cfg := Config{Slots: 6, Replicas: 1, TTL: 30 * time.Second} // no record expires during the rounds
	pc := PlanConfig{Slots: 6, Standbys: 1, MaxLag: 10}
	ctx := context.Background()
	var regs []*Registry
	for i := 0; i < 5; i++ {
		r := openRegistry(t, srv.ClientURL(), cfg)
		if err := r.Renew(ctx, Member{ID: fmt.Sprintf("m%d", i), URL: "http://x"}); err != nil {
			t.Fatal(err)
		}
		regs = append(regs, r)
	}
	var wg sync.WaitGroup
	leads := make([]int, len(regs))
	for i, r := range regs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for round := 0; round < 5; round++ {
				_, _, led, err := r.Step(ctx, fmt.Sprintf("m%d", i), pc, true)
				if err != nil {
					t.Error(err)
					return
				}
				if led {
					leads[i]++
				}
			}
		}()
	}
	wg.Wait()
	for i, n := range leads {
		if (i == 0) != (n > 0) {
			t.Fatalf("member m%d led %d rounds; only m0 (the lowest id) may", i, n)
		}
	}
	cur, _, err := regs[1].Assignments(ctx)
	if err != nil {
		t.Fatal(err)
	}
	counts := map[string]int{}
	for _, a := range cur {
		if a.Owner == "" || a.Epoch != 1 {
			t.Fatalf("slot %d: %+v, want an owner at epoch 1", a.Slot, a)
		}
		counts[a.Owner]++
	}
	for id, n := range counts {
		if n > 2 {
			t.Fatalf("%s owns %d of 6 slots among 5 members", id, n)
		}
	}

	// A stale revision loses: ErrConflict, and the entry is unchanged.
	_, revs, _ := regs[2].Assignments(ctx)
	stale := cur[0]
	stale.Owner, stale.Epoch = "intruder", 99
	if err := regs[2].Write(ctx, stale, revs[0]-1); !errors.Is(err, ErrConflict) {
		t.Fatalf("write with a stale revision: %v, want ErrConflict", err)
	}
	if err := regs[2].Write(ctx, stale, 0); !errors.Is(err, ErrConflict) {
		t.Fatalf("create over an existing slot: %v, want ErrConflict", err)
	}
	after, _, _ := regs[2].Assignments(ctx)
	if after[0].Owner != cur[0].Owner {
		t.Fatalf("a lost compare-and-set changed the owner: %+v", after[0])
	}
}

// TestRegistryExpiredMemberIsGone: a member that stops renewing drops out
// of Members after the TTL, and Leave removes one at once.
func TestRegistryExpiredMemberIsGone(t *testing.T) {
	srv := testnats.Start(t)
	// 3 s: a must not expire before the read after b's Leave (a loaded
	// machine can take a second over the four KV calls).
	r := openRegistry(t, srv.ClientURL(), Config{Slots: 2, Replicas: 1, TTL: 3 * time.Second})
	ctx := context.Background()
	for _, id := range []string{"a", "b"} {
		if err := r.Renew(ctx, Member{ID: id}); err != nil {
			t.Fatal(err)
		}
	}
	if err := r.Leave(ctx, "b"); err != nil {
		t.Fatal(err)
	}
	ms, err := r.Members(ctx, "a")
	if err != nil || len(ms) != 1 || ms[0].ID != "a" {
		t.Fatalf("after b left: %v %v", ms, err)
	}
	testnats.Eventually(t, 10*time.Second, "a expires", func() bool {
		ms, err := r.Members(ctx, "")
		return err == nil && len(ms) == 0
	})
	if err := ValidID("telha-cascade-0"); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{"", ".a", "a.", "a b", "a*", "a>"} {
		if ValidID(bad) == nil {
			t.Fatalf("ValidID(%q) accepted", bad)
		}
	}
}

// TestRegistryMembersJudgedByServerTime: a member whose clock runs 5 s
// ahead of the server's (TTL 6 s) still sees the others as live, because
// ages are measured from its own record's server time.
func TestRegistryMembersJudgedByServerTime(t *testing.T) {
	srv := testnats.Start(t)
	r := openRegistry(t, srv.ClientURL(), Config{Slots: 2, Replicas: 1, TTL: 6 * time.Second})
	ctx := context.Background()
	for _, id := range []string{"a", "b"} {
		if err := r.Renew(ctx, Member{ID: id}); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(1500 * time.Millisecond) // b's record ages by 1.5 s of real time (the point of the test)
	if err := r.Renew(ctx, Member{ID: "a"}); err != nil {
		t.Fatal(err)
	}
	r.now = func() time.Time { return time.Now().Add(5 * time.Second) } // a's clock runs 5 s ahead
	ms, err := r.Members(ctx, "a")
	if err != nil || len(ms) != 2 {
		t.Fatalf("with a 5 s skew: %v %v, want a and b live", ms, err)
	}
}

// TestRegistryStepWithoutLeadWritesNothing: the lowest id that may not
// lead (its own registry call failed within the last TTL) reads the
// assignment and writes none of it; allowed again, it writes the plan.
func TestRegistryStepWithoutLeadWritesNothing(t *testing.T) {
	srv := testnats.Start(t)
	r := openRegistry(t, srv.ClientURL(), Config{Slots: 2, Replicas: 1, TTL: 5 * time.Second})
	pc := PlanConfig{Slots: 2, Standbys: 1, MaxLag: 10}
	ctx := context.Background()
	if err := r.Renew(ctx, Member{ID: "a"}); err != nil {
		t.Fatal(err)
	}
	cur, members, led, err := r.Step(ctx, "a", pc, false)
	if err != nil || led || len(members) != 1 {
		t.Fatalf("Step without lead: led %v, %d members, %v", led, len(members), err)
	}
	for _, a := range cur {
		if a.Owner != "" {
			t.Fatalf("Step without lead assigned slot %d to %q", a.Slot, a.Owner)
		}
	}
	cur, _, led, err = r.Step(ctx, "a", pc, true)
	if err != nil || !led || cur[0].Owner != "a" || cur[1].Owner != "a" {
		t.Fatalf("Step with lead: led %v, %+v, %v", led, cur, err)
	}
}
