package app

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
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
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/telha/telha-cascade/api"
	"github.com/telha/telha-cascade/member"
	"github.com/telha/telha-cascade/metrics"
	"github.com/telha/telha-cascade/partition"
	"github.com/telha/telha-cascade/queue"
	"github.com/telha/telha-cascade/storage"
	"github.com/telha/telha-cascade/ui"
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
//	owner     a slot core: what one static replica runs (runReplica with
//	          --partition-owner i/N, its own Pebble in <data-dir>/slots/<i>/pebble,
//	          restore and replay on start, the claim that fences the
//	          previous writer, its consumer, reaper and checkpoints) on
//	          the member's NATS connection; it binds no port: the
//	          member's HTTP server calls its handler in process
//	standby   a warm copy in that same Pebble directory, caught up from the
//	          newest checkpoint and the changelog, then tailing it; promoted
//	          by stopping the tail and starting the core on the same
//	          directory (the replay left is what arrived meanwhile)
//
// and serves the member's HTTP (--http-addr): a read for tenant t goes to
// the local core of t's slot, or is forwarded to its owner's member
// (--advertise-url), waiting up to --forward-wait while the slot moves.
//
// Handoff: a new owner starts its core only once the previous owner has
// released the slot (its record no longer says owner) or is gone, or the
// handoff bound ran out; the claim fences whatever is left of the previous
// writer either way. SIGTERM marks the member leaving: the leader moves its
// slots warm-first to the others, then the member stops its cores and
// deletes its record. A store's fatal error (its append was fenced: this
// member was a zombie) ends the process, as in the static layout (exit 3):
// its slots are someone else's already, and a restart rejoins clean.

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

	nc     *nats.Conn
	js     jetstream.JetStream
	reg    *member.Registry
	auth   *api.Auth
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
	assign   []member.Assignment
	members  []member.Member
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

	app      atomic.Pointer[App] // owner: its core, once ready
	applied  atomic.Uint64       // standby: applied sequence
	ready    atomic.Bool         // standby: tailing
	stopping atomic.Bool
	served   atomic.Bool // owner: it became ready once
	started  time.Time
	// phase: what the owner's start does, or retries and why
	// (Options.OnStartPhase), until its core is ready.
	phase atomic.Pointer[string]
	// slowLogged: when the loop last said this start is slow (loop only).
	slowLogged time.Time

	// standby: its copy, read while it tails (standbyRead). viewMu is held
	// for reading by each read, and for writing while the tail lets go of
	// the copy, so no read outlives the Pebble it reads.
	viewMu   sync.RWMutex
	copyDB   *pebble.DB // under viewMu: set while the tail holds the copy
	viewOpen sync.Mutex // one opening of the view at a time
	view     atomic.Pointer[standbyView]
	tailLog  atomic.Pointer[partition.Changelog] // the changelog it tails
}

// standbyView is a standby's copy opened for reads (storage.OpenCopy),
// refreshed up to the sequence it last saw applied when a read comes.
type standbyView struct {
	store     *storage.Store
	h         http.Handler
	mu        sync.Mutex    // one refresh at a time
	refreshed atomic.Uint64 // the applied sequence of the last refresh
	lastAt    atomic.Int64  // when (unix ns)
}

// refresh refreshes the view when it reflects less than need (a read's
// must-see), or when the copy moved and the last refresh is older than
// standbyRefreshEvery. applied reads the copy's applied sequence.
func (v *standbyView) refresh(applied func() uint64, need uint64) error {
	stale := func() bool {
		got := v.refreshed.Load()
		return got < need || (got != applied() && time.Since(time.Unix(0, v.lastAt.Load())) >= standbyRefreshEvery)
	}
	if !stale() {
		return nil
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if !stale() { // another read refreshed it meanwhile
		return nil
	}
	a := applied() // read before: the refresh reflects at least a
	if err := v.store.Refresh(); err != nil {
		return err
	}
	v.refreshed.Store(a)
	v.lastAt.Store(time.Now().UnixNano())
	return nil
}

// standbyRefreshEvery bounds how often reads refresh a standby's view
// when they need nothing newer than it holds: a refresh reads every
// tenant's registry entry and journal heads, and a view refreshed a moment
// ago is still safe to read (what committed since lies above its committed
// tx; a journal removed since still fences, so a read answers below it).
const standbyRefreshEvery = 100 * time.Millisecond

// poke wakes the member's loop.
func (m *memberRun) poke() {
	select {
	case m.wake <- struct{}{}:
	default:
	}
}

// lostClaim: a core that never served ended because its claim was fenced
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
		slots:       map[int]*slotRun{}, seen: map[int]seenEpoch{}, restartAt: map[int]time.Time{}, dropping: map[int]bool{}, ended: map[int]string{},
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
		Partitions: m.samples, Members: func() int { m.mu.Lock(); defer m.mu.Unlock(); return len(m.members) },
		Moves: m.moves.Load, Fenced: m.fenced.Load,
	}, deniedReasons)
	// One access control for the member and its slots: the tokens file is
	// read and watched once, and every refusal is counted once, here.
	auth, err := api.NewAuth(api.AuthConfig{Mode: m.cfg.AuthMode(), TokensFile: m.cfg.AuthTokensFile, Logger: m.log, Denied: m.proms.Denied})
	if err != nil {
		return fmt.Errorf("%w: %v", ErrUsage, err)
	}
	m.auth = auth
	logStartChoices(m.log, m.cfg, auth.Mode())
	// One tracer for the member's slots (coreConfig leaves their
	// --otlp-endpoint empty): one exporter per process, not per slot.
	tp, stopTracing, err := tracerFor(m.opts, m.cfg, m.log)
	if err != nil {
		return err
	}
	defer stopTracing()
	m.opts.TracerProvider = tp
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
		m.reg, err = member.Open(octx, js, member.Config{Slots: m.n, Replicas: m.cfg.changelogReplicas(), TTL: m.cfg.Member.TTL})
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
	var handoff <-chan time.Time
	stopping := ctx.Done()
	for {
		if err := m.step(work); err != nil {
			m.log.Warn("member: a round failed; the next one retries", "err", err)
		}
		if m.leaving.Load() && m.ownsNothing() {
			m.log.Info("member: every slot handed off; leaving")
			return m.leave(work)
		}
		select {
		case err := <-m.fatal:
			return err
		case <-stopping:
			// --shutdown-grace bounds the whole exit: half for the handoff,
			// half for the drain of what is left (each core's grace).
			m.log.Info("member: SIGTERM: handing every slot off before exiting", "bound", m.cfg.ShutdownGrace/2)
			m.leaving.Store(true)
			stopping = nil
			handoff = time.After(m.cfg.ShutdownGrace / 2)
		case <-handoff:
			m.log.Warn("member: the handoff outlasted --shutdown-grace; stopping the slots still owned (the others' claims fence them)")
			return m.leave(work)
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
// slot's core would otherwise create at the same moment: the checkpoint
// bucket and the request, result and dead-letter streams. A JetStream
// cluster answers concurrent creates of one stream late or never
// (nats-server#3677): 16 cores creating them at once on a fresh cluster
// waited out 5 and 10 s attempt deadlines (a first start took 12-17 s),
// while concurrent updates of a stream that exists are answered at once.
// Short attempts, for members starting at once: the stream exists, and
// the retry binds it.
func (m *memberRun) provisionShared(ctx context.Context) error {
	c := m.coreConfig(0)
	t0 := time.Now()
	defer m.phase.Store(nil)
	for delay := 200 * time.Millisecond; ; delay = min(2*delay, 5*time.Second) {
		octx, cancel := context.WithTimeout(ctx, 4*time.Second)
		_, err := partition.OpenCheckpoints(octx, m.js, c.checkpointConfig())
		if err == nil {
			slotProvisionMu.Lock() // see provision
			err = queue.ProvisionStreams(octx, m.js, c.queueConfig())
			slotProvisionMu.Unlock()
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

// leave stops every slot and deletes the member's record.
func (m *memberRun) leave(ctx context.Context) error {
	m.stopAll()
	lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
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
	if err := m.reg.Renew(sctx, m.record()); err != nil {
		m.regFailed = time.Now()
		return err
	}
	m.renewedAt.Store(sent.UnixNano())
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
		for _, j := range o.app.journals() {
			if len(rec.Journals) == member.MaxJournalsInRecord {
				break
			}
			rec.Journals = append(rec.Journals, member.JournalRef{Slot: o.i, Tenant: j.Tenant, NodeID: j.NodeID, RequestID: j.RequestID,
				State: j.State, EdgesDone: j.EdgesDone, EdgesTotal: j.EdgesTotal, AgeSeconds: j.AgeSeconds})
		}
	}
	var finished []member.FinishedRef
	for _, o := range m.localOwners() {
		for _, f := range o.app.recentlyFinished() {
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
				st.Applied, st.Ready = a.changelogLast(), !r.stopping.Load()
			}
		case roleStandby:
			st.Applied, st.Ready = r.applied.Load(), r.ready.Load()
		}
		rec.Slots[s] = st
	}
	return rec
}

// changelogLast is the last changelog sequence this core appended or
// replayed.
func (a *App) changelogLast() uint64 {
	if a.changelog == nil {
		return 0
	}
	return a.changelog.cl.Last()
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
				// A standby: promote it. Its tail stops first (it holds the
				// slot's Pebble); the core starts in the round its exit
				// wakes. Never waited for here, under mu: a tail stuck in a
				// NATS call would stop every slot of this member.
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
			if _, err := os.Stat(m.slotDir(s)); err == nil {
				// A copy no role reaches (this member restarted on its old
				// disk and was given nothing of the slot): no erase would
				// ever reach it (issue 29, audit item 1).
				m.dropping[s] = true
				go m.dropRoleless(s)
			}
		}
	}
}

// dropRoleless removes slot s's local copy, which no role of this member
// holds, once it has checked that the slot's changelog holds its data (the
// copy follows the stream NATS holds now); a copy of another log (the
// stream was deleted or lost) may be the only copy of its data, and is set
// aside for an operator instead. Run outside mu: it opens the copy and
// asks NATS.
func (m *memberRun) dropRoleless(s int) {
	defer m.poke()
	defer func() {
		m.mu.Lock()
		delete(m.dropping, s)
		m.mu.Unlock()
	}()
	dir := filepath.Join(m.slotDir(s), "pebble")
	lid, attached, empty, err := inspectCopy(dir)
	if err != nil {
		m.log.Warn("member: inspecting a copy no role holds; kept for now", "slot", s, "err", err)
		return
	}
	if attached && !empty {
		c := &changelog{js: m.js}
		cfg := m.coreConfig(s)
		c.status.Stream = cfg.changelogConfig().StreamName()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		id, _, _, err := c.logIdentity(ctx)
		cancel()
		if err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
			m.log.Warn("member: a copy no role holds; its changelog did not answer, kept for now", "slot", s, "err", err)
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
	empty, err = isEmpty(pe.DB)
	if err == nil {
		logID, attached, err = partition.LogID(pe.DB)
	}
	if cerr := pe.DB.Close(); err == nil {
		err = cerr
	}
	return logID, attached, empty, err
}

// stopRun stops r: a standby at once; an owner's core drains (up to
// --shutdown-grace), in the background when async.
func (m *memberRun) stopRun(r *slotRun, async bool) {
	r.halt()
	if async {
		m.log.Info("member: handing a slot off: draining its core", "slot", r.slot)
		return
	}
	<-r.done
}

// dropCopy deletes the local copy of a slot this member no longer holds:
// no copy of a tenant's data lingers where nothing tails the changelog
// (an erase reaches only the copies that follow it).
func (m *memberRun) dropCopy(s int) {
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
}

func (m *memberRun) slotDir(s int) string {
	return filepath.Join(m.cfg.DataDir, "slots", strconv.Itoa(s))
}

// coreConfig is the configuration of slot s's core: the static replica
// s/N, served by the member's HTTP (no port), with its share of the
// caches.
func (m *memberRun) coreConfig(s int) Config {
	c := m.cfg
	c.Member = MemberConfig{}
	c.Owner = queue.Owner{Index: s, Count: m.n}
	c.PartitionOwner = c.Owner.String()
	c.DataDir = m.slotDir(s)
	c.HTTPAddr, c.APIAddr = "", ""
	c.slotCore = true
	c.OTLPEndpoint = ""
	c.ShutdownGrace = max(m.cfg.ShutdownGrace/2, time.Second) // see run: the handoff has the other half
	c.CacheMB = max(8, m.cfg.CacheMB/m.n)
	c.MemTableMB = max(4, m.cfg.MemTableMB/m.n)
	return c
}

// startOwner starts slot s's core.
func (m *memberRun) startOwner(s int, epoch uint64) *slotRun {
	ctx, cancel := context.WithCancel(context.Background())
	r := &slotRun{slot: s, role: roleOwner, epoch: epoch, stop: cancel, done: make(chan struct{}), started: time.Now()}
	o := m.opts
	o.SlotView = m.slotRows
	o.StandbyApplied = func() []uint64 { return m.standbyApplied(s) }
	o.OnStartPhase = func(p string) { r.phase.Store(&p) }
	o.Conn = m.nc // one NATS connection per member, not one per slot
	o.auth = m.auth
	o.Host = m.host()
	o.OnReady = func(a *App) {
		r.served.Store(true)
		r.app.Store(a)
		st := a.ChangelogStatus()
		if st.ClaimSeq > 1 && !st.Seeded {
			m.fenced.Add(1)
		}
		m.log.Info("member: serving a slot", "slot", s, "epoch", epoch, "start_took", st.StartTook, "restored", st.Restored, "replayed", st.Replayed)
		if m.opts.OnReady != nil {
			m.opts.OnReady(a)
		}
	}
	if err := os.MkdirAll(m.slotDir(s), 0o755); err != nil {
		m.log.Warn("member: slot directory", "slot", s, "err", err)
	}
	m.log.Info("member: taking a slot", "slot", s, "epoch", epoch)
	go func() {
		defer m.poke()
		defer close(r.done)
		r.err = runReplica(ctx, m.coreConfig(s), m.log.With("slot", s), o)
		r.app.Store(nil)
		if lostClaim(r.err, r.served.Load()) {
			// Another writer appended between our catch-up and our claim:
			// the previous owner, still running. Its next append is
			// refused; this slot run starts again (reconcile), the member
			// does not exit for it.
			return
		}
		switch {
		case r.err != nil && errors.Is(r.err, ErrUsage):
			// A configuration every slot shares: the member cannot go on.
			select {
			case m.fatal <- fmt.Errorf("slot %d: %w", s, r.err):
			default:
			}
		case r.err != nil && errors.Is(r.err, storage.ErrFatal):
			// One slot fails alone (issue 30 item 2): fenced (another
			// member owns it now: this one was paused or cut off past its
			// TTL) or its store broke. Its run has closed and released it;
			// the member and its other slots go on, and the next round
			// starts it again if the slot is still this member's.
			m.log.Error("member: a slot stopped on a fatal error; the member and its other slots go on", "slot", s, "err", r.err)
		}
	}()
	return r
}

// startStandby starts a warm copy of slot s.
func (m *memberRun) startStandby(s int) *slotRun {
	ctx, cancel := context.WithCancel(context.Background())
	r := &slotRun{slot: s, role: roleStandby, stop: cancel, done: make(chan struct{}), started: time.Now()}
	log := m.log.With("slot", s, "role", roleStandby)
	go func() {
		defer m.poke()
		defer close(r.done)
		for delay := time.Second; ; delay = min(2*delay, 15*time.Second) {
			err := m.tail(ctx, s, r, log)
			r.ready.Store(false)
			if ctx.Err() != nil {
				return
			}
			log.Warn("member: the standby's tail stopped; catching up again", "err", err, "in", delay)
			if errors.Is(err, errStandbySeed) {
				// Data no log holds (the stream was deleted, or NATS lost
				// it): possibly the only copy. Moved aside, never deleted.
				m.setAside(s)
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(delay):
			}
		}
	}()
	return r
}

// tail catches slot s's copy up (a checkpoint when it is empty or stale,
// then the changelog) and follows the changelog until ctx ends.
func (m *memberRun) tail(ctx context.Context, s int, r *slotRun, log *slog.Logger) error {
	c := m.coreConfig(s)
	cl, err := openChangelog(ctx, m.nc, c, log, nil, func(string) {})
	if err != nil || cl == nil {
		return errors.Join(err, ctx.Err())
	}
	t0 := time.Now()
	sizes := storage.Sizes{CacheBytes: int64(c.CacheMB) << 20, MemTableBytes: uint64(c.MemTableMB) << 20}
	// The core's own directory: promoting the standby opens this Pebble.
	db, err := cl.catchUp(ctx, filepath.Join(m.slotDir(s), "pebble"), sizes, true)
	if err != nil {
		return err
	}
	defer db.Close()
	applied, err := partition.AppliedSeq(db)
	if err != nil {
		return err
	}
	r.applied.Store(applied)
	r.tailLog.Store(cl.cl)
	r.viewMu.Lock()
	r.copyDB = db
	r.viewMu.Unlock()
	defer r.dropView() // before db.Close (deferred first): waits out the reads
	r.ready.Store(true)
	log.Info("member: standby caught up; tailing the changelog", "applied", applied, "restored", cl.status.Restored, "replayed", cl.status.Replayed, "took", time.Since(t0))
	return cl.cl.Tail(ctx, applied+1, func(seq uint64, ws []byte) error {
		if m.opts.beforeStandbyApply != nil {
			m.opts.beforeStandbyApply(s, seq)
		}
		if err := applyStandby(ctx, db, seq, ws); err != nil {
			return err
		}
		r.applied.Store(seq)
		return nil
	})
}

// dropView lets go of the standby's copy: it waits for the reads in
// progress, and no read starts on it after.
func (r *slotRun) dropView() {
	r.viewMu.Lock()
	defer r.viewMu.Unlock()
	r.copyDB = nil
	if v := r.view.Swap(nil); v != nil {
		_ = v.store.Close() // the copy stays open: the tail closes it
	}
}

// acquireView returns the standby's read view, refreshed up to what its
// copy has applied, and the release to call once the read is answered;
// nil when the standby is not tailing (catching up, stopping) or its copy
// holds nothing yet.
func (m *memberRun) acquireView(r *slotRun, need uint64) (_ *standbyView, release func()) {
	r.viewMu.RLock()
	defer func() {
		if release == nil { // not handed to the caller (also on a panic)
			r.viewMu.RUnlock()
		}
	}()
	if r.copyDB == nil || !r.ready.Load() || r.stopping.Load() {
		return nil, nil
	}
	v, err := m.openView(r)
	if v == nil {
		return nil, nil
	}
	if err = v.refresh(r.applied.Load, need); err != nil {
		m.log.Warn("member: a standby's copy could not be refreshed for reads", "slot", r.slot, "err", err)
		return nil, nil
	}
	return v, r.viewMu.RUnlock
}

// openView returns r's read view, opening it on first use (under
// viewMu held for reading); nil when the copy holds nothing yet or cannot
// be opened.
func (m *memberRun) openView(r *slotRun) (*standbyView, error) {
	if v := r.view.Load(); v != nil {
		return v, nil
	}
	r.viewOpen.Lock()
	defer r.viewOpen.Unlock()
	if v := r.view.Load(); v != nil {
		return v, nil
	}
	st, err := storage.OpenCopy(r.copyDB, storage.Options{Logger: m.log})
	if err != nil {
		if !errors.Is(err, storage.ErrEmptyCopy) {
			m.log.Warn("member: a standby's copy could not be opened for reads", "slot", r.slot, "err", err)
		}
		return nil, err
	}
	v := &standbyView{store: st, h: api.Handler(st, api.Options{ReadAPI: true, Copy: true, Auth: m.auth, Logger: m.log.With("slot", r.slot, "role", roleStandby)})}
	r.view.Store(v)
	return v, nil
}

// logEnd is a slot's changelog end as last read from its stream.
type logEnd struct {
	mu       sync.Mutex
	at       time.Time // when the request that read seq was sent
	seq      uint64
	inflight chan struct{} // closed when the request in flight returns
	// failed: when the last request that failed was sent, and why (its
	// waiters get the error rather than each sending one in turn).
	failed    time.Time
	failedErr error
}

// logEndSince returns slot s's changelog end as read by a request sent at
// or after since: a read waiting for a request sent before it arrived
// waits for the next one. Reads share the requests: one in flight per
// slot.
func (m *memberRun) logEndSince(ctx context.Context, s int, cl *partition.Changelog, since time.Time) (uint64, error) {
	m.mu.Lock()
	e := m.logEnds[s]
	if e == nil {
		e = &logEnd{}
		m.logEnds[s] = e
	}
	m.mu.Unlock()
	for {
		e.mu.Lock()
		if !e.at.IsZero() && !e.at.Before(since) {
			seq := e.seq
			e.mu.Unlock()
			return seq, nil
		}
		if !e.failed.IsZero() && !e.failed.Before(since) {
			err := e.failedErr
			e.mu.Unlock()
			return 0, err
		}
		if ch := e.inflight; ch != nil {
			e.mu.Unlock()
			select {
			case <-ch:
				continue
			case <-ctx.Done():
				return 0, ctx.Err()
			}
		}
		ch := make(chan struct{})
		e.inflight = ch
		e.mu.Unlock()
		sent := time.Now()
		rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		seq, err := cl.End(rctx)
		cancel()
		e.mu.Lock()
		if err == nil && sent.After(e.at) {
			e.at, e.seq = sent, seq
		}
		if err != nil && sent.After(e.failed) {
			e.failed, e.failedErr = sent, err
		}
		e.inflight = nil
		close(ch)
		e.mu.Unlock()
		if err != nil {
			return 0, err
		}
	}
}

// localStandby returns this member's standby run of slot s, or nil.
func (m *memberRun) localStandby(s int) *slotRun {
	m.mu.Lock()
	defer m.mu.Unlock()
	if r := m.slots[s]; r != nil && r.role == roleStandby && !r.stopping.Load() {
		return r
	}
	return nil
}

// standbyURLs returns the advertised URLs of the other members whose
// standby of slot s tails the changelog (as of their last renewal).
func (m *memberRun) standbyURLs(s int) []string {
	var out []string
	for _, mm := range m.tailingStandbys(s) {
		if mm.ID != m.id && mm.URL != "" {
			out = append(out, mm.URL)
		}
	}
	return out
}

// tailingStandbys returns the members whose standby of slot s tails the
// changelog, as of their last renewal.
func (m *memberRun) tailingStandbys(s int) []member.Member {
	m.mu.Lock()
	defer m.mu.Unlock()
	if s >= len(m.assign) {
		return nil
	}
	var out []member.Member
	for _, mm := range m.members {
		if slices.Contains(m.assign[s].Standbys, mm.ID) {
			if st, ok := mm.Slots[s]; ok && st.Role == roleStandby && st.Ready {
				out = append(out, mm)
			}
		}
	}
	return out
}

// standbyRead answers a read of an entity (a node or an edge, its edges,
// its history) from this member's standby copy of slot s, at the position
// the copy has applied: the answer's as_of_tx says where. The copy holds
// only write-sets the changelog acknowledged (the owner's commits, and at
// most the group it is committing, which its successor replays).
// Receipts and erasures are left to the owner.
// It reports whether it answered.
func (m *memberRun) standbyRead(w http.ResponseWriter, r *http.Request, s int, arrived time.Time) bool {
	if !standbyAnswers(r) {
		return false
	}
	run := m.localStandby(s)
	if run == nil {
		return false
	}
	// Read-your-writes, and no erased byte: a write answered before this
	// read arrived (an erase's rewrite too) is in the changelog, so the
	// copy answers once it has read the log as far as it reached after
	// the read arrived (one stream request per slot for every read
	// waiting, however many). Not waited for here: the caller tries the
	// owner, then the copy again, until its deadline.
	cl := run.tailLog.Load()
	if cl == nil {
		return false
	}
	end, err := m.logEndSince(r.Context(), s, cl, arrived)
	if err != nil || cl.ReadThrough() < end {
		return false
	}
	v, release := m.acquireView(run, run.applied.Load())
	if v == nil {
		return false
	}
	// A copy's committed tx moves only when a read refreshes it: a read
	// that waits would wait for nothing (and hold the copy from its tail).
	q := r.URL.Query()
	if q.Has("wait") {
		q.Del("wait")
		r = r.Clone(r.Context())
		r.URL.RawQuery = q.Encode()
	}
	// Answered into memory (a page is bounded: MaxLimit), and the copy let
	// go before a slow client reads it: the tail must never wait for one
	// to stop or to be promoted.
	buf := &bufferedResponse{h: http.Header{}}
	func() {
		defer release() // even if the handler panics: the tail waits for it
		v.h.ServeHTTP(buf, r)
	}()
	if !m.standbyAnswered(cmp.Or(buf.status, http.StatusOK)) {
		return false // a copy's 503 (a cascade in flight, a cursor ahead) or 500: the owner may still answer
	}
	buf.h.Set(hdrReadFrom, "standby")
	m.proms.StandbyRead(s)
	buf.writeTo(w)
	return true
}

// bufferedResponse is a ResponseWriter that keeps the answer in memory.
type bufferedResponse struct {
	h      http.Header
	status int
	body   bytes.Buffer
}

func (b *bufferedResponse) Header() http.Header { return b.h }

func (b *bufferedResponse) WriteHeader(code int) {
	if b.status == 0 {
		b.status = code
	}
}

func (b *bufferedResponse) Write(p []byte) (int, error) {
	b.WriteHeader(http.StatusOK)
	return b.body.Write(p)
}

// reset forgets what was written.
func (b *bufferedResponse) reset() {
	b.h, b.status = http.Header{}, 0
	b.body.Reset()
}

// writeTo writes the answer kept to w.
func (b *bufferedResponse) writeTo(w http.ResponseWriter) {
	for k, vs := range b.h {
		w.Header()[k] = vs
	}
	w.WriteHeader(cmp.Or(b.status, http.StatusOK))
	_, _ = w.Write(b.body.Bytes())
}

// standbyAnswers: the reads a standby's copy answers (an entity, its
// edges, its history), not a request's receipt or an erasure (those the
// owner answers, from registries a copy does not keep).
func standbyAnswers(r *http.Request) bool {
	rest := strings.TrimPrefix(r.URL.Path, "/v1/tenants/"+r.PathValue("t")+"/")
	return strings.HasPrefix(rest, "nodes/") || strings.HasPrefix(rest, "edges/")
}

// handler is the member's HTTP.
func (m *memberRun) handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok\n") })
	mux.HandleFunc("GET /readyz", m.readyz)
	mux.HandleFunc("GET /metrics", m.metricsHandler)
	mux.HandleFunc("GET /v1/partitions", m.admitted(m.partitions))
	mux.HandleFunc("GET /v1/journals", m.admitted(m.journals))
	mux.HandleFunc("GET /v1/tenants/{t}/", m.admitted(m.tenantRead))
	mux.HandleFunc("/", m.firstCore)
	return mux
}

// admitted checks the caller as the cores would (the cores check again;
// in loopback mode only this check can see the real client).
func (m *memberRun) admitted(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if _, ok, status, msg := m.auth.Principal(r); !ok {
			writeJSONError(w, status, msg)
			return
		}
		h(w, r)
	}
}

func writeJSONError(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]string{"error": msg})
}

func (m *memberRun) readyz(w http.ResponseWriter, _ *http.Request) {
	var why []string
	m.mu.Lock()
	if len(m.assign) == 0 {
		why = append(why, "member: no assignment read yet")
		if p := m.phase.Load(); p != nil {
			why = append(why, *p)
		}
	}
	for _, a := range m.assign {
		if a.Owner == "" {
			why = append(why, fmt.Sprintf("slot %d: no owner yet", a.Slot))
		}
		if a.Owner == m.id {
			if r := m.slots[a.Slot]; r == nil || r.role != roleOwner || r.app.Load() == nil {
				why = append(why, m.startingReason(a.Slot, r))
			}
		}
	}
	m.mu.Unlock()
	if m.leaving.Load() {
		why = append(why, "member: leaving (SIGTERM)")
	}
	if lost := m.leaseLost(); lost != "" {
		why = append(why, lost)
	}
	if len(why) > 0 {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusServiceUnavailable)
		_ = json.NewEncoder(w).Encode(map[string]any{"ready": false, "reasons": why})
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{"ready": true})
}

// startingReason says why slot s, owned here, does not serve yet (m.mu
// held; r is its run, if any).
func (m *memberRun) startingReason(s int, r *slotRun) string {
	switch {
	case r == nil:
		if why, ok := m.ended[s]; ok {
			if at := m.restartAt[s]; time.Now().Before(at) {
				return fmt.Sprintf("slot %d: starting again in %s: %s", s, time.Until(at).Round(100*time.Millisecond), why)
			}
		}
		return fmt.Sprintf("slot %d: starting", s)
	case r.role == roleStandby && r.stopping.Load():
		return fmt.Sprintf("slot %d: starting: its standby stops to be promoted", s)
	case r.role == roleStandby:
		return fmt.Sprintf("slot %d: starting: waiting for the previous owner to release it (a standby warms meanwhile)", s)
	case r.stopping.Load():
		return fmt.Sprintf("slot %d: stopping", s)
	}
	return fmt.Sprintf("slot %d: starting for %s: %s", s, time.Since(r.started).Round(100*time.Millisecond), r.startPhase())
}

// metricsHandler merges the member's families with every local core's,
// each labelled with its slot.
func (m *memberRun) metricsHandler(w http.ResponseWriter, r *http.Request) {
	gs := prometheus.Gatherers{m.proms.Registry}
	m.mu.Lock()
	for s, run := range m.slots {
		if a := run.app.Load(); a != nil {
			gs = append(gs, metrics.SlotGatherer(s, a.Metrics().Registry))
		}
	}
	m.mu.Unlock()
	promhttp.HandlerFor(gs, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError}).ServeHTTP(w, r)
}

// samples feeds telha_partition_*.
func (m *memberRun) samples() []metrics.PartitionSample {
	var owners []ownerAt
	m.mu.Lock()
	out := make([]metrics.PartitionSample, 0, m.n)
	for s := 0; s < m.n; s++ {
		p := metrics.PartitionSample{Slot: s, CheckpointAge: -1}
		if s < len(m.assign) {
			p.Epoch = m.assign[s].Epoch
		}
		if r := m.slots[s]; r != nil {
			p.Role = r.role
			switch r.role {
			case roleOwner:
				if a := r.app.Load(); a != nil {
					p.Applied = a.changelogLast()
					owners = append(owners, ownerAt{len(out), a})
				}
			case roleStandby:
				p.Applied = r.applied.Load()
				if o := m.ownerApplied(s); o > p.Applied {
					p.Lag = o - p.Applied
				}
			}
		}
		out = append(out, p)
	}
	m.mu.Unlock()
	// A core's status takes its changelog's lock, held through a
	// checkpoint's upload: never while holding m.mu.
	for _, o := range owners {
		st := o.app.ChangelogStatus()
		out[o.i].StartSeconds = st.StartTook.Seconds()
		if !st.LastAt.IsZero() {
			out[o.i].CheckpointAge = time.Since(st.LastAt).Seconds()
		}
	}
	return out
}

// ownerAt is a core whose status is read after m.mu is released, and the
// index of the row it fills (or its slot: localOwners).
type ownerAt struct {
	i   int
	app *App
}

// localOwners are the serving cores of the slots this member owns, by
// slot, lowest first.
func (m *memberRun) localOwners() []ownerAt {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []ownerAt
	for s := 0; s < m.n; s++ {
		if r := m.slots[s]; r != nil && r.role == roleOwner && !r.stopping.Load() {
			if a := r.app.Load(); a != nil {
				out = append(out, ownerAt{s, a})
			}
		}
	}
	return out
}

// host is what the status page of this member's slots shows of the
// member (Options.Host).
func (m *memberRun) host() *Host {
	return &Host{
		Started: m.started,
		RequestCounts: func() (map[string]float64, error) {
			sum := map[string]float64{}
			for _, o := range m.localOwners() {
				c, err := o.app.requestCounts()
				if err != nil {
					return nil, err
				}
				for st, n := range c {
					sum[st] += n
				}
			}
			return sum, nil
		},
		StoreBytes: func() uint64 { return dirSize(filepath.Join(m.cfg.DataDir, "slots")) },
		Group:      m.group,
	}
}

// dirSize is the size of the files under dir (0 when unreadable).
func dirSize(dir string) uint64 {
	var n uint64
	_ = filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if fi, err := d.Info(); err == nil {
				n += uint64(fi.Size())
			}
		}
		return nil
	})
	return n
}

// group is the group as this member sees it, for the status page.
func (m *memberRun) group(page int) *ui.Group {
	// This member's slots first (live; not under m.mu: each slot's
	// registries have their own locks).
	now := time.Now()
	var journals []ui.GroupJournal
	var finished []ui.FinishedJournal
	for _, o := range m.localOwners() {
		if o.i != page { // the page's own slot has its live rows
			for _, j := range o.app.journals() {
				journals = append(journals, ui.GroupJournal{Slot: o.i, Member: m.id, Tenant: j.Tenant, NodeID: j.NodeID, RequestID: j.RequestID,
					State: j.State, EdgesDone: j.EdgesDone, EdgesTotal: j.EdgesTotal, AsOf: now})
			}
		}
		for _, f := range o.app.recentlyFinished() {
			f.Slot, f.Member = o.i, m.id
			finished = append(finished, f)
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	g := &ui.Group{Member: m.id, Owned: []int{}, Journals: journals,
		FiguresOf: "The figures above are this member's: the requests its slots answered, its uptime, its copies on disk; the queue, consumer and reaper cards are those of the lowest slot it owns, and each slot's own are in the slots table."}
	owns := map[string][]int{}
	for _, a := range m.assign {
		if a.Owner != "" {
			owns[a.Owner] = append(owns[a.Owner], a.Slot)
		}
		if a.Owner == m.id {
			g.Owned = append(g.Owned, a.Slot)
		}
	}
	for _, mm := range m.members {
		g.Members = append(g.Members, ui.MemberRow{ID: mm.ID, URL: mm.URL, Here: mm.ID == m.id, Leaving: mm.Leaving,
			Owns: fmt.Sprint(owns[mm.ID]), Started: mm.Started, Renewed: mm.Renewed})
		if mm.ID == m.id {
			continue
		}
		for _, j := range mm.Journals {
			g.Journals = append(g.Journals, ui.GroupJournal{Slot: j.Slot, Member: mm.ID, Tenant: j.Tenant, NodeID: j.NodeID, RequestID: j.RequestID,
				State: j.State, EdgesDone: j.EdgesDone, EdgesTotal: j.EdgesTotal, AsOf: mm.Renewed})
		}
		for _, f := range mm.Finished {
			finished = append(finished, ui.FinishedJournal{Slot: f.Slot, Member: mm.ID, Tenant: f.Tenant, NodeID: f.NodeID, RequestID: f.RequestID,
				Outcome: f.Outcome, EdgesTombstoned: f.EdgesTombstoned, Attempts: f.Attempts, Finished: f.Finished,
				Took: time.Duration(f.TookSeconds * float64(time.Second))})
		}
	}
	// A slot that moved may be listed by its old owner's record and by
	// its new owner: one row a journal.
	slices.SortStableFunc(finished, func(a, b ui.FinishedJournal) int { return b.Finished.Compare(a.Finished) })
	seen := map[string]bool{}
	for _, f := range finished {
		key := fmt.Sprint(f.Tenant, "/", f.NodeID, "/", f.RequestID, "/", f.Finished.UnixNano())
		if !seen[key] {
			seen[key] = true
			g.Finished = append(g.Finished, f)
		}
	}
	for i := len(m.events) - 1; i >= 0; i-- {
		e := m.events[i]
		g.Events = append(g.Events, ui.EventRow{At: e.At, Kind: e.Kind, What: e.What})
	}
	return g
}

// ownerApplied is the applied sequence slot s's owner last reported
// (m.mu held).
func (m *memberRun) ownerApplied(s int) uint64 {
	if s >= len(m.assign) {
		return 0
	}
	for _, mm := range m.members {
		if mm.ID == m.assign[s].Owner {
			return mm.Slots[s].Applied
		}
	}
	return 0
}

// SlotView is one slot in the dynamic /v1/partitions.
type SlotView struct {
	Slot       int               `json:"slot"`
	Partitions []int             `json:"partitions"`
	Owner      string            `json:"owner"`
	Epoch      uint64            `json:"epoch"`
	Standbys   []string          `json:"standbys"`
	Prev       string            `json:"prev,omitempty"`
	Changed    time.Time         `json:"changed"`
	Applied    uint64            `json:"owner_applied"`
	Ready      bool              `json:"owner_ready"`
	Standby    map[string]uint64 `json:"standby_applied"`
	Lag        map[string]uint64 `json:"standby_lag"`
	// Reads: the standbys tailing the changelog, which answer the slot's
	// entity reads at their applied position while no owner answers.
	Reads      []string        `json:"standby_reads"`
	Checkpoint *CheckpointView `json:"last_checkpoint,omitempty"`
}

// CheckpointView is a slot's last checkpoint, as its owner (this member)
// took it.
type CheckpointView struct {
	Name string    `json:"name"`
	Seq  uint64    `json:"seq"`
	At   time.Time `json:"at"`
}

func (m *memberRun) partitions(w http.ResponseWriter, _ *http.Request) {
	var owners []ownerAt
	m.mu.Lock()
	byID := map[string]member.Member{}
	var ms []map[string]any
	for _, mm := range m.members {
		byID[mm.ID] = mm
		ms = append(ms, map[string]any{"id": mm.ID, "url": mm.URL, "leaving": mm.Leaving, "renewed": mm.Renewed, "started": mm.Started})
	}
	events := append([]MemberEvent{}, m.events...)
	views := make([]SlotView, 0, len(m.assign))
	owned := []int{}
	for _, a := range m.assign {
		v := SlotView{Slot: a.Slot, Owner: a.Owner, Epoch: a.Epoch, Standbys: a.Standbys, Prev: a.Prev, Changed: a.Changed,
			Standby: map[string]uint64{}, Lag: map[string]uint64{}, Reads: []string{}}
		for p := a.Slot; p < m.cfg.Partitions; p += m.n {
			v.Partitions = append(v.Partitions, p)
			if a.Owner == m.id {
				owned = append(owned, p)
			}
		}
		st := byID[a.Owner].Slots[a.Slot]
		v.Applied, v.Ready = st.Applied, st.Ready && st.Role == roleOwner
		for _, sb := range a.Standbys {
			if ss, ok := byID[sb].Slots[a.Slot]; ok && ss.Role == roleStandby {
				v.Standby[sb] = ss.Applied
				if ss.Ready {
					v.Reads = append(v.Reads, sb)
				}
				if v.Applied > ss.Applied {
					v.Lag[sb] = v.Applied - ss.Applied
				} else {
					v.Lag[sb] = 0
				}
			}
		}
		if r := m.slots[a.Slot]; r != nil && r.role == roleOwner {
			if app := r.app.Load(); app != nil {
				owners = append(owners, ownerAt{len(views), app})
			}
		}
		views = append(views, v)
	}
	m.mu.Unlock()
	for _, o := range owners { // outside m.mu: see samples
		if cs := o.app.ChangelogStatus(); !cs.LastAt.IsZero() {
			views[o.i].Checkpoint = &CheckpointView{Name: cs.LastCheckpoint.Name, Seq: cs.LastCheckpoint.Seq, At: cs.LastAt.UTC()}
		}
	}
	slices.Sort(owned)
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{
		"mode": "dynamic", "member": m.id, "partitions": m.cfg.Partitions, "replicas": m.n, "slots": m.n,
		"owned": owned, "rule": fmt.Sprintf("slot = partition %% %d; each slot's owner, epoch and standbys are in the KV bucket %s", m.n, member.OwnersBucket(m.n)),
		"members": ms, "assignments": views, "events": events,
	})
}

// localOwner returns the ready core of slot s on this member, if any.
func (m *memberRun) localOwner(s int) *App {
	m.mu.Lock()
	defer m.mu.Unlock()
	if r := m.slots[s]; r != nil && r.role == roleOwner && !r.stopping.Load() {
		return r.app.Load()
	}
	return nil
}

// assignedHere: the assignment this member last read names it slot s's
// owner (its core may still be starting).
func (m *memberRun) assignedHere(s int) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return s < len(m.assign) && m.assign[s].Owner == m.id
}

// ownerURL is the advertised URL of slot s's owner ("" unknown, or this
// member). m.mu held.
func (m *memberRun) ownerURL(s int) string {
	if s >= len(m.assign) || m.assign[s].Owner == "" || m.assign[s].Owner == m.id {
		return ""
	}
	for _, mm := range m.members {
		if mm.ID == m.assign[s].Owner {
			return mm.URL
		}
	}
	return ""
}

// slotRoute is where a slot's reads are forwarded: its owner's URL, and a
// context cancelled when that changes.
type slotRoute struct {
	url    string
	ctx    context.Context
	cancel context.CancelFunc
}

// ownerRoute returns the advertised URL of slot s's owner ("" unknown, or
// this member) and a context cancelled when the slot's owner changes or
// its record expires: a read forwarded to an owner that froze (SIGSTOP, a
// cut link whose port still accepts) ends with its route, not with the
// client's patience, and is routed again.
func (m *memberRun) ownerRoute(s int) (string, context.Context) {
	m.mu.Lock()
	defer m.mu.Unlock()
	url := m.ownerURL(s)
	if url == "" {
		return "", nil
	}
	rt := m.routes[s]
	if rt == nil || rt.url != url {
		if rt != nil {
			rt.cancel()
		}
		ctx, cancel := context.WithCancel(context.Background())
		rt = &slotRoute{url: url, ctx: ctx, cancel: cancel}
		m.routes[s] = rt
	}
	return url, rt.ctx
}

// reroute ends the forwards of every slot whose owner's URL changed with
// the assignment or the members just read (m.mu held).
func (m *memberRun) reroute() {
	for s, rt := range m.routes {
		if m.ownerURL(s) != rt.url {
			rt.cancel()
			delete(m.routes, s)
		}
	}
}

// tenantRead answers a read of tenant t: at the local core of t's slot, or
// forwarded to its owner; while the slot has no serving owner (a move, a
// failover), it waits up to --forward-wait.
func (m *memberRun) tenantRead(w http.ResponseWriter, r *http.Request) {
	if lost := m.leaseLost(); lost != "" {
		// Not-owner too: a member that forwarded it routes again.
		w.Header().Set(hdrNotOwner, m.id)
		w.Header().Set("Retry-After", "1")
		writeJSONError(w, http.StatusServiceUnavailable, lost)
		return
	}
	s := queue.Partition(r.PathValue("t"), m.cfg.Partitions) % m.n
	forwarded := r.Header.Get(hdrForwarded) != ""
	arrived := time.Now()
	deadline := arrived.Add(m.cfg.Member.ForwardWait)
	// Between rounds: 50 ms, doubling to 400 ms, so the reads waiting for
	// a slot that takes seconds to start do not flood its member.
	pause := 50 * time.Millisecond
	for {
		if a := m.localOwner(s); a != nil {
			if a.serveHosted(w, r) {
				return
			}
		} else if forwarded {
			// A standby copy here answers (asked for it: the owner did not
			// answer the member that forwarded the read, or was slow; or
			// this member was just given the slot, and its copy tails on
			// until the previous owner lets go).
			if m.standbyRead(w, r, s, arrived) {
				return
			}
			// Forwarded here, but the slot is not (or no longer) this
			// member's, or its core is still starting: say so at once, so
			// the member that forwarded it asks a standby and routes
			// again, rather than waiting out --forward-wait here.
			w.Header().Set(hdrNotOwner, m.id)
			w.Header().Set("Retry-After", "1")
			why := fmt.Sprintf("slot %d is not owned by member %s", s, m.id)
			if m.assignedHere(s) {
				why = fmt.Sprintf("slot %d is starting on member %s", s, m.id)
			}
			writeJSONError(w, http.StatusServiceUnavailable, why)
			return
		} else if url, route := m.ownerRoute(s); url != "" {
			if m.forwardToOwner(w, r, s, url, route, arrived) {
				return
			}
		}
		// No serving owner answered (a failover, a move): a standby copy
		// answers at once, at its applied position.
		if m.localOwner(s) == nil && m.standbyAnswer(w, r, s, arrived) {
			return
		}
		if time.Now().After(deadline) {
			w.Header().Set("Retry-After", "1")
			writeJSONError(w, http.StatusServiceUnavailable, fmt.Sprintf("slot %d (of tenant %q) has no serving owner yet: it is moving or failing over; retry", s, r.PathValue("t")))
			return
		}
		select {
		case <-r.Context().Done():
			return
		case <-time.After(pause):
		}
		pause = min(2*pause, 400*time.Millisecond)
	}
}

// standbyAnswer answers a read from a standby copy of slot s: this
// member's, or another member's (forwarded, marked for its standby). It
// reports whether one answered.
func (m *memberRun) standbyAnswer(w http.ResponseWriter, r *http.Request, s int, arrived time.Time) bool {
	if m.standbyRead(w, r, s, arrived) {
		return true
	}
	if !standbyAnswers(r) {
		return false
	}
	for _, url := range m.standbyURLs(s) {
		// A copy answers at once (it waits at most for one log-end
		// request): a member that does not is frozen, and the next is
		// asked. Its answer is read whole within the bound, then written.
		ctx, cancel := context.WithTimeout(r.Context(), standbyForwardTimeout)
		sr := r.Clone(ctx)
		sr.Header.Set(hdrStandbyRead, "1")
		buf := &bufferedResponse{h: http.Header{}}
		ok := m.forwardIf(buf, sr, url, m.standbyAnswered)
		cancel()
		if ok {
			buf.writeTo(w)
			return true
		}
	}
	return false
}

// hedgeAfter: a read a standby may answer that its owner has not begun
// to answer this long after it was forwarded is asked of a standby too
// (forwardToOwner). An owner answers such a read without waiting, in
// milliseconds; one that does not is frozen or overloaded.
const hedgeAfter = 500 * time.Millisecond

// standbyForwardTimeout bounds a read forwarded to another member's
// standby.
const standbyForwardTimeout = 3 * time.Second

// forwardToOwner forwards r to slot s's owner at base. Until the owner's
// answer begins, the forward ends when route does (the slot's owner
// changed, or its record expired), and false says the caller routes
// again; once it has begun, it is relayed whole. A read a standby may
// answer (an entity read without wait: one with wait may wait at the
// owner for its tx) whose owner has not begun to answer within hedgeAfter
// is asked of a standby too, and the first answer is the read's.
func (m *memberRun) forwardToOwner(w http.ResponseWriter, r *http.Request, s int, base string, route context.Context, arrived time.Time) bool {
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	unroute := context.AfterFunc(route, cancel)
	defer unroute()
	fr := r.WithContext(ctx)
	send := func() (*http.Response, error) {
		resp, err := m.send(fr, base)
		if err == nil && !unroute() { // begun: a route change no longer cuts it
			resp.Body.Close()
			return nil, context.Canceled // the route changed as it began
		}
		return resp, err
	}
	if !standbyAnswers(r) || r.URL.Query().Has("wait") || (m.localStandby(s) == nil && len(m.standbyURLs(s)) == 0) {
		resp, err := send()
		return m.relay(w, resp, err, passAll)
	}
	type sent struct {
		resp *http.Response
		err  error
	}
	owner := make(chan sent, 1)
	go func() {
		resp, err := send()
		owner <- sent{resp, err}
	}()
	timer := time.NewTimer(hedgeAfter)
	defer timer.Stop()
	select {
	case res := <-owner:
		return m.relay(w, res.resp, res.err, passAll)
	case <-timer.C:
	}
	// The owner is slow: a standby is asked beside it, into memory.
	sctx, scancel := context.WithCancel(r.Context())
	defer scancel()
	buf := &bufferedResponse{h: http.Header{}}
	standby := make(chan bool, 1)
	go func() { standby <- m.standbyAnswer(buf, r.WithContext(sctx), s, arrived) }()
	for {
		select {
		case res := <-owner:
			if res.err == nil && standby != nil && notOwner(res.resp) {
				// Refused (it owns the slot no more, or is past its lease):
				// as good as no answer while the standby may still give one.
				_, _ = io.Copy(io.Discard, io.LimitReader(res.resp.Body, 1<<16))
				res.resp.Body.Close()
				res = sent{err: errNotOwner}
			}
			if res.err == nil || standby == nil {
				if standby != nil {
					scancel()
					<-standby // buf is the standby's until it returns
				}
				answered := m.relay(w, res.resp, res.err, passAll)
				m.proms.SlowOwner(map[bool]string{true: metrics.SlowOwnerOwner, false: metrics.SlowOwnerNone}[answered])
				return answered
			}
			owner = nil // the owner failed: the standby's answer decides
		case ok := <-standby:
			if ok {
				cancel()
				if owner != nil {
					go func() {
						if res := <-owner; res.resp != nil {
							res.resp.Body.Close()
						}
					}()
				}
				m.proms.SlowOwner(metrics.SlowOwnerStandby)
				buf.writeTo(w)
				return true
			}
			standby = nil
			if owner == nil {
				m.proms.SlowOwner(metrics.SlowOwnerNone)
				return false
			}
		}
	}
}

func passAll(int) bool { return true }

// hopByHop reports whether header h is one of a connection's own
// (RFC 9110 7.6.1), which a member does not pass on when it forwards.
func hopByHop(h string) bool {
	switch http.CanonicalHeaderKey(h) {
	case "Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization", "Proxy-Connection", "Te", "Trailer", "Transfer-Encoding", "Upgrade":
		return true
	}
	return false
}

// standbyAnswered: a status a standby's copy answers a read with (the
// read's answer, its bad request, and with tokens their refusal, which
// the owner would give too); any other (a loopback-mode refusal of a
// peer, a busy copy) is not passed on, and the read waits for the owner.
func (m *memberRun) standbyAnswered(status int) bool {
	switch status {
	case http.StatusOK, http.StatusNotFound, http.StatusBadRequest:
		return true
	case http.StatusUnauthorized, http.StatusForbidden:
		return m.auth.Mode() == api.AuthTokens
	}
	return false
}

// forwardIf sends r to the member at base and copies the answer when
// pass(status); false (nothing written) when that member could not be
// reached (gone), owns the slot no more, or pass refused the answer: the
// caller routes again.
func (m *memberRun) forwardIf(w http.ResponseWriter, r *http.Request, base string, pass func(status int) bool) bool {
	resp, err := m.send(r, base)
	return m.relay(w, resp, err, pass)
}

// send sends r to the member at base, marked forwarded by this member,
// without the connection's own headers.
func (m *memberRun) send(r *http.Request, base string) (*http.Response, error) {
	var body io.Reader
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		body = r.Body // the status page's POSTs (sign-in, dead letters, pause): sent once
	}
	req, err := http.NewRequestWithContext(r.Context(), r.Method, base+r.URL.RequestURI(), body)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errUnforwardable, err)
	}
	req.Header = r.Header.Clone()
	for h := range req.Header {
		if hopByHop(h) {
			req.Header.Del(h)
		}
	}
	req.ContentLength = r.ContentLength
	req.Header.Set(hdrForwarded, m.id)
	return m.client.Do(req)
}

// relay copies a forwarded read's answer to w when pass(status), and
// reports whether it did; false (nothing written) when the member could
// not be reached, owns the slot no more, or pass refused the answer.
func (m *memberRun) relay(w http.ResponseWriter, resp *http.Response, err error, pass func(status int) bool) bool {
	if errors.Is(err, errUnforwardable) {
		writeJSONError(w, http.StatusBadRequest, err.Error())
		return true
	}
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	if notOwner(resp) || !pass(resp.StatusCode) {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<16))
		return false // that member no longer owns the slot (or cannot answer): route again
	}
	for k, vs := range resp.Header {
		if hopByHop(k) {
			continue
		}
		for _, v := range vs {
			w.Header().Add(k, v)
		}
	}
	w.WriteHeader(resp.StatusCode)
	if _, err := io.Copy(w, resp.Body); err != nil {
		if b, ok := w.(*bufferedResponse); ok {
			b.reset() // a cut answer is no answer
			return false
		}
		// The status is out: the client must see a broken answer, not a
		// short one that looks whole.
		panic(http.ErrAbortHandler)
	}
	return true
}

// notOwner: the member answered that it does not own the slot (or is past
// its lease): the read is routed again.
func notOwner(resp *http.Response) bool {
	return resp.StatusCode == http.StatusServiceUnavailable && resp.Header.Get(hdrNotOwner) != ""
}

// errNotOwner stands for a notOwner answer already read.
var errNotOwner = errors.New("not the slot's owner")

// errUnforwardable: a read that cannot be made into a request to another
// member (400).
var errUnforwardable = errors.New("cannot forward the read")

// journals lists the journals of every slot this member owns and, unless
// forwarded, of every other member's (fetched from them), as a token may
// see them.
func (m *memberRun) journals(w http.ResponseWriter, r *http.Request) {
	if len(r.URL.Query()) > 0 {
		writeJSONError(w, http.StatusBadRequest, "unknown query parameters: /v1/journals takes none")
		return
	}
	p, _, _, _ := m.auth.Principal(r) // admitted: it is someone
	local := m.localOwners()
	m.mu.Lock()
	var peers []member.Member
	if r.Header.Get(hdrForwarded) == "" {
		for _, mm := range m.members {
			if mm.ID != m.id {
				peers = append(peers, mm)
			}
		}
	}
	m.mu.Unlock()
	all := []api.Journal{}
	for _, o := range local {
		for _, j := range o.app.journals() {
			if p.Sees(j.Tenant) {
				all = append(all, j)
			}
		}
	}
	// Every other member at once, each for at most peerJournalsTimeout: one
	// that is frozen or gone (until its record expires) is named, not a
	// reason to list nothing.
	type peerAnswer struct {
		js  []api.Journal
		err error
	}
	answers := make([]peerAnswer, len(peers))
	var wg sync.WaitGroup
	for i, mm := range peers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(r.Context(), peerJournalsTimeout)
			defer cancel()
			answers[i].js, answers[i].err = m.peerJournals(ctx, r, mm.URL)
		}()
	}
	wg.Wait()
	type unreachable struct {
		Member string `json:"member"`
		Error  string `json:"error"`
	}
	body := map[string]any{}
	var missing []unreachable
	for i, a := range answers {
		if a.err != nil {
			missing = append(missing, unreachable{Member: peers[i].ID, Error: a.err.Error()})
			continue
		}
		all = append(all, a.js...)
	}
	if len(missing) > 0 {
		body["unreachable"] = missing
	}
	body["journals"] = all
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(body)
}

// peerJournalsTimeout bounds the journals asked of another member.
const peerJournalsTimeout = 2 * time.Second

// peerJournals is /v1/journals of the member at base, asked with r's
// credentials.
func (m *memberRun) peerJournals(ctx context.Context, r *http.Request, base string) ([]api.Journal, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/v1/journals", nil)
	if err != nil {
		return nil, err
	}
	if v := r.Header.Get("Authorization"); v != "" {
		req.Header.Set("Authorization", v)
	}
	req.Header.Set(hdrForwarded, m.id)
	resp, err := m.client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s: %s", base, resp.Status)
	}
	var body struct {
		Journals []api.Journal `json:"journals"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 64<<20)).Decode(&body); err != nil {
		return nil, fmt.Errorf("%s: %w", base, err)
	}
	return body.Journals, nil
}

// firstCore sends what is not routed by tenant (the status page, its
// assets) to the lowest slot this member owns, in process: the slot sees
// the real client and checks it as a worker would (loopback mode, tokens,
// sessions); a non-loopback client without tokens is refused here already.
func (m *memberRun) firstCore(w http.ResponseWriter, r *http.Request) {
	if m.auth.Mode() == api.AuthLoopback && !loopbackRemote(r.RemoteAddr) {
		writeJSONError(w, http.StatusForbidden, "this worker answers loopback clients only (no --auth-tokens-file)")
		return
	}
	owners := m.localOwners()
	if len(owners) == 0 {
		w.Header().Set("Retry-After", "1")
		writeJSONError(w, http.StatusServiceUnavailable, "this member owns no slot right now; ask another member")
		return
	}
	if !owners[0].app.serveHosted(w, r) {
		w.Header().Set("Retry-After", "1")
		writeJSONError(w, http.StatusServiceUnavailable, "the slot is stopping; retry")
	}
}

// loopbackRemote reports whether a request's RemoteAddr is a loopback IP
// (loopbackHost, of --nats-listen, on its host part).
func loopbackRemote(remote string) bool {
	host, _, err := net.SplitHostPort(remote)
	return err == nil && loopbackHost(host)
}

// applyStandby applies one write-set to a standby's copy; an erase's
// marker (a typed log record, partition.FindScrubMarker) compacts the
// ranges it names, so the erased bytes leave the copy's files. ApplyTo
// records the marker as pending in the same batch, so a standby stopped
// before the compaction redoes it when it catches up again.
func applyStandby(ctx context.Context, db *pebble.DB, seq uint64, ws []byte) error {
	if err := partition.ApplyTo(db, seq, ws, false); err != nil {
		return err
	}
	// ApplyTo recorded a pending scrub if ws carried a marker: one seek
	// finds none otherwise (the write-set is not walked a third time).
	if _, err := partition.ScrubPending(ctx, db); err != nil {
		return fmt.Errorf("standby: %w", err)
	}
	return nil
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
	empty, err := isEmpty(pe.DB)
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
	cl, err := openChangelog(ctx, m.nc, m.coreConfig(idx), m.log, nil, func(string) {})
	if err != nil || cl == nil {
		return errors.Join(err, ctx.Err())
	}
	id, _, last, err := cl.logIdentity(ctx)
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

// slotRows is every slot of the group for the status page.
func (m *memberRun) slotRows() []ui.SlotRow {
	var owners []ownerAt
	m.mu.Lock()
	byID := map[string]member.Member{}
	for _, mm := range m.members {
		byID[mm.ID] = mm
	}
	rows := make([]ui.SlotRow, 0, len(m.assign))
	for _, a := range m.assign {
		st := byID[a.Owner].Slots[a.Slot]
		row := ui.SlotRow{Slot: a.Slot, Owner: a.Owner, Epoch: a.Epoch, Ready: st.Ready && st.Role == roleOwner, Applied: st.Applied}
		var parts, sbs []string
		for p := a.Slot; p < m.cfg.Partitions; p += m.n {
			parts = append(parts, strconv.Itoa(p))
		}
		for _, sb := range a.Standbys {
			ss, ok := byID[sb].Slots[a.Slot]
			switch {
			case !ok || ss.Role != roleStandby:
				sbs = append(sbs, sb+" (starting)")
			case ss.Applied >= st.Applied:
				sbs = append(sbs, sb+" (lag 0)")
			default:
				sbs = append(sbs, fmt.Sprintf("%s (lag %d)", sb, st.Applied-ss.Applied))
			}
		}
		row.Partitions, row.Standbys = strings.Join(parts, ", "), strings.Join(sbs, ", ")
		if r := m.slots[a.Slot]; r != nil && r.role == roleOwner {
			if app := r.app.Load(); app != nil {
				owners = append(owners, ownerAt{len(rows), app})
			}
		}
		rows = append(rows, row)
	}
	m.mu.Unlock()
	now := time.Now()
	for _, o := range owners { // outside m.mu: see samples
		if cs := o.app.ChangelogStatus(); !cs.LastAt.IsZero() {
			rows[o.i].Checkpoint = fmt.Sprintf("seq %d, %s ago", cs.LastCheckpoint.Seq, time.Since(cs.LastAt).Round(time.Second))
		}
		rows[o.i].Queue, rows[o.i].Reaper = o.app.slotSummary(now)
	}
	return rows
}

// standbyApplied is what slot s's tailing standbys reported last.
func (m *memberRun) standbyApplied(s int) []uint64 {
	var out []uint64
	for _, mm := range m.tailingStandbys(s) {
		out = append(out, mm.Slots[s].Applied)
	}
	return out
}
