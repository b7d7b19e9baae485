package client

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Dead letters (CONTRACT §5): reading, retrying and discarding the messages
// of the dead-letter stream, for `enqueue dlq` and the status page.

// DeadLetter is one message of the dead-letter stream.
type DeadLetter struct {
	Seq             uint64            `json:"seq"`
	Time            string            `json:"time"`
	Subject         string            `json:"subject"`
	Tenant          string            `json:"tenant"`
	Reason          string            `json:"reason"`
	Error           string            `json:"error"`
	Deliveries      string            `json:"deliveries"`
	OriginalSubject string            `json:"original_subject"`
	MsgID           string            `json:"original_msg_id,omitempty"`
	RequestID       string            `json:"request_id,omitempty"`
	Size            int               `json:"size"`
	Truncated       bool              `json:"truncated,omitempty"`
	Headers         map[string]string `json:"headers,omitempty"` // full
	Body            json.RawMessage   `json:"body,omitempty"`    // full: the JSON body
	BodyText        string            `json:"body_text,omitempty"`
	BodyBase64      string            `json:"body_base64,omitempty"`
}

// DeadLetterOf reads a stored dead letter; full adds its headers and body.
func DeadLetterOf(m *jetstream.RawStreamMsg, prefix string, full bool) DeadLetter {
	h := m.Header
	d := DeadLetter{Seq: m.Sequence, Time: m.Time.UTC().Format(time.RFC3339Nano), Subject: m.Subject,
		Tenant: strings.TrimPrefix(m.Subject, prefix+".dlq."), Reason: h.Get("Telha-Reason"), Error: h.Get("Telha-Error"),
		Deliveries: h.Get("Telha-Deliveries"), OriginalSubject: h.Get("Telha-Original-Subject"), MsgID: h.Get("Telha-Original-Msg-Id"),
		Size: len(m.Data), Truncated: h.Get("Telha-Truncated") == "true"}
	if d.Truncated {
		d.Size, _ = strconv.Atoi(h.Get("Telha-Original-Size"))
	}
	var peek struct {
		RequestID string `json:"request_id"`
	}
	if json.Unmarshal(m.Data, &peek) == nil {
		d.RequestID = peek.RequestID
	}
	if full {
		d.Headers = map[string]string{}
		for k := range h {
			d.Headers[k] = h.Get(k)
		}
		switch {
		case json.Valid(m.Data):
			d.Body = m.Data
		case utf8.Valid(m.Data):
			d.BodyText = string(m.Data)
		default:
			d.BodyBase64 = base64.StdEncoding.EncodeToString(m.Data)
		}
	}
	return d
}

// DeadLetterFilter selects dead letters (empty fields select all).
type DeadLetterFilter struct {
	Tenant, Reason string
	// Tenants, when not nil, keeps only these tenants ("*" keeps all).
	Tenants []string
	Limit   int // at most this many, newest first (0: 100)
	Full    bool
	// Before, when not 0, keeps the dead letters below this stream
	// sequence: the Next of the previous page.
	Before uint64
}

// DeadLetterPage is a page of dead letters, newest first.
type DeadLetterPage struct {
	Letters []DeadLetter
	// Total is how many dead letters the filter's tenants hold (all
	// tenants: the stream's count), whatever the reason.
	Total uint64
	// Next is the Before of the next (older) page; 0 when there is none.
	Next uint64
	// Read is how many messages were fetched from the server for the page.
	Read int
}

// ListDeadLetters returns the dead letters of stream s, newest first, and
// how many the filter's tenants hold (see ListDeadLetterPage).
func ListDeadLetters(ctx context.Context, s jetstream.Stream, prefix string, f DeadLetterFilter) ([]DeadLetter, uint64, error) {
	p, err := ListDeadLetterPage(ctx, s, prefix, f)
	return p.Letters, p.Total, err
}

// scanPerPage bounds the dead letters a page with a reason filter reads
// (the reason is a header: the server cannot filter on it), in pages.
const scanPerPage = 10

// ListDeadLetterPage returns a page of the dead letters of stream s, newest
// first. It costs O(the page): the tenants are selected by subject on the
// server (<prefix>.dlq.<tenant>), never by reading other tenants' dead
// letters, and each page reads O(Limit × log(stream)) messages at most
// (a reason filter reads up to scanPerPage pages' worth, then gives a
// Next to go on from).
func ListDeadLetterPage(ctx context.Context, s jetstream.Stream, prefix string, f DeadLetterFilter) (DeadLetterPage, error) {
	var page DeadLetterPage
	if f.Limit <= 0 {
		f.Limit = 100
	}
	subjects := tenantSubjects(prefix+".dlq.", f.Tenant, f.Tenants)
	if len(subjects) == 0 {
		return page, nil
	}
	info, err := s.Info(ctx)
	if err != nil {
		return page, err
	}
	if len(subjects) == 1 && subjects[0] == prefix+".dlq.*" {
		page.Total = info.State.Msgs
	} else {
		for _, subj := range subjects {
			si, err := s.Info(ctx, jetstream.WithSubjectFilter(subj))
			if err != nil {
				return page, err
			}
			page.Total += si.State.Subjects[subj]
		}
	}
	page.Next, page.Read, err = newestPage(ctx, s, subjects, info, f.Before, f.Limit, f.Reason != "", func(m *jetstream.RawStreamMsg) bool {
		d := DeadLetterOf(m, prefix, f.Full)
		if f.Reason != "" && d.Reason != f.Reason {
			return false
		}
		page.Letters = append(page.Letters, d)
		return true
	})
	return page, err
}

// tenantSubjects returns the subjects (base is <prefix>.<kind>.) of the
// tenants a filter selects: tenant alone when set (none if it is not a
// safe token or not among tenants), every tenant when tenants is nil or
// holds "*", else each safe token of tenants once. Empty: nothing to read.
func tenantSubjects(base, tenant string, tenants []string) []string {
	all := tenants == nil || containsTenant(tenants, "*")
	switch {
	case tenant != "":
		if !SafeToken(tenant) || (!all && !containsTenant(tenants, tenant)) {
			return nil
		}
		return []string{base + tenant}
	case all:
		return []string{base + "*"}
	}
	var subjects []string
	seen := map[string]bool{}
	for _, t := range tenants {
		if SafeToken(t) && !seen[t] {
			seen[t] = true
			subjects = append(subjects, base+t)
		}
	}
	return subjects
}

// newestPage reads a page of the messages of stream s (info: its state)
// on subjects, newest first, below before when it is not 0, and passes
// each to take, which reports whether the page keeps it; the page is full
// once take has kept limit. filtered: take may drop messages for what the
// server cannot select on (a header, the body), so the page reads at most
// scanPerPage*limit messages, then ends with a Next to go on from. It
// returns the page's Next (0 when there is no older page) and how many
// messages it fetched (also on an error, with the messages taken so far).
func newestPage(ctx context.Context, s jetstream.Stream, subjects []string, info *jetstream.StreamInfo, before uint64, limit int,
	filtered bool, take func(*jetstream.RawStreamMsg) bool) (next uint64, read int, err error) {
	first, hi := info.State.FirstSeq, info.State.LastSeq+1
	if before != 0 && before < hi {
		hi = before
	}
	if first == 0 {
		first = 1
	}
	kept, scanned := 0, 0
	for kept < limit && hi > first {
		if filtered && scanned >= scanPerPage*limit {
			return hi, read, nil // the scan's bound: go on from here
		}
		// The newest limit of every subject below hi, merged.
		var cands []*jetstream.RawStreamMsg
		for _, subj := range subjects {
			ms, n, err := newestBelow(ctx, s, subj, first, hi, limit)
			read += n
			if err != nil {
				return 0, read, err
			}
			cands = append(cands, ms...)
		}
		sort.Slice(cands, func(i, j int) bool { return cands[i].Sequence > cands[j].Sequence })
		if len(cands) > limit {
			cands = cands[:limit]
		}
		if len(cands) == 0 {
			return 0, read, nil
		}
		scanned += len(cands)
		for _, m := range cands {
			hi = m.Sequence
			if !take(m) {
				continue
			}
			kept++
			if kept == limit {
				break
			}
		}
		if len(cands) < limit {
			return 0, read, nil // every subject is read to its start
		}
	}
	if hi > first {
		return hi, read, nil
	}
	return 0, read, nil
}

// newestBelow returns the newest n messages on subject subj (a filter)
// with a sequence in [first, hi), newest first, and how many messages it
// fetched. Every fetch is a server-side "next message on subj from seq",
// so other subjects' messages are never read. It widens a window below hi
// until it holds more than n (or reaches first), then bisects its lower
// edge to where exactly n are above it: O(n log(hi-first)) fetches.
func newestBelow(ctx context.Context, s jetstream.Stream, subj string, first, hi uint64, n int) ([]*jetstream.RawStreamMsg, int, error) {
	read := 0
	// forward reads up to max messages on subj in [lo, hi), oldest first.
	forward := func(lo uint64, max int) ([]*jetstream.RawStreamMsg, error) {
		var out []*jetstream.RawStreamMsg
		for seq := lo; len(out) < max && seq < hi; {
			m, err := s.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(subj))
			if errors.Is(err, jetstream.ErrMsgNotFound) {
				break
			}
			if err != nil {
				return nil, fmt.Errorf("read dead letters on %s from %d: %w", subj, seq, err)
			}
			read++
			if m.Sequence >= hi {
				break
			}
			out = append(out, m)
			seq = m.Sequence + 1
		}
		return out, nil
	}
	newestFirst := func(ms []*jetstream.RawStreamMsg) []*jetstream.RawStreamMsg {
		for i, j := 0, len(ms)-1; i < j; i, j = i+1, j-1 {
			ms[i], ms[j] = ms[j], ms[i]
		}
		return ms
	}
	if hi <= first || n <= 0 {
		return nil, 0, nil
	}
	// Widen: b is a lower edge with at most n above it (kept), a one with
	// more.
	var kept []*jetstream.RawStreamMsg
	b, a := hi, uint64(0)
	for w := uint64(n); ; w *= 2 {
		lo := first
		if hi-first > w {
			lo = hi - w
		}
		ms, err := forward(lo, n+1)
		if err != nil {
			return nil, read, err
		}
		if len(ms) <= n {
			b, kept = lo, ms
			if lo == first || len(ms) == n {
				return newestFirst(kept), read, nil
			}
			continue
		}
		a = lo
		break
	}
	// Bisect between a (more than n above) and b (at most n above).
	for b-a > 1 {
		mid := a + (b-a)/2
		ms, err := forward(mid, n+1)
		if err != nil {
			return nil, read, err
		}
		if len(ms) > n {
			a = mid
		} else {
			b, kept = mid, ms
		}
	}
	return newestFirst(kept), read, nil
}

func containsTenant(ts []string, t string) bool {
	for _, x := range ts {
		if x == "*" || x == t {
			return true
		}
	}
	return false
}

// SafeToken reports whether t can be one token of a subject: 1 to 255
// bytes of valid UTF-8, none of them '.', '*', '>', a space or a control
// character.
func SafeToken(t string) bool {
	if t == "" || len(t) > 255 || !utf8.ValidString(t) {
		return false
	}
	for _, r := range t {
		if r <= ' ' || r == 0x7f || r == '.' || r == '*' || r == '>' || unicode.IsSpace(r) || unicode.IsControl(r) {
			return false
		}
	}
	return true
}

// DeadLetterTenant returns the tenant of a dead letter from its own
// subject, <prefix>.dlq.<tenant>: the subject the worker chose, never a
// header a publisher could have planted.
func DeadLetterTenant(subject, prefix string) (string, bool) {
	t, ok := strings.CutPrefix(subject, prefix+".dlq.")
	return t, ok && SafeToken(t)
}

// Retried is what RetryDeadLetter did.
type Retried struct {
	Seq              uint64 `json:"retried"`
	Subject          string `json:"subject"`
	RequestID        string `json:"request_id"`
	RequestStreamSeq uint64 `json:"request_stream_seq"`
}

// RetryDeadLetter republishes dead letter seq of stream s (its original
// body and headers, under a new message id) to the request subject of its
// own tenant, <prefix>.req.<tenant>, the tenant read from the dead
// letter's subject <prefix>.dlq.<tenant>; then it removes it. It never
// publishes to a subject a header names (Telha-Original-Subject is a
// record, not an address: retry publishes with the worker's or operator's
// credentials), and carries none of the NATS headers (Nats-*) the dead
// letter held.
func RetryDeadLetter(ctx context.Context, js jetstream.JetStream, s jetstream.Stream, prefix string, seq uint64) (Retried, error) {
	m, err := s.GetMsg(ctx, seq)
	if err != nil {
		return Retried{}, fmt.Errorf("dead letter %d: %w", seq, err)
	}
	d := DeadLetterOf(m, prefix, false)
	if d.Truncated {
		return Retried{}, fmt.Errorf("dead letter %d was stored cut short (%d of %d bytes): its body cannot be republished", seq, len(m.Data), d.Size)
	}
	tenant, ok := DeadLetterTenant(m.Subject, prefix)
	if !ok {
		return Retried{}, fmt.Errorf("dead letter %d is on subject %q, not %s.dlq.<tenant>: it cannot be retried", seq, shorten(m.Subject, 80), prefix)
	}
	subject := prefix + ".req." + tenant
	rm := nats.NewMsg(subject)
	rm.Data = m.Data
	keys := make([]string, 0, len(m.Header))
	for k := range m.Header {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if ck := http.CanonicalHeaderKey(k); strings.HasPrefix(ck, "Telha-") || strings.HasPrefix(ck, "Nats-") {
			continue // the worker's annotations, and the server's controls (message id, expectations, rollups, TTLs)
		}
		for _, v := range m.Header.Values(k) {
			rm.Header.Add(k, v)
		}
	}
	// A new message id, in the tenant's own namespace: the original one
	// may still be inside the request stream's duplicate window.
	id := d.MsgID
	if !strings.HasPrefix(id, tenant+".") {
		id = RequestMsgID(tenant, d.RequestID)
	}
	if len(id) > 200 {
		sum := sha256.Sum256([]byte(id))
		id = tenant + ".sha256-" + hex.EncodeToString(sum[:16])
	}
	rm.Header.Set(jetstream.MsgIDHeader, fmt.Sprintf("%s.retry-%d", id, seq))
	ack, err := js.PublishMsg(ctx, rm)
	if err != nil {
		return Retried{}, fmt.Errorf("republish dead letter %d to %s: %w", seq, subject, err)
	}
	if err := s.DeleteMsg(ctx, seq); err != nil {
		return Retried{}, fmt.Errorf("dead letter %d republished (request stream seq %d) but not removed: %w", seq, ack.Sequence, err)
	}
	return Retried{Seq: seq, Subject: subject, RequestID: d.RequestID, RequestStreamSeq: ack.Sequence}, nil
}

func shorten(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}

// DiscardDeadLetter removes dead letter seq of stream s.
func DiscardDeadLetter(ctx context.Context, s jetstream.Stream, seq uint64) error {
	if err := s.DeleteMsg(ctx, seq); err != nil {
		return fmt.Errorf("discard dead letter %d: %w", seq, err)
	}
	return nil
}

// DeadLetterStream reads and acts on a dead-letter stream by name (the
// status page's dead letters).
type DeadLetterStream struct {
	JS     jetstream.JetStream
	Stream string // TELHA_DLQ
	Prefix string // telha
}

func (d DeadLetterStream) s(ctx context.Context) (jetstream.Stream, error) {
	return d.JS.Stream(ctx, d.Stream)
}

// List returns a page of dead letters (ListDeadLetterPage).
func (d DeadLetterStream) List(ctx context.Context, f DeadLetterFilter) (DeadLetterPage, error) {
	s, err := d.s(ctx)
	if err != nil {
		return DeadLetterPage{}, err
	}
	return ListDeadLetterPage(ctx, s, d.Prefix, f)
}

// Count returns how many dead letters the tenants hold (nil or "*": all).
func (d DeadLetterStream) Count(ctx context.Context, tenants []string) (uint64, error) {
	s, err := d.s(ctx)
	if err != nil {
		return 0, err
	}
	p, err := ListDeadLetterPage(ctx, s, d.Prefix, DeadLetterFilter{Tenants: tenants, Limit: 1})
	return p.Total, err
}

// Get returns dead letter seq (without its body).
func (d DeadLetterStream) Get(ctx context.Context, seq uint64) (DeadLetter, error) {
	s, err := d.s(ctx)
	if err != nil {
		return DeadLetter{}, err
	}
	m, err := s.GetMsg(ctx, seq)
	if err != nil {
		return DeadLetter{}, err
	}
	return DeadLetterOf(m, d.Prefix, false), nil
}

// Retry retries dead letter seq (RetryDeadLetter).
func (d DeadLetterStream) Retry(ctx context.Context, seq uint64) (Retried, error) {
	s, err := d.s(ctx)
	if err != nil {
		return Retried{}, err
	}
	return RetryDeadLetter(ctx, d.JS, s, d.Prefix, seq)
}

// Discard removes dead letter seq.
func (d DeadLetterStream) Discard(ctx context.Context, seq uint64) error {
	s, err := d.s(ctx)
	if err != nil {
		return err
	}
	return DiscardDeadLetter(ctx, s, seq)
}
