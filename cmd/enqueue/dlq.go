package main

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/telha/telha-cascade/queue/client"
)

// deadLetter is one message of the dead-letter stream, as `dlq list` and
// `dlq show` print it.
type deadLetter struct {
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
	Headers         map[string]string `json:"headers,omitempty"` // show
	Body            json.RawMessage   `json:"body,omitempty"`    // show: the JSON body
	BodyText        string            `json:"body_text,omitempty"`
	BodyBase64      string            `json:"body_base64,omitempty"`
}

func letterOf(m *jetstream.RawStreamMsg, prefix string, full bool) deadLetter {
	h := m.Header
	d := deadLetter{Seq: m.Sequence, Time: m.Time.UTC().Format(time.RFC3339Nano), Subject: m.Subject,
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

// runDLQ is `enqueue dlq list|show|retry|discard`.
func runDLQ(ctx context.Context, g *globals, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return usageError{"dlq needs a command: list, show SEQ, retry SEQ or discard SEQ"}
	}
	sub, rest := args[0], args[1:]
	fs := flag.NewFlagSet("dlq "+sub, flag.ContinueOnError)
	fs.SetOutput(stderr)
	stream := fs.String("stream", "TELHA_DLQ", "the dead-letter stream")
	tenant := fs.String("tenant", "", "list: only this tenant's dead letters")
	reason := fs.String("reason", "", "list: only dead letters with this reason")
	limit := fs.Int("limit", 100, "list: at most this many, newest first")
	pos, err := parseSub(fs, g, rest)
	if err != nil {
		return err
	}
	var seq uint64
	switch sub {
	case "list":
		if len(pos) > 0 {
			return usageError{"dlq list takes no arguments"}
		}
	case "show", "retry", "discard":
		if len(pos) != 1 {
			return usageError{fmt.Sprintf("dlq %s takes the dead letter's SEQ (see dlq list)", sub)}
		}
		n, err := strconv.ParseUint(pos[0], 10, 64)
		if err != nil || n == 0 {
			return usageError{fmt.Sprintf("SEQ %q must be a positive number (see dlq list)", pos[0])}
		}
		seq = n
	default:
		return usageError{fmt.Sprintf("unknown dlq command %q (list, show, retry, discard)", sub)}
	}
	nc, c, err := connect(g)
	if err != nil {
		return err
	}
	defer nc.Close()
	js := c.JetStream()
	s, err := js.Stream(ctx, *stream)
	if err != nil {
		return fmt.Errorf("stream %s: %w", *stream, err)
	}
	enc := json.NewEncoder(stdout)
	switch sub {
	case "list":
		info, err := s.Info(ctx)
		if err != nil {
			return err
		}
		var out []deadLetter
		for n := info.State.LastSeq; n >= info.State.FirstSeq && n > 0 && len(out) < *limit; n-- {
			m, err := s.GetMsg(ctx, n)
			if errors.Is(err, jetstream.ErrMsgNotFound) {
				continue
			}
			if err != nil {
				return err
			}
			d := letterOf(m, g.prefix, false)
			if (*tenant != "" && d.Tenant != *tenant) || (*reason != "" && d.Reason != *reason) {
				continue
			}
			out = append(out, d)
		}
		for _, d := range out {
			_ = enc.Encode(d)
		}
		fmt.Fprintf(stderr, "%d dead letters shown (of %d in %s)\n", len(out), info.State.Msgs, *stream)
		return nil
	case "show":
		m, err := s.GetMsg(ctx, seq)
		if err != nil {
			return fmt.Errorf("dead letter %d: %w", seq, err)
		}
		return enc.Encode(letterOf(m, g.prefix, true))
	case "retry":
		m, err := s.GetMsg(ctx, seq)
		if err != nil {
			return fmt.Errorf("dead letter %d: %w", seq, err)
		}
		d := letterOf(m, g.prefix, false)
		if d.Truncated {
			return fmt.Errorf("dead letter %d was stored cut short (%d of %d bytes): its body cannot be republished", seq, len(m.Data), d.Size)
		}
		if d.OriginalSubject == "" {
			return fmt.Errorf("dead letter %d has no Telha-Original-Subject", seq)
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
		// A new message id: the original one may still be inside the
		// request stream's duplicate window.
		id := d.MsgID
		if id == "" {
			id = client.RequestMsgID(d.Tenant, d.RequestID)
		}
		rm.Header.Set(jetstream.MsgIDHeader, fmt.Sprintf("%s.retry-%d", id, seq))
		ack, err := js.PublishMsg(ctx, rm)
		if err != nil {
			return fmt.Errorf("republish dead letter %d to %s: %w", seq, d.OriginalSubject, err)
		}
		if err := s.DeleteMsg(ctx, seq); err != nil {
			return fmt.Errorf("dead letter %d republished (request stream seq %d) but not removed from %s: %w", seq, ack.Sequence, *stream, err)
		}
		return enc.Encode(map[string]any{"retried": seq, "subject": d.OriginalSubject, "request_id": d.RequestID, "request_stream_seq": ack.Sequence})
	case "discard":
		if err := s.DeleteMsg(ctx, seq); err != nil {
			return fmt.Errorf("discard dead letter %d: %w", seq, err)
		}
		return enc.Encode(map[string]any{"discarded": seq})
	}
	return nil
}

var partitionRE = regexp.MustCompile(`\{\{\s*partition\(\s*(\d+)\s*,`)

// runOwner is `enqueue owner --tenant T`: which partition holds the
// tenant's requests, and which replica (consumer telha-worker-<i>) owns it.
func runOwner(ctx context.Context, g *globals, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("owner", flag.ContinueOnError)
	fs.SetOutput(stderr)
	tenant := fs.String("tenant", "", "tenant (required)")
	stream := fs.String("stream", "TELHA_REQ", "the request stream")
	if _, err := parseSub(fs, g, args); err != nil {
		return err
	}
	if !client.ValidTenant(*tenant) {
		return usageError{fmt.Sprintf("--tenant %q must match ^[a-z0-9][a-z0-9_-]{0,62}$", *tenant)}
	}
	nc, c, err := connect(g)
	if err != nil {
		return err
	}
	defer nc.Close()
	s, err := c.JetStream().Stream(ctx, *stream)
	if err != nil {
		return fmt.Errorf("stream %s: %w", *stream, err)
	}
	p := 1
	if st := s.CachedInfo().Config.SubjectTransform; st != nil {
		if m := partitionRE.FindStringSubmatch(st.Destination); m != nil {
			p, _ = strconv.Atoi(m[1])
		}
	}
	replicas := 0
	names := s.ConsumerNames(ctx)
	for name := range names.Name() {
		if i, err := strconv.Atoi(strings.TrimPrefix(name, "telha-worker-")); err == nil && strings.HasPrefix(name, "telha-worker-") {
			replicas = max(replicas, i+1)
		}
	}
	part := client.Partition(*tenant, p)
	out := map[string]any{"tenant": *tenant, "partitions": p, "partition": part, "replicas": replicas,
		"rule": "partition = fnv1a32(tenant) % partitions; replica i of N owns the partitions p with p % N == i"}
	if replicas > 0 {
		out["replica"] = part % replicas
		out["consumer"] = fmt.Sprintf("telha-worker-%d", part%replicas)
	}
	return json.NewEncoder(stdout).Encode(out)
}
