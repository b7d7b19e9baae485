package storage

import "errors"

// Sentinel errors. Every error the store returns wraps one of these (test with
// errors.Is), with the details in the message.
var (
	// ErrNotFound: the entity (or an edge's endpoint) never existed.
	ErrNotFound = errors.New("not found")
	// ErrAlreadyTombstoned: the entity's latest version is a tombstone;
	// resurrection and double deletes are refused.
	ErrAlreadyTombstoned = errors.New("already tombstoned")
	// ErrEndpointDead: an edge endpoint's latest version is a tombstone.
	ErrEndpointDead = errors.New("endpoint dead")
	// ErrCascadeInFlight: a cascade journal for a node the write touches is
	// being applied. Transient, but the answer is final for its request id
	// (CONTRACT §5): a publisher sends the request again under a new id.
	ErrCascadeInFlight = errors.New("cascade in flight")
	// ErrConflict: the request id was used before for a different request.
	ErrConflict = errors.New("conflict")
	// ErrInvalid: the request itself is malformed (bad tenant, empty interval,
	// changed edge endpoints, ...).
	ErrInvalid = errors.New("invalid")
	// ErrDecode: a stored record or key failed to decode.
	ErrDecode = errors.New("decode")
	// ErrStorage: the engine failed (I/O, closed, injected crash). Transient
	// from the caller's point of view: the write did not happen.
	ErrStorage = errors.New("storage")
)

// IsRetryable reports whether err is transient: the same write may succeed
// later. It says nothing of request ids: a storage error stored nothing,
// so the queue retries the message as it is; a cascade_in_flight answer is
// final for its request id (CONTRACT §5), retried only under a new one.
func IsRetryable(err error) bool {
	return errors.Is(err, ErrStorage) || errors.Is(err, ErrCascadeInFlight)
}
