package client

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Pausing a replica's consumer (issue 23 item 12): JetStream's own consumer
// pause (nats-server 2.11+), the consumer's pause_until. The server stops
// delivering to the durable consumer, whichever process pulls from it, until
// the deadline or a resume; a worker restart keeps it (the server keeps an
// existing consumer's pause_until when the worker provisions it again). Messages keep
// arriving in the request stream and are consumed after the resume.

// PausedForever is the pause_until of a pause with no end of its own (until
// resumed): JetStream needs a deadline.
var PausedForever = time.Date(9999, 12, 31, 0, 0, 0, 0, time.UTC)

// ReqStream is the default request stream's name.
const ReqStream = "TELHA_REQ"

// ConsumerName is the durable consumer of replica i (queue.Config's
// ConsumerName: a test keeps the two equal).
func ConsumerName(replica int) string { return fmt.Sprintf("telha-worker-%d", replica) }

// PauseState is a consumer's pause.
type PauseState struct {
	Consumer string
	Paused   bool
	// Until is the pause's deadline (PausedForever: until resumed); zero
	// when not paused.
	Until time.Time
}

// Forever reports a pause that lasts until it is resumed.
func (p PauseState) Forever() bool {
	return p.Paused && !p.Until.Before(PausedForever.AddDate(-1, 0, 0))
}

// String says the pause as a person reads it.
func (p PauseState) String() string {
	switch {
	case !p.Paused:
		return "consuming"
	case p.Forever():
		return "paused until resumed"
	default:
		return "paused until " + p.Until.UTC().Format(time.RFC3339)
	}
}

// PauseOf reads the pause of a consumer from its info.
func PauseOf(info *jetstream.ConsumerInfo) PauseState {
	st := PauseState{Consumer: info.Name, Paused: info.Paused}
	if st.Paused {
		if u := info.Config.PauseUntil; u != nil {
			st.Until = u.UTC()
		} else {
			st.Until = time.Now().Add(info.PauseRemaining).UTC()
		}
	}
	return st
}

// PauseConsumer pauses consumer of stream until the deadline (zero:
// PausedForever) and returns its state.
func PauseConsumer(ctx context.Context, js jetstream.JetStream, stream, consumer string, until time.Time) (PauseState, error) {
	if until.IsZero() {
		until = PausedForever
	}
	if !until.After(time.Now()) {
		return PauseState{}, fmt.Errorf("pause %s until %s: the deadline has passed", consumer, until.UTC().Format(time.RFC3339))
	}
	res, err := js.PauseConsumer(ctx, stream, consumer, until)
	if err != nil {
		return PauseState{}, fmt.Errorf("pause consumer %s of %s: %w", consumer, stream, pauseErr(err))
	}
	return PauseState{Consumer: consumer, Paused: res.Paused, Until: res.PauseUntil.UTC()}, nil
}

// ResumeConsumer resumes consumer of stream (a consumer not paused stays
// as it is).
func ResumeConsumer(ctx context.Context, js jetstream.JetStream, stream, consumer string) (PauseState, error) {
	if _, err := js.ResumeConsumer(ctx, stream, consumer); err != nil {
		return PauseState{}, fmt.Errorf("resume consumer %s of %s: %w", consumer, stream, pauseErr(err))
	}
	return PauseState{Consumer: consumer}, nil
}

// ConsumerPause reads the pause of consumer of stream.
func ConsumerPause(ctx context.Context, js jetstream.JetStream, stream, consumer string) (PauseState, error) {
	c, err := js.Consumer(ctx, stream, consumer)
	if err != nil {
		return PauseState{}, fmt.Errorf("consumer %s of %s: %w", consumer, stream, pauseErr(err))
	}
	return PauseOf(c.CachedInfo()), nil
}

// pauseErr makes the errors of a missing consumer readable.
func pauseErr(err error) error {
	if errors.Is(err, jetstream.ErrConsumerNotFound) {
		return fmt.Errorf("%w (is the replica index right? a worker creates its consumer when it starts)", err)
	}
	return err
}
