package member

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
)

// simulate applies plans to a member set until the plan stops changing,
// with every standby reporting itself caught up after each round (what the
// real members do once their tails reach the end). It fails the test on
// any step that breaks an invariant.
func simulate(t *testing.T, cfg PlanConfig, ids []string, leaving map[string]bool, cur []Assignment) []Assignment {
	t.Helper()
	for round := 0; round < 4*cfg.Slots+8; round++ {
		members := records(ids, leaving, nil, cur)
		next := Plan(cfg, members, cur)
		checkStep(t, cfg, members, cur, next)
		if again := Plan(cfg, members, cur); !sameAll(again, next) {
			t.Fatalf("plan not deterministic:\n%v\n%v", next, again)
		}
		if sameAll(cur, next) {
			return next
		}
		cur = next
	}
	t.Fatalf("no fixpoint after %d rounds: %v", 4*cfg.Slots+8, cur)
	return nil
}

// records are the members' records as they report cur: every role they
// hold, caught up and ready, except for a slot they broke (its run is
// gone).
func records(ids []string, leaving map[string]bool, broken map[string][]int, cur []Assignment) []Member {
	members := make([]Member, 0, len(ids))
	for _, id := range ids {
		m := Member{ID: id, Leaving: leaving[id], Slots: map[int]SlotState{}, Broken: broken[id]}
		for _, a := range cur {
			switch {
			case slices.Contains(m.Broken, a.Slot):
			case a.Owner == id:
				m.Slots[a.Slot] = SlotState{Role: RoleOwner, Applied: 100, Ready: true}
			case slices.Contains(a.Standbys, id):
				m.Slots[a.Slot] = SlotState{Role: RoleStandby, Applied: 100, Ready: true}
			}
		}
		members = append(members, m)
	}
	return members
}

func sameAll(a, b []Assignment) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if !a[i].Equal(b[i]) {
			return false
		}
	}
	return true
}

func checkStep(t *testing.T, cfg PlanConfig, members []Member, cur, next []Assignment) {
	t.Helper()
	byID := map[string]Member{}
	var eligible int
	for _, m := range members {
		byID[m.ID] = m
		if !m.Leaving {
			eligible++
		}
	}
	if len(next) != cfg.Slots {
		t.Fatalf("plan has %d slots, want %d", len(next), cfg.Slots)
	}
	for s, a := range next {
		if a.Slot != s {
			t.Fatalf("slot %d labelled %d", s, a.Slot)
		}
		if eligible == 0 {
			continue
		}
		m, ok := byID[a.Owner]
		if !ok {
			t.Fatalf("slot %d owned by %q, not a live member", s, a.Owner)
		}
		var was Assignment
		if s < len(cur) {
			was = cur[s]
		}
		_, wasAlive := byID[was.Owner]
		switch {
		case a.Owner == was.Owner && a.Epoch != was.Epoch:
			t.Fatalf("slot %d: epoch changed %d -> %d without a change of owner", s, was.Epoch, a.Epoch)
		case a.Owner != was.Owner && a.Epoch != was.Epoch+1:
			t.Fatalf("slot %d: owner %q -> %q but epoch %d -> %d", s, was.Owner, a.Owner, was.Epoch, a.Epoch)
		case a.Owner != was.Owner && wasAlive && was.Owner != "":
			// Warm-first: a live owner hands over only to a caught-up standby.
			if !slices.Contains(was.Standbys, a.Owner) || !caughtUp(byID[a.Owner], byID[was.Owner], s, cfg.MaxLag) {
				t.Fatalf("slot %d moved from live %q to %q, which was not a caught-up standby", s, was.Owner, a.Owner)
			}
		}
		if m.Leaving && len(cur) > 0 && was.Owner != a.Owner {
			t.Fatalf("slot %d given to leaving member %q", s, a.Owner)
		}
		seen := map[string]bool{}
		for _, id := range a.Standbys {
			if id == a.Owner || seen[id] {
				t.Fatalf("slot %d standbys %v (owner %q): duplicate or owner", s, a.Standbys, a.Owner)
			}
			if sm, ok := byID[id]; !ok || sm.Leaving {
				t.Fatalf("slot %d standby %q is not an eligible member", s, id)
			}
			seen[id] = true
		}
		if len(a.Standbys) > max(cfg.Standbys, 1) {
			t.Fatalf("slot %d has %d standbys, want at most %d", s, len(a.Standbys), max(cfg.Standbys, 1))
		}
	}
}

// checkBalanced: at the fixpoint, every eligible member owns floor or ceil
// of N/M, a leaving member none, and each slot has min(S, M-1) standbys.
func checkBalanced(t *testing.T, cfg PlanConfig, ids []string, leaving map[string]bool, final []Assignment) {
	t.Helper()
	m := 0
	for _, id := range ids {
		if !leaving[id] {
			m++
		}
	}
	if m == 0 {
		return
	}
	counts := map[string]int{}
	for _, a := range final {
		counts[a.Owner]++
		if want := min(cfg.Standbys, m-1); len(a.Standbys) != want {
			t.Fatalf("slot %d has standbys %v, want %d", a.Slot, a.Standbys, want)
		}
	}
	lo, hi := cfg.Slots/m, (cfg.Slots+m-1)/m
	for _, id := range ids {
		n := counts[id]
		if leaving[id] && n != 0 {
			t.Fatalf("leaving %q still owns %d slots: %v", id, n, final)
		}
		if !leaving[id] && (n < lo || n > hi) {
			t.Fatalf("%q owns %d slots, want %d..%d (%d slots, %d members): %v", id, n, lo, hi, cfg.Slots, m, final)
		}
	}
}

// TestPlanConvergesBalancedWarmFirst: random histories of members joining,
// dying and leaving; after each event the plans converge to a balanced
// fixpoint, and no step breaks an invariant (checkStep).
func TestPlanConvergesBalancedWarmFirst(t *testing.T) {
	for seed := uint64(0); seed < 300; seed++ {
		r := rand.New(rand.NewPCG(seed, 7))
		cfg := PlanConfig{Slots: 1 + r.IntN(12), Standbys: r.IntN(3), MaxLag: 10}
		var ids []string
		next := 0
		join := func() { ids = append(ids, fmt.Sprintf("m%02d", next)); next++ }
		join()
		var cur []Assignment
		leaving := map[string]bool{}
		for step := 0; step < 12; step++ {
			switch k := r.IntN(4); {
			case k == 0 || len(ids) == 1:
				join()
			case k == 1: // dies
				i := r.IntN(len(ids))
				delete(leaving, ids[i])
				ids = slices.Delete(ids, i, i+1)
			case k == 2: // SIGTERM: leaving, then gone once it owns nothing
				leaving[ids[r.IntN(len(ids))]] = true
			default:
				join()
			}
			cur = simulate(t, cfg, ids, leaving, cur)
			checkBalanced(t, cfg, ids, leaving, cur)
			for id := range leaving { // a leaving member with nothing left exits
				owns := false
				for _, a := range cur {
					owns = owns || a.Owner == id
				}
				if !owns {
					delete(leaving, id)
					ids = slices.DeleteFunc(ids, func(x string) bool { return x == id })
				}
			}
		}
	}
}

// TestPlanDeadOwnerGoesToItsStandby: the warm copy is chosen, at once.
func TestPlanDeadOwnerGoesToItsStandby(t *testing.T) {
	cfg := PlanConfig{Slots: 2, Standbys: 1, MaxLag: 10}
	cur := []Assignment{
		{Slot: 0, Owner: "a", Epoch: 3, Standbys: []string{"c"}},
		{Slot: 1, Owner: "b", Epoch: 1, Standbys: []string{"a"}},
	}
	members := []Member{{ID: "b"}, {ID: "c"}} // a is gone
	next := Plan(cfg, members, cur)
	if next[0].Owner != "c" || next[0].Epoch != 4 || next[0].Prev != "a" {
		t.Fatalf("slot 0: %+v, want owner c epoch 4 prev a", next[0])
	}
	if next[1].Owner != "b" || next[1].Epoch != 1 || !slices.Equal(next[1].Standbys, []string{"c"}) {
		t.Fatalf("slot 1: %+v", next[1])
	}
}

// TestPlanLiveMoveWaitsForCatchUp: a new member first becomes a standby;
// the owner flips only when it reports it has caught up.
func TestPlanLiveMoveWaitsForCatchUp(t *testing.T) {
	cfg := PlanConfig{Slots: 2, Standbys: 0, MaxLag: 10}
	cur := []Assignment{{Slot: 0, Owner: "a", Epoch: 1}, {Slot: 1, Owner: "a", Epoch: 1}}
	a := Member{ID: "a", Slots: map[int]SlotState{0: {Role: RoleOwner, Applied: 500, Ready: true}, 1: {Role: RoleOwner, Applied: 500, Ready: true}}}
	b := Member{ID: "b", Slots: map[int]SlotState{}}
	next := Plan(cfg, []Member{a, b}, cur)
	if next[1].Owner != "a" || !slices.Equal(next[1].Standbys, []string{"b"}) {
		t.Fatalf("first plan: slot 1 %+v, want owner a with standby b (warming)", next[1])
	}
	b.Slots[1] = SlotState{Role: RoleStandby, Applied: 100, Ready: true}
	if n := Plan(cfg, []Member{a, b}, next); n[1].Owner != "a" {
		t.Fatalf("flipped to a standby 400 behind: %+v", n[1])
	}
	b.Slots[1] = SlotState{Role: RoleStandby, Applied: 495, Ready: true}
	n := Plan(cfg, []Member{a, b}, next)
	if n[1].Owner != "b" || n[1].Epoch != 2 || n[1].Prev != "a" || n[0].Owner != "a" {
		t.Fatalf("caught up: %+v", n)
	}
}

// TestPlanBrokenSlotMovesAndStaysAway: random groups where members break
// random slots (Pebble failed on their copy: Member.Broken). Every plan
// gives a broken slot to a member that can host it, at once (its owner
// counts as gone for it), never makes a member a standby of a slot it
// broke, keeps every other rule of a step, and reaches a fixpoint.
func TestPlanBrokenSlotMovesAndStaysAway(t *testing.T) {
	for seed := uint64(0); seed < 300; seed++ {
		r := rand.New(rand.NewPCG(seed, 11))
		cfg := PlanConfig{Slots: 1 + r.IntN(8), Standbys: r.IntN(3), MaxLag: 10}
		var ids []string
		for i := range 2 + r.IntN(4) {
			ids = append(ids, fmt.Sprintf("m%d", i))
		}
		cur := simulate(t, cfg, ids, nil, nil)
		broken := map[string][]int{}
		for range 1 + r.IntN(3) {
			id, s := ids[r.IntN(len(ids))], r.IntN(cfg.Slots)
			if !slices.Contains(broken[id], s) {
				broken[id] = append(broken[id], s)
			}
		}
		canHost := func(s int) bool {
			for _, id := range ids {
				if !slices.Contains(broken[id], s) {
					return true
				}
			}
			return false
		}
		fixed := false
		for round := 0; round < 4*cfg.Slots+8 && !fixed; round++ {
			members := records(ids, nil, broken, cur)
			next := Plan(cfg, members, cur)
			if again := Plan(cfg, members, cur); !sameAll(again, next) {
				t.Fatalf("seed %d: plan not deterministic", seed)
			}
			for s, a := range next {
				if slices.Contains(broken[a.Owner], s) && canHost(s) {
					t.Fatalf("seed %d round %d: slot %d stays with %q, which broke it (broken %v): %+v", seed, round, s, a.Owner, broken, next)
				}
				for _, id := range a.Standbys {
					if slices.Contains(broken[id], s) {
						t.Fatalf("seed %d: slot %d has standby %q, which broke it", seed, s, id)
					}
				}
				if was := cur[s]; (a.Owner != was.Owner) != (a.Epoch == was.Epoch+1) || (a.Owner == was.Owner && a.Epoch != was.Epoch) {
					t.Fatalf("seed %d: slot %d owner %q -> %q, epoch %d -> %d", seed, s, was.Owner, a.Owner, was.Epoch, a.Epoch)
				}
			}
			fixed = sameAll(cur, next)
			cur = next
		}
		if !fixed {
			t.Fatalf("seed %d: no fixpoint with broken %v: %+v", seed, broken, cur)
		}
	}
}
