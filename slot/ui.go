package slot

import (
	"context"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"sync"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/telha/telha-cascade/api"
	"github.com/telha/telha-cascade/queue/client"
	"github.com/telha/telha-cascade/reaper"
	"github.com/telha/telha-cascade/storage"
	"github.com/telha/telha-cascade/ui"
)

// The status page (package ui) on the read API's address: its figures and
// its dead letters come from here.

// uiHandler is the status page, or nil before the store and the worker
// are up. It starts the page's sampler (the request counts every 5 s for
// the rates over the last minute, the journals every second for the
// recent history), which ends with the HTTP servers (httpCtx).
func (a *Slot) uiHandler() http.Handler {
	qc := a.worker.Config()
	started := time.Now()
	counts, size := a.RequestCounts, a.store.Engine().DiskUsage
	var group func() *ui.Group
	if h := a.host; h != nil {
		// A member's page: the member's figures (every slot it runs),
		// whichever of its slots serves the page.
		started, counts, size = h.Started, h.RequestCounts, h.StoreBytes
		group = func() *ui.Group { return h.Group(a.cfg.Owner.Index) }
	}
	smp := &uiSampler{rates: &rateWindow{}, history: &journalHistory{}, progress: ui.NewProgress(), counts: counts}
	base, err := counts()
	if err != nil || a.host == nil {
		base = map[string]float64{} // a worker's counters start at 0
	}
	smp.rates.add(time.Now(), base)
	go smp.run(a.httpCtx, a)
	dlq := client.DeadLetterStream{JS: a.worker.JetStream(), Stream: qc.DLQStream, Prefix: qc.Prefix}
	var pause ui.Pauser = a.worker
	if a.host != nil && a.host.Pause != nil {
		pause = a.host.Pause // a member's page: the consumers of every slot it owns
	}
	h := ui.Handler(ui.Options{Store: a.store, Auth: a.auth, Journals: a.Journals, Logger: a.log,
		DeadLetters: dlq, Pause: pause, Progress: smp.progress, Group: group,
		Results: client.ResultStream{JS: a.worker.JetStream(), Stream: qc.ResStream, Prefix: qc.Prefix},
		Finished: func() []ui.FinishedJournal {
			smp.history.observe(a, time.Now()) // what finished since the last tick, too
			return smp.history.list()
		},
		Overview: func(ctx context.Context, p api.Principal) ui.Overview {
			o := ui.Overview{Pending: "-", AckPending: "-", OldestPending: "-", DeadLetters: "-", ReaperResult: "-", ReaperLast: "not yet",
				Partitions: a.partitions(), Build: fmt.Sprintf("telha-cascade %s (revision %s)", a.opts.Build.Version, a.opts.Build.Revision)}
			if a.slotView != nil {
				o.Slots = a.slotView()
			}
			if group != nil && p.Sees("*") {
				o.Group = group()
			}
			if !p.Sees("*") {
				// A token of some tenants: their journals and dead letters
				// only, none of the worker's own figures (they count every
				// tenant's requests).
				o.Scoped = true
				for _, j := range a.Journals() {
					if p.Sees(j.Tenant) {
						o.Journals++
					}
				}
				if n, err := dlq.Count(ctx, p.Tenants); err == nil {
					o.DeadLetters = ui.Num(n)
				}
				return o
			}
			now := time.Now()
			o.Uptime = roundUptime(now.Sub(started))
			o.NATSOK = a.nc.IsConnected()
			o.NATS = strings.ToLower(a.nc.Status().String())
			if o.NATSOK {
				o.NATS = "connected to " + a.nc.ConnectedUrlRedacted()
			}
			if counts, err := counts(); err == nil {
				// Rates over the last minute, from the sampler's ring (a
				// sample every 5 s): against the sample nearest a minute
				// ago; since start while the worker is younger.
				base, at := smp.rates.base(now)
				since := now.Sub(at)
				secs := max(since.Seconds(), 1e-3)
				o.RateWindow = "minute"
				if since < 55*time.Second {
					o.RateWindow, o.RateNote = since.Round(time.Second).String(), "since the worker started"
					if a.host != nil {
						o.RateNote = "since this slot began serving the page"
					}
				}
				var total, baseTotal float64
				for st, n := range counts {
					if n > 0 {
						o.RequestsTotal += n
						o.ByStatus = append(o.ByStatus, ui.StatusCount{Status: st, Count: n, PerSec: max(n-base[st], 0) / secs})
					}
					total += n
					baseTotal += base[st]
				}
				sort.Slice(o.ByStatus, func(i, j int) bool { return o.ByStatus[i].Status < o.ByStatus[j].Status })
				o.RequestsPerSec = max(total-baseTotal, 0) / secs
			}
			if a.host != nil && a.host.Cards != nil {
				a.host.Cards(&o, now) // a member's page: every slot it owns
			} else {
				FillCards(&o, now, []*Slot{a})
			}
			if s, err := a.worker.JetStream().Stream(ctx, qc.DLQStream); err == nil {
				if info, err := s.Info(ctx); err == nil {
					o.DeadLetters = ui.Num(info.State.Msgs)
				}
			}
			if free, err := a.store.DiskFree(); err == nil {
				o.DiskFree = ui.Bytes(free)
			}
			o.StoreSize = ui.Bytes(size())
			return o
		},
	})
	return &uiPage{Handler: h, sampler: smp}
}

// FillCards fills the overview's queue, reaper and journal cards with the
// figures of slots: a static worker's one, or every slot a member owns
// (Host.Cards). Queue figures are summed, the oldest pending is the
// oldest of any, and the reaper card says "error" when any slot's last
// pass failed, naming each slot's last pass when there are several.
func FillCards(o *ui.Overview, now time.Time, slots []*Slot) {
	var pending, ack uint64
	var oldest, asOf time.Time
	read := false
	var runs []string
	errs, skipped, ran := 0, 0, 0
	for _, a := range slots {
		if st := a.worker.Stats(); st != nil {
			read = true
			pending, ack = pending+st.Pending, ack+st.AckPending
			if !st.Oldest.IsZero() && (oldest.IsZero() || st.Oldest.Before(oldest)) {
				oldest = st.Oldest
			}
			if asOf.IsZero() || st.At.Before(asOf) {
				asOf = st.At
			}
		}
		if lr := a.lastRun.Load(); lr != nil {
			ran++
			line := lr.at.UTC().Format(time.RFC3339) + fmt.Sprintf(", resumed %d, took %s", lr.res.Resumed, lr.res.Took.Round(time.Millisecond))
			switch {
			case lr.res.Err != nil:
				errs++
				line += ": " + lr.res.Err.Error()
			case lr.res.Skipped:
				skipped++
			}
			if len(slots) > 1 {
				line = fmt.Sprintf("slot %d: %s", a.cfg.Owner.Index, line)
			}
			runs = append(runs, line)
		}
		sum := a.reaper.Summarize()
		o.Journals, o.Poison = o.Journals+sum.InFlight, o.Poison+sum.Poison
	}
	if read {
		o.Pending, o.AckPending = ui.Num(pending), ui.Num(ack)
		// The oldest read of the slots': the figures are at least as new.
		o.PendingAsOf = fmt.Sprintf("%s (%s ago)", asOf.UTC().Format(time.RFC3339), now.Sub(asOf).Round(time.Second))
		switch {
		case !oldest.IsZero():
			// As telha_queue_oldest_pending_age_seconds: from its
			// stream timestamp to now.
			o.OldestPending = roundUptime(max(now.Sub(oldest), 0))
		case pending == 0 && ack == 0:
			o.OldestPending = "none pending"
		}
	}
	if ran > 0 {
		o.ReaperResult, o.ReaperLast = "ok", strings.Join(runs, "; ")
		switch {
		case errs > 0:
			o.ReaperResult = "error"
		case skipped == ran:
			o.ReaperResult = "skipped"
		}
	}
}

// uiPage is the status page with its sampler (a.uiH holds it), which the
// reaper's hook reaches through uiJournalFinished.
type uiPage struct {
	http.Handler
	sampler *uiSampler
}

// uiJournalFinished records a journal in the status page's recently
// finished list at its finish: the reaper's Hooks.Finished calls it
// (app.go, reaperHooks) after every attempt at a journal, err nil when
// the journal is removed and its receipt rc stored. A journal that starts
// and finishes between two of the sampler's looks (a second apart) is
// listed too (issue 30: the demo's 20,001-edge journal took 0.10 s). A
// finish before the page is up is not recorded.
func (a *Slot) uiJournalFinished(e *storage.JournalEntry, rc storage.Receipt, err error) {
	p := a.uiH.Load()
	if p == nil {
		return
	}
	if page, ok := (*p).(*uiPage); ok && e != nil {
		page.sampler.history.finished(e, rc, err, time.Now())
	}
}

// recentlyFinished is the status page's recently finished journals,
// newest first (none before the page is up): in memory only, as the
// reaper's hook recorded each at its finish (uiJournalFinished), so the
// member's record and page read no store for it.
func (a *Slot) RecentlyFinished() []ui.FinishedJournal {
	p := a.uiH.Load()
	if p == nil {
		return nil
	}
	if page, ok := (*p).(*uiPage); ok {
		return page.sampler.history.list()
	}
	return nil
}

// RequestCounts is telha_requests_total summed by status.
func (a *Slot) RequestCounts() (map[string]float64, error) {
	fams, err := a.metrics.Registry.Gather()
	if err != nil {
		return nil, err
	}
	byStatus := map[string]float64{}
	for _, f := range fams {
		if f.GetName() == "telha_requests_total" {
			for _, m := range f.GetMetric() {
				byStatus[label(m, "status")] += m.GetCounter().GetValue()
			}
		}
	}
	return byStatus, nil
}

// roundUptime is a duration for people: 3d4h5m, 4h5m6s, 5m6s, 6s.
// slotSummary is this slot's queue and reaper in a line each, for a
// member's slots table (the overview's cards are one slot's).
func (a *Slot) Summary(now time.Time) (queue, reaper string) {
	queue, reaper = "-", "not yet"
	if a.worker != nil {
		if st := a.worker.Stats(); st != nil {
			queue = fmt.Sprintf("pending %s, ack pending %s", ui.Num(st.Pending), ui.Num(st.AckPending))
			if !st.Oldest.IsZero() {
				queue += ", oldest " + roundUptime(max(now.Sub(st.Oldest), 0))
			}
		}
		if ps := a.worker.PauseState(); ps.Paused {
			queue = "paused (" + ps.String() + "); " + queue
		}
	}
	if lr := a.lastRun.Load(); lr != nil {
		switch {
		case lr.res.Err != nil:
			reaper = "error at " + lr.at.UTC().Format(time.RFC3339) + ": " + lr.res.Err.Error()
		case lr.res.Skipped:
			reaper = "skipped at " + lr.at.UTC().Format(time.RFC3339)
		default:
			reaper = fmt.Sprintf("ok at %s, resumed %d", lr.at.UTC().Format(time.RFC3339), lr.res.Resumed)
		}
	}
	return queue, reaper
}

func roundUptime(d time.Duration) string {
	d = d.Round(time.Second)
	if days := d / (24 * time.Hour); days > 0 {
		return fmt.Sprintf("%dd%s", days, (d % (24 * time.Hour)).Truncate(time.Minute).String())
	}
	return d.String()
}

// uiSampler samples what the status page shows over time, whether or not
// anyone is looking: the request counts (rates over the last minute) and
// the journals (the recently finished ones).
type uiSampler struct {
	rates    *rateWindow
	history  *journalHistory
	progress *ui.Progress // the journals' progress, for their rate and ETA
	// counts is telha_requests_total by status: the worker's, or the
	// member's (every slot it runs: Host.RequestCounts).
	counts func() (map[string]float64, error)
}

// rateEvery is the rate ring's sampling period.
const rateEvery = 5 * time.Second

func (s *uiSampler) run(ctx context.Context, a *Slot) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	last := time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			s.progress.Observe(now, s.history.observe(a, now))
			if now.Sub(last) >= rateEvery-100*time.Millisecond {
				if counts, err := s.counts(); err == nil {
					s.rates.add(now, counts)
					last = now
				}
			}
		}
	}
}

// reaperRun is the reaper's last pass, for the overview.
type reaperRun struct {
	at  time.Time
	res reaper.RunResult
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// partitions is /v1/partitions' answer.
func (a *Slot) partitions() api.Partitions {
	return api.Partitions{Partitions: a.cfg.Partitions, Replica: a.cfg.Owner.Index, Replicas: a.cfg.Owner.Count,
		Owned: a.cfg.Owner.Partitions(a.cfg.Partitions),
		Rule:  "a tenant's partition is fnv1a32(tenant) % partitions; replica i of N owns the partitions p with p % N == i"}
}

// withUI routes /ui/ to the status page once it is up, the rest to h.
func withUI(h http.Handler, page func() http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/ui" || strings.HasPrefix(r.URL.Path, "/ui/") {
			if r.URL.Path == "/ui" {
				http.Redirect(w, r, "/ui/", http.StatusMovedPermanently)
				return
			}
			if p := page(); p != nil {
				p.ServeHTTP(w, r)
				return
			}
			http.Error(w, "the status page starts with the worker; retry in a moment", http.StatusServiceUnavailable)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// rateWindow is a ring of request counts, a sample every rateEvery, over
// the last two minutes.
type rateWindow struct {
	mu      sync.Mutex
	samples []rateSample
}

type rateSample struct {
	at     time.Time
	counts map[string]float64
}

// add records counts taken at now, and forgets samples older than two
// minutes (the first one, the worker's start, is kept until a sample a
// minute old replaces it as the base).
func (w *rateWindow) add(now time.Time, counts map[string]float64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	keep := w.samples[:0]
	for i, s := range w.samples {
		// Keep the last sample more than a minute old (the base), and the
		// ones after it.
		if i+1 < len(w.samples) && now.Sub(w.samples[i+1].at) > time.Minute {
			continue
		}
		keep = append(keep, s)
	}
	w.samples = append(keep, rateSample{at: now, counts: counts})
}

// base returns the sample the rates at now are over: the newest at least a
// minute before now, else the oldest (the worker's start).
func (w *rateWindow) base(now time.Time) (map[string]float64, time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.samples) == 0 {
		return map[string]float64{}, now
	}
	b := w.samples[0]
	for _, s := range w.samples {
		if now.Sub(s.at) >= time.Minute {
			b = s
		}
	}
	return b.counts, b.at
}

// journalHistory keeps the journals seen finishing, the newest
// finishedKept, in memory. A journal is recorded at its finish by the
// reaper's hook (finished), with its receipt; the sampler's looks (every
// second, and at each view of the page) catch the rest: a journal in the
// list at one look and gone at the next has finished (its receipt says
// how; none: abandoned or poison removed). Each is recorded once.
type journalHistory struct {
	mu   sync.Mutex
	live map[string]seenJournal
	done []finishedJournal // oldest first
	// failed counts the failed attempts the hook saw of journals in
	// flight (at most finishedKept*10 of them).
	failed map[string]int
}

type finishedJournal struct {
	key string // ui.JournalKey
	f   ui.FinishedJournal
}

// finishedKept is how many finished journals the history keeps.
const finishedKept = 100

type seenJournal struct {
	j       api.Journal
	started time.Time
}

// entryJournal is the journal of a registry entry as a.journals lists it
// (its key is the same).
func entryJournal(e *storage.JournalEntry) api.Journal {
	tx := e.J.Tx.Time().Format(storage.TimeLayout)
	return api.Journal{Tenant: e.Scope.Tenant(), NodeID: e.J.NodeID.String(), RequestID: e.J.Prov.RequestID, TxTime: &tx}
}

// recorded reports whether the journal of key is in the list (under mu).
func (h *journalHistory) recorded(key string) bool {
	for i := len(h.done) - 1; i >= 0; i-- {
		if h.done[i].key == key {
			return true
		}
	}
	return false
}

// add records a finished journal, keeping the newest finishedKept (under
// mu).
func (h *journalHistory) add(key string, f ui.FinishedJournal) {
	h.done = append(h.done, finishedJournal{key: key, f: f})
	if n := len(h.done); n > finishedKept {
		h.done = append([]finishedJournal(nil), h.done[n-finishedKept:]...)
	}
}

// finished records journal e at the end of an attempt at it (the reaper's
// Hooks.Finished): err nil, it is done (removed, its receipt rc stored);
// else the attempt failed and the journal stays in flight.
func (h *journalHistory) finished(e *storage.JournalEntry, rc storage.Receipt, err error, now time.Time) {
	j := entryJournal(e)
	key := ui.JournalKey(j)
	h.mu.Lock()
	defer h.mu.Unlock()
	if err != nil {
		if h.failed == nil || len(h.failed) >= finishedKept*10 {
			h.failed = map[string]int{}
		}
		h.failed[key]++
		return
	}
	attempts := h.failed[key] + 1
	delete(h.failed, key)
	if s, ok := h.live[key]; ok {
		attempts = max(attempts, s.j.Failures+1)
		delete(h.live, key) // the next look does not record it again
	}
	if h.recorded(key) {
		return // a look saw it gone first, and found its receipt
	}
	f := ui.FinishedJournal{Tenant: j.Tenant, NodeID: j.NodeID, RequestID: j.RequestID, Finished: now,
		Took: max(now.Sub(e.J.CreatedAt.Time()), 0), Attempts: attempts, Outcome: rc.Status.String(), EdgesTombstoned: rc.EdgesTombstoned}
	if e.J.Quiet {
		f.Outcome = "done (an erase's cascade: the erase answers)" // it stores no receipt
	}
	h.add(key, f)
}

// observe compares the journals now with the last look, and returns them.
func (h *journalHistory) observe(a *Slot, now time.Time) []api.Journal {
	// The list is read under the lock: two observers (the sampler and a
	// page) comparing lists read out of order would report a journal that
	// started between their reads as finished.
	h.mu.Lock()
	defer h.mu.Unlock()
	cur := a.Journals()
	if h.live == nil {
		h.live = map[string]seenJournal{}
	}
	next := make(map[string]seenJournal, len(cur))
	for _, j := range cur {
		k := ui.JournalKey(j)
		s, ok := h.live[k]
		if !ok {
			s.started = now.Add(-time.Duration(j.AgeSeconds * float64(time.Second)))
		}
		s.j = j
		next[k] = s
	}
	for k, s := range h.live {
		if _, ok := next[k]; ok || h.recorded(k) {
			continue
		}
		f := ui.FinishedJournal{Tenant: s.j.Tenant, NodeID: s.j.NodeID, RequestID: s.j.RequestID, Finished: now, Took: now.Sub(s.started),
			Attempts: s.j.Failures + 1, Outcome: "gone (no receipt)"}
		if sc, err := storage.NewScope(s.j.Tenant); err == nil && s.j.RequestID != "" {
			if rc, ok, err := storage.GetReceipt(a.store.Reader(), sc, s.j.RequestID); err == nil && ok {
				f.Outcome, f.EdgesTombstoned = rc.Status.String(), rc.EdgesTombstoned
			}
		}
		if s.j.State == "poison" {
			f.Outcome = "poison, removed"
		}
		h.add(k, f)
	}
	h.live = next
	return cur
}

// list returns the finished journals, newest first.
func (h *journalHistory) list() []ui.FinishedJournal {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]ui.FinishedJournal, 0, len(h.done))
	for i := len(h.done) - 1; i >= 0; i-- {
		out = append(out, h.done[i].f)
	}
	return out
}
