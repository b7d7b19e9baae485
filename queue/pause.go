package queue

import (
	"context"
	"time"

	"github.com/telha/telha-cascade/queue/client"
)

// Pause and resume (issue 23 item 12): the replica's durable consumer is
// paused with JetStream's consumer pause (its pause_until), so the pause
// holds for every process pulling from it and survives a restart
// (the server keeps an existing consumer's pause_until when Provision
// updates it). The worker keeps running, holds nothing
// new, and stays ready: the requests wait in the stream.

// Pause pauses this replica's consumer until the deadline (zero: until
// resumed); by says who asked, for the log.
func (w *Worker) Pause(ctx context.Context, until time.Time, by string) (client.PauseState, error) {
	st, err := client.PauseConsumer(ctx, w.js, w.cfg.ReqStream, w.cfg.ConsumerName(), until)
	if err != nil {
		return st, err
	}
	w.setPause(st, by)
	return st, nil
}

// Resume resumes this replica's consumer; by says who asked, for the log.
func (w *Worker) Resume(ctx context.Context, by string) (client.PauseState, error) {
	st, err := client.ResumeConsumer(ctx, w.js, w.cfg.ReqStream, w.cfg.ConsumerName())
	if err != nil {
		return st, err
	}
	w.setPause(st, by)
	return st, nil
}

// pauseChange returns the pause generation, for a refresh to tell
// whether a Pause or Resume noted its state while it read the consumer.
func (w *Worker) pauseChange() uint64 {
	w.pauseMu.Lock()
	defer w.pauseMu.Unlock()
	return w.pauseGen
}

// setPause notes the state a Pause or Resume set, once the server has
// it, and moves the generation. A refresh that read the generation
// before this may have read the server before the change: it drops what
// it read. One that read it after reads the server after the change.
func (w *Worker) setPause(st client.PauseState, by string) {
	w.pauseMu.Lock()
	defer w.pauseMu.Unlock()
	w.notePause(st, by)
	w.pauseGen++
}

// PauseState is the consumer's pause as of the last refresh, pause or
// resume (zero before the first).
func (w *Worker) PauseState() client.PauseState {
	if p := w.pause.Load(); p != nil {
		return *p
	}
	return client.PauseState{Consumer: w.cfg.ConsumerName()}
}

// notePause records a pause state and logs it when it changed (by: who
// changed it; empty when a refresh found it changed elsewhere: enqueue
// pause, the NATS CLI, another replica's page, a deadline that passed).
func (w *Worker) notePause(st client.PauseState, by string) {
	st.Consumer = w.cfg.ConsumerName()
	old := w.pause.Swap(&st)
	if old != nil && old.Paused == st.Paused && old.Until.Equal(st.Until) {
		return
	}
	if old == nil && !st.Paused {
		return // consuming from the start: nothing to say
	}
	if by == "" {
		by = "outside this worker (enqueue pause|resume, nats consumer pause, or the deadline passed)"
	}
	if st.Paused {
		until := st.Until.Format(time.RFC3339)
		if st.Forever() {
			until = "resumed"
		}
		w.log.Warn("consumer paused: no request is consumed until "+until, "consumer", st.Consumer, "until", st.Until, "by", by)
		return
	}
	w.log.Info("consumer resumed: consuming requests again", "consumer", st.Consumer, "by", by)
}
