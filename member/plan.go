package member

import (
	"slices"
	"sort"
	"time"
)

// Roles a member reports for a slot.
const (
	RoleOwner   = "owner"
	RoleStandby = "standby"
)

// SlotState is what a member reports of one slot it holds.
type SlotState struct {
	Role string `json:"role"`
	// Applied is the changelog sequence its local copy reflects.
	Applied uint64 `json:"applied"`
	// Ready: an owner serves (consumes and answers); a standby tails.
	Ready bool `json:"ready"`
	// Epoch is the assignment epoch the member acts on.
	Epoch uint64 `json:"epoch,omitempty"`
}

// Member is a member's record in TELHA_MEMBERS.
type Member struct {
	ID  string `json:"id"`
	URL string `json:"url"` // where its HTTP answers reads (forwarding)
	// Leaving: SIGTERM; its slots move away (warm-first) before it exits.
	Leaving bool      `json:"leaving,omitempty"`
	Started time.Time `json:"started"`
	// Incarnation is random per process: two processes started with one
	// --member-id write different ones (Registry.CheckDuplicate).
	Incarnation string            `json:"incarnation,omitempty"`
	Renewed     time.Time         `json:"renewed"`
	Slots       map[int]SlotState `json:"slots,omitempty"`
	// Broken lists the slots this process can no longer host: Pebble
	// itself failed on the slot's copy (its directory stays locked until
	// the process exits). Plan gives such a slot, and its standby duty, to
	// the other members; a restart of the process clears it.
	Broken []int `json:"broken,omitempty"`
	// Journals: the journals in flight on the slots it owns, as of its
	// last renewal, oldest first, at most MaxJournalsInRecord (every
	// member's status page lists the group's).
	Journals []JournalRef `json:"journals,omitempty"`
	// Finished: the journals that finished last on the slots it owns,
	// newest first, at most MaxFinishedInRecord (every member's status
	// page lists the group's recently finished).
	Finished []FinishedRef `json:"finished,omitempty"`
}

// MaxJournalsInRecord bounds Member.Journals (a record stays small).
const MaxJournalsInRecord = 20

// MaxFinishedInRecord bounds Member.Finished.
const MaxFinishedInRecord = 10

// FinishedRef is a journal that finished on a member's slot.
type FinishedRef struct {
	Slot            int       `json:"slot"`
	Tenant          string    `json:"tenant"`
	NodeID          string    `json:"node_id"`
	RequestID       string    `json:"request_id,omitempty"`
	Outcome         string    `json:"outcome"`
	EdgesTombstoned uint64    `json:"edges_tombstoned"`
	Attempts        int       `json:"attempts"`
	Finished        time.Time `json:"finished"`
	TookSeconds     float64   `json:"took_seconds"`
}

// JournalRef is a journal in flight on a member's slot.
type JournalRef struct {
	Slot       int     `json:"slot"`
	Tenant     string  `json:"tenant"`
	NodeID     string  `json:"node_id"`
	RequestID  string  `json:"request_id,omitempty"`
	State      string  `json:"state"`
	EdgesDone  int64   `json:"edges_done"`
	EdgesTotal uint64  `json:"edges_total"`
	AgeSeconds float64 `json:"age_seconds"`
}

// Assignment is one slot's entry in TELHA_OWNERS_<N>.
type Assignment struct {
	Slot  int    `json:"slot"`
	Owner string `json:"owner"`
	// Epoch grows by one with each change of owner.
	Epoch    uint64   `json:"epoch"`
	Standbys []string `json:"standbys"`
	// Prev is the owner before this epoch: the new owner waits until it
	// has released the slot (or is gone) before it claims the changelog.
	Prev    string    `json:"prev,omitempty"`
	Changed time.Time `json:"changed"`
}

// Equal reports whether a and b assign the same (Changed aside).
func (a Assignment) Equal(b Assignment) bool {
	return a.Slot == b.Slot && a.Owner == b.Owner && a.Epoch == b.Epoch && a.Prev == b.Prev && slices.Equal(a.Standbys, b.Standbys)
}

// PlanConfig shapes Plan.
type PlanConfig struct {
	Slots    int
	Standbys int
	// MaxLag: a standby whose applied sequence is within MaxLag of the
	// owner's has caught up (a move then waits only for that much replay).
	MaxLag uint64
}

// Plan returns the next assignment of every slot (len cfg.Slots), given the
// live members (their records) and the current assignment (cur[s] for slot
// s; a zero Owner is unassigned). It is deterministic, so every member
// computes the same one.
//
//   - A slot whose owner is gone goes at once to its live standby with the
//     fewest slots (warm), else to the member with the fewest (cold: it
//     restores a checkpoint and replays).
//   - The owners are balanced: no member owns more than ceil(N/M) or fewer
//     than floor(N/M); a leaving member owns none. A slot whose owner is
//     alive moves warm-first: the target is first made a standby, and the
//     owner flips only once the target reports it has caught up.
//   - Each slot keeps up to cfg.Standbys standbys (distinct from its owner),
//     sticky, then the members with the fewest standby duties.
//   - A member never owns or stands by a slot its record lists as Broken;
//     an owner that broke its slot counts as gone for that slot (when no
//     other member can take it, the slot stays where it is).
func Plan(cfg PlanConfig, members []Member, cur []Assignment) []Assignment {
	next := make([]Assignment, cfg.Slots)
	byID := map[string]Member{}
	var eligible []string
	for _, m := range members {
		byID[m.ID] = m
		if !m.Leaving {
			eligible = append(eligible, m.ID)
		}
	}
	sort.Strings(eligible)
	for s := range next {
		if s < len(cur) {
			next[s] = cur[s]
			next[s].Standbys = slices.Clone(cur[s].Standbys)
		}
		next[s].Slot = s
	}
	if len(eligible) == 0 {
		return next // nobody to give anything to
	}
	isEligible := func(id string) bool { _, ok := slices.BinarySearch(eligible, id); return ok }
	broke := func(id string, s int) bool { return slices.Contains(byID[id].Broken, s) }
	// canTake: the eligible members of cands that can host slot s.
	canTake := func(cands []string, s int) []string {
		var out []string
		for _, id := range cands {
			if isEligible(id) && !broke(id, s) {
				out = append(out, id)
			}
		}
		return out
	}
	counts := map[string]int{}
	for _, id := range eligible {
		counts[id] = 0
	}
	for s := range next {
		if isEligible(next[s].Owner) {
			counts[next[s].Owner]++
		}
	}
	fewest := func(cands []string) string {
		best := ""
		for _, id := range cands {
			if best == "" || counts[id] < counts[best] || (counts[id] == counts[best] && id < best) {
				best = id
			}
		}
		return best
	}
	flip := func(s int, to string) {
		a := &next[s]
		a.Prev, a.Owner, a.Epoch = a.Owner, to, a.Epoch+1
		a.Standbys = slices.DeleteFunc(a.Standbys, func(id string) bool { return id == to })
	}

	// 1. Slots without a live owner (or whose owner broke them). A slot
	// flipped here is not moved again by this plan (one epoch a plan).
	flipped := map[int]bool{}
	for s := range next {
		if _, alive := byID[next[s].Owner]; alive && next[s].Owner != "" && !broke(next[s].Owner, s) {
			continue
		}
		to := fewest(canTake(next[s].Standbys, s))
		if to == "" {
			to = fewest(canTake(eligible, s))
		}
		if to == "" {
			continue // nobody can: it stays as it is
		}
		if isEligible(next[s].Owner) {
			counts[next[s].Owner]--
		}
		flip(s, to)
		counts[to]++
		flipped[s] = true
	}

	// 2. Balance, warm-first. planned counts a move as done when it is
	// decided, so later decisions see it; the flip itself waits for the
	// target to catch up.
	planned := map[string]int{}
	for id, n := range counts {
		planned[id] = n
	}
	lo, hi := cfg.Slots/len(eligible), (cfg.Slots+len(eligible)-1)/len(eligible)
	pending := map[int]string{} // slot -> warming target
	// target: the least loaded member other than src that can host s.
	target := func(src string, s int) string {
		to := ""
		for _, id := range canTake(eligible, s) {
			if id != src && (to == "" || planned[id] < planned[to] || (planned[id] == planned[to] && id < to)) {
				to = id
			}
		}
		return to
	}
	for {
		src, slot := "", -1
		// A leaving (or otherwise ineligible but alive) owner first.
		for s := len(next) - 1; s >= 0; s-- {
			if _, warming := pending[s]; !warming && !flipped[s] && !isEligible(next[s].Owner) {
				src, slot = next[s].Owner, s
				break
			}
		}
		if slot < 0 {
			// The most loaded eligible member above hi, or above lo while
			// some member is below lo.
			under := false
			for _, id := range eligible {
				under = under || planned[id] < lo
			}
			for _, id := range eligible {
				if planned[id] > hi || (under && planned[id] > lo) {
					if src == "" || planned[id] > planned[src] || (planned[id] == planned[src] && id < src) {
						src = id
					}
				}
			}
			if src == "" {
				break
			}
			for s := len(next) - 1; s >= 0; s-- {
				if _, warming := pending[s]; !warming && !flipped[s] && next[s].Owner == src && target(src, s) != "" {
					slot = s
					break
				}
			}
			if slot < 0 {
				break
			}
		}
		to := target(src, slot)
		if to == "" {
			break
		}
		if isEligible(src) {
			planned[src]--
		}
		planned[to]++
		pending[slot] = to
	}
	for s, to := range pending {
		if from := next[s].Owner; caughtUp(byID[to], byID[from], s, cfg.MaxLag) {
			flip(s, to)
			// The old owner's copy is the warmest standby there is.
			next[s].Standbys = append([]string{from}, next[s].Standbys...)
			continue
		}
		a := &next[s]
		a.Standbys = append([]string{to}, slices.DeleteFunc(a.Standbys, func(id string) bool { return id == to })...)
	}

	// 3. Standbys: sticky, distinct, eligible; the warming target first.
	duties := map[string]int{}
	for s := range next {
		a := &next[s]
		var keep []string
		for _, id := range a.Standbys {
			if id != a.Owner && isEligible(id) && !broke(id, s) && !slices.Contains(keep, id) {
				keep = append(keep, id)
			}
		}
		limit := cfg.Standbys
		if _, warming := pending[s]; warming && limit < 1 {
			limit = 1
		}
		if len(keep) > limit {
			keep = keep[:limit]
		}
		a.Standbys = keep
		for _, id := range keep {
			duties[id]++
		}
	}
	for s := range next {
		a := &next[s]
		for len(a.Standbys) < cfg.Standbys {
			best := ""
			for _, id := range eligible {
				if id == a.Owner || slices.Contains(a.Standbys, id) || broke(id, s) {
					continue
				}
				if best == "" || duties[id] < duties[best] || (duties[id] == duties[best] && id < best) {
					best = id
				}
			}
			if best == "" {
				break
			}
			a.Standbys = append(a.Standbys, best)
			duties[best]++
		}
		if a.Standbys == nil {
			a.Standbys = []string{}
		}
	}
	return next
}

// caughtUp: standby reports slot s ready within maxLag of the owner's
// applied sequence.
func caughtUp(standby, owner Member, s int, maxLag uint64) bool {
	st, ok := standby.Slots[s]
	if !ok || st.Role != RoleStandby || !st.Ready {
		return false
	}
	return st.Applied+maxLag >= owner.Slots[s].Applied
}
