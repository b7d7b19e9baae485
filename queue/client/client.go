package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"regexp"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Result statuses (CONTRACT §5). The worker's storage.Status names are the
// same; a test in package queue keeps the two lists equal.
const (
	StatusOK                = "ok"
	StatusNotFound          = "not_found"
	StatusAlreadyTombstoned = "already_tombstoned"
	StatusEndpointDead      = "endpoint_dead"
	StatusCascadeInFlight   = "cascade_in_flight"
	StatusInvalid           = "invalid"
	StatusFailed            = "failed"
	StatusConflict          = "conflict"
)

// MaxMessageBytes is the largest request body the worker accepts.
const MaxMessageBytes = 256 << 10

// Result is the result body published on <prefix>.res.<tenant>, one per
// distinct answer (CONTRACT §5): a request id may have several, the latest
// stored being its answer. TxTime is set exactly on "ok"; otherwise it is
// written null (results stored before wrote "": both decode to "").
type Result struct {
	RequestID       string `json:"request_id"`
	Op              string `json:"op"`
	Tenant          string `json:"tenant"`
	ID              string `json:"id"`
	Status          string `json:"status"`
	Error           string `json:"error"`
	TxTime          string `json:"tx_time"`
	EdgesTombstoned uint64 `json:"edges_tombstoned"`
	Journaled       bool   `json:"journaled"`
	// VersionsErased: how many stored versions an erase_node or erase_edge
	// rewrote (0 when everything was already erased); absent for other ops.
	VersionsErased *uint64 `json:"versions_erased,omitempty"`
	// RequestIDFrom is "nats_msg_id" when the body had no readable
	// request_id and RequestID is the message's Nats-Msg-Id instead.
	RequestIDFrom string `json:"request_id_from,omitempty"`
}

// MarshalJSON writes Result with "tx_time": null when TxTime is empty.
func (r Result) MarshalJSON() ([]byte, error) {
	type fields Result // no MarshalJSON: no recursion
	var tx *string
	if r.TxTime != "" {
		tx = &r.TxTime
	}
	return json.Marshal(struct {
		fields
		TxTime *string `json:"tx_time"` // shadows fields.TxTime
	}{fields(r), tx})
}

// Request is a request body (CONTRACT §5) as a publisher builds it.
// Empty fields are left out; the worker rejects fields that do not belong
// to the op.
type Request struct {
	RequestID  string          `json:"request_id"`
	Op         string          `json:"op"`
	Tenant     string          `json:"tenant"`
	ID         string          `json:"id"`
	Src        string          `json:"src,omitempty"`
	Dst        string          `json:"dst,omitempty"`
	Label      string          `json:"label,omitempty"`
	ValidFrom  string          `json:"valid_from,omitempty"`
	ValidTo    string          `json:"valid_to,omitempty"`
	ValidEnd   string          `json:"valid_end,omitempty"`
	Props      json.RawMessage `json:"props,omitempty"`
	Provenance *Provenance     `json:"provenance,omitempty"`
}

// Provenance is a request's provenance object.
type Provenance struct {
	Actor     string `json:"actor,omitempty"`
	Reason    string `json:"reason,omitempty"`
	Source    string `json:"source,omitempty"`
	DecidedAt string `json:"decided_at,omitempty"`
}

// RequestMsgID is the Nats-Msg-Id a request is published with:
// <tenant>.<request_id> (the request stream's duplicate window spans
// tenants, so the id must not).
func RequestMsgID(tenant, requestID string) string { return tenant + "." + requestID }

// ResultMsgID is the common start of the Nats-Msg-Ids of a request's
// results, res.<tenant>.<request_id>: each answer's id adds
// .<answer> (16 hex digits of the hash of what it says) or, for a failed
// answer, .dlq-<stream>-<seq> (CONTRACT §5). It names no message itself.
//
// Deprecated: results no longer have one id per request; match results by
// their request_id field.
func ResultMsgID(tenant, requestID string) string { return "res." + tenant + "." + requestID }

// Config names the subjects and the results stream. Zero fields take the
// defaults: prefix "telha", results stream "TELHA_RES".
type Config struct {
	Prefix    string
	ResStream string
}

func (c Config) withDefaults() Config {
	if c.Prefix == "" {
		c.Prefix = "telha"
	}
	if c.ResStream == "" {
		c.ResStream = "TELHA_RES"
	}
	return c
}

// ReqSubject is the subject requests of a tenant are published to.
func (c Config) ReqSubject(tenant string) string { return c.withDefaults().Prefix + ".req." + tenant }

// ResSubject is the subject results of a tenant are published on.
func (c Config) ResSubject(tenant string) string { return c.withDefaults().Prefix + ".res." + tenant }

// Client publishes requests (with Nats-Msg-Id <tenant>.<request_id>, which
// names the message in dead letters; the request stream keeps no duplicate
// window, so a retry is delivered again and answered from its receipt) and
// collects their results from the results stream.
type Client struct {
	js  jetstream.JetStream
	cfg Config
}

// New returns a client over an open connection. An async publish whose
// ack never comes (its stream's leader lost with it in flight) fails with
// jetstream.ErrAsyncPublishTimeout after 30 s; opts may set another bound.
func New(nc *nats.Conn, cfg Config, opts ...jetstream.JetStreamOpt) (*Client, error) {
	opts = append([]jetstream.JetStreamOpt{jetstream.WithPublishAsyncTimeout(30 * time.Second)}, opts...)
	js, err := jetstream.New(nc, opts...)
	if err != nil {
		return nil, err
	}
	return &Client{js: js, cfg: cfg.withDefaults()}, nil
}

// JetStream returns the client's JetStream context.
func (c *Client) JetStream() jetstream.JetStream { return c.js }

// RequestMsg builds the message of a request body for tenant.
func (c *Client) RequestMsg(tenant, requestID string, body []byte) *nats.Msg {
	m := nats.NewMsg(c.cfg.ReqSubject(tenant))
	m.Data = body
	if requestID != "" {
		m.Header.Set(jetstream.MsgIDHeader, RequestMsgID(tenant, requestID))
	}
	return m
}

// Publish publishes one request and waits for the stream's ack. The
// request stream keeps no duplicate window (CONTRACT §5), so the ack's
// Duplicate flag is never set: a request published again is delivered
// again, and answered from its receipt (the same answer, one effect).
func (c *Client) Publish(ctx context.Context, tenant, requestID string, body []byte) (*jetstream.PubAck, error) {
	return c.js.PublishMsg(ctx, c.RequestMsg(tenant, requestID, body))
}

// PublishRequest marshals r and publishes it (see Publish).
func (c *Client) PublishRequest(ctx context.Context, r *Request) (*jetstream.PubAck, error) {
	body, err := Marshal(r)
	if err != nil {
		return nil, err
	}
	return c.Publish(ctx, r.Tenant, r.RequestID, body)
}

// Marshal is json.Marshal without its HTML escaping: props holding <, >
// or & stay as they are, instead of growing six times each (\u003c) and
// passing the request size limit a body published as written would not.
func Marshal(v any) ([]byte, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(b.Bytes(), []byte("\n")), nil
}

// PublishAsync publishes without waiting; bound the number in flight with
// jetstream.WithPublishAsyncMaxPending on the client.
func (c *Client) PublishAsync(tenant, requestID string, body []byte) (jetstream.PubAckFuture, error) {
	return c.js.PublishMsgAsync(c.RequestMsg(tenant, requestID, body))
}

// Results follows the results of some tenants from `since` on (use a time
// a little before the first publish, or before the first publish of a
// request id that may be answered again) and calls fn for each, until ctx
// is done or fn returns false.
func (c *Client) Results(ctx context.Context, tenants []string, since time.Time, fn func(Result) bool) error {
	return c.results(ctx, tenants, since, func(r *Result, _ bool) bool { return r == nil || fn(*r) })
}

// results is Results, also saying whether each result is the last of
// those stored before it was read (caughtUp: no result was stored after
// it, or it was stored after results was called); r is nil for a message
// that is no result.
func (c *Client) results(ctx context.Context, tenants []string, since time.Time, fn func(r *Result, caughtUp bool) bool) error {
	start := time.Now()
	var filters []string
	seen := map[string]bool{}
	for _, t := range tenants {
		if !seen[t] {
			seen[t] = true
			filters = append(filters, c.cfg.ResSubject(t))
		}
	}
	if len(filters) == 0 {
		return errors.New("no tenants")
	}
	oc, err := c.js.OrderedConsumer(ctx, c.cfg.ResStream, jetstream.OrderedConsumerConfig{
		FilterSubjects: filters,
		DeliverPolicy:  jetstream.DeliverByStartTimePolicy,
		OptStartTime:   &since,
	})
	if err != nil {
		return fmt.Errorf("follow results: %w", err)
	}
	// Short heartbeats: on a cluster the ordered consumer's first pull is
	// now and then lost (the consumer was not yet ready where the pull
	// arrived); the client notices only when two heartbeats are missed and
	// then recreates the consumer. With the default (a 5 s heartbeat) a
	// wait stalled exactly 10 s in about 1 of 70 waits (issue 32 item 1,
	// TestWaitOnAClusterDoesNotStall); with these it resumes within a
	// second or so, at the cost of a pull request every 2 s while idle.
	msgs, err := oc.Messages(jetstream.PullExpiry(2*time.Second), jetstream.PullHeartbeat(500*time.Millisecond))
	if err != nil {
		return err
	}
	defer msgs.Stop()
	var once sync.Once
	stop := context.AfterFunc(ctx, func() { once.Do(msgs.Stop) })
	defer stop()
	for {
		m, err := msgs.Next()
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return err
		}
		caughtUp := true
		if meta, err := m.Metadata(); err == nil {
			// The timestamp bounds the wait on a busy stream, where results
			// may keep coming faster than they are read.
			caughtUp = meta.NumPending == 0 || meta.Timestamp.After(start)
		}
		r := &Result{}
		if err := json.Unmarshal(m.Data(), r); err != nil {
			r = nil
		}
		if !fn(r, caughtUp) {
			return nil
		}
	}
}

// Wait collects the results of the given request ids until each has one
// and every result stored before Wait was called has been read, or ctx is
// done. A request id with several answers (an invalid request fixed and
// sent again under its id) gets the latest of those read, so the latest
// stored when Wait was called or after (CONTRACT §5: the latest stored
// answer is the id's answer). It returns what it collected. To wait for
// requests about to be published, call Follow before publishing and
// Waiter.Wait after: a result is then seen the moment it is stored.
func (c *Client) Wait(ctx context.Context, tenants []string, since time.Time, ids map[string]bool) (map[string]Result, error) {
	w, err := c.Follow(ctx, tenants, since, ids)
	if err != nil {
		return map[string]Result{}, err
	}
	return w.Wait(ctx)
}

// Waiter waits for the results of some requests (Follow).
//
// Two paths read the results: the stream, from since on (an ordered
// consumer, read by Wait), and a plain subscription to the tenants'
// result subjects, taken by Follow. A result published after the
// subscription is the newest answer of its id, so it is final when it
// arrives, even if the consumer's pull was lost on a cluster and the
// stream path would see it only after the client recreates its consumer
// (issue 32 item 1: waits stalled 10 s). An id answered live is not
// overwritten by the stream path, which can only deliver it again or
// deliver an older answer.
type Waiter struct {
	c       *Client
	tenants []string
	since   time.Time
	ids     map[string]bool
	subs    []*nats.Subscription
	done    chan struct{} // closed once every id was answered live

	mu   sync.Mutex
	got  map[string]Result
	live map[string]bool
	once sync.Once
}

// Follow starts following the results of ids (of tenants, stored from
// since on); call it before publishing the requests, then Wait (or Stop
// when they could not be published).
func (c *Client) Follow(ctx context.Context, tenants []string, since time.Time, ids map[string]bool) (*Waiter, error) {
	w := &Waiter{c: c, tenants: tenants, since: since, ids: ids, done: make(chan struct{}), got: map[string]Result{}, live: map[string]bool{}}
	nc := c.js.Conn()
	seen := map[string]bool{}
	for _, t := range tenants {
		if seen[t] {
			continue
		}
		seen[t] = true
		sub, err := nc.Subscribe(c.cfg.ResSubject(t), w.onLive)
		if err != nil {
			w.Stop()
			return nil, fmt.Errorf("follow results: %w", err)
		}
		w.subs = append(w.subs, sub)
	}
	// The subscription is in place on the server before anything is
	// published or the stream is read.
	fctx, cancel := context.WithTimeout(ctx, 10*time.Second) // FlushWithContext needs a deadline
	defer cancel()
	if err := nc.FlushWithContext(fctx); err != nil {
		w.Stop()
		return nil, fmt.Errorf("follow results: %w", err)
	}
	return w, nil
}

func (w *Waiter) onLive(m *nats.Msg) {
	var r Result
	if json.Unmarshal(m.Data, &r) != nil || !w.ids[r.RequestID] {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.got[r.RequestID], w.live[r.RequestID] = r, true
	if w.complete(false) {
		w.once.Do(func() { close(w.done) })
	}
}

// complete: every id has a result, and each is final (under mu).
func (w *Waiter) complete(caughtUp bool) bool {
	if len(w.got) < len(w.ids) {
		return false
	}
	if caughtUp {
		return true
	}
	for id := range w.ids {
		if !w.live[id] {
			return false
		}
	}
	return true
}

// Stop stops following (Wait does it too).
func (w *Waiter) Stop() {
	for _, s := range w.subs {
		_ = s.Unsubscribe()
	}
}

// Wait returns once every id has its result (see Client.Wait) or ctx is
// done, with what it collected.
func (w *Waiter) Wait(ctx context.Context) (map[string]Result, error) {
	defer w.Stop()
	if len(w.ids) == 0 {
		return map[string]Result{}, nil
	}
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	go func() {
		select {
		case <-w.done:
			stop()
		case <-wctx.Done():
		}
	}()
	err := w.c.results(wctx, w.tenants, w.since, func(r *Result, caughtUp bool) bool {
		w.mu.Lock()
		defer w.mu.Unlock()
		if r != nil && w.ids[r.RequestID] && !w.live[r.RequestID] {
			w.got[r.RequestID] = *r // a later answer replaces an earlier one
		}
		return !w.complete(caughtUp)
	})
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make(map[string]Result, len(w.got))
	for id, r := range w.got {
		out[id] = r
	}
	if len(out) == len(w.ids) {
		return out, nil
	}
	if err == nil || (errors.Is(err, context.Canceled) && ctx.Err() == nil) {
		err = ctx.Err()
	}
	return out, err
}

var tenantRE = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,62}$`)

// ValidTenant reports whether t is a tenant name (CONTRACT §1).
func ValidTenant(t string) bool { return tenantRE.MatchString(t) }

// Partition is the partition of a tenant among p (FNV-1a of the tenant,
// mod p: what the request stream's {{partition(p,1)}} transform computes).
func Partition(tenant string, p int) int {
	if p <= 0 {
		return 0
	}
	h := fnv.New32a()
	_, _ = h.Write([]byte(tenant))
	return int(h.Sum32() % uint32(p))
}
