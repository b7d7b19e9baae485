package attempt

import (
	"context"
	"errors"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Policy bounds the tries of one request: the first is bounded by First,
// each later one by twice the one before, up to Max (Max 0: First).
type Policy struct {
	First, Max time.Duration
}

// Pause separates two tries when the first failed quickly ("no
// responders" comes back at once while a stream has no leader): a pause,
// not a loop of requests at the servers.
const Pause = 250 * time.Millisecond

// Bounded runs fn under p's bound per try, trying again while a try goes
// unanswered and ctx lasts. fn must be safe to repeat (a read, a put of
// the same value, a delete that finds the message gone the second time,
// a compare-and-set whose loss the caller handles).
func Bounded[T any](ctx context.Context, p Policy, fn func(context.Context) (T, error)) (T, error) {
	per := p.First
	for {
		start := time.Now()
		actx, cancel := context.WithTimeout(ctx, per)
		v, err := fn(actx)
		cancel()
		if err == nil || ctx.Err() != nil || !Unanswered(err) {
			return v, err
		}
		if wait := Pause - time.Since(start); wait > 0 {
			select {
			case <-ctx.Done():
				return v, err
			case <-time.After(wait):
			}
		}
		per = min(2*per, max(p.Max, p.First))
	}
}

// Unanswered: the request timed out, or nobody took it (no leader yet).
func Unanswered(err error) bool {
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout) ||
		errors.Is(err, nats.ErrNoResponders) || errors.Is(err, jetstream.ErrNoStreamResponse)
}
