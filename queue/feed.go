package queue

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/telha/telha-cascade/queue/client"
	"github.com/telha/telha-cascade/storage"
)

// The change feed's publisher (CONTRACT §5, "Change feed").
//
// What a slot's store committed is read from the store
// (storage.Store.ReadFeed: each tenant's tx_time_index up to its feed
// horizon, erases' rows) and published to ChgStream, one message per
// change, each named by a Nats-Msg-Id that is a function of the change
// alone (client.ChangeMsgID). Once every message of a round is stored,
// the tenants' cursors are saved in one durable batch (which, on a
// replicated slot, goes through the changelog like any write). A crash or
// a slot's move between a publish and its save publishes those changes
// again from the saved cursor, and the stream's duplicate window stores
// them once: exactly once within ChangesDuplicateWindow of the crash.
//
// Order: one tenant's changes are published in feed order, a round's at
// most feedBatch in flight, and the cursor moves only when all of them are
// stored. A failed round is published again from the cursor; a message
// the server lost while a later one of the same round was stored (a stream
// leader lost mid-round) would then be stored after it: the publisher
// counts and logs that case (FeedHooks.Reordered), it does not hide it.
// Two rules keep that case to a leader lost mid-round: a publish answered
// "no responders" (no leader) is not retried within the round (nats.go's
// retries race each other), and the first round after a failed one sends
// one change and waits for it before the rest (a leader elected while
// the round is sent would store the later changes only).

// feedBatch bounds one tenant's changes in one round (the worker's memory:
// a million-edge cascade is published feedBatch at a time).
const feedBatch = 1024

// feedSaveEvery: how often the positions of stored changes are saved (a
// durable batch through the writer; once per round cost a fifth of the
// worker's throughput). A crash or a move publishes at most this much
// again, which the stream's duplicate window stores once.
const feedSaveEvery = 500 * time.Millisecond

// feedMinGap: the shortest time from one round's start to the next's
// (when the last one emptied the feed): a change waits at most this much
// more, and a busy slot's commits share rounds.
const feedMinGap = 20 * time.Millisecond

// feedOwnedFor: how long the feed takes FeedHooks.Owned's yes for: at
// most four requests a second to the changelog's leader, not one per
// round (every 20 ms under load, beside the writer's appends). A zombie
// is not helped by it: its pause (SIGSTOP, a cut-off link) runs on the
// monotonic clock, so the first round after it asks again.
const feedOwnedFor = 250 * time.Millisecond

// feedAckWait bounds the wait for one change's ack. A publish the server
// never answers (the stream's leader was lost with it in flight, or a
// server that took it died) would otherwise hold its round, and the
// tenant's feed, for good: timed out, the round fails and the tenant is
// published again from its cursor.
const feedAckWait = 10 * time.Second

// ChangesStreamConfig is the change feed's stream.
func ChangesStreamConfig(c Config) jetstream.StreamConfig {
	c = c.Defaults()
	return jetstream.StreamConfig{
		Name:        c.ChgStream,
		Description: "telha-cascade change feed: every entity version committed, per tenant in commit order",
		Subjects:    []string{c.Prefix + ".chg.*.*.*"},
		Retention:   jetstream.LimitsPolicy,
		Storage:     jetstream.FileStorage,
		MaxAge:      c.ChangesMaxAge,
		MaxBytes:    c.ChangesMaxBytes,
		// Per tenant subject: a tenant's flood ages out its own oldest
		// changes first.
		MaxMsgsPerSubject: c.ChangesMaxPerTenant,
		Discard:           jetstream.DiscardOld,
		Duplicates:        c.ChangesDuplicateWindow,
		Replicas:          c.StreamReplicas,
	}
}

// ErrNotOwned: a feed round published nothing because FeedHooks.Owned
// said this copy may no longer be the slot's.
var ErrNotOwned = errors.New("change feed: this copy may no longer be the slot's; nothing published")

// FeedHooks observe the publisher (metrics). Nil fields are skipped.
type FeedHooks struct {
	// Published: n changes stored (their cursors saved).
	Published func(n int)
	// Failed: a round failed (it is published again from the cursors).
	Failed func(err error)
	// Reordered: a round lost a message while a later one was stored.
	Reordered func(tenant string)
	// Erased: a round published erases (their results waited for it).
	Erased func()
	// Lag: after each round, how far behind the feed is: the age of the
	// oldest change not yet stored (0 when every tenant caught up).
	Lag func(time.Duration)
	// Owned, when set, is asked before the feed publishes or deletes
	// anything: is this copy still the slot's? An error fails the round
	// with nothing more published (the cursors stay). A yes is taken for
	// feedOwnedFor from when it was asked, checked at every publish (a
	// pause of the process lasts longer than that on the monotonic clock,
	// so a zombie that resumes asks first). A slot with a changelog asks its
	// stream (partition.Changelog.Owned), so that an owner whose slot
	// moved while it was paused or cut off from NATS does not publish
	// from its stale copy (a put whose props the new owner's erase already
	// deleted from the feed) until its next append is fenced.
	Owned func(context.Context) error
}

// FeedPublisher publishes one store's change feed.
type FeedPublisher struct {
	// conn: the feed's connection (ownConn: made by this publisher); nc,
	// js and closed (closed when nc closes): as the round took it (dial).
	conn    *FeedConn
	ownConn bool
	nc      *nats.Conn
	js      jetstream.JetStream
	closed  <-chan struct{}
	st      *storage.Store
	cfg     Config
	log     *slog.Logger
	hooks   FeedHooks
	pos     map[storage.Scope]storage.FeedPos // stored positions (the saved cursors, read once, then moved on)
	// dirty: positions stored and not saved yet; erased: erase rows
	// published and not deleted yet; savedAt: the last save.
	dirty  map[storage.Scope]storage.FeedPos
	erased [][]byte
	// scrubbed: erases whose puts this publisher deleted from the feed
	// ahead of its tenant's backlog, to be marked so (scrubbedKeys: their
	// rows' keys) by the next save; unclean: tenants whose last round
	// lost a publish (it may still be stored late: no scrub ahead until a
	// round of theirs is stored whole).
	scrubbed     []*storage.Change
	scrubbedKeys map[string]bool
	unclean      map[storage.Scope]bool
	savedAt      time.Time
	saveEvery    time.Duration
	read         map[storage.Scope]feedRead // tenants read up to their horizon (skipped while nothing moves)
	lastN        int                        // changes stored by the last round
	ownedAt      time.Time                  // when hooks.Owned's last yes was asked
	notOwned     error                      // hooks.Owned's no, for the rest of the round
	rate         int                        // changes per second at most (Config.ChangesMaxRate; 0: unpaced)
	// maxData: the largest body the server takes (its max payload, less
	// room for the subject and headers).
	maxData int
}

// NewFeedPublisher returns the publisher of st's feed on fc, or, with fc
// nil, on a FeedConn of its own made from nc (closed when Run ends).
func NewFeedPublisher(fc *FeedConn, nc *nats.Conn, st *storage.Store, cfg Config, log *slog.Logger, hooks FeedHooks) (*FeedPublisher, error) {
	own := fc == nil
	if own {
		if nc == nil {
			return nil, errors.New("change feed: no NATS connection")
		}
		fc = NewFeedConn(nc)
	}
	p := newFeedPublisher(fc, st, cfg, log, hooks)
	p.ownConn = own
	return p, nil
}

func newFeedPublisher(fc *FeedConn, st *storage.Store, cfg Config, log *slog.Logger, hooks FeedHooks) *FeedPublisher {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &FeedPublisher{conn: fc, st: st, cfg: cfg.Defaults(), log: log, hooks: hooks, pos: map[storage.Scope]storage.FeedPos{},
		dirty: map[storage.Scope]storage.FeedPos{}, scrubbedKeys: map[string]bool{}, unclean: map[storage.Scope]bool{}, saveEvery: feedSaveEvery, read: map[storage.Scope]feedRead{}, rate: cfg.Defaults().ChangesMaxRate}
}

// Close closes the feed's connection if the publisher made it (a
// FeedConn given by the process is the process's to close). Run does
// when it ends.
func (p *FeedPublisher) Close() {
	if p.ownConn {
		p.conn.Close()
	}
}

// dial takes the feed's connection as it is now (FeedConn.get: dialled
// again if it closed) for the round, waiting for a dial until ctx ends.
func (p *FeedPublisher) dial(ctx context.Context) error {
	nc, closed, err := p.conn.get(ctx)
	if err != nil {
		return err
	}
	if nc != p.nc {
		// A JetStream context of its own on the shared connection: its
		// own cap on publishes in flight, its own ack subscription.
		js, err := jetstream.New(nc, jetstream.WithPublishAsyncTimeout(p.conn.ackWait))
		if err != nil {
			return fmt.Errorf("change feed: jetstream: %w", err)
		}
		p.nc, p.js = nc, js
	}
	p.closed = closed
	p.maxData = int(nc.MaxPayload()) - 4096
	return nil
}

// answer waits for a publish's answer: nil once it is stored.
func (p *FeedPublisher) answer(ctx context.Context, f jetstream.PubAckFuture) error {
	select {
	case <-f.Ok():
		return nil
	case err := <-f.Err():
		if errors.Is(err, jetstream.ErrAsyncPublishTimeout) {
			// Unanswered for the ack wait: its server may be paused or
			// cut off while the TCP connection looks alive (the
			// process's pings, which this connection shares, notice it
			// after 10-15 s; with nats.go's defaults, minutes). Closed,
			// the next round dials afresh.
			p.conn.drop(p.nc)
		}
		return err
	case <-p.closed:
		// An answer received before the close is the answer (select
		// picks at random among what is ready).
		select {
		case <-f.Ok():
			return nil
		case err := <-f.Err():
			return err
		default:
			return fmt.Errorf("change feed: %w", nats.ErrConnectionClosed)
		}
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Run publishes until ctx ends: a round after every commit (at most one
// round in flight), and at least every second (a journal or an erase that
// finished moves the horizon without a commit of its own).
func (p *FeedPublisher) Run(ctx context.Context) error {
	defer func() {
		// What was stored and not saved yet: saved now, briefly (the
		// store is still open: the slot stops its publisher first).
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		_ = p.save(sctx)
		cancel()
		p.Close()
	}()
	backoff := 100 * time.Millisecond
	for {
		wake := p.st.Changed()
		began := time.Now()
		p.lastN = 0
		more, err := p.Round(ctx)
		p.pace(ctx, began, p.lastN)
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			p.log.Warn("change feed: round failed; publishing again from the saved cursors", "err", err, "retry_in", backoff)
			if p.hooks.Failed != nil {
				p.hooks.Failed(err)
			}
			if errors.Is(err, jetstream.ErrNoStreamResponse) {
				p.recreate(ctx)
			}
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, 5*time.Second)
			continue
		}
		backoff = 100 * time.Millisecond
		if more {
			continue
		}
		var flush <-chan time.Time
		if len(p.dirty) > 0 {
			flush = time.After(max(p.saveEvery-time.Since(p.savedAt), 0))
		}
		// Rounds at most every feedMinGap: the commits in between share
		// one (a round's reads and acks cost the same for 1 change or 100).
		if d := feedMinGap - time.Since(began); d > 0 {
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(d):
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-wake:
		case <-flush:
			if err := p.save(ctx); err != nil && ctx.Err() == nil {
				p.log.Warn("change feed: saving the cursors failed; retried", "err", err)
			}
		case <-time.After(time.Second):
		}
	}
}

// recreate creates the feed's stream again if it is gone (deleted while
// the slot ran: every publish is answered "no responders", and the
// erases waiting for their feed would wait until a restart provisioned
// it). The next round publishes from the saved cursors into it. A stream
// that is there but has no leader (an election) is left alone: creating
// it again changes nothing.
func (p *FeedPublisher) recreate(ctx context.Context) {
	if p.cfg.ChangeFeedOff || p.js == nil {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := p.js.Stream(ctx, p.cfg.ChgStream); !errors.Is(err, jetstream.ErrStreamNotFound) {
		return
	}
	if _, err := p.js.CreateStream(ctx, ChangesStreamConfig(p.cfg)); err != nil && !errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
		p.log.Warn("change feed: the stream is gone, and creating it again failed; retried", "stream", p.cfg.ChgStream, "err", err)
		return
	}
	p.log.Warn("change feed: the stream was gone (deleted while this slot ran); created it again: the changes its consumers had not read are lost, the ones after the saved cursors are published again",
		"stream", p.cfg.ChgStream)
}

// feedRead is what the last read of a tenant saw: its write count, and
// whether a journal held its horizon below the committed tx (it must be
// read again when the journal ends, which is no write of the tenant).
type feedRead struct {
	gen  uint64
	held bool
}

// pace waits, after a round that stored n changes from began on, until
// the feed's rate is at most p.rate: a burst (a million-edge cascade that
// finished) is published at that rate, not as fast as the two cores
// allow, so the requests beside it keep their latency; the feed lags
// instead (telha_change_feed_lag_seconds).
func (p *FeedPublisher) pace(ctx context.Context, began time.Time, n int) {
	if p.rate <= 0 || n == 0 {
		return
	}
	d := time.Duration(float64(n)/float64(p.rate)*float64(time.Second)) - time.Since(began)
	if d <= 0 {
		return
	}
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

type feedTenant struct {
	read   feedRead
	sc     storage.Scope
	pos    storage.FeedPos
	futs   []jetstream.PubAckFuture // published, their acks not received yet
	stored int                      // published and acked (before an erase, or the probe)
	lost   error                    // a publish of this round failed (settle)
	erased [][]byte
}

// Round publishes what every tenant's feed holds up to its horizon (at
// most feedBatch changes each) and saves the cursors of those fully
// stored. more: some tenant had more.
func (p *FeedPublisher) Round(ctx context.Context) (more bool, err error) {
	var ts []*feedTenant
	var behind []storage.Scope // tenants this round did not bring up to their horizon
	var readErr error
	p.notOwned = nil // a no stands for one round; the next asks again (owned)
	if err := p.dial(ctx); err != nil {
		return false, err
	}
	if p.cfg.ChangeFeedOff {
		return false, p.scrubOnly(ctx)
	}
	for _, sc := range p.st.Tenants() {
		// Nothing new: no write since its last read, which no journal
		// held back.
		gen := p.st.FeedGen(sc)
		if r, ok := p.read[sc]; ok && r.gen == gen && !r.held {
			continue
		}
		from, ok := p.pos[sc]
		if !ok {
			if from, err = p.st.FeedCursor(sc); err != nil {
				readErr = errors.Join(readErr, err)
				continue
			}
			p.pos[sc] = from
		}
		// Erases whose puts are still on the feed are scrubbed now, ahead
		// of the tenant's backlog, so that an erase's result never waits
		// for the feed to reach it (a million-edge cascade's backlog is
		// about 50 s at the default pace).
		if err := p.scrubAhead(ctx, sc); err != nil {
			readErr = errors.Join(readErr, fmt.Errorf("tenant %s: %w", sc, err))
			behind = append(behind, sc)
			continue
		}
		ft := &feedTenant{sc: sc}
		horizon := p.st.FeedHorizon(sc)
		ft.read = feedRead{gen: gen, held: horizon < p.st.Committed()}
		probe := p.unclean[sc]
		pos, err := p.st.ReadFeed(ctx, storage.FeedRead{Scope: sc, From: from, UpTo: horizon, Max: feedBatch}, func(c *storage.Change) error {
			if c.Op == storage.FeedErase && !c.Scrubbed && !p.scrubbedKeys[string(c.EraseKey)] {
				// The erased props leave the feed before the erase is on it.
				if err := p.settle(ctx, ft); err != nil {
					return err
				}
				if err := p.scrubErases(ctx, sc, []*storage.Change{c}); err != nil {
					return err
				}
			}
			if err := p.owned(ctx); err != nil {
				return err
			}
			// No retry on "no responders" (the stream has no leader):
			// nats.go retries each from its own timer, and the retries,
			// racing, would be stored out of order once a leader is back.
			// The round fails instead; the next publishes from the cursor.
			f, err := p.js.PublishMsgAsync(changeMsg(p.cfg, sc, c, p.maxData), jetstream.WithRetryAttempts(0))
			if err != nil {
				return err
			}
			ft.futs = append(ft.futs, f)
			if probe {
				// The first change after a failed round is stored before
				// the rest are sent: should a leader be elected while the
				// round is sent, an early change answered "no responders"
				// and a later one stored would be out of order.
				probe = false
				if err := p.settle(ctx, ft); err != nil {
					return err
				}
			}
			if c.EraseKey != nil {
				ft.erased = append(ft.erased, c.EraseKey)
			}
			return nil
		})
		ft.pos = pos
		if err != nil {
			readErr = errors.Join(readErr, fmt.Errorf("tenant %s: %w", sc, err))
			// What was published waits for its acks like the rest, but
			// the cursor stays: published again next round.
			ft.pos = from
			behind = append(behind, sc)
		}
		switch {
		case len(ft.futs)+ft.stored > 0 || pos != from:
			ts = append(ts, ft)
		case err == nil: // nothing new up to its horizon
			p.read[sc] = ft.read
		}
		if len(ft.futs)+ft.stored >= feedBatch {
			more = true
			behind = append(behind, sc)
		}
	}
	save := map[storage.Scope]storage.FeedPos{}
	var erased [][]byte
	n := 0
	var ackErr error
	for _, ft := range ts {
		failed := ft.lost != nil // its error is the read's (readErr)
		for _, f := range ft.futs {
			switch err := p.answer(ctx, f); {
			case ctx.Err() != nil:
				return false, ctx.Err()
			case err == nil && failed:
				if p.hooks.Reordered != nil {
					p.hooks.Reordered(ft.sc.Tenant())
				}
				p.log.Error("change feed: a change was lost while a later one was stored; it is published again after it", "tenant", ft.sc.Tenant())
			case err != nil:
				if !failed {
					ackErr = errors.Join(ackErr, fmt.Errorf("tenant %s: %w", ft.sc, err))
				}
				failed = true
			}
		}
		if failed {
			p.unclean[ft.sc] = true
			behind = append(behind, ft.sc)
			continue
		}
		delete(p.unclean, ft.sc) // every publish of its round stored
		if ft.pos == p.pos[ft.sc] && len(ft.erased) == 0 {
			continue
		}
		save[ft.sc] = ft.pos
		erased = append(erased, ft.erased...)
		n += len(ft.futs) + ft.stored
		p.lastN += len(ft.futs) + ft.stored
	}
	// Stored: the positions move on in memory at once; they are saved
	// (one durable batch through the writer) at most every saveEvery,
	// and at once when erases wait on it.
	for sc, pos := range save {
		p.pos[sc] = pos
		p.dirty[sc] = pos
	}
	// A tenant read to its horizon, every change stored: skipped until it
	// writes again. One behind (more, failed) is read again.
	isBehind := map[storage.Scope]bool{}
	for _, sc := range behind {
		isBehind[sc] = true
	}
	for _, ft := range ts {
		if !isBehind[ft.sc] {
			p.read[ft.sc] = ft.read
		} else {
			delete(p.read, ft.sc)
		}
	}
	for _, sc := range behind {
		delete(p.read, sc)
	}
	p.erased = append(p.erased, erased...)
	if p.hooks.Published != nil && n > 0 {
		p.hooks.Published(n)
	}
	if len(p.erased) > 0 || len(p.scrubbed) > 0 || len(p.dirty) > 0 && time.Since(p.savedAt) >= p.saveEvery {
		if err := p.save(ctx); err != nil {
			return false, errors.Join(readErr, ackErr, err)
		}
	}
	if p.hooks.Lag != nil {
		p.hooks.Lag(p.lag(behind))
	}
	if err := errors.Join(readErr, ackErr); err != nil {
		return false, err
	}
	return more, nil
}

// save writes the positions stored since the last save, and deletes the
// erase rows published, in one durable batch.
func (p *FeedPublisher) save(ctx context.Context) error {
	if len(p.dirty) == 0 && len(p.erased) == 0 && len(p.scrubbed) == 0 {
		return nil
	}
	// The save waits for the writer, which a draining or stopping slot
	// may hold: the publisher gives up with ctx, and the writer skips the
	// task when it reaches it (its ctx is done), so a stop never waits on
	// the feed.
	done := make(chan error, 1)
	dirty, erasedRows, scrubbed := p.dirty, p.erased, p.scrubbed
	go func() { done <- p.st.SaveFeed(ctx, dirty, erasedRows, scrubbed...) }()
	select {
	case err := <-done:
		if err != nil {
			return fmt.Errorf("save feed cursors: %w", err)
		}
	case <-ctx.Done():
		return fmt.Errorf("save feed cursors: %w", ctx.Err())
	}
	erased := len(p.erased) > 0 || len(p.scrubbed) > 0
	p.dirty, p.erased, p.savedAt = map[storage.Scope]storage.FeedPos{}, nil, time.Now()
	p.scrubbed, p.scrubbedKeys = nil, map[string]bool{}
	if erased && p.hooks.Erased != nil {
		p.hooks.Erased()
	}
	return nil
}

// scrubAhead deletes from the feed the puts of the tenant's erases not
// scrubbed yet, wherever its feed stands, and queues them to be marked
// scrubbed by the next save (their results wait for that mark only). Safe
// ahead of the backlog: between rounds none of the tenant's publishes is
// in flight (unless its last round lost one, which may still be stored:
// then it waits for a clean round), and the changes published from now
// on are read from the store, where the erase's rewrites are committed
// (its row is written in the batch that finishes it). The erase's own
// message is published in order later, without a second scrub.
func (p *FeedPublisher) scrubAhead(ctx context.Context, sc storage.Scope) error {
	if p.unclean[sc] {
		return nil
	}
	todo, err := p.st.FeedErasesToScrub(sc)
	if err != nil {
		return err
	}
	var batch []*storage.Change
	for i := range todo {
		c := &todo[i]
		if !p.scrubbedKeys[string(c.EraseKey)] { // else scrubbed, its mark not saved yet
			batch = append(batch, c)
		}
	}
	if len(batch) == 0 {
		return nil
	}
	// With --change-feed-props=false too: the stream may keep puts
	// published with props before (each put published without them says
	// so, and is kept). The erases waiting share one read of the feed.
	if err := p.scrubErases(ctx, sc, batch); err != nil {
		return err
	}
	for _, c := range batch {
		p.scrubbed = append(p.scrubbed, c)
		p.scrubbedKeys[string(c.EraseKey)] = true
	}
	return nil
}

// scrubOnly is a round of a feed turned off (--change-feed=false): it
// publishes nothing and leaves every cursor where it stands, but the
// stream may keep puts published while the feed was on, so each erase
// still deletes the puts that carried what it erased (scrubAhead; with
// no stream, there is nothing to delete) before its result goes out.
func (p *FeedPublisher) scrubOnly(ctx context.Context) error {
	var errs error
	for _, sc := range p.st.Tenants() {
		// A tenant with no write since its last look has no new erase
		// (finishing one writes the tenant's feed row).
		gen := p.st.FeedGen(sc)
		if r, ok := p.read[sc]; ok && r.gen == gen {
			continue
		}
		if err := p.scrubAhead(ctx, sc); err != nil {
			errs = errors.Join(errs, fmt.Errorf("tenant %s: %w", sc, err))
			continue
		}
		p.read[sc] = feedRead{gen: gen}
	}
	if len(p.scrubbed) > 0 {
		errs = errors.Join(errs, p.save(ctx))
	}
	return errs
}

// lag is the age of the oldest change not published yet (a change's age:
// now less its tx) of the tenants the round left behind (the others
// caught up to their horizon).
func (p *FeedPublisher) lag(behind []storage.Scope) time.Duration {
	var oldest storage.Ts
	for _, sc := range behind {
		pos := p.pos[sc]
		h := p.st.FeedHorizon(sc)
		var first storage.Ts
		_, _ = p.st.ReadFeed(context.Background(), storage.FeedRead{Scope: sc, From: pos, UpTo: h, Max: 1}, func(c *storage.Change) error {
			first = max(c.V.Tx.Start, 1)
			return nil
		})
		if first != 0 && (oldest == 0 || first < oldest) {
			oldest = first
		}
	}
	if oldest == 0 {
		return 0
	}
	return max(time.Since(oldest.Time()), 0)
}

// settle waits for the answers (answer) to what the round published of ft
// so far: the stored are counted; at the first failure (kept in ft.lost)
// the futures not answered yet stay for the round's ack loop. A future's
// answer is received once, so an answered one must not stay: the ack loop
// would wait on it until the slot stops.
func (p *FeedPublisher) settle(ctx context.Context, ft *feedTenant) error {
	for i, f := range ft.futs {
		if err := p.answer(ctx, f); err != nil {
			if ctx.Err() != nil {
				ft.futs = ft.futs[i:]
				return err
			}
			ft.lost = err
			ft.futs = ft.futs[i+1:]
			return err
		}
		ft.stored++
	}
	ft.futs = ft.futs[:0]
	return nil
}

// owned is FeedHooks.Owned's answer, asked before every publish and
// scrub of the feed: a yes is taken for feedOwnedFor from when it was
// asked; a no stands for the rest of the round (Round resets it).
func (p *FeedPublisher) owned(ctx context.Context) error {
	switch {
	case p.hooks.Owned == nil:
		return nil
	case p.notOwned != nil:
		return p.notOwned
	case time.Since(p.ownedAt) < feedOwnedFor:
		return nil
	}
	asked := time.Now()
	if err := p.hooks.Owned(ctx); err != nil {
		p.notOwned = fmt.Errorf("%w: %w", ErrNotOwned, err)
		return p.notOwned
	}
	p.ownedAt = asked
	return nil
}

// scrubErases deletes from the feed the puts that carried what the
// erases cs (of one tenant) erased (scrubFeed), and logs what it deleted.
func (p *FeedPublisher) scrubErases(ctx context.Context, sc storage.Scope, cs []*storage.Change) error {
	// A copy that is no longer the slot's deletes nothing either: its
	// erase's scrub, run late, would match puts the new owner published
	// since for an entity of the same id.
	if err := p.owned(ctx); err != nil {
		return err
	}
	del, err := p.scrubFeed(ctx, sc, cs)
	if err != nil {
		what := fmt.Sprintf("%s %s", cs[0].V.Kind, cs[0].V.ID)
		if len(cs) > 1 {
			what += fmt.Sprintf(" and %d more erases", len(cs)-1)
		}
		return fmt.Errorf("scrub the feed of %s: %w", what, err)
	}
	for i, c := range cs {
		if del[i].Deleted > 0 {
			p.log.Info("change feed: erased puts deleted from the feed", "tenant", sc.Tenant(), "id", c.V.ID, "deleted", del[i].Deleted, "overwritten", del[i].Overwritten, "erases_sharing_the_read", len(cs))
		}
	}
	return nil
}

// scrubbedPuts is what a scrub of the feed deleted for one erase: how
// many puts, and how many of those it overwrote.
type scrubbedPuts struct{ Deleted, Overwritten int }

// scrubFeed deletes from the feed every put of the tenant that carried a
// payload one of the erases cs erased: the entity's own, and for a node
// its edges'. It reads the headers of the tenant's puts the stream still
// keeps once for all of cs (an erase costs a read of them: CONTRACT §5,
// "Change feed"; erases that waited together share it), then deletes the
// ones found, for each erase: the first scrubSecureMax with JetStream's
// secure delete (the message's bytes overwritten), the entity's own puts
// first, then its edges'; the rest (a hub's edges) plainly. A put two
// erases carried (an edge of two erased nodes) is the first one's. It
// returns what it deleted for each of cs, in order.
func (p *FeedPublisher) scrubFeed(ctx context.Context, sc storage.Scope, cs []*storage.Change) ([]scrubbedPuts, error) {
	if p.js == nil { // called outside a round (tests)
		if err := p.dial(ctx); err != nil {
			return nil, err
		}
	}
	out := make([]scrubbedPuts, len(cs))
	stream, err := p.js.Stream(ctx, p.cfg.ChgStream)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return out, nil // no feed was ever on (or it was deleted): nothing kept
	}
	if err != nil {
		return nil, err
	}
	own, edges, err := erasedPuts(ctx, stream, p.cfg.Prefix, sc, cs)
	if err != nil {
		return nil, err
	}
	for i := range cs {
		seqs := append(own[i], edges[i]...)
		overwritten := min(len(seqs), scrubSecureMax)
		if err := deleteAll(ctx, stream, seqs[:overwritten], true); err != nil {
			return nil, err
		}
		if err := deleteAll(ctx, stream, seqs[overwritten:], false); err != nil {
			return nil, err
		}
		out[i] = scrubbedPuts{Deleted: len(seqs), Overwritten: overwritten}
	}
	return out, nil
}

// scrubSecureMax: the most puts an erase's scrub deletes with a secure
// delete (the entity's own first). The server overwrites a message by
// rewriting its whole block file (up to 16 MB), once per message; a hub's
// thousands of edges would take minutes. Beyond it the puts are deleted
// plainly: gone from every read at once, their bytes left in the block
// until the server compacts it (more than half of it deleted) or
// retention removes it (--change-feed-max-age) (docs/RELIABILITY.md,
// (f2)).
const scrubSecureMax = 64

// erasedPuts returns, for each erase of cs, the stream sequences of the
// tenant's puts that carried what it erased, reading the headers of the
// tenant's puts the stream keeps once for all: own[i], the erased
// entity's; edges[i], for a node's erase, its edges'. A put is listed
// once, for the first erase that carried it.
func erasedPuts(ctx context.Context, stream jetstream.Stream, prefix string, sc storage.Scope, cs []*storage.Change) (own, edges [][]uint64, err error) {
	own, edges = make([][]uint64, len(cs)), make([][]uint64, len(cs))
	// entity: the erase (its index in cs) of a kind and an id; nodes: of
	// a node's id, for its edges.
	entity, nodes := map[string]int{}, map[string]int{}
	for i := len(cs) - 1; i >= 0; i-- { // the first erase of an entity wins
		id := cs[i].V.ID.String()
		kind := client.KindEdge
		if cs[i].V.Kind == storage.KindNode {
			kind = client.KindNode
			nodes[id] = i
		}
		entity[kind+"."+id] = i
	}
	filters := []string{client.ChangeSubject(prefix, sc.Tenant(), client.KindEdge, client.ChangePut)}
	if len(nodes) > 0 {
		filters = append(filters, client.ChangeSubject(prefix, sc.Tenant(), client.KindNode, client.ChangePut))
	}
	pattern := client.ChangeSubject(prefix, sc.Tenant(), "*", client.ChangePut)
	if len(filters) == 1 {
		pattern = filters[0]
	}
	info, err := stream.Info(ctx, jetstream.WithSubjectFilter(pattern))
	if err != nil {
		return nil, nil, err
	}
	total := uint64(0)
	for _, n := range info.State.Subjects {
		total += n
	}
	if total == 0 { // none of the tenant's puts is kept
		return own, edges, nil
	}
	// The read ends at the tenant's last put as the stream's leader has it.
	// The ordered consumer below is placed on a replica the server picks
	// at random, which may lag behind the leader (a server just restarted
	// or continued): its NumPending 0 would end the read before the puts
	// it has not applied yet, and the erase would be answered with them
	// still on the feed (a black-box probe on three servers: erased props
	// read 2-14 s after the erase's result, after a slot moved). A replica
	// that has a message has every message and delete the log held before
	// it, so reading up to it is reading everything the leader had.
	lastPut, err := stream.GetLastMsgForSubject(ctx, pattern)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return own, edges, nil
	}
	if err != nil {
		return nil, nil, err
	}
	upTo := lastPut.Sequence
	// Headers only: the message id names the entity, an edge's headers its
	// endpoints; the bodies (props and all) stay on the server.
	// MaxResetAttempts: the client recreates an ordered consumer after a
	// lost server without end by default, deaf to ctx (a probe saw a
	// member's feed stuck so for 6.5 minutes after a paused NATS server
	// came back, 29 erases unanswered); bounded, the fetch fails and the
	// round is retried (as the changelog's reader, partition/replay.go).
	cons, err := stream.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{FilterSubjects: filters, HeadersOnly: true, MaxResetAttempts: 3})
	if err != nil {
		return nil, nil, err
	}
	seen, reached := uint64(0), uint64(0)
	noResponders := 0
	// retry: a pull answered "no responders" is sent again, a few times.
	// An ordered consumer is created anew for each fetch, and on a
	// cluster the first pull can reach the server before the new
	// consumer's interest has (a probe on 3 servers saw a member's scrub
	// rounds fail so 189 times in 30 minutes, each erase then waiting a
	// round more).
	retry := func(err error) bool {
		if !errors.Is(err, nats.ErrNoResponders) || noResponders >= scrubNoRespondersRetries {
			return false
		}
		noResponders++
		select {
		case <-ctx.Done():
			return false
		case <-time.After(time.Duration(noResponders) * 50 * time.Millisecond):
			return true
		}
	}
	for wait := false; ; {
		var batch jetstream.MessageBatch
		if wait {
			batch, err = cons.Fetch(512, jetstream.FetchMaxWait(2*time.Second))
		} else {
			batch, err = cons.FetchNoWait(512)
		}
		if err != nil {
			if retry(err) {
				continue
			}
			return nil, nil, err
		}
		got, last := 0, uint64(1)
		for m := range batch.Messages() {
			got++
			md, err := m.Metadata()
			if err != nil {
				return nil, nil, err
			}
			last = md.NumPending
			reached = max(reached, md.Sequence.Stream)
			h := m.Headers()
			if h.Get(client.ChangeNoPropsHeader) == "none" {
				continue // published without props: nothing of it was erased
			}
			if i, ok := entity[changeEntity(h.Get(jetstream.MsgIDHeader), sc.Tenant())]; ok {
				own[i] = append(own[i], md.Sequence.Stream)
				continue
			}
			i, src := nodes[h.Get(client.ChangeSrcHeader)]
			if j, dst := nodes[h.Get(client.ChangeDstHeader)]; dst && (!src || j < i) {
				i, src = j, true
			}
			if src {
				edges[i] = append(edges[i], md.Sequence.Stream)
			}
		}
		seen += uint64(got)
		if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) {
			if retry(err) {
				continue
			}
			return nil, nil, err
		}
		switch {
		case reached >= upTo:
			return own, edges, nil
		case got == 0 && wait:
			return nil, nil, fmt.Errorf("read %d of the %d puts the feed keeps for %s, up to sequence %d of %d (the replica read may lag)", seen, total, sc, reached, upTo)
		}
		// Nothing pending on the consumer's replica short of upTo: it
		// lags; the next fetch waits for what it applies meanwhile.
		wait = got == 0 || last == 0
	}
}

// scrubNoRespondersRetries: how many pulls answered "no responders" an
// erase's read of the feed sends again (50 ms, 100 ms, ... apart) before
// its round fails.
const scrubNoRespondersRetries = 8

// scrubDeletesInFlight bounds the deletes of an erase's scrub in flight
// at once. Each is a request to the stream's leader (replicated, a round
// of its group): one at a time, a hub's edges cost a round trip each.
const scrubDeletesInFlight = 32

// deleteAll deletes the messages seqs of stream (with JetStream's secure
// delete when secure), scrubDeletesInFlight at a time; one already gone
// counts as deleted.
func deleteAll(ctx context.Context, stream jetstream.Stream, seqs []uint64, secure bool) error {
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs error
	)
	sem := make(chan struct{}, scrubDeletesInFlight)
	for _, seq := range seqs {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			wg.Wait()
			return errors.Join(errs, ctx.Err())
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			del := stream.DeleteMsg
			if secure {
				del = stream.SecureDeleteMsg
			}
			if err := del(ctx, seq); err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
				mu.Lock()
				errs = errors.Join(errs, fmt.Errorf("delete of message %d (secure: %t): %w", seq, secure, err))
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return errs
}

// changeEntity is the entity a change's message id names, as
// "<kind>.<id>" (chg.<tenant>.<kind>.<id>.<tx>.<valid>:
// client.ChangeMsgID), or "".
func changeEntity(msgID, tenant string) string {
	rest, ok := strings.CutPrefix(msgID, "chg."+tenant+".")
	if !ok {
		return ""
	}
	kind, rest, _ := strings.Cut(rest, ".")
	id, _, _ := strings.Cut(rest, ".")
	return kind + "." + id
}

// changeMsg is a change's message. A put whose props would make it larger
// than the server takes (maxData) goes without them, marked
// props_omitted: one tenant's large props must not stop its feed (a
// message the server refuses would be published again for ever).
func changeMsg(cfg Config, sc storage.Scope, c *storage.Change, maxData int) *nats.Msg {
	body := ChangeOf(sc, c, !cfg.ChangeFeedNoProps)
	m := nats.NewMsg(client.ChangeSubject(cfg.Prefix, body.Tenant, body.Kind, body.Op))
	m.Data = appendChange(make([]byte, 0, 320+len(body.Props)), &body)
	if maxData > 0 && len(m.Data) > maxData && body.Props != nil {
		body.Props, body.PropsOmitted = nil, true
		m.Data = appendChange(m.Data[:0], &body)
	}
	if c.Op == storage.FeedErase {
		m.Header.Set(jetstream.MsgIDHeader, client.EraseChangeMsgID(sc.Tenant(), c.V.Prov.RequestID))
	} else {
		m.Header.Set(jetstream.MsgIDHeader, client.ChangeMsgID(sc.Tenant(), body.Kind, body.ID, int64(c.V.Tx.Start), int64(c.V.Valid.Start)))
	}
	if body.Kind == client.KindEdge && c.Op != storage.FeedErase {
		m.Header.Set(client.ChangeSrcHeader, body.Src)
		m.Header.Set(client.ChangeDstHeader, body.Dst)
	}
	if c.Op == storage.FeedPut && body.Props == nil {
		m.Header.Set(client.ChangeNoPropsHeader, "none")
	}
	return m
}

// ChangeOf is the wire form of a change.
func ChangeOf(sc storage.Scope, c *storage.Change, props bool) client.Change {
	v := &c.V
	out := client.Change{Tenant: sc.Tenant(), Kind: client.KindNode, Op: c.Op.String(), ID: v.ID.String(),
		TxTime: fmtTs(v.Tx.Start), RequestID: v.Prov.RequestID}
	if v.Kind == storage.KindEdge {
		out.Kind = client.KindEdge
	}
	if c.Op == storage.FeedErase {
		n := c.VersionsErased
		out.VersionsErased = &n
		return out
	}
	out.ValidFrom = fmtTs(v.Valid.Start)
	if !v.Valid.IsOpen() {
		out.ValidEnd = fmtTs(v.Valid.End)
	}
	if v.Kind == storage.KindEdge {
		out.Src, out.Dst, out.Label = v.Src.String(), v.Dst.String(), v.Label
	}
	if c.Cause != [16]byte{} {
		out.Cause = c.Cause.String()
	}
	out.Erased = v.Erased
	if props && c.Op == storage.FeedPut {
		out.Props = json.RawMessage(v.Props)
	}
	return out
}

func fmtTs(t storage.Ts) string { return t.Time().Format(storage.TimeLayout) }

// appendChange appends c's JSON, the same object encoding/json writes for
// client.Change (field order, omitted empty fields), without reflection:
// the feed encodes one per change (about a twentieth of a worker's CPU
// with encoding/json). Props are the stored compact JSON, appended as
// they are.
func appendChange(b []byte, c *client.Change) []byte {
	b = append(b, `{"tenant":`...)
	b = appendJSONString(b, c.Tenant)
	b = append(b, `,"kind":`...)
	b = appendJSONString(b, c.Kind)
	b = append(b, `,"op":`...)
	b = appendJSONString(b, c.Op)
	b = append(b, `,"id":`...)
	b = appendJSONString(b, c.ID)
	b = append(b, `,"tx_time":`...)
	b = appendJSONString(b, c.TxTime)
	opt := func(name, v string) {
		if v != "" {
			b = append(b, `,"`...)
			b = append(b, name...)
			b = append(b, `":`...)
			b = appendJSONString(b, v)
		}
	}
	opt("valid_from", c.ValidFrom)
	opt("valid_end", c.ValidEnd)
	b = append(b, `,"request_id":`...)
	b = appendJSONString(b, c.RequestID)
	opt("cause", c.Cause)
	opt("src", c.Src)
	opt("dst", c.Dst)
	opt("label", c.Label)
	if len(c.Props) > 0 {
		b = append(b, `,"props":`...)
		b = append(b, c.Props...)
	}
	if c.Erased {
		b = append(b, `,"erased":true`...)
	}
	if c.PropsOmitted {
		b = append(b, `,"props_omitted":true`...)
	}
	if c.VersionsErased != nil {
		b = append(b, `,"versions_erased":`...)
		b = strconv.AppendUint(b, *c.VersionsErased, 10)
	}
	return append(b, '}')
}

// appendJSONString appends s as a JSON string: quotes, backslashes and
// control characters escaped, invalid UTF-8 as U+FFFD, U+2028 and U+2029
// escaped (as encoding/json does).
func appendJSONString(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
			i += size
			start = i
			continue
		}
		if r == '\u2028' || r == '\u2029' {
			b = append(b, s[start:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', hex[r&0xf])
			i += size
			start = i
			continue
		}
		i += size
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}
