package app

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/telha/telha-cascade/api"
	"github.com/telha/telha-cascade/member"
	"github.com/telha/telha-cascade/partition"
	"github.com/telha/telha-cascade/slot"
	"github.com/telha/telha-cascade/storage"
)

// A member's standbys: a slot's copy kept warm by tailing its changelog,
// and opened read-only to answer entity reads while no owner answers.

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

// startStandby starts a warm copy of slot s (m.mu held).
func (m *memberRun) startStandby(s int) *slotRun {
	m.closeKept(s) // the tail opens the copy itself
	ctx, cancel := context.WithCancel(context.Background())
	r := &slotRun{slot: s, role: roleStandby, stop: cancel, done: make(chan struct{}), started: time.Now()}
	log := m.log.With("slot", s, "role", roleStandby)
	go func() {
		defer m.poke()
		defer r.end(nil)
		for delay := time.Second; ; delay = min(2*delay, 15*time.Second) {
			err := m.tail(ctx, s, r, log)
			r.ready.Store(false)
			if ctx.Err() != nil {
				return
			}
			log.Warn("member: the standby's tail stopped; catching up again", "err", err, "in", delay)
			if errors.Is(err, slot.ErrStandbySeed) {
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
	c := m.slotConfig(s)
	cl, err := slot.OpenChangelog(ctx, m.nc, c, log, nil, func(string) {})
	if err != nil || cl == nil {
		return errors.Join(err, ctx.Err())
	}
	cl.FS = m.opts.FS
	// A Pebble fatal error on this copy (a failed WAL or MANIFEST write:
	// its disk failed) ends this standby run, not the process: the member
	// gives the slot up (reconcile, m.broken) and serves its other slots.
	// The goroutine that hit it parks (Pebble's Fatalf must not return),
	// and the copy, never closed, stays locked until the process exits.
	var broke atomic.Bool
	cl.OnFatal = func(msg string) {
		broke.Store(true)
		r.ready.Store(false)
		r.end(fmt.Errorf("%w: %w: the standby's copy of slot %d: %s", storage.ErrFatal, storage.ErrEngine, s, msg))
		r.stop() // the tail, if it is not the goroutine parked here
		m.poke()
		select {}
	}
	t0 := time.Now()
	sizes := storage.Sizes{CacheBytes: int64(c.CacheMB) << 20, MemTableBytes: uint64(c.MemTableMB) << 20}
	// The slot's own directory, and its Pebble: a promotion hands it over
	// open to the slot (in place: no close and reopen).
	pe, err := cl.CatchUp(ctx, filepath.Join(m.slotDir(s), "pebble"), sizes, true)
	if err != nil {
		return err
	}
	defer func() {
		switch {
		case broke.Load(): // never closed nor used again
		case r.promote.Load():
			m.keep(s, pe)
		default:
			_ = pe.Close()
		}
	}()
	db := pe.DB
	applied, err := partition.AppliedSeq(db)
	if err != nil {
		return err
	}
	r.applied.Store(applied)
	r.tailLog.Store(cl.Log())
	r.viewMu.Lock()
	r.copyDB = db
	r.viewMu.Unlock()
	defer r.dropView() // before the close or the handover (deferred first): waits out the reads
	r.ready.Store(true)
	log.Info("member: standby caught up; tailing the changelog", "applied", applied, "restored", cl.Status().Restored, "replayed", cl.Status().Replayed, "took", time.Since(t0))
	return cl.Log().Tail(ctx, applied+1, func(seq uint64, ws []byte) error {
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

// keep holds slot s's Pebble, which its standby had open, for the slot's
// owner run that the promotion starts next (startOwner). A copy kept
// before and never taken is closed first.
func (m *memberRun) keep(s int, pe *storage.PebbleEngine) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if old := m.kept[s]; old != nil {
		_ = old.Close()
	}
	m.kept[s] = pe
}

// closeKept closes slot s's kept Pebble, if any: the slot was not
// promoted after all (its next run opens the copy again), or its copy is
// going (m.mu held).
func (m *memberRun) closeKept(s int) {
	if pe := m.kept[s]; pe != nil {
		_ = pe.Close()
		delete(m.kept, s)
	}
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
		// Shared by every read waiting: not ended by the one that asked
		// first going away (a hedge the owner won, a client gone).
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
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

// standbyApplied is what slot s's tailing standbys reported last.
func (m *memberRun) standbyApplied(s int) []uint64 {
	var out []uint64
	for _, mm := range m.tailingStandbys(s) {
		out = append(out, mm.Slots[s].Applied)
	}
	return out
}
