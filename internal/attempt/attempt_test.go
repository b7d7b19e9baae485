package attempt

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
)

// TestBoundedTriesAgainWhatWentUnanswered: a request that gets no answer
// (sent to a paused server) is sent again after its try's bound, not
// waited for until the caller's deadline; an error that is an answer is
// returned at once, and the caller's deadline still ends the tries.
func TestBoundedTriesAgainWhatWentUnanswered(t *testing.T) {
	const per = 2 * time.Second
	p := Policy{First: per}
	ctx, cancel := context.WithTimeout(context.Background(), 2*per+time.Second)
	defer cancel()
	tries := 0
	// Waited for until ctx ends, the first try would leave no time for a
	// second: the 7 proves it was sent again after per.
	v, err := Bounded(ctx, p, func(ctx context.Context) (int, error) {
		if tries++; tries == 1 {
			<-ctx.Done() // the first goes unanswered
			return 0, ctx.Err()
		}
		return 7, nil
	})
	if err != nil || v != 7 || tries != 2 {
		t.Fatalf("Bounded: %d %v after %d tries, want 7 after 2", v, err, tries)
	}
	refused := errors.New("refused")
	tries = 0
	if _, err := Bounded(ctx, p, func(context.Context) (int, error) { tries++; return 0, refused }); !errors.Is(err, refused) || tries != 1 {
		t.Fatalf("an answer that is an error: %v after %d tries, want it after 1", err, tries)
	}
	// An instant "no responders" (no leader yet) is tried again after a
	// pause, not in a loop: about 4 tries a second.
	tries = 0
	second, cancelSecond := context.WithTimeout(context.Background(), time.Second)
	defer cancelSecond()
	if _, err := Bounded(second, p, func(context.Context) (int, error) { tries++; return 0, nats.ErrNoResponders }); !errors.Is(err, nats.ErrNoResponders) || tries > 5 {
		t.Fatalf("instant no-responders for a second: %v after %d tries, want it after at most 5", err, tries)
	}
	short, cancelShort := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancelShort()
	if _, err := Bounded(short, p, func(ctx context.Context) (int, error) { <-ctx.Done(); return 0, ctx.Err() }); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("tries past the caller's deadline: %v, want its deadline", err)
	}
}

// TestBoundedGrowsItsTries: each try that timed out gives the next twice
// its time, up to Max, so a server slow but alive (every answer later
// than First) is still answered. Each try's bound is checked against its
// level (at most its level, more than the level below: a stall of the
// test's goroutine only shortens what is left of a try).
func TestBoundedGrowsItsTries(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var bounds []time.Duration
	v, err := Bounded(ctx, Policy{First: 200 * time.Millisecond, Max: 800 * time.Millisecond}, func(ctx context.Context) (int, error) {
		dl, _ := ctx.Deadline()
		bounds = append(bounds, time.Until(dl))
		select {
		case <-time.After(600 * time.Millisecond): // answers after 600 ms
			return 1, nil
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	})
	if err != nil || v != 1 {
		t.Fatalf("a server that answers in 600 ms: %d %v (tries bounded by %v)", v, err, bounds)
	}
	want := []time.Duration{200 * time.Millisecond, 400 * time.Millisecond, 800 * time.Millisecond}
	if len(bounds) != len(want) {
		t.Fatalf("tries bounded by %v, want %v", bounds, want)
	}
	for i := range want {
		if bounds[i] > want[i] || bounds[i] <= want[i]/2 {
			t.Fatalf("tries bounded by %v, want %v", bounds, want)
		}
	}
}
