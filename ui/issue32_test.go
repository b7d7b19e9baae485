package ui_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/telha/telha-cascade/api"
	"github.com/telha/telha-cascade/queue/client"
	"github.com/telha/telha-cascade/ui"
)

// The status page after issue 32 item 7 and issue 30, through its handler.

var (
	resultRowRE = regexp.MustCompile(`<tr class="result" data-request="([^"]+)"`)
	letterRowRE = regexp.MustCompile(`<tr class="letter" id="letter-(\d+)"`)
	recentNext  = regexp.MustCompile(`id="recent-next" href="([^"]+)"`)
	dlqNext     = regexp.MustCompile(`id="dlq-next" href="([^"]+)"`)
)

// publishResults publishes n results of tenant, statuses from status(i).
func (w *world) publishResults(tenant string, n int, status func(i int) string) {
	w.t.Helper()
	for i := 0; i < n; i++ {
		b, _ := json.Marshal(client.Result{RequestID: fmt.Sprintf("%s-%04d", tenant, i), Tenant: tenant, Status: status(i), Op: "put_node", ID: uuid.NewString()})
		if _, err := w.js.Publish(context.Background(), "telha.res."+tenant, b); err != nil {
			w.t.Fatal(err)
		}
	}
}

func okStatus(int) string { return client.StatusOK }

// TestOlderOnlyWhenThereIsSomethingOlder (issue 32 item 7.3): the recent
// requests and the dead letters offer "Older" only when an older one
// exists: not for exactly a page (the client's Next then points below the
// page's last row, at nothing of the tenant's), yes for a page and one,
// whose next page holds that one and no "Older"; a status filter whose
// bounded scan stopped with 6 matches does not call its link "Older".
func TestOlderOnlyWhenThereIsSomethingOlder(t *testing.T) {
	for _, n := range []int{ui.ResultsPageSize, ui.ResultsPageSize + 1} {
		t.Run(fmt.Sprintf("results/%d", n), func(t *testing.T) {
			w := newWorld(t, worldOpts{mode: api.AuthLoopback, nats: true, extra: func(w *world, o *ui.Options) {
				o.Results = client.ResultStream{JS: mustJS(t, w.nc), Stream: "TELHA_RES", Prefix: "telha"}
			}})
			w.publishResults("beta", 3, okStatus) // older messages of another tenant
			w.publishResults("acme", n, okStatus)
			body := w.do(req{path: "/ui/requests?tenant=acme"}).Body.String()
			rows := resultRowRE.FindAllStringSubmatch(body, -1)
			next := recentNext.FindStringSubmatch(body)
			if len(rows) != ui.ResultsPageSize {
				t.Fatalf("%d results: the first page shows %d, want %d", n, len(rows), ui.ResultsPageSize)
			}
			if n == ui.ResultsPageSize {
				if next != nil {
					t.Fatalf("exactly a page of results (%d) offers Older: %s", n, next[1])
				}
				return
			}
			if next == nil {
				t.Fatalf("%d results, a page of %d: no Older", n, ui.ResultsPageSize)
			}
			body = w.do(req{path: unescape(next[1])}).Body.String()
			rows2 := resultRowRE.FindAllStringSubmatch(body, -1)
			if len(rows2) != 1 || rows2[0][1] != "acme-0000" || recentNext.MatchString(body) {
				t.Fatalf("the older page: %v, Older %v; want acme-0000 alone and no Older", rows2, recentNext.MatchString(body))
			}
		})
	}
	for _, n := range []int{ui.DLQPageSize, ui.DLQPageSize + 1} {
		t.Run(fmt.Sprintf("dead-letters/%d", n), func(t *testing.T) {
			w := newWorld(t, worldOpts{mode: api.AuthLoopback, nats: true})
			w.deadLetter("beta", []byte(`{"request_id":"b"}`), map[string]string{"Telha-Reason": "invalid"})
			for i := 0; i < n; i++ {
				w.deadLetter("acme", []byte(fmt.Sprintf(`{"request_id":"a-%d"}`, i)), map[string]string{"Telha-Reason": "invalid"})
			}
			body := w.do(req{path: "/ui/dlq?tenant=acme"}).Body.String()
			rows := letterRowRE.FindAllStringSubmatch(body, -1)
			next := dlqNext.FindStringSubmatch(body)
			if len(rows) != ui.DLQPageSize {
				t.Fatalf("%d dead letters: the first page shows %d", n, len(rows))
			}
			if strings.Count(body, `name="seq"`) != 2*ui.DLQPageSize {
				t.Fatalf("the bulk forms carry %d seqs, want the page's %d each", strings.Count(body, `name="seq"`)/2, ui.DLQPageSize)
			}
			if n == ui.DLQPageSize {
				if next != nil {
					t.Fatalf("exactly a page of dead letters (%d) offers Older: %s", n, next[1])
				}
				return
			}
			if next == nil {
				t.Fatalf("%d dead letters, a page of %d: no Older", n, ui.DLQPageSize)
			}
			body = w.do(req{path: unescape(next[1])}).Body.String()
			if rows := letterRowRE.FindAllStringSubmatch(body, -1); len(rows) != 1 || dlqNext.MatchString(body) {
				t.Fatalf("the older page: %d letters, Older %v; want 1 and no Older", len(rows), dlqNext.MatchString(body))
			}
		})
	}
	t.Run("status-filter", func(t *testing.T) {
		w := newWorld(t, worldOpts{mode: api.AuthLoopback, nats: true, extra: func(w *world, o *ui.Options) {
			o.Results = client.ResultStream{JS: mustJS(t, w.nc), Stream: "TELHA_RES", Prefix: "telha"}
		}})
		// 6 not_found among the newest of 1,200 results: the filter's scan
		// stops at its bound before the stream's start.
		w.publishResults("acme", 1200, func(i int) string {
			if i >= 1190 && i%2 == 0 || i == 1199 {
				return client.StatusNotFound
			}
			return client.StatusOK
		})
		body := w.do(req{path: "/ui/requests?status=not_found"}).Body.String()
		if rows := resultRowRE.FindAllStringSubmatch(body, -1); len(rows) != 6 {
			t.Fatalf("not_found: %d rows, want 6", len(rows))
		}
		if m := recentNext.FindStringSubmatch(body); m != nil {
			t.Fatalf("6 results of a filter offer Older (%s): nothing older is known", m[1])
		}
		m := regexp.MustCompile(`id="recent-search" href="([^"]+)"`).FindStringSubmatch(body)
		if m == nil || !strings.Contains(body, "not searched yet") {
			t.Fatal("the filter's bounded scan does not offer to search further back")
		}
		u, _ := url.Parse(unescape(m[1]))
		if u.Query().Get("status") != "not_found" || u.Query().Get("before") == "" {
			t.Fatalf("search further: %s, want the filter and a cursor", m[1])
		}
		// Searching on finds nothing older (all are ok) and says so.
		for i := 0; i < 5 && m != nil; i++ {
			body = w.do(req{path: unescape(m[1])}).Body.String()
			if rows := resultRowRE.FindAllStringSubmatch(body, -1); len(rows) != 0 || recentNext.MatchString(body) {
				t.Fatalf("searching further: %d rows, Older %v", len(rows), recentNext.MatchString(body))
			}
			m = regexp.MustCompile(`id="recent-search" href="([^"]+)"`).FindStringSubmatch(body)
		}
		if m != nil {
			t.Fatal("the search never reached the stream's start")
		}
	})
}

// TestBytes (issue 32 item 7.2): the overview's store size and disk free
// in B, KB, MB, GB with three significant digits: a 38 KB store is not
// "0.0 MB".
func TestBytes(t *testing.T) {
	for _, c := range []struct {
		n    uint64
		want string
	}{
		{0, "0 B"},
		{1, "1 B"},
		{999, "999 B"},
		{1000, "1.00 KB"},
		{1234, "1.23 KB"},
		{9994, "9.99 KB"},
		{9995, "10.0 KB"},
		{38_400, "38.4 KB"},
		{99_949, "99.9 KB"},
		{99_950, "100 KB"},
		{512_000, "512 KB"},
		{999_499, "999 KB"},
		{999_500, "1.00 MB"},
		{1_000_000, "1.00 MB"},
		{38_000_000, "38.0 MB"},
		{1_230_000_000, "1.23 GB"},
		{512_000_000_000, "512 GB"},
		{999_999_999_999, "1.00 TB"},
		{4_000_000_000_000, "4.00 TB"},
		{1<<64 - 1, "18.4 EB"},
	} {
		if got := ui.Bytes(c.n); got != c.want {
			t.Errorf("Bytes(%d) = %q, want %q", c.n, got, c.want)
		}
	}
}

// TestJournalETAFromObservedProgress (issue 32 item 7.4): a journal that
// waits 1 s (its slot, its count of edges), then applies 9,000 edges at
// 2,000 a second, finishing 5.5 s after it was written: the ETA is
// "estimating" until progress has been seen over a second, then the
// edges left at the rate observed between samples (3 s at 2.5 s, not the
// 5 s that the edges done over the journal's age gave); a stall reads no
// ETA; progress going back starts over; a journal no longer listed is
// forgotten.
func TestJournalETAFromObservedProgress(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	tx := "2026-01-01T00:00:00.000000Z"
	j := api.Journal{Tenant: "acme", NodeID: uuid.NewString(), RequestID: "r1", TxTime: &tx, EdgesTotal: 9000, State: "applying"}
	done := func(at time.Duration) int64 { // the journal's progress at t0+at
		if at <= time.Second {
			return 0
		}
		return min(int64((at-time.Second).Seconds()*2000), 9000)
	}
	p := ui.NewProgress()
	look := func(at time.Duration) (float64, time.Duration, bool) {
		j.EdgesDone = done(at)
		j.AgeSeconds = at.Seconds()
		p.Observe(t0.Add(at), []api.Journal{j})
		return p.Estimate(j)
	}
	// The worker samples every second from 0.5 s on.
	if _, _, ok := look(500 * time.Millisecond); ok {
		t.Fatal("an estimate from one sample without progress")
	}
	if _, _, ok := look(1500 * time.Millisecond); ok {
		t.Fatal("an estimate from the first sample with progress (1,000 edges in 1.5 s of age)")
	}
	rate, eta, ok := look(2500 * time.Millisecond)
	if !ok || math.Abs(rate-2000) > 1 || (eta-3*time.Second).Abs() > 10*time.Millisecond {
		t.Fatalf("at 2.5 s (3,000 of 9,000 done): rate %.0f/s, ETA %s, ok %v; want 2,000/s and 3s", rate, eta, ok)
	}
	if old := float64(9000-3000) / (float64(3000) / 2.5); old < 4.9 {
		t.Fatalf("the age's estimate is %.1f s: the test no longer shows the difference", old)
	}
	for at := 3500 * time.Millisecond; at <= 5500*time.Millisecond; at += time.Second {
		rate, eta, ok = look(at)
		want := t0.Add(5500 * time.Millisecond).Sub(t0.Add(at))
		if !ok || math.Abs(rate-2000) > 1 || (eta-want).Abs() > 10*time.Millisecond {
			t.Fatalf("at %s: rate %.0f, ETA %s, want %s", at, rate, eta, want)
		}
	}

	// A stall: no progress over the window, no ETA.
	j2 := api.Journal{Tenant: "acme", NodeID: uuid.NewString(), RequestID: "r2", EdgesTotal: 100, EdgesDone: 40, State: "failing"}
	for s := 0; s <= 12; s++ {
		p.Observe(t0.Add(time.Duration(s)*time.Second), []api.Journal{j2})
	}
	if rate, eta, ok := p.Estimate(j2); !ok || rate != 0 || eta >= 0 {
		t.Fatalf("stalled for 12 s: rate %.1f, ETA %s, ok %v; want 0 and none", rate, eta, ok)
	}
	// Progress going back (an attempt counting again) starts over.
	j2.EdgesDone = 10
	p.Observe(t0.Add(13*time.Second), []api.Journal{j2})
	if _, _, ok := p.Estimate(j2); ok {
		t.Fatal("an estimate across progress that went back")
	}
	// j is no longer listed: forgotten.
	if _, _, ok := p.Estimate(j); ok {
		t.Fatal("a journal no longer listed keeps its samples")
	}
}

// TestJournalsPageETA: the journals page shows "estimating" for an
// applying journal seen once, then the ETA from the worker's samples
// (Options.Progress).
func TestJournalsPageETA(t *testing.T) {
	j := api.Journal{Tenant: "acme", NodeID: uuid.NewString(), RequestID: "r1", EdgesTotal: 10_000, EdgesDone: 1000, AgeSeconds: 40, State: "applying"}
	prog := ui.NewProgress()
	w := newWorld(t, worldOpts{mode: api.AuthLoopback, extra: func(w *world, o *ui.Options) {
		o.Journals = func() []api.Journal { return []api.Journal{j} }
		o.Progress = prog
	}})
	cells := regexp.MustCompile(`<td class="num rate">([^<]*)</td><td class="eta">([^<]*)</td>`)
	body := w.do(req{path: "/ui/journals"}).Body.String()
	if m := cells.FindStringSubmatch(body); m == nil || m[1] != "estimating" || m[2] != "estimating" {
		t.Fatalf("a journal seen once: rate and ETA %q, want estimating", m)
	}
	// Another journal: the worker's sampler saw 1,000 edges done 2 s ago
	// and 3,000 1 s ago: 2,000/s; the page sees 5,000 of 10,000 now (the
	// age's rate, 5,000 over 40 s, would read 1m0s).
	now := time.Now()
	j.RequestID, j.EdgesDone = "r2", 1000
	prog.Observe(now.Add(-2*time.Second), []api.Journal{j})
	j.EdgesDone = 3000
	prog.Observe(now.Add(-time.Second), []api.Journal{j})
	j.EdgesDone = 5000
	body = w.do(req{path: "/ui/journals"}).Body.String()
	// The page adds its own look at the time it answers, a little after
	// now (1,999/s on a loaded CI): about 2,000/s, not the age's 125/s.
	m := cells.FindStringSubmatch(body)
	if m == nil {
		t.Fatalf("no rate and ETA on the page:\n%s", body)
	}
	rate, err := strconv.ParseFloat(strings.TrimSuffix(strings.ReplaceAll(m[1], ",", ""), "/s"), 64)
	if err != nil || rate < 1900 || rate > 2000 || (m[2] != "3s" && m[2] != "2s") {
		t.Fatalf("rate and ETA %q, want about 2,000/s and 2-3s", m)
	}
}
