package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// The change feed (CONTRACT §5, "Change feed"): one message per entity
// version a request committed, on <prefix>.chg.<tenant>.<kind>.<op> in the
// stream TELHA_CHG, in commit order within a tenant.

// Change kinds and ops, as they appear in subjects and bodies.
const (
	KindNode = "node"
	KindEdge = "edge"

	ChangePut       = "put"
	ChangeTombstone = "tombstone"
	ChangeErase     = "erase"
)

// Change is one message of the change feed.
type Change struct {
	Tenant string `json:"tenant"`
	Kind   string `json:"kind"` // node or edge
	Op     string `json:"op"`   // put, tombstone or erase
	ID     string `json:"id"`
	// TxTime: the version's transaction time (an erase: the erase's, as in
	// its result), RFC 3339 UTC with 6 fractional digits.
	TxTime string `json:"tx_time"`
	// ValidFrom and ValidEnd: the version's valid interval (ValidEnd empty
	// when open); both empty for an erase.
	ValidFrom string `json:"valid_from,omitempty"`
	ValidEnd  string `json:"valid_end,omitempty"`
	RequestID string `json:"request_id"`
	// Cause: for an edge a cascade tombstoned, the node whose tombstone
	// tombstoned it.
	Cause string `json:"cause,omitempty"`
	// Src, Dst and Label: an edge's (put and tombstone).
	Src   string `json:"src,omitempty"`
	Dst   string `json:"dst,omitempty"`
	Label string `json:"label,omitempty"`
	// Props: a put's, unless the worker runs with
	// --change-feed-props=false; "{}" once erased.
	Props json.RawMessage `json:"props,omitempty"`
	// Erased: the version's payload was erased before it was published.
	Erased bool `json:"erased,omitempty"`
	// PropsOmitted: the put's props were too large for the server's
	// largest message with the rest of the change; read the version
	// (GET /v1/tenants/<t>/nodes/<id>?tx=<tx_time>) for them.
	PropsOmitted bool `json:"props_omitted,omitempty"`
	// VersionsErased: an erase's count of versions rewritten (for a node,
	// its edges' included).
	VersionsErased *uint64 `json:"versions_erased,omitempty"`
}

// ChangeSubject is the subject of a change (prefix default "telha").
func ChangeSubject(prefix, tenant, kind, op string) string {
	if prefix == "" {
		prefix = "telha"
	}
	return prefix + ".chg." + tenant + "." + kind + "." + op
}

// ChangeMsgID is a change's Nats-Msg-Id: chg.<tenant>.<kind>.<id>.<tx
// µs>.<valid_from µs> for a version (which names it: a version is one
// key), chg.<tenant>.erase.<request_id> for an erase.
func ChangeMsgID(tenant, kind, id string, txMicros, validMicros int64) string {
	return fmt.Sprintf("chg.%s.%s.%s.%d.%d", tenant, kind, id, txMicros, validMicros)
}

// The headers of an edge's change besides Nats-Msg-Id: its endpoints. An
// erase of a node deletes the puts of its edges from the feed; its scrub
// reads the tenant's puts headers only (the bodies, props and all, stay
// on the server), so what it reads per put is a few hundred bytes
// whatever the props.
const (
	ChangeSrcHeader = "Telha-Src"
	ChangeDstHeader = "Telha-Dst"
	// ChangeNoPropsHeader ("none") marks a put published without its
	// props (--change-feed-props=false, or props_omitted): an erase's
	// scrub keeps it, since it carries nothing the erase erased. A put
	// without it may carry props (every put published before it existed).
	ChangeNoPropsHeader = "Telha-Props"
)

// EraseChangeMsgID is an erase's Nats-Msg-Id.
func EraseChangeMsgID(tenant, requestID string) string {
	return "chg." + tenant + ".erase." + requestID
}

// ChangesConfig says which feed to read and from where.
type ChangesConfig struct {
	// Prefix and Stream: defaults "telha" and "TELHA_CHG".
	Prefix, Stream string
	Tenant         string
	// Durable names a durable consumer: an acked position survives the
	// reader (Next resumes after the last change acked). Empty: an
	// ephemeral consumer, starting at From or FromSeq.
	Durable string
	// From: start at the first change stored at or after this time (a
	// tx_time to resume from: every change of a tenant with tx_time >= T is
	// stored after every change with tx_time < T, erases aside). Zero: the
	// start of what the stream keeps.
	From time.Time
	// FromSeq: start at this stream sequence (wins over From).
	FromSeq uint64
}

// Changes reads one tenant's change feed.
type Changes struct {
	cons jetstream.Consumer
	it   jetstream.MessagesContext
	from string // skip versions below (ChangesConfig.From)
}

// ChangeMsg is one change with what acks it.
type ChangeMsg struct {
	Change
	// Seq is the message's stream sequence (ChangesConfig.FromSeq resumes
	// after it); Pending, how many of the reader's changes the stream held
	// after it when it was delivered (0: the reader has caught up).
	Seq, Pending uint64
	msg          jetstream.Msg
}

// Ack acknowledges the change: a durable reader resumes after it.
func (m *ChangeMsg) Ack() error { return m.msg.Ack() }

// ErrBadChange: a message of the feed that is not a change (its raw data is
// in the error).
var ErrBadChange = errors.New("bad change message")

// OpenChanges opens a reader of tenant's feed. A durable reader whose
// consumer exists resumes after its last ack (open it with the config it
// was created with: From and FromSeq cannot change on an existing one).
func (c *Client) OpenChanges(ctx context.Context, cfg ChangesConfig) (*Changes, error) {
	if cfg.Prefix == "" {
		cfg.Prefix = c.cfg.Prefix
	}
	if cfg.Stream == "" {
		cfg.Stream = "TELHA_CHG"
	}
	if !ValidTenant(cfg.Tenant) {
		// A wildcard ("*", "a.node") would read other tenants' feeds.
		return nil, fmt.Errorf("changes: tenant %q must match %s", cfg.Tenant, tenantRE)
	}
	cc := jetstream.ConsumerConfig{
		Durable:       cfg.Durable,
		FilterSubject: cfg.Prefix + ".chg." + cfg.Tenant + ".>",
		AckPolicy:     jetstream.AckExplicitPolicy,
		MaxAckPending: 1, // in order, even across redeliveries
		DeliverPolicy: jetstream.DeliverAllPolicy,
	}
	if cfg.Durable == "" {
		cc.InactiveThreshold = 5 * time.Minute
	}
	switch {
	case cfg.FromSeq > 0:
		cc.DeliverPolicy, cc.OptStartSeq = jetstream.DeliverByStartSequencePolicy, cfg.FromSeq
	case !cfg.From.IsZero():
		// The stream's clock stamps a change when it is stored, after its
		// commit: start FromSkew before From (clocks differ) and skip
		// what is older (Next).
		start := cfg.From.Add(-FromSkew)
		cc.DeliverPolicy, cc.OptStartTime = jetstream.DeliverByStartTimePolicy, &start
	}
	// One API call, whose subject names the filter (what a tenant's NATS
	// permissions allow: docs/examples/nats-tenants.conf). A durable that
	// exists resumes at its last ack (open it with the same config).
	cons, err := c.js.CreateOrUpdateConsumer(ctx, cfg.Stream, cc)
	if err != nil {
		return nil, fmt.Errorf("changes of %s: %w", cfg.Tenant, err)
	}
	it, err := cons.Messages()
	if err != nil {
		return nil, fmt.Errorf("changes of %s: %w", cfg.Tenant, err)
	}
	r := &Changes{cons: cons, it: it}
	if !cfg.From.IsZero() && cfg.FromSeq == 0 {
		r.from = cfg.From.UTC().Format(timeLayout)
	}
	return r, nil
}

// FromSkew: how far before ChangesConfig.From a reader starts reading the
// stream, for the worker's and the NATS server's clocks to differ by up
// to that much.
const FromSkew = time.Minute

// timeLayout is the service's one time format (RFC 3339 UTC, 6 fractional
// digits): such strings sort as their times do.
const timeLayout = "2006-01-02T15:04:05.000000Z07:00"

// Pending returns how many changes the reader has not been delivered yet
// (the consumer's pending count).
func (r *Changes) Pending(ctx context.Context) (uint64, error) {
	info, err := r.cons.Info(ctx)
	if err != nil {
		return 0, err
	}
	return info.NumPending, nil
}

type got struct {
	m   jetstream.Msg
	err error
}

// Next waits for the next change (until ctx ends). Ack it before the next
// one is delivered: the reader holds one change at a time, so the feed's
// order is kept even when a change is delivered again.
func (r *Changes) Next(ctx context.Context) (*ChangeMsg, error) {
	ch := make(chan got, 1)
	for {
		m, err := r.next(ctx, ch)
		if errors.Is(err, jetstream.ErrNoHeartbeat) {
			// A missed heartbeat (a slow or failing-over server): the
			// iterator pulls again by itself; wait on.
			continue
		}
		if err != nil || r.from == "" || m.Op == ChangeErase || m.TxTime >= r.from {
			return m, err
		}
		_ = m.Ack() // below From: started early for clock skew
	}
}

func (r *Changes) next(ctx context.Context, ch chan got) (*ChangeMsg, error) {
	go func() {
		m, err := r.it.Next()
		ch <- got{m, err}
	}()
	var g got
	select {
	case g = <-ch:
	case <-ctx.Done():
		r.it.Stop() // Next returns; the goroutine ends
		<-ch
		return nil, ctx.Err()
	}
	if g.err != nil {
		return nil, g.err
	}
	out := &ChangeMsg{msg: g.m}
	if md, err := g.m.Metadata(); err == nil {
		out.Seq, out.Pending = md.Sequence.Stream, md.NumPending
	}
	if err := json.Unmarshal(g.m.Data(), &out.Change); err != nil {
		return out, fmt.Errorf("%w: %v: %q", ErrBadChange, err, g.m.Data())
	}
	return out, nil
}

// Close stops the reader (a durable consumer stays, at its last ack).
// The change the server delivered after the last ack and Next has not
// returned is given back (nak): unacked, it would hold a durable reader
// opened again for the consumer's ack wait (30 s by default; one change
// in flight at a time), as a black-box probe saw in 3 of 8 reopens.
func (r *Changes) Close() {
	r.it.Drain()
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			m, err := r.it.Next()
			if err != nil {
				return // drained: ErrMsgIteratorClosed
			}
			_ = m.Nak()
		}
	}()
	select {
	case <-done:
	case <-time.After(closeDrainWait):
		r.it.Stop() // the server is slow to answer the drain: the ack wait gives it back
		<-done
	}
}

// closeDrainWait bounds how long Close waits for the changes delivered
// and not yet read.
const closeDrainWait = 2 * time.Second
