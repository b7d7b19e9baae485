package partition

import (
	"context"
	"errors"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/telha/telha-cascade/internal/attempt"
)

// The scrub's requests to the checkpoint bucket are bounded per try and
// sent again when unanswered (package attempt says why): attemptPolicy
// bounds one request, listPolicy one listing (a consumer created, then
// every entry read).
var (
	attemptPolicy = attempt.Policy{First: 5 * time.Second}
	listPolicy    = attempt.Policy{First: 10 * time.Second}
)

// bounded runs fn under attemptPolicy (attempt.Bounded).
func bounded[T any](ctx context.Context, fn func(context.Context) (T, error)) (T, error) {
	return attempt.Bounded(ctx, attemptPolicy, fn)
}

// jsSequenceNotFound is the server's answer to a delete of a sequence
// already deleted (a try whose answer was lost did delete it).
const jsSequenceNotFound jetstream.ErrorCode = 10043

// gone: a delete found the message already deleted.
func gone(err error) bool {
	var apiErr *jetstream.APIError
	return errors.Is(err, jetstream.ErrMsgNotFound) || (errors.As(err, &apiErr) && apiErr.ErrorCode == jsSequenceNotFound)
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
