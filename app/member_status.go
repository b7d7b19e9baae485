package app

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/telha/telha-cascade/member"
	"github.com/telha/telha-cascade/metrics"
	"github.com/telha/telha-cascade/queue/client"
	"github.com/telha/telha-cascade/slot"
	"github.com/telha/telha-cascade/ui"
)

// What a member says of itself and the group: /readyz, /metrics,
// /v1/partitions and the status page's view of the group.

func (m *memberRun) readyz(w http.ResponseWriter, _ *http.Request) {
	var why []string
	m.mu.Lock()
	if len(m.assign) == 0 {
		why = append(why, "member: no assignment read yet")
		if p := m.phase.Load(); p != nil {
			why = append(why, *p)
		}
	}
	for _, a := range m.assign {
		if a.Owner == "" {
			why = append(why, fmt.Sprintf("slot %d: no owner yet", a.Slot))
		}
		if a.Owner == m.id {
			if r := m.slots[a.Slot]; r == nil || r.role != roleOwner || r.app.Load() == nil {
				why = append(why, m.startingReason(a.Slot, r))
			}
		}
	}
	m.mu.Unlock()
	if m.leaving.Load() {
		why = append(why, "member: leaving (SIGTERM)")
	}
	if lost := m.leaseLost(); lost != "" {
		why = append(why, lost)
	}
	if len(why) > 0 {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusServiceUnavailable)
		_ = json.NewEncoder(w).Encode(map[string]any{"ready": false, "reasons": why})
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{"ready": true})
}

// startingReason says why slot s, owned here, does not serve yet (m.mu
// held; r is its run, if any).
func (m *memberRun) startingReason(s int, r *slotRun) string {
	switch {
	case r == nil:
		if why, ok := m.ended[s]; ok {
			if at := m.restartAt[s]; time.Now().Before(at) {
				return fmt.Sprintf("slot %d: starting again in %s: %s", s, time.Until(at).Round(100*time.Millisecond), why)
			}
		}
		return fmt.Sprintf("slot %d: starting", s)
	case r.role == roleStandby && r.stopping.Load():
		return fmt.Sprintf("slot %d: starting: its standby stops to be promoted", s)
	case r.role == roleStandby:
		return fmt.Sprintf("slot %d: starting: waiting for the previous owner to release it (a standby warms meanwhile)", s)
	case r.stopping.Load():
		return fmt.Sprintf("slot %d: stopping", s)
	}
	return fmt.Sprintf("slot %d: starting for %s: %s", s, time.Since(r.started).Round(100*time.Millisecond), r.startPhase())
}

// metricsHandler merges the member's families with every local slot's,
// each labelled with its slot.
func (m *memberRun) metricsHandler(w http.ResponseWriter, r *http.Request) {
	gs := prometheus.Gatherers{m.proms.Registry}
	m.mu.Lock()
	for s, run := range m.slots {
		if a := run.app.Load(); a != nil {
			gs = append(gs, metrics.SlotGatherer(s, a.Metrics().Registry))
		}
	}
	m.mu.Unlock()
	promhttp.HandlerFor(gs, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError}).ServeHTTP(w, r)
}

// samples feeds telha_partition_*.
func (m *memberRun) samples() []metrics.PartitionSample {
	var owners []ownerAt
	m.mu.Lock()
	out := make([]metrics.PartitionSample, 0, m.n)
	for s := 0; s < m.n; s++ {
		p := metrics.PartitionSample{Slot: s, CheckpointAge: -1}
		if s < len(m.assign) {
			p.Epoch = m.assign[s].Epoch
		}
		if _, broke := m.broken[s]; broke {
			p.Role = metrics.RoleBroken
		}
		if r := m.slots[s]; r != nil {
			p.Role = r.role
			switch r.role {
			case roleOwner:
				if a := r.app.Load(); a != nil {
					p.Applied = a.ChangelogLast()
					owners = append(owners, ownerAt{len(out), a})
				}
			case roleStandby:
				p.Applied = r.applied.Load()
				if o := m.ownerApplied(s); o > p.Applied {
					p.Lag = o - p.Applied
				}
			}
		}
		out = append(out, p)
	}
	m.mu.Unlock()
	// A slot's status takes its changelog's lock, held through a
	// checkpoint's upload: never while holding m.mu.
	for _, o := range owners {
		st := o.app.ChangelogStatus()
		out[o.i].StartSeconds = st.StartTook.Seconds()
		if !st.LastAt.IsZero() {
			out[o.i].CheckpointAge = time.Since(st.LastAt).Seconds()
		}
	}
	return out
}

// ownerAt is a slot whose status is read after m.mu is released, and the
// index of the row it fills (or its slot: localOwners).
type ownerAt struct {
	i   int
	app *slot.Slot
}

// localOwners are the serving slots this member owns, by
// slot, lowest first.
func (m *memberRun) localOwners() []ownerAt {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []ownerAt
	for s := 0; s < m.n; s++ {
		if r := m.slots[s]; r != nil && r.role == roleOwner && !r.stopping.Load() {
			if a := r.app.Load(); a != nil {
				out = append(out, ownerAt{s, a})
			}
		}
	}
	return out
}

// host is what the status page of this member's slots shows of the
// member (Options.Host).
func (m *memberRun) host() *slot.Host {
	return &slot.Host{
		Started: m.started,
		RequestCounts: func() (map[string]float64, error) {
			sum := map[string]float64{}
			for _, o := range m.localOwners() {
				c, err := o.app.RequestCounts()
				if err != nil {
					return nil, err
				}
				for st, n := range c {
					sum[st] += n
				}
			}
			return sum, nil
		},
		StoreBytes: func() uint64 { return dirSize(filepath.Join(m.cfg.DataDir, "slots")) },
		Group:      m.group,
		Cards:      func(o *ui.Overview, now time.Time) { slot.FillCards(o, now, m.ownedSlots()) },
		Pause:      memberPause{m},
	}
}

// ownedSlots are the serving slots this member owns, by slot.
func (m *memberRun) ownedSlots() []*slot.Slot {
	var out []*slot.Slot
	for _, o := range m.localOwners() {
		out = append(out, o.app)
	}
	return out
}

// memberPause is the status page's consumer card on a member: it pauses
// and resumes the consumer of every slot the member owns now (a pause is
// the consumer's, on the server: it stays with the slot if the slot
// moves). Its state names the paused consumers when any is paused (the
// card then offers Resume, which resumes them all), else every consumer.
type memberPause struct{ m *memberRun }

func (p memberPause) PauseState() client.PauseState {
	var all, paused []string
	var st client.PauseState
	for _, s := range p.m.ownedSlots() {
		ps := s.Worker().PauseState()
		all = append(all, ps.Consumer)
		if ps.Paused {
			paused = append(paused, ps.Consumer)
			if !st.Paused || ps.Until.Before(st.Until) {
				st.Until = ps.Until // the first to end
			}
			st.Paused = true
		}
	}
	st.Consumer = strings.Join(all, ", ")
	if st.Paused {
		st.Consumer = strings.Join(paused, ", ")
	}
	return st
}

func (p memberPause) Pause(ctx context.Context, until time.Time, by string) (client.PauseState, error) {
	return p.each(func(s *slot.Slot) error {
		_, err := s.Worker().Pause(ctx, until, by)
		return err
	})
}

func (p memberPause) Resume(ctx context.Context, by string) (client.PauseState, error) {
	return p.each(func(s *slot.Slot) error {
		_, err := s.Worker().Resume(ctx, by)
		return err
	})
}

// each calls fn for every owned slot, all of them even when one fails.
func (p memberPause) each(fn func(*slot.Slot) error) (client.PauseState, error) {
	var errs []error
	for _, s := range p.m.ownedSlots() {
		if err := fn(s); err != nil {
			errs = append(errs, fmt.Errorf("slot %d: %w", s.Config().Owner.Index, err))
		}
	}
	return p.PauseState(), errors.Join(errs...)
}

// dirSize is the size of the files under dir (0 when unreadable).
func dirSize(dir string) uint64 {
	var n uint64
	_ = filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if fi, err := d.Info(); err == nil {
				n += uint64(fi.Size())
			}
		}
		return nil
	})
	return n
}

// group is the group as this member sees it, for the status page.
func (m *memberRun) group(page int) *ui.Group {
	// This member's slots first (live; not under m.mu: each slot's
	// registries have their own locks).
	now := time.Now()
	var journals []ui.GroupJournal
	var finished []ui.FinishedJournal
	for _, o := range m.localOwners() {
		if o.i != page { // the page's own slot has its live rows
			for _, j := range o.app.Journals() {
				journals = append(journals, ui.GroupJournal{Slot: o.i, Member: m.id, Tenant: j.Tenant, NodeID: j.NodeID, RequestID: j.RequestID,
					State: j.State, EdgesDone: j.EdgesDone, EdgesTotal: j.EdgesTotal, AsOf: now})
			}
		}
		for _, f := range o.app.RecentlyFinished() {
			f.Slot, f.Member = o.i, m.id
			finished = append(finished, f)
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	g := &ui.Group{Member: m.id, Owned: []int{}, Journals: journals,
		FiguresOf: "The figures above are this member's: the requests its slots answered, its uptime, its copies on disk; the queue, consumer and reaper cards sum up the slots it owns (a pause or resume acts on each of their consumers), and each slot's own are in the slots table."}
	owns := map[string][]int{}
	for _, a := range m.assign {
		if a.Owner != "" {
			owns[a.Owner] = append(owns[a.Owner], a.Slot)
		}
		if a.Owner == m.id {
			g.Owned = append(g.Owned, a.Slot)
		}
	}
	for _, mm := range m.members {
		g.Members = append(g.Members, ui.MemberRow{ID: mm.ID, URL: mm.URL, Here: mm.ID == m.id, Leaving: mm.Leaving,
			Owns: fmt.Sprint(owns[mm.ID]), Started: mm.Started, Renewed: mm.Renewed})
		if mm.ID == m.id {
			continue
		}
		for _, j := range mm.Journals {
			g.Journals = append(g.Journals, ui.GroupJournal{Slot: j.Slot, Member: mm.ID, Tenant: j.Tenant, NodeID: j.NodeID, RequestID: j.RequestID,
				State: j.State, EdgesDone: j.EdgesDone, EdgesTotal: j.EdgesTotal, AsOf: mm.Renewed})
		}
		for _, f := range mm.Finished {
			finished = append(finished, ui.FinishedJournal{Slot: f.Slot, Member: mm.ID, Tenant: f.Tenant, NodeID: f.NodeID, RequestID: f.RequestID,
				Outcome: f.Outcome, EdgesTombstoned: f.EdgesTombstoned, Attempts: f.Attempts, Finished: f.Finished,
				Took: time.Duration(f.TookSeconds * float64(time.Second))})
		}
	}
	// A slot that moved may be listed by its old owner's record and by
	// its new owner: one row a journal.
	slices.SortStableFunc(finished, func(a, b ui.FinishedJournal) int { return b.Finished.Compare(a.Finished) })
	seen := map[string]bool{}
	for _, f := range finished {
		key := fmt.Sprint(f.Tenant, "/", f.NodeID, "/", f.RequestID, "/", f.Finished.UnixNano())
		if !seen[key] {
			seen[key] = true
			g.Finished = append(g.Finished, f)
		}
	}
	for i := len(m.events) - 1; i >= 0; i-- {
		e := m.events[i]
		g.Events = append(g.Events, ui.EventRow{At: e.At, Kind: e.Kind, What: e.What})
	}
	return g
}

// ownerApplied is the applied sequence slot s's owner last reported
// (m.mu held).
func (m *memberRun) ownerApplied(s int) uint64 {
	if s >= len(m.assign) {
		return 0
	}
	for _, mm := range m.members {
		if mm.ID == m.assign[s].Owner {
			return mm.Slots[s].Applied
		}
	}
	return 0
}

// SlotView is one slot in the dynamic /v1/partitions.
type SlotView struct {
	Slot       int               `json:"slot"`
	Partitions []int             `json:"partitions"`
	Owner      string            `json:"owner"`
	Epoch      uint64            `json:"epoch"`
	Standbys   []string          `json:"standbys"`
	Prev       string            `json:"prev,omitempty"`
	Changed    time.Time         `json:"changed"`
	Applied    uint64            `json:"owner_applied"`
	Ready      bool              `json:"owner_ready"`
	Standby    map[string]uint64 `json:"standby_applied"`
	Lag        map[string]uint64 `json:"standby_lag"`
	// Reads: the standbys tailing the changelog, which answer the slot's
	// entity reads at their applied position while no owner answers.
	Reads      []string        `json:"standby_reads"`
	Checkpoint *CheckpointView `json:"last_checkpoint,omitempty"`
}

// CheckpointView is a slot's last checkpoint, as its owner (this member)
// took it.
type CheckpointView struct {
	Name string    `json:"name"`
	Seq  uint64    `json:"seq"`
	At   time.Time `json:"at"`
}

func (m *memberRun) partitions(w http.ResponseWriter, _ *http.Request) {
	var owners []ownerAt
	m.mu.Lock()
	byID := map[string]member.Member{}
	var ms []map[string]any
	for _, mm := range m.members {
		byID[mm.ID] = mm
		broken := mm.Broken
		if broken == nil {
			broken = []int{}
		}
		ms = append(ms, map[string]any{"id": mm.ID, "url": mm.URL, "leaving": mm.Leaving, "renewed": mm.Renewed, "started": mm.Started, "broken": broken})
	}
	events := append([]MemberEvent{}, m.events...)
	views := make([]SlotView, 0, len(m.assign))
	owned := []int{}
	for _, a := range m.assign {
		v := SlotView{Slot: a.Slot, Owner: a.Owner, Epoch: a.Epoch, Standbys: a.Standbys, Prev: a.Prev, Changed: a.Changed,
			Standby: map[string]uint64{}, Lag: map[string]uint64{}, Reads: []string{}}
		for p := a.Slot; p < m.cfg.Partitions; p += m.n {
			v.Partitions = append(v.Partitions, p)
			if a.Owner == m.id {
				owned = append(owned, p)
			}
		}
		st := byID[a.Owner].Slots[a.Slot]
		v.Applied, v.Ready = st.Applied, st.Ready && st.Role == roleOwner
		for _, sb := range a.Standbys {
			if ss, ok := byID[sb].Slots[a.Slot]; ok && ss.Role == roleStandby {
				v.Standby[sb] = ss.Applied
				if ss.Ready {
					v.Reads = append(v.Reads, sb)
				}
				if v.Applied > ss.Applied {
					v.Lag[sb] = v.Applied - ss.Applied
				} else {
					v.Lag[sb] = 0
				}
			}
		}
		if r := m.slots[a.Slot]; r != nil && r.role == roleOwner {
			if app := r.app.Load(); app != nil {
				owners = append(owners, ownerAt{len(views), app})
			}
		}
		views = append(views, v)
	}
	m.mu.Unlock()
	for _, o := range owners { // outside m.mu: see samples
		if cs := o.app.ChangelogStatus(); !cs.LastAt.IsZero() {
			views[o.i].Checkpoint = &CheckpointView{Name: cs.LastCheckpoint.Name, Seq: cs.LastCheckpoint.Seq, At: cs.LastAt.UTC()}
		}
	}
	slices.Sort(owned)
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{
		"mode": "dynamic", "member": m.id, "partitions": m.cfg.Partitions, "replicas": m.n, "slots": m.n,
		"owned": owned, "rule": fmt.Sprintf("slot = partition %% %d; each slot's owner, epoch and standbys are in the KV bucket %s", m.n, member.OwnersBucket(m.n)),
		"members": ms, "assignments": views, "events": events,
	})
}

// slotRows is every slot of the group for the status page.
func (m *memberRun) slotRows() []ui.SlotRow {
	var owners []ownerAt
	m.mu.Lock()
	byID := map[string]member.Member{}
	for _, mm := range m.members {
		byID[mm.ID] = mm
	}
	rows := make([]ui.SlotRow, 0, len(m.assign))
	for _, a := range m.assign {
		st := byID[a.Owner].Slots[a.Slot]
		row := ui.SlotRow{Slot: a.Slot, Owner: a.Owner, Epoch: a.Epoch, Ready: st.Ready && st.Role == roleOwner, Applied: st.Applied}
		var parts, sbs []string
		for p := a.Slot; p < m.cfg.Partitions; p += m.n {
			parts = append(parts, strconv.Itoa(p))
		}
		for _, sb := range a.Standbys {
			ss, ok := byID[sb].Slots[a.Slot]
			switch {
			case !ok || ss.Role != roleStandby:
				sbs = append(sbs, sb+" (starting)")
			case ss.Applied >= st.Applied:
				sbs = append(sbs, sb+" (lag 0)")
			default:
				sbs = append(sbs, fmt.Sprintf("%s (lag %d)", sb, st.Applied-ss.Applied))
			}
		}
		row.Partitions, row.Standbys = strings.Join(parts, ", "), strings.Join(sbs, ", ")
		if r := m.slots[a.Slot]; r != nil && r.role == roleOwner {
			if app := r.app.Load(); app != nil {
				owners = append(owners, ownerAt{len(rows), app})
			}
		}
		rows = append(rows, row)
	}
	m.mu.Unlock()
	now := time.Now()
	for _, o := range owners { // outside m.mu: see samples
		if cs := o.app.ChangelogStatus(); !cs.LastAt.IsZero() {
			rows[o.i].Checkpoint = fmt.Sprintf("seq %d, %s ago", cs.LastCheckpoint.Seq, time.Since(cs.LastAt).Round(time.Second))
		}
		rows[o.i].Queue, rows[o.i].Reaper = o.app.Summary(now)
	}
	return rows
}
