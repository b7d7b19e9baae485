package queue

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/telha/telha-cascade/cascade"
	"github.com/telha/telha-cascade/queue/client"
	"github.com/telha/telha-cascade/storage"
)

// Result statuses: the wire names of storage.Status, where the one
// vocabulary of outcomes lives (CONTRACT §5, plus "failed": dead-lettered
// after the final delivery of a transient failure; nothing was applied).
var (
	StatusOK                = storage.StatusOK.String()
	StatusNotFound          = storage.StatusNotFound.String()
	StatusAlreadyTombstoned = storage.StatusAlreadyTombstoned.String()
	StatusEndpointDead      = storage.StatusEndpointDead.String()
	StatusCascadeInFlight   = storage.StatusCascadeInFlight.String()
	StatusInvalid           = storage.StatusInvalid.String()
	StatusFailed            = storage.StatusFailed.String()
	StatusConflict          = storage.StatusConflict.String()
)

// Statuses lists every status, for metrics initialisation.
func Statuses() []string {
	var out []string
	for _, s := range storage.Statuses() {
		out = append(out, s.String())
	}
	return out
}

// UnknownOpStatuses lists the statuses a result can have when its
// request's op could not be read (op "unknown" in metrics): only a message
// rejected before it is decoded has no readable op, and a rejected message
// is answered invalid (crash_loop, which answers failed, and conflict
// concern decoded requests only).
func UnknownOpStatuses() []string { return []string{StatusInvalid} }

// Result is the result body published on telha.res.<tenant>, one per
// answer, with Nats-Msg-Id ResultMsgID(result).
type Result = client.Result

// ResultOfReceipt builds the result of a request from its receipt (fresh or
// stored: a duplicate gets the same tx_time). err, when set, is the
// refusal's cause.
func ResultOfReceipt(tenant, requestID string, rc storage.Receipt, err error) Result {
	res := Result{RequestID: requestID, Op: rc.Op.String(), Tenant: tenant, ID: rc.ID.String(), Status: rc.Status.String()}
	switch {
	case rc.Status == storage.StatusOK:
		res.TxTime = rc.Tx.Time().Format(storage.TimeLayout)
		if rc.Op == storage.OpTombstoneNode {
			res.EdgesTombstoned, res.Journaled = rc.EdgesTombstoned, rc.Journaled
		}
		if rc.Op == storage.OpEraseNode || rc.Op == storage.OpEraseEdge {
			n := rc.VersionsErased
			res.VersionsErased = &n
			res.EdgesTombstoned, res.Journaled = rc.EdgesTombstoned, rc.Journaled
		}
	case err != nil:
		res.Error = err.Error()
	default:
		res.Error = res.Status
	}
	return res
}

// resultOfOutcome maps an answered, invalid or conflicting outcome to its
// result (a journaled one is answered from the outbox).
func resultOfOutcome(req *cascade.Request, oc cascade.Outcome) Result {
	if oc.Kind == cascade.Answered {
		return ResultOfReceipt(req.Scope.Tenant(), req.RequestID, oc.Receipt, oc.Err)
	}
	res := Result{RequestID: req.RequestID, Op: req.Op.String(), Tenant: req.Scope.Tenant(), ID: req.ID.String(), Status: oc.Status().String()}
	if oc.Err != nil {
		res.Error = oc.Err.Error()
	}
	return res
}

// resultMsg is the message of a result on the results stream.
func resultMsg(cfg Config, res Result) *nats.Msg {
	body, _ := json.Marshal(res)
	m := nats.NewMsg(cfg.resSubject(res.Tenant))
	m.Data = body
	if res.RequestID != "" {
		m.Header.Set(jetstream.MsgIDHeader, ResultMsgID(res))
	}
	return m
}

// ResultMsgID is the Nats-Msg-Id of a result:
// res.<tenant>.<request_id>.<answer>, where <answer> is 16 hex digits of
// the SHA-256 of what the answer says (status, op, id, tx_time, counts,
// and the error of an invalid or conflict answer, which no receipt
// backs). A replay of the same answer (a redelivery, a publisher's retry
// answered from the receipt, the outbox published again) has the same id
// and is stored once; a different answer under the same request id (an
// invalid request fixed and sent again) is stored too (issue 20: the
// results stream dropped the fixed request's ok as a duplicate of the
// invalid answer). A failed answer (crash_loop, retries_exhausted) never
// gets this id: its error counts deliveries, so Worker.deadLetter names
// it by its message (res.<tenant>.<request_id>.dlq-<stream>-<seq>).
func ResultMsgID(res Result) string {
	key := struct {
		Status, Op, ID, TxTime, RequestIDFrom, Error string
		Edges                                        uint64
		Journaled                                    bool
		Erased                                       *uint64
	}{res.Status, res.Op, res.ID, res.TxTime, res.RequestIDFrom, "", res.EdgesTombstoned, res.Journaled, res.VersionsErased}
	if res.Status == StatusInvalid || res.Status == StatusConflict {
		key.Error = res.Error // no receipt: the error is the answer
	}
	b, _ := json.Marshal(key)
	sum := sha256.Sum256(b)
	return "res." + res.Tenant + "." + res.RequestID + "." + hex.EncodeToString(sum[:8])
}

// RequestMsgID is the Nats-Msg-Id of a request (client.RequestMsgID).
func RequestMsgID(tenant, requestID string) string { return client.RequestMsgID(tenant, requestID) }

// Publisher publishes results on the results stream, waiting for the
// stream's ack. A result published twice within the stream's duplicate
// window is stored once (Nats-Msg-Id ResultMsgID).
type Publisher struct {
	js  jetstream.JetStream
	cfg Config
}

// NewPublisher returns a publisher over an open connection.
func NewPublisher(nc *nats.Conn, cfg Config) (*Publisher, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("jetstream: %w", err)
	}
	return &Publisher{js: js, cfg: cfg.Defaults()}, nil
}

// Publish publishes one result and waits for the stream to store it.
func (p *Publisher) Publish(ctx context.Context, res Result) error {
	m := resultMsg(p.cfg, res)
	TraceContext.Inject(ctx, HeaderCarrier(m.Header)) // the request's traceparent, when ctx carries one
	_, err := p.js.PublishMsg(ctx, m)
	return err
}

// PublishResult publishes the result of a request from its receipt (the
// result outbox of finished journals: reaper.Publisher).
func (p *Publisher) PublishResult(ctx context.Context, tenant, requestID string, rc storage.Receipt) error {
	return p.Publish(ctx, ResultOfReceipt(tenant, requestID, rc, nil))
}
