package queue

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/telha/telha-cascade/cascade"
	"github.com/telha/telha-cascade/queue/client"
	"github.com/telha/telha-cascade/storage"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// Hooks let the metrics layer observe the worker. Every field is optional.
type Hooks struct {
	// Result fires once per result published (op "unknown" when the request
	// could not be read).
	Result func(op, status string)
	// Acked fires when a request message is acked or terminated, with the
	// time since the worker received it.
	Acked func(op string, took time.Duration)
	// DeadLetter fires once per dead letter.
	DeadLetter func(reason string)
	// DeadLetterFailed fires when a message that had to be dead-lettered
	// was terminated without its copy in the dead-letter stream (the copy
	// kept failing until the message's MaxDeliver-th delivery).
	DeadLetterFailed func(reason string)
	// DeadLetterResultFailed fires when a dead-lettered message was
	// terminated without its result in the results stream (publishing it
	// kept failing until the message's MaxDeliver-th delivery).
	DeadLetterResultFailed func(reason string)
	// Queued fires when the handling of a message starts, with its time in
	// queue: since its stream timestamp (a redelivery: since the original
	// publish).
	Queued func(d time.Duration)
}

// ConsumerStats is the consumer's state as of the last refresh.
type ConsumerStats struct {
	Pending, AckPending, Redelivered uint64
	At                               time.Time
	// Oldest is the stream timestamp of the consumer's oldest message not
	// yet acked (waiting or being handled); zero when there is none or it
	// could not be read.
	Oldest time.Time
}

// Worker consumes this replica's requests and applies them.
type Worker struct {
	cfg   Config
	nc    *nats.Conn
	js    jetstream.JetStream
	reqS  atomic.Pointer[jetstream.Stream]
	ops   *cascade.Ops
	store *storage.Store
	hooks Hooks
	log   *slog.Logger

	cons  jetstream.Consumer
	loop  atomic.Pointer[consumeLoop]
	stats atomic.Pointer[ConsumerStats]
	pause atomic.Pointer[client.PauseState]
	// pauseMu and pauseGen keep a refresh from noting a pause state read
	// before a Pause or Resume over the state that call set (the status
	// page showed "paused" right after its resume said "consuming").
	pauseMu  sync.Mutex
	pauseGen uint64 // under pauseMu; moved by each Pause and Resume that succeeded
}

// New returns a worker over an open NATS connection and cascade engine.
func New(nc *nats.Conn, ops *cascade.Ops, cfg Config, hooks Hooks, log *slog.Logger) (*Worker, error) {
	// A result the server never acks (its stream's leader lost with it in
	// flight) times out like settle's wait for it, and leaves the
	// publisher's table of pending acks: unbounded, those would stall
	// every later publish.
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncTimeout(resultAckWait))
	if err != nil {
		return nil, fmt.Errorf("jetstream: %w", err)
	}
	if log == nil {
		log = slog.Default()
	}
	return &Worker{cfg: cfg.Defaults(), nc: nc, js: js, ops: ops, store: ops.Store(), hooks: hooks, log: log}, nil
}

// Config returns the effective configuration.
func (w *Worker) Config() Config { return w.cfg }

// JetStream returns the JetStream context.
func (w *Worker) JetStream() jetstream.JetStream { return w.js }

// Provision creates the streams and this replica's consumer (idempotent).
func (w *Worker) Provision(ctx context.Context) error {
	cons, err := Provision(ctx, w.js, w.cfg)
	if err != nil {
		return err
	}
	w.cons = cons
	return nil
}

// Stats returns the last consumer stats (nil before the first refresh).
func (w *Worker) Stats() *ConsumerStats { return w.stats.Load() }

// RefreshStats reads the consumer's info from the server.
func (w *Worker) RefreshStats(ctx context.Context) error {
	if w.cons == nil {
		return errors.New("not provisioned")
	}
	gen := w.pauseChange()
	info, err := w.cons.Info(ctx)
	if err != nil {
		return err
	}
	st := &ConsumerStats{Pending: info.NumPending, AckPending: uint64(info.NumAckPending), Redelivered: uint64(info.NumRedelivered), At: time.Now()}
	w.pauseMu.Lock()
	if w.pauseGen == gen { // no Pause or Resume noted its state since the read began
		w.notePause(client.PauseOf(info), "")
	}
	w.pauseMu.Unlock()
	if st.Pending > 0 || st.AckPending > 0 {
		if st.Oldest, err = w.oldestPending(ctx, info); err != nil {
			w.log.Debug("oldest pending request not read", "err", err)
		}
	}
	w.stats.Store(st)
	return nil
}

// oldestPending returns the stream timestamp of the consumer's oldest
// message not yet acked. TELHA_REQ is a work-queue stream: an acked (or
// terminated) message is removed, so the first message stored after the
// ack floor under one of the consumer's filter subjects is the oldest one
// not acked. One message lookup per filter subject (the server finds the
// next message of a subject from its index), only while something is
// pending; a replica that owns every partition needs one lookup for the
// whole stream.
func (w *Worker) oldestPending(ctx context.Context, info *jetstream.ConsumerInfo) (time.Time, error) {
	s, err := w.reqStream(ctx)
	if err != nil {
		return time.Time{}, err
	}
	filters := info.Config.FilterSubjects
	if f := info.Config.FilterSubject; f != "" {
		filters = append(filters, f)
	}
	if w.cfg.Owner.Count <= 1 || len(filters) == 0 {
		filters = []string{w.cfg.Prefix + ".req.>"}
	}
	var oldest time.Time
	for _, f := range filters {
		m, err := s.GetMsg(ctx, info.AckFloor.Stream+1, jetstream.WithGetMsgSubject(f))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			return time.Time{}, fmt.Errorf("first message of %s after %d: %w", f, info.AckFloor.Stream, err)
		}
		if oldest.IsZero() || m.Time.Before(oldest) {
			oldest = m.Time
		}
	}
	return oldest, nil
}

// item is one message of a group on its way through the pipeline.
type item struct {
	msg      jetstream.Msg
	meta     *jetstream.MsgMetadata
	received time.Time
	tenant   string // the subject's tenant token, AnswerToken'd: results and dead letters go there
	req      cascade.Request
	rej      *Reject
	applied  bool
	deaths   int  // the crash-loop guard's count for this delivery
	suspect  bool // it killed the worker before: handled alone
	marked   bool // dead-lettered by the guard: its marker goes in finish
	outcome  cascade.Outcome
	failure  error // transient failure of the group's transaction
	// trace is the message's trace context (its traceparent; empty without).
	trace context.Context
}

func (it *item) opLabel() string {
	if it.rej == nil {
		return it.req.Op.String()
	}
	if _, ok := storage.ParseOp(it.rej.Op); ok {
		return it.rej.Op
	}
	return "unknown"
}

// Run consumes until ctx is done, then drains: it stops fetching, applies
// what it already holds, publishes and acks, and returns. The caller then
// closes the cascade engine (journals in flight stay durable) and the store.
// The drain is not bounded: see RunUntil.
func (w *Worker) Run(ctx context.Context) error {
	return w.RunUntil(ctx, context.WithoutCancel(ctx))
}

// RunUntil is Run, applying, publishing and acking with work instead: a
// context that ctx's end (SIGTERM: stop fetching, finish what is held) does
// not cancel, and a hard stop does (the drain outlasted its grace, or the
// store failed). Once work is cancelled, nothing more is committed; what is
// still held is left unacked (it is redelivered to the next worker), and
// never dead-lettered for it.
func (w *Worker) RunUntil(ctx, work context.Context) error {
	if w.cons == nil {
		return errors.New("queue: Run before Provision")
	}
	in := make(chan jetstream.Msg, w.cfg.Buffer)
	var (
		inMu     sync.RWMutex
		inClosed bool
	)
	// held bounds the bytes of the messages taken from the consumer and not
	// yet finished (waiting in `in`, in a group, or being finished): the
	// callback waits for room, which holds the consumer back.
	held := newByteBudget(w.cfg.BufferBytes)
	loop := &consumeLoop{w: w, busy: held.busy}
	loop.handler = func(m jetstream.Msg) {
		inMu.RLock()
		defer inMu.RUnlock()
		if inClosed {
			return // redelivered after AckWait; only possible if the drain timed out
		}
		held.acquire(len(m.Data()))
		in <- m
	}
	// Short pulls with frequent heartbeats: after a consumer leader change
	// (a NATS server lost) the client resets its pending counts but may
	// send no new pull (nats.go#2063), so only a missed heartbeat or an
	// expired pull starts one again. 5 s and 1 s bound that stall to a few
	// seconds instead of the default 30 s pull; the stall watch (stall.go)
	// restarts a pull that stays silent all the same.
	loop.opts = []jetstream.PullConsumeOpt{
		jetstream.PullMaxBytes(w.cfg.BufferBytes),
		jetstream.PullExpiry(5 * time.Second),
		jetstream.PullHeartbeat(time.Second),
		jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
			w.log.Warn("consume", "err", err)
		}),
	}
	if err := loop.start(); err != nil {
		return fmt.Errorf("consume: %w", err)
	}
	w.loop.Store(loop)
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		if w.cfg.StallCheck > 0 {
			loop.watch(ctx, w.cfg.StallCheck)
		}
	}()
	go func() {
		<-ctx.Done()
		<-watched // no restart after this: the subscription drained is the last one
		cc := loop.current()
		cc.Drain()
		select {
		case <-cc.Closed():
		case <-time.After(10 * time.Second):
			w.log.Warn("consumer drain timed out; unprocessed buffered messages will be redelivered")
			cc.Stop()
		}
		inMu.Lock()
		inClosed = true
		close(in)
		inMu.Unlock()
	}()

	// Three stages, each its own goroutine: this loop groups and applies;
	// the next publishes each group's results (asynchronously) and dead
	// letters; the last waits for the results' acknowledgements and acks
	// the requests. A group's results go out while the one before waits
	// for its acknowledgements: one round trip to the results stream per
	// group, in series, was most of a small request's latency beside a
	// super-node cascade (docs/BENCHMARKS.md, "mixed").
	groups := make(chan []*item, 2)
	answering := make(chan *answers, answeringDepth(w.cfg.GroupMax))
	finished := make(chan struct{})
	go func() {
		defer close(answering)
		for g := range groups {
			answering <- w.finish(work, g)
		}
	}()
	go func() {
		defer close(finished)
		for a := range answering {
			w.settle(a)
			n := 0
			for _, it := range a.items {
				n += len(it.msg.Data())
			}
			held.release(n)
		}
	}()
	for {
		first, ok := <-in
		if !ok {
			break
		}
		batch := []jetstream.Msg{first}
		closed := false
		var wait <-chan time.Time
		if w.cfg.GroupWait > 0 {
			wait = time.After(w.cfg.GroupWait)
		}
	fill:
		for len(batch) < w.cfg.GroupMax {
			if wait == nil {
				select {
				case m, ok := <-in:
					if !ok {
						closed = true
						break fill
					}
					batch = append(batch, m)
				default:
					break fill
				}
				continue
			}
			select {
			case m, ok := <-in:
				if !ok {
					closed = true
					break fill
				}
				batch = append(batch, m)
			case <-wait:
				break fill
			}
		}
		groups <- w.apply(work, batch)
		if closed {
			break
		}
	}
	close(groups)
	<-finished
	return nil
}

// apply decodes a group and applies the valid requests in one transaction
// (or a few, when they outgrow max_batch_ops), keeping the messages alive
// with InProgress while it works.
func (w *Worker) apply(ctx context.Context, msgs []jetstream.Msg) []*item {
	now := time.Now()
	items := make([]*item, len(msgs))
	var (
		reqs []cascade.Request
		idx  []int
	)
	for i, m := range msgs {
		it := &item{msg: m, received: now}
		items[i] = it
		it.meta, _ = m.Metadata()
		if w.hooks.Queued != nil && it.meta != nil {
			w.hooks.Queued(now.Sub(it.meta.Timestamp))
		}
		tenant, part, err := parseSubject(w.cfg.Prefix, m.Subject(), w.cfg.Partitions)
		it.tenant = AnswerToken(tenant)
		switch {
		case tenant == "*" || tenant == ">":
			it.rej = &Reject{Reason: ReasonInvalid, Err: fmt.Sprintf("subject %s: %q is a wildcard, not a tenant (publish to %s.req.<tenant>)",
				clip(originalSubject(w.cfg.Prefix, m.Subject()), MaxHeaderBytes), tenant, w.cfg.Prefix)}
		case err != nil:
			it.rej = &Reject{Reason: ReasonWrongPartition, Err: err.Error()}
		case part != Partition(tenant, w.cfg.Partitions) || !w.cfg.Owner.Owns(part):
			it.rej = &Reject{Reason: ReasonWrongPartition, Err: fmt.Sprintf("partition %d of tenant %q is not owned by replica %s of %d partitions", part, tenant, w.cfg.Owner, w.cfg.Partitions)}
		}
		it.trace = context.Background()
		if w.cfg.TracerProvider != nil {
			it.trace = traceOf(m.Headers())
		}
		_, span := w.start(it.trace, "telha.decode", nil)
		if it.rej == nil {
			it.req, it.rej = DecodeRequest(m.Data(), tenant)
		} else {
			it.rej.RequestID, it.rej.Op, it.rej.ID = peekRequest(m.Data())
		}
		if it.rej != nil {
			// What is echoed from the request is bounded (issue 20).
			it.rej.Err = clip(it.rej.Err, MaxHeaderBytes)
			it.rej.Op, it.rej.ID = clip(it.rej.Op, MaxEchoBytes), clip(it.rej.ID, MaxEchoBytes)
		}
		if span.IsRecording() {
			span.SetAttributes(requestAttrs(it)...)
			if it.rej != nil {
				span.SetStatus(codes.Error, it.rej.Reason)
			}
		}
		if it.rej == nil && trace.SpanContextFromContext(it.trace).IsValid() {
			it.req.Traceparent = Traceparent(it.trace) // for its journal or erase
		}
		span.End()
		if it.rej != nil {
			continue
		}
		reqs = append(reqs, it.req)
		idx = append(idx, i)
	}
	if len(idx) == 0 {
		return items
	}
	stop := w.keepAlive(msgs)
	together, alone := w.guard(ctx, items, idx)
	w.applyGuarded(ctx, items, together)
	for _, i := range alone {
		w.applyGuarded(ctx, items, []int{i})
	}
	stop()
	return items
}

// applyGroup applies the requests of items[idx] together.
func (w *Worker) applyGroup(ctx context.Context, items []*item, idx []int) {
	if len(idx) == 0 {
		return
	}
	reqs := make([]cascade.Request, len(idx))
	spans := make([]trace.Span, len(idx))
	for k, i := range idx {
		reqs[k] = items[i].req
		it := items[i]
		_, spans[k] = w.start(it.trace, "telha.group_commit", func() []attribute.KeyValue {
			return append(requestAttrs(it), attribute.Int("telha.group_size", len(idx)))
		})
	}
	outs, _, err := w.ops.Apply(ctx, reqs)
	for k, i := range idx {
		if outs[k].Kind != 0 {
			items[i].applied, items[i].outcome = true, outs[k]
			if spans[k].IsRecording() {
				spans[k].SetAttributes(attribute.String("telha.status", outs[k].Status().String()))
			}
		} else {
			items[i].failure = err
			spans[k].SetStatus(codes.Error, err.Error())
		}
		spans[k].End()
	}
	if err != nil {
		w.log.Warn("group failed; its requests will be retried", "requests", len(reqs), "err", err)
	}
}

// The crash-loop guard (Config.MaxDeaths). While a redelivered message is
// being handled (decided and committed), a durable marker with the deaths
// counted so far says so; it is deleted as soon as the handling is over. A
// marker found when the message comes again means the worker died while
// handling it: one death more. A message that already killed the worker is
// handled alone, after the others and one at a time, so only its own
// handling is ever blamed on it; one that killed the worker MaxDeaths
// times is dead-lettered (crash_loop) without being handled again. First
// deliveries pay nothing: deaths are counted from the second delivery on.

// guard reads the markers of the redelivered messages among items[idx] and
// sorts them: handled together (first deliveries, and redeliveries without
// a marker), handled alone (a marker: it killed the worker before), or
// dead-lettered (MaxDeaths reached).
func (w *Worker) guard(ctx context.Context, items []*item, idx []int) (together, alone []int) {
	var redelivered []int
	for _, i := range idx {
		if m := items[i].meta; m != nil && m.NumDelivered > 1 {
			redelivered = append(redelivered, i)
		} else {
			together = append(together, i)
		}
	}
	if len(redelivered) == 0 {
		return together, nil
	}
	err := w.store.Update(ctx, func(t *storage.Txn) error {
		for _, i := range redelivered {
			m := items[i].meta
			d, found, err := t.Delivery(m.Stream, m.Sequence.Stream)
			if err != nil {
				return err
			}
			if found {
				d++
			}
			items[i].deaths, items[i].suspect = d, found
		}
		return nil
	})
	if err != nil {
		w.log.Warn("crash-loop guard: delivery markers not read", "err", err)
		return append(together, redelivered...), nil
	}
	for _, i := range redelivered {
		it := items[i]
		switch {
		case it.deaths >= w.cfg.MaxDeaths:
			it.marked = true // the last marker goes when the dead letter is done
			it.rej = &Reject{Reason: ReasonCrashLoop, Err: fmt.Sprintf("the worker died %d times while handling this request (delivery %d); it is not handled again (--max-deaths %d)",
				it.deaths, it.meta.NumDelivered, w.cfg.MaxDeaths), RequestID: it.req.RequestID, Op: it.req.Op.String(), ID: it.req.ID.String()}
			w.log.Error("request dead-lettered by the crash-loop guard", "stream", it.meta.Stream, "seq", it.meta.Sequence.Stream,
				"subject", it.msg.Subject(), "request_id", it.req.RequestID, "op", it.req.Op.String(), "deaths", it.deaths)
		case it.suspect:
			w.log.Warn("request killed the worker before; handling it alone", "stream", it.meta.Stream, "seq", it.meta.Sequence.Stream,
				"request_id", it.req.RequestID, "op", it.req.Op.String(), "deaths", it.deaths)
			alone = append(alone, i)
		default:
			together = append(together, i)
		}
	}
	return together, alone
}

// applyGuarded applies items[idx] together, with the delivery markers of
// its redelivered messages stored for the time of the handling.
func (w *Worker) applyGuarded(ctx context.Context, items []*item, idx []int) {
	var mark []*item
	for _, i := range idx {
		if m := items[i].meta; m != nil && m.NumDelivered > 1 {
			mark = append(mark, items[i])
		}
	}
	if len(mark) > 0 {
		err := w.store.Update(ctx, func(t *storage.Txn) error {
			for _, it := range mark {
				t.MarkDelivery(it.meta.Stream, it.meta.Sequence.Stream, it.deaths)
			}
			return nil
		})
		if err != nil {
			w.log.Warn("crash-loop guard: delivery markers not stored", "err", err)
		}
	}
	w.applyGroup(ctx, items, idx)
	// Not cancelled by a hard stop: a marker left behind would count the
	// stop as one more death of a healthy request (crash-loop guard).
	w.clearMarkers(context.WithoutCancel(ctx), mark)
}

// clearMarkers deletes the delivery markers of items.
func (w *Worker) clearMarkers(ctx context.Context, items []*item) {
	if len(items) == 0 {
		return
	}
	err := w.store.Update(ctx, func(t *storage.Txn) error {
		for _, it := range items {
			t.ClearDelivery(it.meta.Stream, it.meta.Sequence.Stream)
		}
		return nil
	})
	if err != nil {
		// A marker left behind counts one death too many if the message
		// comes again: conservative, and bounded.
		w.log.Warn("crash-loop guard: delivery markers not deleted", "err", err)
	}
}

// keepAlive sends InProgress for msgs every AckWait/3 until stopped, so a
// long group (a super-node's collection) never lets AckWait expire.
func (w *Worker) keepAlive(msgs []jetstream.Msg) func() {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(w.cfg.AckWait / 3)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				for _, m := range msgs {
					_ = m.InProgress()
				}
			}
		}
	}()
	return func() { close(done); wg.Wait() }
}

// maxAsyncResults is nats.go's default bound on asynchronous publishes
// awaiting their acknowledgement (jetstream.WithPublishAsyncMaxPending):
// beyond it a publish stalls for 200 ms, then fails.
const maxAsyncResults = 4000

// answeringDepth is how many published groups may wait for settle beyond
// the one being settled and the one being published: as many as keep
// their results (groupMax each at most) under maxAsyncResults, at most 8.
func answeringDepth(groupMax int) int {
	return min(8, max(0, maxAsyncResults/max(groupMax, 1)-2))
}

// answers is a group whose results are published and whose messages
// wait for those results' acknowledgements (settle).
type answers struct {
	items  []*item
	pubs   []pendingResult
	ctx    context.Context
	cancel context.CancelFunc
}

// resultAckWait bounds a group's answers: each result's ack is waited for
// this long after finish, then its request is naked to come again.
const resultAckWait = 30 * time.Second

type pendingResult struct {
	it  *item
	fut jetstream.PubAckFuture
	res Result
}

// finish publishes a group's dead letters and results (the results
// asynchronously) and acks, terminates or naks each message that needs no
// result; settle acks the rest once their results are acknowledged. work
// is RunUntil's.
func (w *Worker) finish(work context.Context, items []*item) *answers {
	ctx, cancel := context.WithTimeout(work, resultAckWait)
	defer func() {
		var marked []*item
		for _, it := range items {
			if it.marked {
				marked = append(marked, it)
			}
		}
		w.clearMarkers(context.WithoutCancel(work), marked) // see applyGuarded
	}()
	a := &answers{items: items, ctx: ctx, cancel: cancel}
	for _, it := range items {
		switch {
		case it.rej != nil:
			status := StatusInvalid
			if it.rej.Reason == ReasonCrashLoop {
				status = StatusFailed // nothing applied; it may be valid
			}
			res := Result{RequestID: it.rej.RequestID, Op: it.rej.Op, Tenant: it.tenant, ID: it.rej.ID,
				Status: status, Error: it.rej.Reason + ": " + it.rej.Err}
			if res.RequestID == "" {
				// No readable request_id: answer under the publisher's
				// message id, so the publisher can still match it.
				// A publisher's message id is "<tenant>.<request id>"
				// (client.RequestMsgID): the request id is what follows
				// the tenant (issue 32 item 7).
				id := it.msg.Headers().Get(jetstream.MsgIDHeader)
				if rest, ok := strings.CutPrefix(id, it.tenant+"."); ok && validRequestID(rest) {
					id = rest
				}
				if validRequestID(id) {
					res.RequestID, res.RequestIDFrom = id, "nats_msg_id"
				}
			}
			w.deadLetter(ctx, it, it.rej.Reason, it.rej.Err, res)
		case !it.applied && work.Err() != nil:
			// A hard stop, not the request's doing: it comes back.
			_ = it.msg.Nak()
		case !it.applied:
			delivered := uint64(1)
			if it.meta != nil {
				delivered = it.meta.NumDelivered
			}
			if delivered >= uint64(w.cfg.MaxDeliver) {
				reason := fmt.Sprintf("transient failure on delivery %d of %d: %v", delivered, w.cfg.MaxDeliver, it.failure)
				w.deadLetter(ctx, it, ReasonRetriesExhausted, reason, Result{
					RequestID: it.req.RequestID, Op: it.req.Op.String(), Tenant: it.tenant, ID: it.req.ID.String(),
					Status: StatusFailed, Error: reason,
				})
				continue
			}
			_ = it.msg.NakWithDelay(w.cfg.backoff(delivered))
		case it.outcome.Kind == cascade.Conflict || it.outcome.Kind == cascade.Invalid:
			// Nothing applied and it can never apply as sent: like an
			// invalid body, it is dead-lettered (with its reason) and
			// answered.
			reason := ReasonInvalid
			if it.outcome.Kind == cascade.Conflict {
				reason = ReasonConflict
			}
			res := resultOfOutcome(&it.req, it.outcome)
			w.deadLetter(ctx, it, reason, res.Error, res)
		case it.outcome.Kind == cascade.Journaled || it.outcome.Kind == cascade.Erasing:
			// The journal (the commit point) is durable: the cascade will
			// complete, and its result is published from the outbox when the
			// node tombstone lands (package reaper).
			w.ack(ctx, it)
		default:
			res := resultOfOutcome(&it.req, it.outcome)
			fut, err := w.publishResult(it.trace, res)
			if err != nil {
				w.log.Warn("publish result", "request_id", res.RequestID, "err", err)
				_ = it.msg.NakWithDelay(time.Second)
				continue
			}
			a.pubs = append(a.pubs, pendingResult{it, fut, res})
		}
	}
	return a
}

// settle waits for the acknowledgement of each result of a and acks its
// request (naks it, to come again, when the results stream refused it or
// did not answer within 30 s of finish).
func (w *Worker) settle(a *answers) {
	defer a.cancel()
	ctx := a.ctx
	for _, p := range a.pubs {
		select {
		case <-p.fut.Ok():
			w.log.Debug("request answered", "tenant", p.res.Tenant, "request_id", p.res.RequestID, "op", p.res.Op, "id", p.res.ID,
				"status", p.res.Status, "tx_time", p.res.TxTime, "took", time.Since(p.it.received))
			if w.hooks.Result != nil {
				w.hooks.Result(p.it.opLabel(), p.res.Status)
			}
			w.ack(ctx, p.it)
		case err := <-p.fut.Err():
			w.log.Warn("result not accepted by the results stream; the request will be redelivered", "request_id", p.res.RequestID, "err", err)
			_ = p.it.msg.NakWithDelay(time.Second)
		case <-ctx.Done():
			_ = p.it.msg.NakWithDelay(time.Second)
		}
	}
}

func (w *Worker) ack(ctx context.Context, it *item) {
	if w.cfg.SecureDeleteAcked && it.meta != nil {
		// Overwrite the message's bytes before the ack unlinks it (a
		// failure costs the overwrite, never the ack).
		ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		if s, err := w.reqStream(ctx); err == nil {
			err = s.SecureDeleteMsg(ctx, it.meta.Sequence.Stream)
			if err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
				w.log.Warn("secure delete of a handled request (its bytes stay in the stream's files until the server compacts them)",
					"stream_seq", it.meta.Sequence.Stream, "err", err)
			}
		}
		cancel()
	}
	if err := it.msg.Ack(); err != nil {
		w.log.Warn("ack", "err", err)
	}
	if w.hooks.Acked != nil {
		w.hooks.Acked(it.opLabel(), time.Since(it.received))
	}
}

// reqStream returns the request stream's handle (looked up once).
func (w *Worker) reqStream(ctx context.Context) (jetstream.Stream, error) {
	if s := w.reqS.Load(); s != nil {
		return *s, nil
	}
	s, err := w.js.Stream(ctx, w.cfg.ReqStream)
	if err != nil {
		return nil, err
	}
	w.reqS.Store(&s)
	return s, nil
}

func (w *Worker) resultMsg(res Result) *nats.Msg { return resultMsg(w.cfg, res) }

func (w *Worker) publishResult(tc context.Context, res Result) (jetstream.PubAckFuture, error) {
	ctx, span := w.start(tc, "telha.result", func() []attribute.KeyValue {
		return []attribute.KeyValue{attribute.String("telha.request_id", res.RequestID), attribute.String("telha.status", res.Status)}
	})
	defer span.End()
	m := w.resultMsg(res)
	TraceContext.Inject(ctx, HeaderCarrier(m.Header))
	return w.js.PublishMsgAsync(m)
}

// deadLetter copies the payload to TELHA_DLQ (waiting for the server's
// ack), publishes the invalid/failed result, and only then terminates the
// message: a work-queue stream deletes a terminated message, so the copy
// must be safe first.
func (w *Worker) deadLetter(ctx context.Context, it *item, reason, why string, res Result) {
	why, res.Error = clip(why, MaxHeaderBytes), clip(res.Error, MaxHeaderBytes)
	tctx, span := w.start(it.trace, "telha.dead_letter", func() []attribute.KeyValue {
		return append(requestAttrs(it), attribute.String("telha.reason", reason))
	})
	defer span.End()
	m := nats.NewMsg(w.cfg.dlqSubject(it.tenant))
	m.Data = it.msg.Data()
	TraceContext.Inject(tctx, HeaderCarrier(m.Header))
	delivered := uint64(1)
	stream, seq := "", uint64(0)
	if it.meta != nil {
		delivered, stream, seq = it.meta.NumDelivered, it.meta.Stream, it.meta.Sequence.Stream
		m.Header.Set(jetstream.MsgIDHeader, fmt.Sprintf("dlq-%s-%d", stream, seq))
	}
	origID := it.msg.Headers().Get(jetstream.MsgIDHeader)
	// Every header built from input is bounded, so a dead letter always
	// fits the server's 64 KB of headers (issue 20).
	m.Header.Set("Telha-Error", why)
	m.Header.Set("Telha-Reason", reason)
	m.Header.Set("Telha-Original-Subject", clip(originalSubject(w.cfg.Prefix, it.msg.Subject()), MaxHeaderBytes))
	m.Header.Set("Telha-Stream-Subject", clip(it.msg.Subject(), MaxHeaderBytes))
	m.Header.Set("Telha-Deliveries", strconv.FormatUint(delivered, 10))
	if origID != "" {
		m.Header.Set("Telha-Original-Msg-Id", clip(origID, MaxHeaderBytes))
	}
	fitDeadLetter(m, w.maxPayload())
	// On a hard stop (ctx cancelled, not timed out) a failed publish is no
	// reason to terminate the message without its copy or result.
	last := func() bool { return delivered >= uint64(w.cfg.MaxDeliver) && !errors.Is(ctx.Err(), context.Canceled) }
	keep := func() {
		// Redelivered, it is dead-lettered again: the copy under the same
		// id is dropped as a duplicate, and a crash_loop message keeps its
		// marker, so it is not handled on the way.
		it.marked = false
		_ = it.msg.NakWithDelay(w.cfg.backoff(delivered))
	}
	if ack, err := w.js.PublishMsg(ctx, m); err != nil {
		if !last() {
			w.log.Error("dead letter not stored; the message is kept for redelivery", "reason", reason, "stream", stream, "seq", seq,
				"subject", it.msg.Subject(), "msg_id", clip(origID, MaxEchoBytes), "request_id", res.RequestID, "delivery", delivered, "err", err)
			keep()
			return
		}
		// Never loop for ever: on its MaxDeliver-th delivery a message is
		// terminated even without its copy, loudly.
		w.log.Error("dead letter not stored after every delivery; the message is terminated WITHOUT a copy in the dead-letter stream",
			"reason", reason, "stream", stream, "seq", seq, "subject", it.msg.Subject(), "msg_id", origID,
			"request_id", res.RequestID, "deliveries", delivered, "err", err)
		if w.hooks.DeadLetterFailed != nil {
			w.hooks.DeadLetterFailed(reason)
		}
	} else if !ack.Duplicate { // a duplicate: stored on an earlier delivery, counted then
		if w.hooks.DeadLetter != nil {
			w.hooks.DeadLetter(reason)
		}
		w.log.Warn("dead-lettered", "reason", reason, "error", why, "subject", it.msg.Subject(), "request_id", res.RequestID, "deliveries", delivered)
	}
	rm := w.resultMsg(res)
	TraceContext.Inject(tctx, HeaderCarrier(rm.Header))
	if res.Status == StatusFailed && res.RequestID != "" {
		// Its error counts deliveries, so a later delivery would say it
		// otherwise: the answer is named by its message.
		rm.Header.Set(jetstream.MsgIDHeader, fmt.Sprintf("res.%s.%s.dlq-%s-%d", res.Tenant, res.RequestID, stream, seq))
	}
	// Terminated only once its result is stored (issue 20: it was
	// terminated anyway, and the answer lost), or loudly on the last
	// delivery.
	if _, err := w.js.PublishMsg(ctx, rm); err != nil {
		if !last() {
			w.log.Warn("the result of a dead-lettered request was not stored; the message is kept for redelivery", "reason", reason,
				"request_id", res.RequestID, "status", res.Status, "stream", stream, "seq", seq, "delivery", delivered, "err", err)
			keep()
			return
		}
		w.log.Error("the result of a dead-lettered request was not stored after every delivery; the message is terminated WITHOUT its result in the results stream",
			"reason", reason, "request_id", res.RequestID, "status", res.Status, "subject", rm.Subject, "stream", stream, "seq", seq,
			"deliveries", delivered, "err", err)
		if w.hooks.DeadLetterResultFailed != nil {
			w.hooks.DeadLetterResultFailed(reason)
		}
	} else if w.hooks.Result != nil {
		w.hooks.Result(it.opLabel(), res.Status)
	}
	if err := it.msg.TermWithReason(reason); err != nil {
		w.log.Warn("term", "err", err)
	}
	if w.hooks.Acked != nil {
		w.hooks.Acked(it.opLabel(), time.Since(it.received))
	}
}

// maxPayload is the largest message the server accepts.
func (w *Worker) maxPayload() int {
	if n := w.nc.MaxPayload(); n > 0 {
		return int(n)
	}
	return 1 << 20
}

// fitDeadLetter truncates a dead letter's body when the copy with its
// headers would not fit the server's max payload, and says so in headers:
// Telha-Truncated, Telha-Original-Size and Telha-Original-Sha256 (of the
// whole body), so a dead letter can always be stored.
func fitDeadLetter(m *nats.Msg, maxPayload int) {
	hdr := 0
	for k, vs := range m.Header {
		for _, v := range vs {
			hdr += len(k) + len(v) + 4
		}
	}
	const room = 1024 // the truncation headers, and the header block's own framing
	if len(m.Data)+hdr+room <= maxPayload {
		return
	}
	sum := sha256.Sum256(m.Data)
	keep := max(0, maxPayload-hdr-room)
	m.Header.Set("Telha-Truncated", "true")
	m.Header.Set("Telha-Original-Size", strconv.Itoa(len(m.Data)))
	m.Header.Set("Telha-Original-Sha256", hex.EncodeToString(sum[:]))
	m.Data = m.Data[:keep]
}

// byteBudget is a counting bound on bytes held: acquire waits until n more
// fit under max, except that anything fits when nothing is held (a single
// message larger than the budget must still be handled).
type byteBudget struct {
	mu   sync.Mutex
	cond *sync.Cond
	used int
	max  int
}

func newByteBudget(max int) *byteBudget {
	b := &byteBudget{max: max}
	b.cond = sync.NewCond(&b.mu)
	return b
}

func (b *byteBudget) acquire(n int) {
	b.mu.Lock()
	for b.used > 0 && b.used+n > b.max {
		b.cond.Wait()
	}
	b.used += n
	b.mu.Unlock()
}

// busy reports whether any message is held.
func (b *byteBudget) busy() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.used > 0
}

func (b *byteBudget) release(n int) {
	b.mu.Lock()
	b.used -= n
	b.mu.Unlock()
	b.cond.Broadcast()
}
