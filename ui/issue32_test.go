package ui_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"regexp"
	"strings"
	"testing"

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
