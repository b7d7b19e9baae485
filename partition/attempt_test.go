package partition

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// TestBoundedTriesAgainWhatWentUnanswered: a request that gets no answer
// (sent to a paused server) is sent again after attemptTimeout, not
// waited for until the caller's deadline; an error that is an answer is
// returned at once, and the caller's deadline still ends the tries.
func TestBoundedTriesAgainWhatWentUnanswered(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*attemptTimeout+time.Second)
	defer cancel()
	tries := 0
	// Waited for until ctx ends, the first try would leave no time for a
	// second: the 7 proves it was sent again after attemptTimeout.
	v, err := bounded(ctx, func(ctx context.Context) (int, error) {
		if tries++; tries == 1 {
			<-ctx.Done() // the first goes unanswered
			return 0, ctx.Err()
		}
		return 7, nil
	})
	if err != nil || v != 7 || tries != 2 {
		t.Fatalf("bounded: %d %v after %d tries, want 7 after 2", v, err, tries)
	}
	refused := errors.New("refused")
	tries = 0
	if _, err := bounded(ctx, func(context.Context) (int, error) { tries++; return 0, refused }); !errors.Is(err, refused) || tries != 1 {
		t.Fatalf("an answer that is an error: %v after %d tries, want it after 1", err, tries)
	}
	// An instant "no responders" (no leader yet) is tried again after a
	// pause, not in a loop: about 4 tries a second.
	tries = 0
	second, cancelSecond := context.WithTimeout(context.Background(), time.Second)
	defer cancelSecond()
	if _, err := bounded(second, func(context.Context) (int, error) { tries++; return 0, nats.ErrNoResponders }); !errors.Is(err, nats.ErrNoResponders) || tries > 5 {
		t.Fatalf("instant no-responders for a second: %v after %d tries, want it after at most 5", err, tries)
	}
	short, cancelShort := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancelShort()
	if _, err := bounded(short, func(ctx context.Context) (int, error) { <-ctx.Done(); return 0, ctx.Err() }); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("tries past the caller's deadline: %v, want its deadline", err)
	}
}

// TestGoneIsADeleteAlreadyDone: a delete tried again after its first
// answer was lost finds its sequence gone; the server says so with
// err_code 10043 (a probe's erase failed on it and waited its backoff).
func TestGoneIsADeleteAlreadyDone(t *testing.T) {
	seqGone := fmt.Errorf("nats: message deletion unsuccessful: %w", &jetstream.APIError{Code: 400, ErrorCode: 10043, Description: "sequence 34891 not found"})
	for _, c := range []struct {
		err  error
		want bool
	}{
		{seqGone, true},
		{jetstream.ErrMsgNotFound, true},
		{fmt.Errorf("wrapped: %w", jetstream.ErrMsgNotFound), true},
		{&jetstream.APIError{Code: 500, ErrorCode: 10057, Description: "stream store failed"}, false},
		{context.DeadlineExceeded, false},
	} {
		if got := gone(c.err); got != c.want {
			t.Errorf("gone(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}
