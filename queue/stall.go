package queue

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// A pull subscription can go silent: after a consumer leader change the
// client resets its pending counts, and when that status arrives while a
// pull is being sent it never sends another (nats.go#2063, open in v1.56.0).
// The connection is healthy, the server holds requests, and none arrive
// until the process restarts. Short pulls and heartbeats (RunUntil) cover
// most of it; the stall watch covers the rest: while the worker holds
// nothing, it asks the server every Config.StallCheck what its consumer
// holds, and two answers in a row that say "requests waiting, none
// delivered since" restart the pull.

// stallSample is one look at the consumer while the worker held nothing.
type stallSample struct {
	pending    uint64 // requests the server has not delivered yet
	ackPending int    // delivered and not acked
	delivered  uint64 // the consumer's last delivered stream sequence
	received   uint64 // messages the worker's callback has received
	paused     bool   // the consumer is paused (CONTRACT §6, Pause): silence is expected
}

// stalled reports whether two consecutive samples, both taken while the
// worker held nothing, show a consumer that has requests for this worker
// and delivered none of them in between.
func stalled(prev, cur stallSample, maxAckPending int) bool {
	switch {
	case prev.paused || cur.paused:
		return false
	case prev.pending == 0 || cur.pending == 0:
		return false
	case cur.ackPending >= maxAckPending:
		return false // the server holds them back on purpose; redeliveries will come
	}
	return cur.delivered == prev.delivered && cur.received == prev.received
}

// consumeLoop owns the worker's pull subscription: it starts it, restarts
// it when the stall watch says so, and drains it when ctx ends.
type consumeLoop struct {
	w        *Worker
	handler  jetstream.MessageHandler
	opts     []jetstream.PullConsumeOpt
	received atomic.Uint64
	looks    atomic.Int64 // answered looks while idle (tests wait on it)
	busy     func() bool  // whether the worker holds any message

	mu       sync.Mutex
	cc       jetstream.ConsumeContext
	restarts int
}

func (l *consumeLoop) start() error {
	cc, err := l.w.cons.Consume(func(m jetstream.Msg) {
		l.received.Add(1)
		l.handler(m)
	}, l.opts...)
	if err != nil {
		return err
	}
	l.mu.Lock()
	l.cc = cc
	l.mu.Unlock()
	return nil
}

func (l *consumeLoop) current() jetstream.ConsumeContext {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.cc
}

// restart stops the silent subscription and starts a new one. Messages the
// old one had pulled and not handed over are redelivered after AckWait.
func (l *consumeLoop) restart() error {
	old := l.current()
	old.Stop()
	if err := l.start(); err != nil {
		return err
	}
	l.mu.Lock()
	l.restarts++
	l.mu.Unlock()
	return nil
}

// Restarts returns how many times the stall watch restarted the pull.
func (l *consumeLoop) Restarts() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.restarts
}

// watch samples the consumer every period while the worker holds nothing,
// until ctx ends.
func (l *consumeLoop) watch(ctx context.Context, period time.Duration) {
	t := time.NewTicker(period)
	defer t.Stop()
	var prev stallSample
	havePrev := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if l.busy() {
			havePrev = false
			continue
		}
		// At least 2 s for the answer, whatever the period: a short period
		// (tests) on a loaded machine must not turn every look into "no
		// answer". Ticks missed meanwhile are dropped, not queued.
		ictx, cancel := context.WithTimeout(ctx, max(period, 2*time.Second))
		info, err := l.w.cons.Info(ictx)
		cancel()
		if err != nil || l.busy() {
			havePrev = false // no answer is no evidence: the next look starts over
			continue
		}
		cur := stallSample{pending: info.NumPending, ackPending: info.NumAckPending, delivered: info.Delivered.Stream,
			received: l.received.Load(), paused: info.Paused}
		l.looks.Add(1)
		if havePrev && stalled(prev, cur, l.w.cfg.MaxAckPending) {
			l.w.log.Warn("consume: the consumer holds requests but delivered none of them for a while; restarting the pull (nats.go#2063)",
				"pending", cur.pending, "ack_pending", cur.ackPending, "last_delivered_seq", cur.delivered, "silent_for", 2*period)
			if err := l.restart(); err != nil {
				l.w.log.Warn("consume: restarting the pull failed; the next look retries", "err", err)
			}
			havePrev = false
			continue
		}
		prev, havePrev = cur, true
	}
}
