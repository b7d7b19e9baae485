package queue

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Client is what an upstream service needs: publish requests (with
// Nats-Msg-Id = <tenant>.<request_id>, so the request stream deduplicates publisher
// retries) and collect their results from TELHA_RES.
type Client struct {
	js  jetstream.JetStream
	cfg Config
}

// NewClient returns a client over an open connection. Only Prefix and the
// stream names of cfg matter.
func NewClient(nc *nats.Conn, cfg Config, opts ...jetstream.JetStreamOpt) (*Client, error) {
	js, err := jetstream.New(nc, opts...)
	if err != nil {
		return nil, err
	}
	return &Client{js: js, cfg: cfg.Defaults()}, nil
}

// JetStream returns the client's JetStream context.
func (c *Client) JetStream() jetstream.JetStream { return c.js }

// RequestMsg builds the message of a request body for tenant.
func (c *Client) RequestMsg(tenant, requestID string, body []byte) *nats.Msg {
	m := nats.NewMsg(c.cfg.reqSubject(tenant))
	m.Data = body
	if requestID != "" {
		m.Header.Set(jetstream.MsgIDHeader, RequestMsgID(tenant, requestID))
	}
	return m
}

// Publish publishes one request and waits for the stream's ack. The ack's
// Duplicate flag says the stream already had this request id.
func (c *Client) Publish(ctx context.Context, tenant, requestID string, body []byte) (*jetstream.PubAck, error) {
	return c.js.PublishMsg(ctx, c.RequestMsg(tenant, requestID, body))
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
			filters = append(filters, c.cfg.resSubject(t))
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
