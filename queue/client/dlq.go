package client

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"
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
}

// ListDeadLetters returns the dead letters of stream s, newest first, and
// how many the stream holds.
func ListDeadLetters(ctx context.Context, s jetstream.Stream, prefix string, f DeadLetterFilter) ([]DeadLetter, uint64, error) {
	if f.Limit <= 0 {
		f.Limit = 100
	}
	info, err := s.Info(ctx)
	if err != nil {
		return nil, 0, err
	}
	var out []DeadLetter
	for n := info.State.LastSeq; n >= info.State.FirstSeq && n > 0 && len(out) < f.Limit; n-- {
		m, err := s.GetMsg(ctx, n)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			return nil, 0, err
		}
		d := DeadLetterOf(m, prefix, f.Full)
		if (f.Tenant != "" && d.Tenant != f.Tenant) || (f.Reason != "" && d.Reason != f.Reason) {
			continue
		}
		if f.Tenants != nil && !containsTenant(f.Tenants, d.Tenant) {
			continue
		}
		out = append(out, d)
	}
	return out, info.State.Msgs, nil
}

func containsTenant(ts []string, t string) bool {
	for _, x := range ts {
		if x == "*" || x == t {
			return true
		}
	}
	return false
}

// Retried is what RetryDeadLetter did.
type Retried struct {
	Seq              uint64 `json:"retried"`
	Subject          string `json:"subject"`
	RequestID        string `json:"request_id"`
	RequestStreamSeq uint64 `json:"request_stream_seq"`
}

// RetryDeadLetter republishes dead letter seq of stream s (its original
// body and headers, to its original subject, under a new message id) and
// then removes it.
func RetryDeadLetter(ctx context.Context, js jetstream.JetStream, s jetstream.Stream, prefix string, seq uint64) (Retried, error) {
	m, err := s.GetMsg(ctx, seq)
	if err != nil {
		return Retried{}, fmt.Errorf("dead letter %d: %w", seq, err)
	}
	d := DeadLetterOf(m, prefix, false)
	if d.Truncated {
		return Retried{}, fmt.Errorf("dead letter %d was stored cut short (%d of %d bytes): its body cannot be republished", seq, len(m.Data), d.Size)
	}
	if d.OriginalSubject == "" {
		return Retried{}, fmt.Errorf("dead letter %d has no Telha-Original-Subject", seq)
	}
	rm := nats.NewMsg(d.OriginalSubject)
	rm.Data = m.Data
	keys := make([]string, 0, len(m.Header))
	for k := range m.Header {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if strings.HasPrefix(k, "Telha-") || k == jetstream.MsgIDHeader {
			continue // the worker's annotations, and the dead letter's own id
		}
		for _, v := range m.Header.Values(k) {
			rm.Header.Add(k, v)
		}
	}
	// A new message id: the original one may still be inside the request
	// stream's duplicate window.
	id := d.MsgID
	if id == "" {
		id = RequestMsgID(d.Tenant, d.RequestID)
	}
	rm.Header.Set(jetstream.MsgIDHeader, fmt.Sprintf("%s.retry-%d", id, seq))
	ack, err := js.PublishMsg(ctx, rm)
	if err != nil {
		return Retried{}, fmt.Errorf("republish dead letter %d to %s: %w", seq, d.OriginalSubject, err)
	}
	if err := s.DeleteMsg(ctx, seq); err != nil {
		return Retried{}, fmt.Errorf("dead letter %d republished (request stream seq %d) but not removed: %w", seq, ack.Sequence, err)
	}
	return Retried{Seq: seq, Subject: d.OriginalSubject, RequestID: d.RequestID, RequestStreamSeq: ack.Sequence}, nil
}

// DiscardDeadLetter removes dead letter seq of stream s.
func DiscardDeadLetter(ctx context.Context, s jetstream.Stream, seq uint64) error {
	if err := s.DeleteMsg(ctx, seq); err != nil {
		return fmt.Errorf("discard dead letter %d: %w", seq, err)
	}
	return nil
}
