package ui

import (
	"context"
	"fmt"
	"html/template"
	"math"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/telha/telha-cascade/api"
	"github.com/telha/telha-cascade/queue/client"
)

// Issue 23 items 7 to 12: numbers people read, the consumer's pause, the
// recent results, the recently finished journals, and bulk dead-letter
// actions.

// funcs are the templates' helpers.
var funcs = template.FuncMap{
	"num":      Num,
	"reqlink":  requestLink,
	"inc":      func(n int) int { return n + 1 },
	"add":      func(a, b int) int { return a + b },
	"duration": func(d time.Duration) string { return roundDuration(d).String() },
	"statuses": func() []string {
		return []string{client.StatusOK, client.StatusNotFound, client.StatusAlreadyTombstoned, client.StatusEndpointDead,
			client.StatusCascadeInFlight, client.StatusInvalid, client.StatusFailed, client.StatusConflict}
	},
}

// Num formats a count with thousands separators (1234567 → "1,234,567");
// a float with a fraction keeps one decimal.
func Num(v any) string {
	switch x := v.(type) {
	case int:
		return group(strconv.FormatInt(int64(x), 10))
	case int64:
		return group(strconv.FormatInt(x, 10))
	case uint64:
		return group(strconv.FormatUint(x, 10))
	case float64:
		if math.IsNaN(x) || math.IsInf(x, 0) {
			return "-"
		}
		if x == math.Trunc(x) && math.Abs(x) < 1e18 {
			return group(strconv.FormatInt(int64(x), 10))
		}
		s := strconv.FormatFloat(x, 'f', 1, 64)
		i := strings.IndexByte(s, '.')
		return group(s[:i]) + s[i:]
	default:
		return fmt.Sprint(v)
	}
}

// Bytes formats a size for people, in decimal units (1 KB = 1,000 B, as
// df -H and the metrics' bytes): "0 B", "999 B", "38.4 KB", "1.23 MB",
// "512 GB"; three significant digits from KB up.
func Bytes(n uint64) string {
	if n < 1000 {
		return strconv.FormatUint(n, 10) + " B"
	}
	units := []string{"KB", "MB", "GB", "TB", "PB", "EB"}
	v, u := float64(n)/1000, 0
	for {
		// The precision the value shows; a value that rounds up to 1000
		// is the next unit's 1.00.
		prec := 0
		switch {
		case v < 9.995:
			prec = 2
		case v < 99.95:
			prec = 1
		}
		if s := strconv.FormatFloat(v, 'f', prec, 64); v < 999.5 || u == len(units)-1 {
			return s + " " + units[u]
		}
		v, u = v/1000, u+1
	}
}

// group puts a comma every three digits of an integer's decimal form.
func group(s string) string {
	sign := ""
	if strings.HasPrefix(s, "-") {
		sign, s = "-", s[1:]
	}
	if len(s) <= 3 {
		return sign + s
	}
	var b strings.Builder
	b.WriteString(sign)
	head := len(s) % 3
	if head > 0 {
		b.WriteString(s[:head])
	}
	for i := head; i < len(s); i += 3 {
		if b.Len() > len(sign) {
			b.WriteByte(',')
		}
		b.WriteString(s[i : i+3])
	}
	return b.String()
}

// roundDuration rounds a duration for people: to the second past a
// minute, to the millisecond below.
func roundDuration(d time.Duration) time.Duration {
	if d >= time.Minute {
		return d.Round(time.Second)
	}
	if d >= time.Second {
		return d.Round(100 * time.Millisecond)
	}
	return d.Round(time.Millisecond)
}

// requestLink is the request lookup of a tenant's request.
func requestLink(tenant, rid string) string {
	return "/ui/requests?" + url.Values{"tenant": {tenant}, "id": {rid}}.Encode()
}

// Pauser pauses and resumes this replica's consumer (*queue.Worker).
type Pauser interface {
	PauseState() client.PauseState
	Pause(ctx context.Context, until time.Time, by string) (client.PauseState, error)
	Resume(ctx context.Context, by string) (client.PauseState, error)
}

// mayPause: pausing stops every tenant of the replica, so it needs the
// operate role and a token of every tenant.
func mayPause(p api.Principal) bool { return p.Operates() && p.Sees("*") }

// pauseFor are the pause lengths the overview offers.
var pauseFor = map[string]time.Duration{"": 0, "15m": 15 * time.Minute, "1h": time.Hour, "4h": 4 * time.Hour}

func (s *server) pauseAction(w http.ResponseWriter, r *http.Request, p api.Principal, _ *page, sess *session) {
	if !mayPause(p) {
		s.o.Auth.Denied("forbidden_role")
		http.Error(w, fmt.Sprintf("token %q may not pause the consumer: it stops every tenant's requests, so it needs the operate role on every tenant", p.Name), http.StatusForbidden)
		return
	}
	if s.o.Pause == nil {
		http.Error(w, "this worker has no consumer to pause", http.StatusNotFound)
		return
	}
	var (
		st  client.PauseState
		err error
	)
	switch r.PathValue("action") {
	case "pause":
		d, ok := pauseFor[r.PostFormValue("for")]
		if !ok {
			http.Error(w, fmt.Sprintf("for %q: want 15m, 1h, 4h or nothing (until resumed)", r.PostFormValue("for")), http.StatusBadRequest)
			return
		}
		var until time.Time
		if d > 0 {
			until = time.Now().Add(d)
		}
		st, err = s.o.Pause.Pause(r.Context(), until, "status page, token "+p.Name)
	case "resume":
		st, err = s.o.Pause.Resume(r.Context(), "status page, token "+p.Name)
	default:
		http.Error(w, "unknown action", http.StatusNotFound)
		return
	}
	if err != nil {
		sess.setFlash(fmt.Sprintf("The %s failed: %v", r.PathValue("action"), err))
	} else {
		sess.setFlash(fmt.Sprintf("Consumer %s: %s.", st.Consumer, st))
	}
	http.Redirect(w, r, "/ui/", http.StatusSeeOther)
}

// FinishedJournal is a journal that left the list (the worker keeps the
// last ones in memory, for the journals page's recent history).
type FinishedJournal struct {
	// Slot and Member: where it ran (shown on a member's page only).
	Slot                      int
	Member                    string
	Tenant, NodeID, RequestID string
	// Outcome: the request's receipt status (ok, ...), or what is known.
	Outcome         string
	EdgesTombstoned uint64
	Attempts        int
	Finished        time.Time
	Took            time.Duration
}

// Results lists recent results (client.ResultStream).
type Results interface {
	List(ctx context.Context, f client.ResultFilter) (client.ResultPage, error)
}

// ResultsPageSize is how many recent requests a page lists.
const ResultsPageSize = 50

type recentData struct {
	Tenant, Status string
	Rows           []client.StoredResult
	Next           string // the older page's link: older results exist
	// Search: the status filter's bounded scan stopped before finding one
	// more result; the link searches on from where it stopped.
	Search string
	First  bool
	Error  string
}

// pageCut decides what a page read with limit+1 shows (a list of n rows,
// newest first, whose row i has stream sequence seq(i), and the client's
// Next): its first show rows; older, when the page read one more row
// than it shows, is the cursor (Before) of the older page, which then
// holds at least that row; search, when the page read no row more but
// the client stopped a filtered scan at its bound (Next), is the cursor
// to search on from. "Older" is offered only when there is an older row:
// never for a page that is exactly full.
func pageCut(n, limit int, next uint64, seq func(i int) uint64) (show int, older, search uint64) {
	if n > limit {
		return limit, seq(limit - 1), 0
	}
	return n, 0, next
}

// recent lists the newest results of the principal's tenants.
func (s *server) recent(ctx context.Context, p api.Principal, q url.Values) *recentData {
	d := &recentData{Tenant: q.Get("tenant"), Status: q.Get("status"), First: q.Get("before") == ""}
	if s.o.Results == nil {
		return nil
	}
	f := client.ResultFilter{Tenant: d.Tenant, Status: d.Status, Limit: ResultsPageSize + 1} // one more: is there an older one?
	if !p.All {
		f.Tenants = p.Tenants
	}
	if b := q.Get("before"); b != "" {
		n, err := strconv.ParseUint(b, 10, 64)
		if err != nil || n == 0 {
			d.Error = fmt.Sprintf("before %q is not a stream sequence", b)
			return d
		}
		f.Before = n
	}
	if d.Tenant != "" && !p.Sees(d.Tenant) {
		s.o.Auth.Denied("forbidden_tenant")
		d.Error = fmt.Sprintf("your token may not read tenant %q", d.Tenant)
		return d
	}
	res, err := s.o.Results.List(ctx, f)
	if err != nil {
		d.Error = "the results stream could not be read: " + err.Error()
		return d
	}
	show, older, search := pageCut(len(res.Results), ResultsPageSize, res.Next, func(i int) uint64 { return res.Results[i].Seq })
	d.Rows = res.Results[:show]
	link := func(before uint64) string {
		v := url.Values{"before": {strconv.FormatUint(before, 10)}}
		if d.Tenant != "" {
			v.Set("tenant", d.Tenant)
		}
		if d.Status != "" {
			v.Set("status", d.Status)
		}
		return "/ui/requests?" + v.Encode()
	}
	if older != 0 {
		d.Next = link(older)
	}
	if search != 0 {
		d.Search = link(search)
	}
	return d
}

// deadLetterSearch bounds the search of a request's dead letter: the
// tenant's newest deadLetterSearchPages pages of 100.
const deadLetterSearchPages = 10

// findDeadLetter looks for the dead letter of a request among the
// tenant's newest dead letters (by request id, or by the message id
// <tenant>.<request_id> when the body had none readable).
func (s *server) findDeadLetter(ctx context.Context, tenant, rid string) (client.DeadLetter, bool, bool) {
	if s.o.DeadLetters == nil {
		return client.DeadLetter{}, false, false
	}
	f := client.DeadLetterFilter{Tenant: tenant, Limit: 100}
	for i := 0; i < deadLetterSearchPages; i++ {
		page, err := s.o.DeadLetters.List(ctx, f)
		if err != nil {
			return client.DeadLetter{}, false, false
		}
		for _, l := range page.Letters {
			if l.RequestID == rid || l.MsgID == client.RequestMsgID(tenant, rid) || l.MsgID == rid {
				return l, true, false
			}
		}
		if page.Next == 0 {
			return client.DeadLetter{}, false, false
		}
		f.Before = page.Next
	}
	return client.DeadLetter{}, false, true // not among the newest: searched no further
}

// dlqBulk retries or discards the dead letters the page showed (their
// seqs, at most a page), each checked again: it exists, the principal
// sees its tenant, and it still matches the page's filter.
func (s *server) dlqBulk(w http.ResponseWriter, r *http.Request, p api.Principal, _ *page, sess *session) {
	if !p.Operates() {
		s.o.Auth.Denied("forbidden_role")
		http.Error(w, fmt.Sprintf("token %q has role %s: retrying and discarding need operate", p.Name, p.Role), http.StatusForbidden)
		return
	}
	action := r.PostFormValue("action")
	if action != "retry" && action != "discard" {
		http.Error(w, "action must be retry or discard", http.StatusBadRequest)
		return
	}
	seqs := r.PostForm["seq"]
	if len(seqs) == 0 || len(seqs) > DLQPageSize || s.o.DeadLetters == nil {
		http.Error(w, fmt.Sprintf("a bulk %s takes 1 to %d dead letters (a page)", action, DLQPageSize), http.StatusBadRequest)
		return
	}
	tenant, reason := r.PostFormValue("tenant"), r.PostFormValue("reason")
	back := "/ui/dlq?" + url.Values{"tenant": {tenant}, "reason": {reason}}.Encode()
	done, skipped := 0, 0
	var failed []string
	for _, x := range seqs {
		seq, err := strconv.ParseUint(x, 10, 64)
		if err != nil {
			skipped++
			continue
		}
		l, err := s.o.DeadLetters.Get(r.Context(), seq)
		if err != nil || !p.Sees(l.Tenant) || (tenant != "" && l.Tenant != tenant) || (reason != "" && l.Reason != reason) {
			skipped++ // gone meanwhile, or not one the page could show
			continue
		}
		if action == "retry" {
			_, err = s.o.DeadLetters.Retry(r.Context(), seq)
		} else {
			err = s.o.DeadLetters.Discard(r.Context(), seq)
		}
		if err != nil {
			failed = append(failed, fmt.Sprintf("%d: %v", seq, err))
			continue
		}
		done++
		s.o.Logger.Info("status page: dead letter "+action, "seq", seq, "by", p.Name, "tenant", l.Tenant, "request_id", l.RequestID, "bulk", true)
	}
	verb := map[string]string{"retry": "retried (republished to their tenants' request subjects and removed)", "discard": "discarded"}[action]
	msg := fmt.Sprintf("%d dead letters %s", done, verb)
	if skipped > 0 {
		msg += fmt.Sprintf("; %d skipped (gone meanwhile or outside the filter)", skipped)
	}
	if len(failed) > 0 {
		msg += fmt.Sprintf("; %d failed: %s", len(failed), strings.Join(failed, "; "))
	}
	sess.setFlash(msg + ".")
	http.Redirect(w, r, back, http.StatusSeeOther)
}
