package client

import (
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
// request, with Nats-Msg-Id ResultMsgID(tenant, request_id).
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

// ResultMsgID is the Nats-Msg-Id of a request's result:
// res.<tenant>.<request_id>.
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

// Client publishes requests (with Nats-Msg-Id <tenant>.<request_id>, so the
// request stream deduplicates publisher retries) and collects their results
// from the results stream.
type Client struct {
	js  jetstream.JetStream
	cfg Config
}

// New returns a client over an open connection.
func New(nc *nats.Conn, cfg Config, opts ...jetstream.JetStreamOpt) (*Client, error) {
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

// Publish publishes one request and waits for the stream's ack. The ack's
// Duplicate flag says the stream already had this request within its
// duplicate window (no second result will come).
func (c *Client) Publish(ctx context.Context, tenant, requestID string, body []byte) (*jetstream.PubAck, error) {
	return c.js.PublishMsg(ctx, c.RequestMsg(tenant, requestID, body))
}

// PublishRequest marshals r and publishes it (see Publish).
func (c *Client) PublishRequest(ctx context.Context, r *Request) (*jetstream.PubAck, error) {
	body, err := json.Marshal(r)
	if err != nil {
		return nil, err
	}
	return c.Publish(ctx, r.Tenant, r.RequestID, body)
}

// PublishAsync publishes without waiting; bound the number in flight with
// jetstream.WithPublishAsyncMaxPending on the client.
func (c *Client) PublishAsync(tenant, requestID string, body []byte) (jetstream.PubAckFuture, error) {
	return c.js.PublishMsgAsync(c.RequestMsg(tenant, requestID, body))
}

// Results follows the results of some tenants from `since` on (use a time
// a little before the first publish, minus the duplicate window if some
// requests may be publisher retries) and calls fn for each, until ctx is
// done or fn returns false.
func (c *Client) Results(ctx context.Context, tenants []string, since time.Time, fn func(Result) bool) error {
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
	msgs, err := oc.Messages()
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
		var r Result
		if err := json.Unmarshal(m.Data(), &r); err != nil {
			continue
		}
		if !fn(r) {
			return nil
		}
	}
}

// Wait collects the results of the given request ids (first result per id),
// until all have one or ctx is done. It returns what it collected.
func (c *Client) Wait(ctx context.Context, tenants []string, since time.Time, ids map[string]bool) (map[string]Result, error) {
	got := map[string]Result{}
	if len(ids) == 0 {
		return got, nil
	}
	err := c.Results(ctx, tenants, since, func(r Result) bool {
		if ids[r.RequestID] {
			if _, dup := got[r.RequestID]; !dup {
				got[r.RequestID] = r
			}
		}
		return len(got) < len(ids)
	})
	if len(got) == len(ids) {
		return got, nil
	}
	return got, err
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
