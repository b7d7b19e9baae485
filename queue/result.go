package queue

import (
	"errors"

	"github.com/telha/telha-cascade/cascade"
	"github.com/telha/telha-cascade/storage"
)

// Result statuses (DESIGN §4, plus "failed": dead-lettered after the final
// delivery of a transient failure; nothing was applied).
const (
	StatusOK                = "ok"
	StatusNotFound          = "not_found"
	StatusAlreadyTombstoned = "already_tombstoned"
	StatusEndpointDead      = "endpoint_dead"
	StatusCascadeInFlight   = "cascade_in_flight"
	StatusInvalid           = "invalid"
	StatusFailed            = "failed"
)

// Statuses lists every status, for metrics initialisation.
func Statuses() []string {
	return []string{StatusOK, StatusNotFound, StatusAlreadyTombstoned, StatusEndpointDead, StatusCascadeInFlight, StatusInvalid, StatusFailed}
}

// Result is the result body published on telha.res.<tenant>, one per
// request, with Nats-Msg-Id res-<request_id>.
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
}

func statusOf(s storage.Status) string {
	switch s {
	case storage.StatusOK:
		return StatusOK
	case storage.StatusNotFound:
		return StatusNotFound
	case storage.StatusAlreadyTombstoned:
		return StatusAlreadyTombstoned
	case storage.StatusEndpointDead:
		return StatusEndpointDead
	case storage.StatusCascadeInFlight:
		return StatusCascadeInFlight
	}
	return StatusFailed
}

// ResultOfReceipt builds the result of a request from its receipt (fresh or
// stored: a duplicate gets the same tx_time).
func ResultOfReceipt(tenant, requestID string, rc storage.Receipt, err error) Result {
	res := Result{RequestID: requestID, Op: rc.Op.String(), Tenant: tenant, ID: rc.ID.String(), Status: statusOf(rc.Status)}
	if rc.Status == storage.StatusOK {
		res.TxTime = rc.Tx.Time().Format(storage.TimeLayout)
		if rc.Op == storage.OpTombstoneNode {
			res.EdgesTombstoned, res.Journaled = rc.EdgesTombstoned, rc.Journaled
		}
	} else if err != nil {
		res.Error = err.Error()
	} else {
		res.Error = res.Status
	}
	return res
}

// resultOfOutcome maps a non-journaled outcome to its result.
func resultOfOutcome(req *cascade.Request, oc cascade.Outcome) Result {
	if oc.Final {
		return ResultOfReceipt(req.Scope.Tenant(), req.RequestID, oc.Receipt, oc.Err)
	}
	res := Result{RequestID: req.RequestID, Op: req.Op.String(), Tenant: req.Scope.Tenant(), ID: req.ID.String(), Status: StatusInvalid}
	if errors.Is(oc.Err, storage.ErrCascadeInFlight) {
		res.Status = StatusCascadeInFlight
	}
	if oc.Err != nil {
		res.Error = oc.Err.Error()
	}
	return res
}
