package partition

import (
	"context"
	"fmt"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
)

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
