package partition

import (
	"context"
	"errors"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// A NATS server that is paused (SIGSTOP, a frozen VM) keeps its routes
// open for a while: a request routed to it (a direct get, answered by any
// of a stream's replicas; an API request to a leader it still holds) gets
// no answer, and waits out its whole context. A black-box probe paused one
// of three servers for 30 s and saw an erase's scrub of the checkpoints
// wait its full 2 minutes, and a scheduled checkpoint its 10.

// attemptTimeout bounds one request to the streams, listAttempt one
// listing (a consumer created, then every entry read); a request that
// timed out is sent again (to another replica, or to the leader elected
// meanwhile) until the caller's context ends.
const (
	attemptTimeout = 5 * time.Second
	listAttempt    = 10 * time.Second
)

// bounded runs fn with at most attemptTimeout per try, trying again while
// a try times out and ctx lasts. fn must be safe to repeat (a read, a
// delete that finds the message gone the second time).
func bounded[T any](ctx context.Context, fn func(context.Context) (T, error)) (T, error) {
	return boundedBy(ctx, attemptTimeout, fn)
}

// boundedBy is bounded with per as the bound of a try.
func boundedBy[T any](ctx context.Context, per time.Duration, fn func(context.Context) (T, error)) (T, error) {
	for {
		actx, cancel := context.WithTimeout(ctx, per)
		v, err := fn(actx)
		cancel()
		if err == nil || ctx.Err() != nil || !unanswered(err) {
			return v, err
		}
		// "No responders" comes back at once while a stream has no
		// leader: a pause, not a loop of requests at the servers.
		select {
		case <-ctx.Done():
			return v, err
		case <-time.After(retryPause):
		}
	}
}

// retryPause separates two tries of bounded.
const retryPause = 250 * time.Millisecond

// jsSequenceNotFound is the server's answer to a delete of a sequence
// already deleted (a try whose answer was lost did delete it).
const jsSequenceNotFound jetstream.ErrorCode = 10043

// gone: a delete found the message already deleted.
func gone(err error) bool {
	var apiErr *jetstream.APIError
	return errors.Is(err, jetstream.ErrMsgNotFound) || (errors.As(err, &apiErr) && apiErr.ErrorCode == jsSequenceNotFound)
}

// unanswered: the request timed out, or nobody took it (no leader yet).
func unanswered(err error) bool {
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout) ||
		errors.Is(err, nats.ErrNoResponders) || errors.Is(err, jetstream.ErrNoStreamResponse)
}

// uploadContext is ctx without its deadline, still ended when ctx ends.
// An object store's Put publishes its chunks asynchronously and, under a
// context with a deadline, waits for their acks until that deadline: one
// ack lost to a paused server held a checkpoint for its whole 10 minutes.
// Without one, each publish is bounded by the JetStream context's default
// timeout (the slot's: 30 s) and a lost ack fails the upload then.
func uploadContext(ctx context.Context) (context.Context, context.CancelFunc) {
	uctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	stop := context.AfterFunc(ctx, cancel)
	return uctx, func() { stop(); cancel() }
}
