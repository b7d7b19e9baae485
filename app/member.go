package app

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/telha/telha-cascade/api"
	"github.com/telha/telha-cascade/member"
	"github.com/telha/telha-cascade/metrics"
	"github.com/telha/telha-cascade/partition"
	"github.com/telha/telha-cascade/queue"
	"github.com/telha/telha-cascade/slot"
	"github.com/telha/telha-cascade/storage"
	"go.opentelemetry.io/otel/trace"
)

// --partition-owner dynamic (issue 21, item 3): a member of a group.
//
// The unit that moves is a slot: slot i of N holds the partitions p with
// p % N == i, exactly what replica i/N owns in the static layout, with the
// same changelog stream (TELHA_LOG_STATIC<N>_<i>), checkpoints
// (TELHA_CKPT_STATIC<N>) and request consumer, so a static install of N
// replicas upgrades to dynamic/N without moving a byte. A member runs, for
// each slot the assignment (package member) gives it:
//
//	owner     the slot (package slot: slot.New, then Run) with its own
//	          Pebble in <data-dir>/slots/<i>/pebble, restore and replay on
//	          start, the claim that fences the previous writer, its
//	          consumer, reaper and checkpoints, on the member's NATS
//	          connection, access control and tracer; it binds no port:
//	          the member's HTTP server calls it in process (ServeHosted)
//	standby   a warm copy in that same Pebble directory, caught up from the
//	          newest checkpoint and the changelog (slot.Changelog.CatchUp),
//	          then tailing it; promoted by stopping the tail and starting
//	          the slot on the same directory (the replay left is what
//	          arrived meanwhile)
//
// and serves the member's HTTP (--http-addr): a read for tenant t goes to
// the slot t's partition is in, when this member serves it, or is forwarded to its owner's member
// (--advertise-url), waiting up to --forward-wait while the slot moves.
//
// Handoff: a new owner starts the slot only once the previous owner has
// released the slot (its record no longer says owner) or is gone, or the
// handoff bound ran out; the claim fences whatever is left of the previous
// writer either way. SIGTERM marks the member leaving: the leader moves its
// slots warm-first to the others, then the member stops its slots and
// deletes its record. A slot's fatal error (its append was fenced: this
// member was a zombie for it, or its store broke) ends that slot alone:
// it closes and releases itself, and the member and its other slots go
// on (issue 30 item 2).

const (
	roleOwner   = member.RoleOwner
	roleStandby = member.RoleStandby
	// hdrForwarded marks a read one member forwarded to another: the
	// receiver answers it locally or waits, never forwards again.
	hdrForwarded = "Telha-Forwarded-By"
	// hdrNotOwner marks a 503 to a forwarded read from a member that does
	// not own the read's slot (any more): the forwarding member routes it
	// again instead of passing the 503 on.
	hdrNotOwner = "Telha-Not-Owner"
	// hdrReadFrom says a read was answered by a standby's copy, not the
	// owner (its as_of_tx is the copy's position).
	hdrReadFrom = "Telha-Read-From"
	// hdrStandbyRead marks a read forwarded to a member for its standby's
	// copy to answer (the slot's owner did not answer the forwarder).
	hdrStandbyRead = "Telha-Standby-Read"
)

// memberRun is one running member.
type memberRun struct {
	cfg  Config
	log  *slog.Logger
	opts Options
	id   string
	n    int // slots
	pc   member.PlanConfig

	nc *nats.Conn
	js jetstream.JetStream
	// feedConn: the slots' change feeds' connection (queue.FeedConn).
	feedConn *queue.FeedConn
	reg      *member.Registry
	auth     *api.Auth
	// tracer: the one tracer of the member and its slots (tracerFor).
	tracer trace.TracerProvider
	proms  *metrics.MemberMetrics
	client *http.Client
	// logEnds: per slot, its changelog's end as last read (standby reads).
	logEnds map[int]*logEnd

	mu    sync.Mutex
	slots map[int]*slotRun
	seen  map[int]seenEpoch
	// restartAt: a slot run that ended on its own starts again only then.
	restartAt map[int]time.Time
	// dropping: a copy without a role being inspected and removed
	// (dropRoleless); no run of that slot starts meanwhile.
	dropping map[int]bool
	// dropRetry: a copy without a role whose inspection failed (locked,
	// NATS did not answer) is tried again only then, not at the round its
	// failure woke (a locked copy was inspected about 10 times a second).
	dropRetry map[int]time.Time
	// kept: a promoted standby's Pebble, still open, for the owner run
	// that starts next (standby.go keep; under mu).
	kept    map[int]*storage.PebbleEngine
	assign  []member.Assignment
	members []member.Member
	// routes: per slot, the route reads are forwarded on (its owner's
	// URL) and a context cancelled when it changes (ownerRoute).
	routes  map[int]*slotRoute
	started time.Time
	leaving atomic.Bool
	moves   atomic.Uint64
	fenced  atomic.Uint64
	fatal   chan error
	// wake: a slot run ended; the loop reconciles at once (a promotion
	// waits for its standby's tail to stop, never under mu).
	wake chan struct{}
	// incarnation is this process's (random; member.Member.Incarnation).
	incarnation string
	// renewedAt: when the last renewal that succeeded was sent (unix
	// nanoseconds; 0: never). The lease of this member's reads runs from
	// it (leaseLost).
	renewedAt atomic.Int64
	// regFailed: when this member's last renewal failed (zero: never).
	// Only the loop's goroutine touches it.
	regFailed time.Time
	// phase: what the member does before it joins (/readyz), nil once
	// joined.
	phase atomic.Pointer[string]
	// ended: why a slot run that ended on its own did (m.mu; /readyz
	// until it starts again).
	ended map[int]string
	// broken: the slots whose Pebble failed in this process (why), m.mu.
	// Their directory stays locked until the process exits: the member
	// never runs them again and its record lists them (member.Member
	// Broken), so the plan gives them to the other members.
	broken map[int]string
	// events: the group's changes this member saw, oldest first, the
	// newest eventsKept (m.mu; /v1/partitions, the status page);
	// sawMembers: the members were read once (noteMembership).
	events     []MemberEvent
	sawMembers bool
}

// slotRun is a slot running on this member, as owner or standby.
type slotRun struct {
	slot  int
	role  string
	epoch uint64
	stop  context.CancelFunc
	done  chan struct{}
	err   error

	app      atomic.Pointer[slot.Slot] // owner: the slot, once ready
	applied  atomic.Uint64             // standby: applied sequence
	ready    atomic.Bool               // standby: tailing
	promote  atomic.Bool               // standby: halted to be promoted; its tail keeps the copy open
	stopping atomic.Bool
	served   atomic.Bool // owner: it became ready once
	started  time.Time
	// phase: what the owner's start does, or retries and why
	// (Options.OnStartPhase), until the slot is ready.
	phase atomic.Pointer[string]
	// slowLogged: when the loop last said this start is slow (loop only).
	slowLogged time.Time
	// endOnce closes done: the run ends, or its copy broke (a Pebble
	// fatal error: tail's OnFatal, or the owner's OnCopyFatal).
	endOnce sync.Once

	// standby: its copy, read while it tails (standbyRead). viewMu is held
	// for reading by each read, and for writing while the tail lets go of
	// the copy, so no read outlives the Pebble it reads.
	viewMu   sync.RWMutex
	copyDB   *pebble.DB // under viewMu: set while the tail holds the copy
	viewOpen sync.Mutex // one opening of the view at a time
	view     atomic.Pointer[standbyView]
	tailLog  atomic.Pointer[partition.Changelog] // the changelog it tails
}

// poke wakes the member's loop.
func (m *memberRun) poke() {
	select {
	case m.wake <- struct{}{}:
	default:
	}
}

// lostClaim: a slot that never served ended because its claim was fenced
// (partition.ErrFenced): it lost a race with the previous writer, which is
// no reason to stop the member's other slots.
func lostClaim(err error, served bool) bool {
	return err != nil && !served && errors.Is(err, partition.ErrFenced)
}

// halt asks r to stop (it is stopping from now on) and does not wait.
func (r *slotRun) halt() {
	r.stopping.Store(true)
	r.stop()
}

// end records err as the run's end and closes done, once: the run's
// goroutine ends, or a Pebble fatal error ends the run while that
// goroutine stays parked inside Pebble (a standby's tail OnFatal, an
// owner's OnCopyFatal).
func (r *slotRun) end(err error) {
	r.endOnce.Do(func() {
		r.err = err
		close(r.done)
	})
}

func (r *slotRun) exited() bool {
	select {
	case <-r.done:
		return true
	default:
		return false
	}
}

// runMember is Run for --partition-owner dynamic.
func runMember(ctx context.Context, cfg Config, log *slog.Logger, opts Options) error {
	m := &memberRun{
		cfg: cfg, log: log.With("member", cfg.Member.ID), opts: opts, id: cfg.Member.ID, n: cfg.Owner.Count,
		pc:          member.PlanConfig{Slots: cfg.Owner.Count, Standbys: cfg.Member.Standbys, MaxLag: cfg.Member.MaxLag},
		incarnation: uuid.NewString(),
		slots:       map[int]*slotRun{}, seen: map[int]seenEpoch{}, restartAt: map[int]time.Time{}, dropping: map[int]bool{}, dropRetry: map[int]time.Time{}, ended: map[int]string{}, broken: map[int]string{}, kept: map[int]*storage.PebbleEngine{},
		fatal:   make(chan error, 1),
		wake:    make(chan struct{}, 1),
		client:  &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64, IdleConnTimeout: time.Minute}},
		logEnds: map[int]*logEnd{},
		routes:  map[int]*slotRoute{},
	}
	return m.run(ctx)
}

func (m *memberRun) run(ctx context.Context) (err error) {
	m.started = time.Now()
	m.proms = metrics.NewMemberMetrics(Build, metrics.MemberState{
		Slots: m.n, Partitions: m.samples, Members: func() int { m.mu.Lock(); defer m.mu.Unlock(); return len(m.members) },
		Moves: m.moves.Load, Fenced: m.fenced.Load,
	}, slot.DeniedReasons)
	// One access control for the member and its slots: the tokens file is
	// read and watched once, and every refusal is counted once, here.
	auth, err := api.NewAuth(api.AuthConfig{Mode: m.cfg.AuthMode(), TokensFile: m.cfg.AuthTokensFile, Logger: m.log, Denied: m.proms.Denied})
	if err != nil {
		return fmt.Errorf("%w: %v", ErrUsage, err)
	}
	m.auth = auth
	logStartChoices(m.log, m.cfg, auth.Mode())
	// One tracer for the member's slots: one exporter per process, not
	// per slot.
	tp, stopTracing, err := tracerFor(m.opts, m.cfg, m.log)
	if err != nil {
		return err
	}
	defer stopTracing()
	m.tracer = tp
	ln, err := net.Listen("tcp", m.cfg.HTTPAddr)
	if err != nil {
		return fmt.Errorf("listen on --http-addr %s: %w", m.cfg.HTTPAddr, err)
	}
	// As a worker's own server (serve), with the forwarding wait on top.
	srv := &http.Server{Handler: m.handler(), ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 10 * time.Second,
		WriteTimeout: 60*time.Second + m.cfg.Member.ForwardWait, IdleTimeout: 120 * time.Second, MaxHeaderBytes: 64 << 10,
		ErrorLog: slog.NewLogLogger(m.log.Handler(), slog.LevelWarn)}
	go func() { _ = srv.Serve(ln) }()
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()

	// The member's one NATS connection: its slots use it (Options.Conn).
	// dial settles --stream-replicas 0 in m.cfg, which the slots inherit.
	conn, err := dial(ctx, &m.cfg, m.log)
	if conn != nil {
		defer conn.close()
	}
	if err != nil {
		return err
	}
	m.nc = conn.nc
	// The change feed's connection (queue.FeedConn), shared by the slots'
	// feeds: closed after the slots stop (deferred after conn.close above,
	// so run before it).
	m.feedConn = queue.NewFeedConn(conn.nc)
	defer m.feedConn.Close()
	js, err := jetstream.New(conn.nc)
	if err != nil {
		return fmt.Errorf("member: %w", err)
	}
	m.js = js
	// Short attempts: JetStream clusters answer concurrent creates of one
	// stream (every member starting at once) late or never
	// (nats-server#3677); the stream exists, and the retry binds it.
	for delay := 200 * time.Millisecond; ; delay = min(2*delay, 5*time.Second) {
		octx, cancel := context.WithTimeout(ctx, 4*time.Second)
		m.reg, err = member.Open(octx, js, member.Config{Slots: m.n, Replicas: m.cfg.LogReplicas(), TTL: m.cfg.Member.TTL})
		cancel()
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return nil
		}
		startupRetry(m.log, m.started, "member: opening the membership buckets failed; retrying", "err", err, "in", delay)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(delay):
		}
	}
	// Two processes with one --member-id would fence each other's slots
	// for ever: the second one stops here (issue 30 item 5). Any other
	// error is retried: on a fresh cluster the bucket just created may
	// have no leader yet ("no responders"; a first start exited 1 so).
	for delay := 200 * time.Millisecond; ; delay = min(2*delay, 5*time.Second) {
		err := m.reg.CheckDuplicate(ctx, m.id, m.incarnation, 2*m.stepEvery()+time.Second)
		if err == nil {
			break
		}
		if errors.Is(err, member.ErrDuplicateMember) {
			m.log.Error("member: another live process already runs with this --member-id; give each process its own id", "member_id", m.id, "err", err)
			return fmt.Errorf("%w: --member-id %s: %w", ErrUsage, m.id, err)
		}
		if ctx.Err() != nil {
			return nil
		}
		startupRetry(m.log, m.started, "member: reading this member's record failed; retrying", "err", err, "in", delay)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(delay):
		}
	}
	if err := m.checkLegacy(ctx); err != nil {
		return err
	}
	if err := m.provisionShared(ctx); err != nil || ctx.Err() != nil {
		return err
	}
	m.log.Info("member: joining", "slots", m.n, "partitions", m.cfg.Partitions, "standbys", m.cfg.Member.Standbys, "ttl", m.cfg.Member.TTL,
		"advertise_url", m.cfg.Member.AdvertiseURL, "http", ln.Addr().String())

	// The loop's NATS calls use work, which outlives SIGTERM: the handoff
	// after it still talks to the group.
	work, stopWork := context.WithCancel(context.WithoutCancel(ctx))
	defer stopWork()
	changed, err := m.reg.Watch(work)
	if err != nil {
		return err
	}
	defer m.stopAll()
	tick := time.NewTicker(m.stepEvery())
	defer tick.Stop()
	// --shutdown-grace bounds the whole exit from SIGTERM on: half for
	// the handoff, half for the drain of what is left (each slot's grace).
	// The handoff's rounds run under handoff, which ends half a grace
	// after SIGTERM, even when SIGTERM came during a round (cut off from
	// NATS, a round waits up to half a TTL).
	handoff, endHandoff := context.WithCancel(work)
	defer endHandoff()
	var exitBy atomic.Int64 // unix nanoseconds; 0 until SIGTERM
	defer context.AfterFunc(ctx, func() {
		exitBy.Store(time.Now().Add(m.cfg.ShutdownGrace).UnixNano())
		time.AfterFunc(m.cfg.ShutdownGrace/2, endHandoff)
	})()
	leave := func() error {
		by := time.Time{}
		if n := exitBy.Load(); n != 0 {
			by = time.Unix(0, n)
		}
		return m.leave(work, by)
	}
	stopping := ctx.Done()
	for {
		if handoff.Err() != nil {
			if stopping != nil { // SIGTERM came during a round that outlasted the handoff
				m.log.Info("member: SIGTERM: handing every slot off before exiting", "bound", m.cfg.ShutdownGrace/2)
			}
			m.log.Warn("member: the handoff outlasted --shutdown-grace; stopping the slots still owned (the others' claims fence them)")
			return leave()
		}
		if err := m.step(handoff); err != nil {
			m.log.Warn("member: a round failed; the next one retries", "err", err)
		}
		if m.leaving.Load() && m.ownsNothing() {
			m.log.Info("member: every slot handed off; leaving")
			return leave()
		}
		select {
		case err := <-m.fatal:
			return err
		case <-stopping:
			m.log.Info("member: SIGTERM: handing every slot off before exiting", "bound", m.cfg.ShutdownGrace/2)
			m.leaving.Store(true)
			stopping = nil
		case <-handoff.Done(): // the loop's first check leaves
		case <-changed:
		case <-m.wake:
		case <-tick.C:
		}
	}
}

// startupQuiet: retries this early in a member's start are INFO, not
// WARN. Members starting together on a fresh cluster race to create the
// same buckets and streams, and JetStream answers concurrent creates late
// (nats-server#3677): a few retries are expected and say nothing is
// wrong; past this they do.
const startupQuiet = 30 * time.Second

// startupRetry logs a failed start step that is retried: INFO within
// startupQuiet of started, WARN after.
func startupRetry(log *slog.Logger, started time.Time, msg string, args ...any) {
	if time.Since(started) < startupQuiet {
		log.Info(msg+" (members starting together race to create them; expected on a fresh cluster)", args...)
		return
	}
	log.Warn(msg, args...)
}

// provisionShared creates, once and before any slot starts, what every
// slot would otherwise create at the same moment: the checkpoint
// bucket and the request, result and dead-letter streams. A JetStream
// cluster answers concurrent creates of one stream late or never
// (nats-server#3677): 16 slots creating them at once on a fresh cluster
// waited out 5 and 10 s attempt deadlines (a first start took 12-17 s),
// while concurrent updates of a stream that exists are answered at once.
// Short attempts, for members starting at once: the stream exists, and
// the retry binds it.
func (m *memberRun) provisionShared(ctx context.Context) error {
	c := m.slotConfig(0)
	t0 := time.Now()
	defer m.phase.Store(nil)
	for delay := 200 * time.Millisecond; ; delay = min(2*delay, 5*time.Second) {
		octx, cancel := context.WithTimeout(ctx, 4*time.Second)
		_, err := partition.OpenCheckpoints(octx, m.js, c.CheckpointConfig())
		if err == nil {
			slot.ProvisionMu.Lock() // see provision
			err = queue.ProvisionStreams(octx, m.js, c.QueueConfig())
			slot.ProvisionMu.Unlock()
		}
		cancel()
		if err == nil {
			m.log.Info("member: the checkpoint bucket and the request streams are in place", "took", time.Since(t0))
			return nil
		}
		if errors.Is(err, queue.ErrPartitionsChanged) {
			return fmt.Errorf("%w: %w", ErrUsage, err)
		}
		if ctx.Err() != nil {
			return nil
		}
		startupRetry(m.log, m.started, "member: creating the checkpoint bucket and the request streams failed; retrying", "err", err, "in", delay)
		p := fmt.Sprintf("member: creating the checkpoint bucket and the request streams failed, retrying in %s: %v", delay, err)
		m.phase.Store(&p)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(delay):
		}
	}
}

func (m *memberRun) stepEvery() time.Duration {
	return min(max(m.cfg.Member.TTL/4, 100*time.Millisecond), time.Second)
}

// leave stops every slot and deletes the member's record, within what is
// left of the exit (exitBy; zero: no SIGTERM, as a fatal error's exit).
// Cut off from NATS it does not try: the record expires after the TTL,
// and a wait for NATS would only outlast --shutdown-grace.
func (m *memberRun) leave(ctx context.Context, exitBy time.Time) error {
	m.stopAll()
	if !m.nc.IsConnected() {
		m.log.Warn("member: not connected to NATS; the record is left to expire after the TTL", "ttl", m.cfg.Member.TTL)
		return nil
	}
	bound := 5 * time.Second
	if !exitBy.IsZero() {
		bound = min(bound, max(time.Until(exitBy), time.Second))
	}
	lctx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	if err := m.reg.Leave(lctx, m.id); err != nil {
		m.log.Warn("member: deleting the record failed; it expires after the TTL", "err", err)
	}
	return nil
}

// ownsNothing: no slot is owned here, in the assignment or still running.
func (m *memberRun) ownsNothing() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	others := 0
	for _, mm := range m.members {
		if mm.ID != m.id && !mm.Leaving {
			others++
		}
	}
	if others == 0 {
		return true // nobody to hand to: stop (the slots wait for a member)
	}
	for _, a := range m.assign {
		if a.Owner == m.id {
			return false
		}
	}
	for _, r := range m.slots {
		if r.role == roleOwner {
			return false
		}
	}
	return true
}

// step renews the record, leads if lowest, and reconciles the slots.
func (m *memberRun) step(ctx context.Context) error {
	sctx, cancel := context.WithTimeout(ctx, max(m.cfg.Member.TTL/2, time.Second))
	defer cancel()
	sent := time.Now() // the record lives TTL from the server's receipt, which is later
	// lapsed: the lease ran out before this renewal (paused, cut off from
	// NATS). The record may have expired and the slots moved; the renewal
	// (a Put) creates it again, but it says nothing of what this member
	// still owns. The lease counts from it only once this step has read
	// the assignment and stopped the slots that moved (reconcile, below):
	// before, reads were answered from a moved slot's stale copy meanwhile.
	lapsed := m.leaseLost() != ""
	if err := m.reg.Renew(sctx, m.record()); err != nil {
		m.regFailed = time.Now()
		return err
	}
	if !lapsed {
		m.renewedAt.Store(sent.UnixNano())
	}
	// After this member could not reach the registry, every record may
	// be stale for the same reason: lead again only after a whole TTL of
	// renewals (the others have renewed by then, or are gone).
	mayLead := m.regFailed.IsZero() || time.Since(m.regFailed) > m.cfg.Member.TTL
	cur, members, _, err := m.reg.Step(sctx, m.id, m.pc, mayLead)
	if err != nil {
		m.regFailed = time.Now()
		return err
	}
	m.mu.Lock()
	for s, a := range cur {
		if s < len(m.assign) && m.assign[s].Epoch != a.Epoch && m.assign[s].Owner != "" {
			m.moves.Add(1)
		}
	}
	prev := m.members
	m.assign, m.members = cur, members
	m.reroute()
	events := m.noteMembership(prev, members, time.Now())
	m.mu.Unlock()
	for _, e := range events {
		if e.Kind == "expired" {
			m.log.Warn("member: "+e.What, "other", e.Member)
		} else {
			m.log.Info("member: "+e.What, "other", e.Member)
		}
	}
	m.reconcile(cur, members)
	if lapsed {
		m.renewedAt.Store(sent.UnixNano())
	}
	m.logSlowStarts()
	return nil
}

// MemberEvent is a change of the group this member saw: another member
// joined, left (SIGTERM: its record said leaving) or expired (its record's
// TTL ran out: killed, paused or cut off from NATS).
type MemberEvent struct {
	At     time.Time `json:"at"`
	Member string    `json:"member"`
	Kind   string    `json:"kind"` // joined, left, expired
	What   string    `json:"what"`
}

// eventsKept is how many group changes a member remembers (/v1/partitions).
const eventsKept = 50

// noteMembership records how the group changed between two reads of the
// members (m.mu held) and returns the new events. The first read is not
// a change: every member there was already in the group.
func (m *memberRun) noteMembership(prev, cur []member.Member, now time.Time) []MemberEvent {
	if !m.sawMembers {
		m.sawMembers = true
		return nil
	}
	was := map[string]member.Member{}
	for _, mm := range prev {
		was[mm.ID] = mm
	}
	is := map[string]bool{}
	var out []MemberEvent
	for _, mm := range cur {
		is[mm.ID] = true
		if _, ok := was[mm.ID]; !ok && mm.ID != m.id {
			out = append(out, MemberEvent{At: now, Member: mm.ID, Kind: "joined", What: fmt.Sprintf("%s joined the group (%s)", mm.ID, mm.URL)})
		}
	}
	for _, mm := range prev {
		if is[mm.ID] || mm.ID == m.id {
			continue
		}
		var owned []int
		for _, a := range m.assign {
			if a.Prev == mm.ID || a.Owner == mm.ID {
				owned = append(owned, a.Slot)
			}
		}
		e := MemberEvent{At: now, Member: mm.ID, Kind: "expired",
			What: fmt.Sprintf("%s expired: no renewal since %s (TTL %s): killed, paused or cut off from NATS; its slots %v move to the others",
				mm.ID, mm.Renewed.UTC().Format(time.RFC3339), m.cfg.Member.TTL, owned)}
		if mm.Leaving {
			e.Kind, e.What = "left", fmt.Sprintf("%s left the group (SIGTERM; its slots were handed off)", mm.ID)
		}
		out = append(out, e)
	}
	m.events = append(m.events, out...)
	if n := len(m.events); n > eventsKept {
		m.events = append([]MemberEvent(nil), m.events[n-eventsKept:]...)
	}
	return out
}

// leaseLost says why this member may no longer answer reads from its
// copies, or "" while it may (issue 30 item 4: reads under a lease).
//
// Invariant: a slot moves only after its owner's record expired, TTL after
// the server received the owner's last renewal, so no other member can
// have written to a slot this member owns before renewedAt + TTL. This
// member answers reads from its copies only until renewedAt + TTL - margin
// (margin: a third of the TTL, at least a second: clocks run at slightly
// different rates, and a read already admitted must finish); past it, a
// member cut off from NATS answers 503 and reports not ready, so a Service
// routes elsewhere, and it never answers a stale 200, or a 404 for an
// entity written after the move.
func (m *memberRun) leaseLost() string {
	at := m.renewedAt.Load()
	if at == 0 {
		return ""
	}
	ttl := m.cfg.Member.TTL
	lease := ttl - max(ttl/3, time.Second)
	if since := time.Since(time.Unix(0, at)); since > lease {
		return fmt.Sprintf("member: its membership was last renewed %s ago (lease %s of a %s TTL): NATS unreachable? its copies may be stale, so it answers no read", since.Round(100*time.Millisecond), lease, ttl)
	}
	return ""
}

// slowStart: an owner's start this long is said in the log (and again
// after as long), with what it does or retries.
const slowStart = 30 * time.Second

// logSlowStarts says which owned slots are still starting, and why, once
// per slowStart (only the loop's goroutine calls it).
func (m *memberRun) logSlowStarts() {
	m.mu.Lock()
	defer m.mu.Unlock()
	for s, r := range m.slots {
		if r.role != roleOwner || r.app.Load() != nil || r.stopping.Load() || time.Since(r.started) < slowStart || time.Since(r.slowLogged) < slowStart {
			continue
		}
		r.slowLogged = time.Now()
		m.log.Warn("member: a slot is still starting", "slot", s, "for", time.Since(r.started).Round(time.Second), "phase", r.startPhase())
	}
}

// startPhase is what an owner's start does ("connecting" before its
// first step).
func (r *slotRun) startPhase() string {
	if p := r.phase.Load(); p != nil {
		return *p
	}
	return "connecting"
}

// record is this member's record: its slots and their positions.
func (m *memberRun) record() member.Member {
	rec := member.Member{ID: m.id, URL: m.cfg.Member.AdvertiseURL, Leaving: m.leaving.Load(), Started: m.started.UTC(), Incarnation: m.incarnation,
		Slots: map[int]member.SlotState{}}
	for _, o := range m.localOwners() {
		for _, j := range o.app.Journals() {
			if len(rec.Journals) == member.MaxJournalsInRecord {
				break
			}
			rec.Journals = append(rec.Journals, member.JournalRef{Slot: o.i, Tenant: j.Tenant, NodeID: j.NodeID, RequestID: j.RequestID,
				State: j.State, EdgesDone: j.EdgesDone, EdgesTotal: j.EdgesTotal, AgeSeconds: j.AgeSeconds})
		}
	}
	var finished []member.FinishedRef
	for _, o := range m.localOwners() {
		for _, f := range o.app.RecentlyFinished() {
			finished = append(finished, member.FinishedRef{Slot: o.i, Tenant: f.Tenant, NodeID: f.NodeID, RequestID: f.RequestID,
				Outcome: f.Outcome, EdgesTombstoned: f.EdgesTombstoned, Attempts: f.Attempts, Finished: f.Finished.UTC(), TookSeconds: f.Took.Seconds()})
		}
	}
	slices.SortStableFunc(finished, func(a, b member.FinishedRef) int { return b.Finished.Compare(a.Finished) })
	rec.Finished = finished[:min(len(finished), member.MaxFinishedInRecord)]
	m.mu.Lock()
	defer m.mu.Unlock()
	for s, r := range m.slots {
		st := member.SlotState{Role: r.role, Epoch: r.epoch}
		switch r.role {
		case roleOwner:
			if a := r.app.Load(); a != nil {
				st.Applied, st.Ready = a.ChangelogLast(), !r.stopping.Load()
			}
		case roleStandby:
			st.Applied, st.Ready = r.applied.Load(), r.ready.Load()
		}
		rec.Slots[s] = st
	}
	for s := range m.broken {
		rec.Broken = append(rec.Broken, s)
	}
	slices.Sort(rec.Broken)
	return rec
}

// released: no other live member runs slot a as its owner (its record
// says so; a member gone runs nothing), or the handoff bound ran out since
// this member first saw a's epoch (m.mu held). Every other member counts,
// not only a.Prev: an owner before it may still be draining.
func (m *memberRun) released(a member.Assignment, members []member.Member) bool {
	if seen, ok := m.seen[a.Slot]; ok && seen.epoch == a.Epoch && time.Since(seen.at) > m.cfg.ShutdownGrace+m.cfg.Member.TTL {
		return true
	}
	for _, mm := range members {
		if mm.ID == m.id {
			continue
		}
		if st, ok := mm.Slots[a.Slot]; ok && st.Role == roleOwner {
			return false
		}
	}
	return true
}

// seenEpoch is when this member first saw a slot's epoch (its own
// monotonic clock: the assignment's Changed is the leader's clock).
type seenEpoch struct {
	epoch uint64
	at    time.Time
}

// reconcile starts and stops slot runs to match the assignment.
func (m *memberRun) reconcile(cur []member.Assignment, members []member.Member) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for s, a := range cur {
		if m.seen[s].epoch != a.Epoch {
			m.seen[s] = seenEpoch{a.Epoch, time.Now()}
		}
		want := ""
		switch {
		case a.Owner == m.id:
			want = roleOwner
		case slices.Contains(a.Standbys, m.id):
			want = roleStandby
		}
		r := m.slots[s]
		if r != nil && r.exited() && errors.Is(r.err, storage.ErrEngine) {
			// Pebble failed on this copy: nothing may touch it again in
			// this process, and its lock is held until the exit. Give the
			// slot up for good (the record says so; the plan moves it).
			m.log.Error("member: Pebble failed on a slot's copy; this member gives the slot up until it restarts (the group moves it to another member)",
				"slot", s, "role", r.role, "err", r.err)
			m.broken[s] = r.err.Error()
			delete(m.slots, s)
			r = nil
		}
		if _, broke := m.broken[s]; broke {
			continue
		}
		if r != nil && r.exited() && !r.stopping.Load() {
			// It ended on its own (an error it did not survive): start again,
			// after a pause (a conflict only an operator settles would
			// otherwise restart it every round). A lost claim is a race
			// with the previous writer: it starts again sooner.
			pause := 5 * time.Second
			if lostClaim(r.err, r.served.Load()) {
				pause = time.Second
			}
			m.log.Warn("member: a slot run ended; restarting it", "slot", s, "role", r.role, "err", r.err, "in", pause)
			m.ended[s] = fmt.Sprintf("its %s run ended (%v)", r.role, r.err)
			delete(m.slots, s)
			m.restartAt[s] = time.Now().Add(pause)
			r = nil
		}
		if r == nil && (time.Now().Before(m.restartAt[s]) || m.dropping[s]) {
			continue
		}
		if r != nil && r.stopping.Load() {
			if !r.exited() {
				continue // wait for it
			}
			delete(m.slots, s)
			r = nil
			if want == "" {
				m.dropCopy(s)
			}
		}
		switch want {
		case roleOwner:
			if r != nil && r.role == roleOwner {
				r.epoch = a.Epoch
				continue
			}
			if !m.released(a, members) {
				if r == nil {
					m.slots[s] = m.startStandby(s) // keep warming meanwhile
				}
				continue
			}
			if r != nil {
				// A standby: promote it in place. Its tail stops first and
				// keeps the slot's Pebble open (keep); the slot starts on it
				// in the round its exit wakes. Never waited for here, under
				// mu: a tail stuck in a NATS call would stop every slot of
				// this member.
				r.promote.Store(true)
				r.halt()
				continue
			}
			m.slots[s] = m.startOwner(s, a.Epoch)
		case roleStandby:
			if r != nil && r.role == roleStandby {
				continue
			}
			if r != nil {
				m.stopRun(r, true) // an owner: drain, in the background
				continue
			}
			m.slots[s] = m.startStandby(s)
		default:
			if r != nil {
				m.stopRun(r, r.role == roleOwner)
				if r.role == roleStandby {
					delete(m.slots, s)
					m.dropCopy(s)
				}
				continue
			}
			if _, err := os.Stat(m.slotDir(s)); err == nil && time.Now().After(m.dropRetry[s]) {
				// A copy no role reaches (this member restarted on its old
				// disk and was given nothing of the slot): no erase would
				// ever reach it (issue 29, audit item 1).
				m.dropping[s] = true
				go m.dropRoleless(s)
			}
		}
	}
}

// dropRetryAfter: how long a copy without a role whose inspection failed
// is kept before it is inspected again.
const dropRetryAfter = 5 * time.Second

// dropRoleless removes slot s's local copy, which no role of this member
// holds, once it has checked that the slot's changelog holds its data (the
// copy follows the stream NATS holds now); a copy of another log (the
// stream was deleted or lost) may be the only copy of its data, and is set
// aside for an operator instead. Run outside mu: it opens the copy and
// asks NATS.
func (m *memberRun) dropRoleless(s int) {
	failed := false
	defer func() {
		m.mu.Lock()
		delete(m.dropping, s)
		if failed {
			m.dropRetry[s] = time.Now().Add(dropRetryAfter)
		} else {
			delete(m.dropRetry, s)
		}
		m.mu.Unlock()
		if !failed {
			m.poke()
		}
	}()
	dir := filepath.Join(m.slotDir(s), "pebble")
	lid, attached, empty, err := inspectCopy(dir)
	if err != nil {
		failed = true
		m.log.Warn("member: inspecting a copy no role holds; kept for now, tried again later", "slot", s, "in", dropRetryAfter, "err", err)
		return
	}
	if attached && !empty {
		cfg := m.slotConfig(s)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		id, _, _, err := slot.LogIdentity(ctx, m.js, cfg.ChangelogConfig().StreamName())
		cancel()
		if err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
			failed = true
			m.log.Warn("member: a copy no role holds; its changelog did not answer, kept for now, tried again later", "slot", s, "in", dropRetryAfter, "err", err)
			return
		}
		if id != lid {
			m.setAside(s)
			return
		}
	}
	m.dropCopy(s)
	m.log.Info("member: removed the copy of a slot this member holds no role of", "slot", s)
}

// inspectCopy opens the Pebble in dir (when there is one) and reports the
// changelog it follows and whether it is empty.
func inspectCopy(dir string) (logID string, attached, empty bool, err error) {
	if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
		return "", false, true, nil
	}
	pe, err := storage.OpenPebble(dir, nil, nil, nil, nil, storage.Sizes{CacheBytes: 8 << 20, MemTableBytes: 4 << 20})
	if err != nil {
		return "", false, false, err
	}
	empty, err = slot.IsEmpty(pe.DB)
	if err == nil {
		logID, attached, err = partition.LogID(pe.DB)
	}
	if cerr := pe.DB.Close(); err == nil {
		err = cerr
	}
	return logID, attached, empty, err
}

// stopRun stops r: a standby at once; an owner's slot drains (up to
// --shutdown-grace), in the background when async.
func (m *memberRun) stopRun(r *slotRun, async bool) {
	r.halt()
	if async {
		m.log.Info("member: handing a slot off: draining it", "slot", r.slot)
		return
	}
	<-r.done
}

// dropCopy deletes the local copy of a slot this member no longer holds:
// no copy of a tenant's data lingers where nothing tails the changelog
// (an erase reaches only the copies that follow it).
func (m *memberRun) dropCopy(s int) {
	m.closeKept(s)
	if err := os.RemoveAll(m.slotDir(s)); err != nil {
		m.log.Warn("member: removing the copy of a slot no longer held", "slot", s, "err", err)
	}
}

// setAside moves slot s's copy out of the way (<data-dir>/slots/<s>.aside-
// <time>), for an operator: it holds data that no changelog holds.
func (m *memberRun) setAside(s int) {
	to := fmt.Sprintf("%s.aside-%s", m.slotDir(s), time.Now().UTC().Format("20060102T150405Z"))
	if err := os.Rename(m.slotDir(s), to); err != nil {
		m.log.Error("member: moving aside a copy no changelog holds", "slot", s, "err", err)
		return
	}
	m.log.Error("member: slot's local copy holds data that its changelog does not (the stream was deleted, or NATS lost it); "+
		"moved aside, not deleted: restore it as the static replica i/N with --changelog jetstream to seed a new changelog (RUNBOOK, Backups)",
		"slot", s, "moved_to", to)
}

func (m *memberRun) stopAll() {
	m.mu.Lock()
	runs := make([]*slotRun, 0, len(m.slots))
	for _, r := range m.slots {
		runs = append(runs, r)
	}
	m.mu.Unlock()
	for _, r := range runs {
		r.halt()
	}
	for _, r := range runs {
		<-r.done
	}
	m.mu.Lock()
	for s := range m.kept {
		m.closeKept(s)
	}
	m.mu.Unlock()
}

func (m *memberRun) slotDir(s int) string {
	return filepath.Join(m.cfg.DataDir, "slots", strconv.Itoa(s))
}

// slotConfig is the configuration of slot s on this member: slot s of
// N, served by the member's HTTP (no port of its own), with its share of
// the caches.
func (m *memberRun) slotConfig(s int) slot.Config {
	c := m.cfg.Config
	c.Owner = queue.Owner{Index: s, Count: m.n}
	c.DataDir = m.slotDir(s)
	c.Hosted = true
	c.ShutdownGrace = max(m.cfg.ShutdownGrace/2, time.Second) // see run: the handoff has the other half
	c.CacheMB = max(8, m.cfg.CacheMB/m.n)
	c.MemTableMB = max(4, m.cfg.MemTableMB/m.n)
	return c
}

// startOwner starts slot s as its owner (package slot).
func (m *memberRun) startOwner(s int, epoch uint64) *slotRun {
	ctx, cancel := context.WithCancel(context.Background())
	r := &slotRun{slot: s, role: roleOwner, epoch: epoch, stop: cancel, done: make(chan struct{}), started: time.Now()}
	o := m.opts.slotOptions(m.tracer)
	o.SlotView = m.slotRows
	o.StandbyApplied = func() []uint64 { return m.standbyApplied(s) }
	o.OnStartPhase = func(p string) { r.phase.Store(&p) }
	o.Conn = m.nc // one NATS connection per member, not one per slot
	o.FeedConn = m.feedConn
	o.Auth = m.auth // one access control, refusals counted once
	o.Host = m.host()
	if pe := m.kept[s]; pe != nil { // m.mu held
		o.Copy = pe // promoted in place: the slot takes the standby's open Pebble
		delete(m.kept, s)
	}
	o.OnReady = func(a *slot.Slot) {
		r.served.Store(true)
		r.app.Store(a)
		st := a.ChangelogStatus()
		if st.ClaimSeq > 1 && !st.Seeded {
			m.fenced.Add(1)
		}
		m.log.Info("member: serving a slot", "slot", s, "epoch", epoch, "start_took", st.StartTook, "restored", st.Restored, "replayed", st.Replayed,
			"in_place", st.InPlace)
		if m.opts.OnReady != nil {
			m.opts.OnReady(a)
		}
	}
	if err := os.MkdirAll(m.slotDir(s), 0o755); err != nil {
		m.log.Warn("member: slot directory", "slot", s, "err", err)
	}
	m.log.Info("member: taking a slot", "slot", s, "epoch", epoch)
	// A Pebble fatal error in the catch-up, before the slot's store opens
	// (a failed MANIFEST or WAL write: its disk failed), ends this run,
	// not the process, as a standby's does (tail): the next round gives
	// the slot up (reconcile, m.broken) and the member serves its other
	// slots. The goroutine that met it parks inside Pebble.
	o.OnCopyFatal = func(err error) {
		m.log.Error("member: Pebble failed on a slot's copy while catching it up; the member and its other slots go on", "slot", s, "err", err)
		r.app.Store(nil)
		r.end(err)
		r.stop()
		m.poke()
		select {}
	}
	go func() {
		defer m.poke()
		sl, err := slot.New(m.slotConfig(s), m.log.With("slot", s), o)
		if err == nil {
			err = sl.Run(ctx)
		}
		defer r.end(err)
		r.app.Store(nil)
		if lostClaim(err, r.served.Load()) {
			// Another writer appended between our catch-up and our claim:
			// the previous owner, still running. Its next append is
			// refused; this slot run starts again (reconcile), the member
			// does not exit for it.
			return
		}
		switch {
		case err != nil && errors.Is(err, ErrUsage):
			// A configuration every slot shares: the member cannot go on.
			select {
			case m.fatal <- fmt.Errorf("slot %d: %w", s, err):
			default:
			}
		case err != nil && errors.Is(err, storage.ErrFatal):
			// One slot fails alone (issue 30 item 2): fenced (another
			// member owns it now: this one was paused or cut off past its
			// TTL) or its store broke. The member and its other slots go
			// on. Fenced, its run has closed and released it: the next
			// round starts it again if the slot is still this member's.
			// Broken (storage.ErrEngine), its copy stays locked: the next
			// round gives the slot up (reconcile, m.broken).
			m.log.Error("member: a slot stopped on a fatal error; the member and its other slots go on", "slot", s, "err", err)
		}
	}()
	return r
}

// checkLegacy refuses to start on a data directory whose static store
// (<data-dir>/pebble, written with --partition-owner i/N) holds data its
// changelog does not: a member would never read it, and the slot's new
// owner would start a log without it, hiding it for good. Such a store is
// carried over by one start of this release as i/N with --changelog
// jetstream (it seeds the changelog); then the member reads it from the
// changelog, and the static store stays in place, untouched, for a
// rollback (docs/DEPLOY.md, "Upgrading to dynamic").
func (m *memberRun) checkLegacy(ctx context.Context) error {
	dir := filepath.Join(m.cfg.DataDir, "pebble")
	if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	pe, err := storage.OpenPebble(dir, nil, nil, nil, nil, storage.Sizes{CacheBytes: 8 << 20, MemTableBytes: 4 << 20})
	if err != nil {
		return fmt.Errorf("member: inspecting the static store %s: %w", dir, err)
	}
	empty, err := slot.IsEmpty(pe.DB)
	var lid string
	var attached bool
	var applied uint64
	if err == nil {
		lid, attached, err = partition.LogID(pe.DB)
	}
	if err == nil {
		applied, err = partition.AppliedSeq(pe.DB)
	}
	if cerr := pe.DB.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("member: inspecting the static store %s: %w", dir, err)
	}
	if empty {
		return nil
	}
	refuse := func(why string) error {
		return fmt.Errorf("%w: %s holds a static replica's store %s; a member would not read it. Carry it over first: start this release once with "+
			"--partition-owner i/%d --changelog jetstream on this data directory (it seeds the changelog), stop it, then start it as a member (docs/DEPLOY.md)",
			ErrUsage, dir, why, m.n)
	}
	if !attached {
		return refuse("written without a changelog")
	}
	name, _, _ := strings.Cut(lid, "@")
	prefix := fmt.Sprintf("TELHA_LOG_STATIC%d_", m.n)
	idx, err := strconv.Atoi(strings.TrimPrefix(name, prefix))
	if !strings.HasPrefix(name, prefix) || err != nil || idx < 0 || idx >= m.n {
		return refuse(fmt.Sprintf("following the changelog %s, not one of the %d slots' (%s<i>)", name, m.n, prefix))
	}
	cl, err := slot.OpenChangelog(ctx, m.nc, m.slotConfig(idx), m.log, nil, func(string) {})
	if err != nil || cl == nil {
		return errors.Join(err, ctx.Err())
	}
	id, _, last, err := cl.LogIdentity(ctx)
	if err != nil {
		return err
	}
	if id != lid || last < applied {
		return refuse(fmt.Sprintf("following %s up to sequence %d, while NATS holds %s up to %d", lid, applied, id, last))
	}
	m.log.Info("member: the static store of this data directory is in its changelog; it stays in place, untouched, for a rollback (delete it once the upgrade is confirmed)",
		"dir", dir, "slot", idx, "changelog", lid, "applied", applied)
	return nil
}
