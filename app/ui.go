package app

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/telha/telha-cascade/api"
	"github.com/telha/telha-cascade/queue/client"
	"github.com/telha/telha-cascade/reaper"
	"github.com/telha/telha-cascade/ui"
)

// The status page (package ui) on the read API's address: its figures and
// its dead letters come from here.

// uiHandler is the status page, or nil before the store and the worker
// are up.
func (a *App) uiHandler() http.Handler {
	qc := a.worker.Config()
	started := time.Now()
	rates := &rateWindow{}
	dlq := client.DeadLetterStream{JS: a.worker.JetStream(), Stream: qc.DLQStream, Prefix: qc.Prefix}
	return ui.Handler(ui.Options{Store: a.store, Auth: a.auth, Journals: a.journals, Logger: a.log,
		DeadLetters: dlq,
		Overview: func(ctx context.Context, p api.Principal) ui.Overview {
			o := ui.Overview{Pending: "-", AckPending: "-", DeadLetters: "-", ReaperResult: "-", ReaperLast: "not yet",
				Partitions: a.partitions(), Build: fmt.Sprintf("telha-cascade %s (revision %s)", Build.Version, Build.Revision)}
			if !p.Sees("*") {
				// A token of some tenants: their journals and dead letters
				// only, none of the worker's own figures (they count every
				// tenant's requests).
				o.Scoped = true
				for _, j := range a.journals() {
					if p.Sees(j.Tenant) {
						o.Journals++
					}
				}
				if n, err := dlq.Count(ctx, p.Tenants); err == nil {
					o.DeadLetters = fmt.Sprint(n)
				}
				return o
			}
			secs := time.Since(started).Seconds()
			if fams, err := a.metrics.Registry.Gather(); err == nil {
				byStatus := map[string]float64{}
				for _, f := range fams {
					switch f.GetName() {
					case "telha_requests_total":
						for _, m := range f.GetMetric() {
							byStatus[label(m, "status")] += m.GetCounter().GetValue()
						}
					}
				}
				// Rates over the last minute: against the oldest sample of
				// the last 60 s that the page's earlier loads took (since
				// start when there is none yet).
				now := time.Now()
				base, since := rates.window(now, byStatus)
				if base == nil {
					base, since = map[string]float64{}, now.Sub(started)
				}
				secs = max(since.Seconds(), 1e-3)
				o.RateWindow = since.Round(time.Second).String()
				var total, baseTotal float64
				for st, n := range byStatus {
					if n > 0 {
						o.RequestsTotal += n
						o.ByStatus = append(o.ByStatus, ui.StatusCount{Status: st, Count: n, PerSec: (n - base[st]) / secs})
					}
					total += n
					baseTotal += base[st]
				}
				o.RequestsPerSec = (total - baseTotal) / secs
			}
			if st := a.worker.Stats(); st != nil {
				o.Pending, o.AckPending = fmt.Sprint(st.Pending), fmt.Sprint(st.AckPending)
			}
			if lr := a.lastRun.Load(); lr != nil {
				o.ReaperResult, o.ReaperLast = "ok", lr.at.UTC().Format(time.RFC3339)+fmt.Sprintf(", resumed %d, took %s", lr.res.Resumed, lr.res.Took.Round(time.Millisecond))
				switch {
				case lr.res.Skipped:
					o.ReaperResult = "skipped"
				case lr.res.Err != nil:
					o.ReaperResult, o.ReaperLast = "error", o.ReaperLast+": "+lr.res.Err.Error()
				}
			}
			sum := a.reaper.Summarize()
			o.Journals, o.Poison = sum.InFlight, sum.Poison
			if s, err := a.worker.JetStream().Stream(ctx, qc.DLQStream); err == nil {
				if info, err := s.Info(ctx); err == nil {
					o.DeadLetters = fmt.Sprint(info.State.Msgs)
				}
			}
			if free, err := a.store.DiskFree(); err == nil {
				o.DiskFree = fmt.Sprintf("%.1f GB", float64(free)/1e9)
			}
			o.StoreSize = fmt.Sprintf("%.1f MB", float64(a.store.Engine().DiskUsage())/1e6)
			return o
		},
	})
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
func (a *App) partitions() api.Partitions {
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

// rateWindow keeps the request counts the overview saw over the last two
// minutes, to show rates over the last minute.
type rateWindow struct {
	mu      sync.Mutex
	samples []rateSample
}

type rateSample struct {
	at     time.Time
	counts map[string]float64
}

// window records counts at now and returns the oldest sample of the last
// 60 s before it (nil when there is none) and how long ago it was taken.
func (w *rateWindow) window(now time.Time, counts map[string]float64) (map[string]float64, time.Duration) {
	w.mu.Lock()
	defer w.mu.Unlock()
	keep := w.samples[:0]
	for _, s := range w.samples {
		if now.Sub(s.at) <= 2*time.Minute {
			keep = append(keep, s)
		}
	}
	w.samples = keep
	var base *rateSample
	for i := range w.samples {
		if now.Sub(w.samples[i].at) <= time.Minute {
			base = &w.samples[i]
			break
		}
	}
	w.samples = append(w.samples, rateSample{at: now, counts: counts})
	if base == nil || now.Sub(base.at) < time.Second {
		return nil, 0
	}
	return base.counts, now.Sub(base.at)
}
