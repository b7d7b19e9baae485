package storage

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
)

// Options configure Open. Every field is optional.
type Options struct {
	// Clock is the wall clock behind the TxClock. Default: the system clock.
	Clock Clock
	// FS is the filesystem Pebble uses. Default: the OS. Tests pass a
	// fault-injecting vfs.FS.
	FS vfs.FS
	// WrapEngine, when set, wraps the opened engine (fault injection).
	WrapEngine func(Engine) Engine
	// Logger receives the store's and Pebble's logs. Default: slog.Default().
	Logger *slog.Logger
	// OnCommit, when set, observes every durable call: its duration, the
	// number of ops in the batch and its error.
	OnCommit func(d time.Duration, ops int, err error)
	// MinFreeBytes is the disk-space reserve: while the filesystem of the
	// store has less free space, every durable write is refused with
	// ErrDiskFull (a transient ErrStorage) before it reaches Pebble, so a
	// full disk gives a clear error instead of a fatal WAL write failure.
	// 0 disables the guard.
	MinFreeBytes uint64
	// DiskFree reports the free bytes of the store's filesystem. Default:
	// statfs of the store directory. Tests inject their own.
	DiskFree func() (uint64, error)
	// Pebble, when set, adjusts Pebble's options before open (tests use it
	// for small memtables).
	Pebble func(*pebble.Options)
	// Sizes of Pebble's block cache and memtables (defaults in Sizes).
	Sizes Sizes
	// OnWriterTask, when set, observes every task of the writer: its lane,
	// how long it waited in the lane and how long it ran (metrics: a small
	// request's wait behind a super-node cascade shows here).
	OnWriterTask func(lane Lane, wait, run time.Duration)
	// Durable, when set, receives every batch's write-set before the local
	// commit, and the local commit then skips fsync (durable.go). Nil: the
	// local commit is fsynced and is the only copy (today's behaviour).
	Durable Durable
	// DurableTimeout bounds one Durable.Append (DefaultDurableTimeout when
	// 0); past it the store stops (durable.go).
	DurableTimeout time.Duration
	// Copies, when set with Durable, makes an erase reach the copies of
	// this store outside its disk (the changelog's stream files, the
	// checkpoints): Scrub calls it, holding the writer, before an erase's
	// result is stored (durable.go, "Erasure and the copies").
	Copies CopyScrubber
	// OnTxnRead, a test signal, is called before every read a transaction
	// makes (Update). It may block: interleaving tests hold a decision
	// between two of its reads with it and check that nothing commits
	// meanwhile. Nil in production.
	OnTxnRead func()
}

// ErrDiskFull: the disk-space reserve is exhausted; writes are refused
// until space is freed. It wraps ErrStorage (retryable).
var ErrDiskFull = fmt.Errorf("%w: disk full", ErrStorage)

// Store is the tritemporal version store. It is safe for concurrent use:
// reads run concurrently against committed state; writes that allocate a
// transaction time are serialised by Update.
type Store struct {
	eng      Engine
	clock    *TxClock
	log      *slog.Logger
	onCommit func(time.Duration, int, error)

	w         *writer
	committed *committed
	fatal     *fatalState
	onTxnRead func()

	tenantsMu sync.RWMutex
	tenants   map[string]bool
	// feedGens counts each tenant's committed write transactions (under
	// tenantsMu): the feed skips a tenant whose count did not move.
	feedGens map[string]uint64
	// refreshMu serializes Refresh (a store over a copy, copy.go).
	refreshMu sync.Mutex

	journals *Journals
	erases   *Erases
	// dir and fs are Pebble's directory and filesystem (erasure's scrub
	// checks the WAL files itself; empty for OpenEngine).
	dir    string
	fs     vfs.FS
	stalls *StallCounter
	closed atomic.Bool

	minFree  uint64
	diskFree func() (uint64, error)
	diskMu   sync.Mutex
	diskAt   time.Time
	diskLast uint64
	diskErr  error

	durable        Durable
	durableTimeout time.Duration
	// appends: the parent of every Durable.Append's context; AbortAppends
	// cancels it.
	appends      context.Context
	abortAppends context.CancelFunc
	copies       CopyScrubber
	appended     atomic.Uint64 // the changelog sequence of the last Append (on the writer)
	db           *pebble.DB    // OpenStore's Pebble (checkpoints); nil for OpenEngine

	failures    atomic.Int64 // consecutive failed durable commits
	lastFailure atomic.Pointer[string]
}

// WriteStalls returns Pebble's write-stall count and total duration.
func (s *Store) WriteStalls() (uint64, time.Duration) {
	if s.stalls == nil {
		return 0, 0
	}
	return s.stalls.Stats()
}

// OpenStore opens the store in dir (Pebble), creating it if needed, and rebuilds
// the in-memory tenant registry and journal fences from disk.
func OpenStore(dir string, opts Options) (*Store, error) {
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	pe, err := OpenPebble(dir, opts.FS, log, nil, opts.Pebble, opts.Sizes)
	if err != nil {
		return nil, err
	}
	return OpenStoreOn(pe, dir, opts)
}

// OpenStoreOn opens the store on pe, a Pebble already open in dir (by
// OpenPebble: a slot's catch-up, or a standby's copy promoted in place),
// as OpenStore does after its open: the store takes pe (it closes it when
// the store closes, or now when the open fails) and receives its fatal
// errors, and with opts.Logger its log lines, from now on. opts' FS,
// Pebble and Sizes are the ones pe was opened with; they are not read
// again.
func OpenStoreOn(pe *PebbleEngine, dir string, opts Options) (*Store, error) {
	fatal := newFatalState()
	pe.SetFatal(fatal.raise)
	pe.setLog(opts.Logger)
	var eng Engine = pe
	if opts.WrapEngine != nil {
		eng = opts.WrapEngine(eng)
	}
	s, err := openEngine(eng, opts, fatal)
	if err != nil {
		_ = pe.Close()
		return nil, err
	}
	s.stalls = pe.Stalls()
	s.db = pe.DB
	s.dir, s.fs = dir, opts.FS
	if s.fs == nil {
		s.fs = vfs.Default
	}
	if s.diskFree == nil && s.minFree > 0 {
		s.diskFree = func() (uint64, error) { return statfsFree(dir) }
	}
	return s, nil
}

// OpenEngine opens a store over an already open engine.
func OpenEngine(eng Engine, opts Options) (*Store, error) {
	return openEngine(eng, opts, newFatalState())
}

func openEngine(eng Engine, opts Options, fatal *fatalState) (*Store, error) {
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	s := &Store{
		eng:       eng,
		log:       log,
		onCommit:  opts.OnCommit,
		tenants:   map[string]bool{},
		journals:  newJournals(),
		minFree:   opts.MinFreeBytes,
		diskFree:  opts.DiskFree,
		fatal:     fatal,
		onTxnRead: opts.OnTxnRead,
		durable:   opts.Durable,
		copies:    opts.Copies,
	}
	s.durableTimeout = opts.DurableTimeout
	if s.durableTimeout <= 0 {
		s.durableTimeout = DefaultDurableTimeout
	}
	s.appends, s.abortAppends = context.WithCancel(context.Background())
	if err := s.checkFormat(); err != nil {
		return nil, err
	}
	if err := s.loadTenants(); err != nil {
		return nil, err
	}
	hwm, err := s.readHWM()
	if err != nil {
		return nil, err
	}
	s.clock = NewTxClock(opts.Clock, hwm)
	s.committed = newCommitted(hwm)
	if err := s.loadJournals(); err != nil {
		return nil, err
	}
	if err := s.loadErases(); err != nil {
		return nil, err
	}
	s.w = newWriter(opts.OnWriterTask, nil)
	return s, nil
}

func (s *Store) checkFormat() error {
	v, ok, err := getValue(s.eng, formatKey())
	if err != nil {
		return err
	}
	if ok {
		if len(v) != 1 || v[0] != FormatVersion {
			return fmt.Errorf("%w: store format %x, this build reads %d", ErrDecode, v, FormatVersion)
		}
		return nil
	}
	b := s.eng.NewBatch()
	defer b.Close()
	_ = b.Set(formatKey(), []byte{FormatVersion}, nil)
	return s.commit(b)
}

// readHWM returns the clock's durable high-water mark: the largest tx any
// durable record carries. Every version is indexed in its tenant's
// tx_time_index under its tx, and a journal head (whose tx its chunks will
// use) carries its tx as created_at, so the mark is the largest of the last
// tx-index key and the last journal head of each tenant: a few seeks, and no
// rewritten "clock" key (every key outside the jobs keyspace is written
// once).
func (s *Store) readHWM() (Ts, error) {
	hwm := NoTs
	for _, sc := range s.Tenants() {
		for _, r := range [][2][]byte{
			func() [2][]byte { lo, hi := TenantRange(ksTxIdx, sc); return [2][]byte{lo, hi} }(),
			func() [2][]byte { lo, hi := JobsInState(sc, CascadeJournalState); return [2][]byte{lo, hi} }(),
			func() [2][]byte { lo, hi := JobsInState(sc, EraseJobState); return [2][]byte{lo, hi} }(),
		} {
			k, ok, err := lastKey(s.eng, r[0], r[1])
			if err != nil {
				return NoTs, err
			}
			if !ok {
				continue
			}
			key, err := DecodeKey(k)
			if err != nil {
				return NoTs, err
			}
			hwm = max(hwm, key.Tx, key.CreatedAt)
		}
	}
	return hwm, nil
}

func lastKey(r pebble.Reader, lo, hi []byte) ([]byte, bool, error) {
	it, err := r.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: hi})
	if err != nil {
		return nil, false, fmt.Errorf("%w: iterator: %w", ErrStorage, err)
	}
	defer it.Close()
	if !it.Last() {
		return nil, false, it.Error()
	}
	return append([]byte(nil), it.Key()...), true, nil
}

func (s *Store) loadTenants() error {
	lo, hi := TenantRegistryRange()
	return scan(s.eng, lo, hi, func(k, _ []byte) error {
		key, err := DecodeKey(k)
		if err != nil {
			return err
		}
		s.tenants[key.Tenant] = true
		return nil
	})
}

// loadJournals registers every durable journal head (an undecodable one is
// recorded as poison). It runs once, at open, before the writer starts;
// from then on only the writer changes the registry, in the same task as
// the commit that makes the change true.
func (s *Store) loadJournals() error {
	for _, sc := range s.Tenants() {
		lo, hi := JobsInState(sc, CascadeJournalState)
		err := scan(s.eng, lo, hi, func(k, v []byte) error {
			e, derr := journalEntry(sc, k, v)
			if derr != nil {
				p := &PoisonJournal{Scope: sc, HeadKey: append([]byte(nil), k...), Err: derr.Error(), Seen: s.clock.Wall().Now()}
				s.journals.addPoison(p)
				s.log.Error("undecodable cascade journal", "tenant", sc.Tenant(), "key", fmt.Sprintf("%x", k), "err", derr)
				return nil
			}
			s.journals.add(e)
			return nil
		})
		if err != nil {
			return err
		}
	}
	return nil
}

var errStopScan = errors.New("stop scan")

func journalEntry(sc Scope, k, v []byte) (*JournalEntry, error) {
	key, err := DecodeKey(k)
	if err != nil {
		return nil, err
	}
	if key.Tenant != sc.Tenant() || key.State != CascadeJournalState {
		return nil, fmt.Errorf("%w: journal key %x outside scope", ErrDecode, k)
	}
	j, err := DecodeJournal(v)
	if err != nil {
		return nil, err
	}
	if j.Tx != key.CreatedAt {
		return nil, fmt.Errorf("%w: journal tx %d differs from key created_at %d", ErrDecode, j.Tx, key.CreatedAt)
	}
	e := newJournalEntry(sc, append([]byte(nil), k...), j)
	e.committed.Store(true) // read from disk
	return e, nil
}

// Close stops the writer (the tasks already queued still run) and closes
// the engine. Callers stop submitting first.
func (s *Store) Close() error {
	if !s.closed.CompareAndSwap(false, true) {
		return nil
	}
	defer s.abortAppends()
	s.w.close()
	if err := s.eng.Close(); err != nil {
		return fmt.Errorf("%w: close: %w", ErrStorage, err)
	}
	return nil
}

// Engine returns the engine (for fault-injection tests and tools).
func (s *Store) Engine() Engine { return s.eng }

// Clock returns the store's transaction clock.
func (s *Store) Clock() *TxClock { return s.clock }

// Journals returns the journal registry (the fences).
func (s *Store) Journals() *Journals { return s.journals }

// Tenants lists every tenant that has written anything, in name order.
func (s *Store) Tenants() []Scope {
	s.tenantsMu.RLock()
	defer s.tenantsMu.RUnlock()
	out := make([]Scope, 0, len(s.tenants))
	for t := range s.tenants {
		out = append(out, Scope{tenant: t})
	}
	sortScopes(out)
	return out
}

func (s *Store) knownTenant(t string) bool {
	s.tenantsMu.RLock()
	defer s.tenantsMu.RUnlock()
	return s.tenants[t]
}

// NewSnapshot returns a consistent snapshot of committed state.
func (s *Store) NewSnapshot() *pebble.Snapshot { return s.eng.NewSnapshot() }

// Reader returns a reader of the latest committed state.
func (s *Store) Reader() pebble.Reader { return s.eng }

// NewBatch returns an empty write batch for CommitBatch.
func (s *Store) NewBatch(opts ...pebble.BatchOption) *pebble.Batch { return s.eng.NewBatch(opts...) }

// commit makes b durable. It runs on the writer only (writer.go). With a
// Durable set, durable means "in the changelog" (durable.go); otherwise an
// fsynced local commit.
func (s *Store) commit(b *pebble.Batch) error {
	if s.closed.Load() {
		return fmt.Errorf("%w: store closed", ErrStorage)
	}
	start := time.Now()
	err := s.checkDisk()
	switch {
	case err != nil:
	case s.durable != nil:
		err = s.commitDurable(b)
	default:
		err = s.eng.Commit(b)
		if err != nil {
			err = fmt.Errorf("%w: durable commit of %d ops: %w", ErrStorage, b.Count(), err)
		}
	}
	if s.onCommit != nil {
		s.onCommit(time.Since(start), int(b.Count()), err)
	}
	if err != nil {
		s.failures.Add(1)
		msg := err.Error()
		s.lastFailure.Store(&msg)
		return err
	}
	s.failures.Store(0)
	return nil
}

// checkDisk refuses writes while free space is under the reserve. The free
// space is read at most once a second.
func (s *Store) checkDisk() error {
	if s.minFree == 0 || s.diskFree == nil {
		return nil
	}
	free, err := s.DiskFree()
	if err != nil {
		return nil // cannot tell; let Pebble try
	}
	if free < s.minFree {
		return fmt.Errorf("%w: %d bytes free, under the reserve of %d (--min-free-disk-mb)", ErrDiskFull, free, s.minFree)
	}
	return nil
}

// DiskFree returns the free bytes of the store's filesystem (cached for a
// second), or an error when the guard is off or statfs fails.
func (s *Store) DiskFree() (uint64, error) {
	if s.diskFree == nil {
		return 0, errors.New("disk-space guard off")
	}
	s.diskMu.Lock()
	defer s.diskMu.Unlock()
	if time.Since(s.diskAt) >= time.Second {
		s.diskLast, s.diskErr = s.diskFree()
		s.diskAt = time.Now()
	}
	return s.diskLast, s.diskErr
}

// Health reports how many durable commits failed in a row (0 after any
// success) and the last failure.
func (s *Store) Health() (consecutiveFailures int64, last string) {
	if p := s.lastFailure.Load(); p != nil {
		last = *p
	}
	return s.failures.Load(), last
}

// Update runs fn on the writer (foreground lane) in a read-write
// transaction and commits its writes in one durable batch. fn reads through
// the Txn, which sees the committed state plus the transaction's own pending
// writes; nothing else commits until this batch has (writer.go). If fn
// returns an error nothing is written and the transaction's in-memory
// effects (fences it raised) are rolled back. After a successful commit the
// transaction's after-commit actions run, still on the writer.
//
// Invariant: every tx allocated inside an Update lands in the batch's
// tx-index entries or journal head, which is where a reopened store reads
// its clock's high-water mark from (readHWM).
func (s *Store) Update(ctx context.Context, fn func(*Txn) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return s.w.do(ctx, Foreground, func() error { return s.update(fn) })
}

func (s *Store) update(fn func(*Txn) error) (err error) {
	t := &Txn{s: s, b: s.eng.NewIndexedBatch(), newTenants: map[string]bool{}}
	t.r = txnReader{Batch: t.b, t: t}
	defer t.b.Close()
	defer t.closeIter()
	defer func() {
		if p := recover(); p != nil {
			t.rollback()
			panic(p)
		}
	}()
	if err := fn(t); err != nil {
		t.rollback()
		return err
	}
	if t.b.Empty() && len(t.newTenants) == 0 {
		t.runAfterCommit()
		return nil
	}
	for tn := range t.newTenants {
		_ = t.b.Set(TenantKey(Scope{tenant: tn}), nil, nil)
	}
	if err := s.commit(t.b); err != nil {
		t.rollback()
		return err
	}
	// Before the task's result is delivered (safetime.go).
	if t.written > s.Committed() {
		s.committed.advance(t.written)
	} else {
		s.committed.poke()
	}
	if len(t.newTenants) > 0 || len(t.touched) > 0 {
		s.tenantsMu.Lock()
		for tn := range t.newTenants {
			s.tenants[tn] = true
		}
		if s.feedGens == nil {
			s.feedGens = map[string]uint64{}
		}
		for tn := range t.touched {
			s.feedGens[tn]++
		}
		s.tenantsMu.Unlock()
	}
	t.runAfterCommit()
	return nil
}

// CommitBatch makes a prepared batch durable on the writer's background
// lane (a journal chunk: versions re-using their journal's tx, no decision
// to make). check, when set, runs on the writer right before the commit;
// its error aborts it (an applier checks that its journal is still
// registered).
func (s *Store) CommitBatch(ctx context.Context, b *pebble.Batch, check func() error) error {
	return s.CommitBatchAsync(ctx, b, check).Wait()
}

// CommitBatchAsync queues CommitBatch and returns at once; an applier
// builds its next chunk while this one commits. The batch must not be
// touched until Wait returns.
func (s *Store) CommitBatchAsync(ctx context.Context, b *pebble.Batch, check func() error) PendingCommit {
	return PendingCommit{s.w.submit(ctx, Background, func() error {
		if check != nil {
			if err := check(); err != nil {
				return err
			}
		}
		return s.commit(b)
	})}
}

// PendingCommit is a queued CommitBatchAsync.
type PendingCommit struct{ ch <-chan taskResult }

// Wait waits for the commit and returns its error.
func (p PendingCommit) Wait() error { return wait(p.ch) }

// Exclusive runs fn on the writer (foreground lane) with nothing else
// running: what fn reads of the engine and of the journal registry is one
// consistent point of the commit order. Journal appliers take their
// snapshot and their view of other journals' fences this way.
func (s *Store) Exclusive(ctx context.Context, fn func() error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return s.w.do(ctx, Foreground, fn)
}

// WriterQueue returns the tasks waiting for the writer in each lane (not
// counting the one running).
func (s *Store) WriterQueue() (foreground, background int) { return s.w.queued() }

// WriterIdle returns a channel closed once the writer has run every task
// queued so far and has nothing to do (tests).
func (s *Store) WriterIdle() <-chan struct{} { return s.w.whenIdle() }

// PendingOutbox lists a tenant's finished journaled requests whose result has
// not been published yet, with their row keys.
func (s *Store) PendingOutbox(sc Scope) ([]Outbox, [][]byte, error) {
	lo, hi := JobsInState(sc, ResultOutboxState)
	var out []Outbox
	var keys [][]byte
	err := scan(s.eng, lo, hi, func(k, v []byte) error {
		o, err := DecodeOutbox(v)
		if err != nil {
			s.log.Error("undecodable outbox row", "tenant", sc.Tenant(), "key", fmt.Sprintf("%x", k), "err", err)
			return nil
		}
		o.Tenant = sc.Tenant()
		out = append(out, o)
		keys = append(keys, append([]byte(nil), k...))
		return nil
	})
	return out, keys, err
}

// getValue reads one key; ok is false when it is absent.
func getValue(r pebble.Reader, k []byte) ([]byte, bool, error) {
	v, c, err := r.Get(k)
	if errors.Is(err, pebble.ErrNotFound) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("%w: get %x: %w", ErrStorage, k, err)
	}
	out := append([]byte(nil), v...)
	_ = c.Close()
	return out, true, nil
}

// scan calls fn for every key in [lo, hi) in order. The slices are only
// valid during the call.
func scan(r pebble.Reader, lo, hi []byte, fn func(k, v []byte) error) error {
	it, done, err := openIter(r, lo, hi)
	if err != nil {
		return err
	}
	return walk(it, done, it.First(), fn)
}

// walk calls fn for the iterator's current key (ok: it has one) and every key after
// it, then releases it with done.
func walk(it *pebble.Iterator, done func() error, ok bool, fn func(k, v []byte) error) error {
	for ; ok; ok = it.Next() {
		v, err := it.ValueAndErr()
		if err != nil {
			_ = done()
			return fmt.Errorf("%w: read %x: %w", ErrStorage, it.Key(), err)
		}
		if err := fn(it.Key(), v); err != nil {
			_ = done()
			return err
		}
	}
	if err := done(); err != nil {
		return fmt.Errorf("%w: iterate: %w", ErrStorage, err)
	}
	return nil
}

// scanPrefix calls fn for every key with prefix p in order, in a prefix
// iteration: Pebble consults only the tables whose bloom filter may hold
// p (and the memtables and batch), instead of seeking every level. p must
// be a whole EntitySplit prefix, and r a reader of a Pebble opened with
// Comparer (OpenPebble does): under another Split the iteration finds
// nothing. The slices are only valid during the call.
func scanPrefix(r pebble.Reader, p []byte, fn func(k, v []byte) error) error {
	it, done, err := openPrefixIter(r, p)
	if err != nil {
		return err
	}
	return walk(it, done, it.SeekPrefixGE(p), fn)
}

// openPrefixIter opens an iterator over the keys with prefix p, a whole
// EntitySplit prefix (a programming error otherwise: a prefix iteration
// with a shorter key would find nothing).
func openPrefixIter(r pebble.Reader, p []byte) (*pebble.Iterator, func() error, error) {
	if EntitySplit(p) != len(p) {
		panic(fmt.Sprintf("storage: %x is not an entity prefix", p))
	}
	return openIter(r, p, PrefixEnd(p))
}

// iterPool is a reader that lends out one reusable iterator (a
// transaction's: creating a merging iterator over the batch, memtables and
// every level per read was a sixth of a busy worker's CPU).
type iterPool interface {
	acquire(lo, hi []byte) (*pebble.Iterator, func() error, error)
}

// openIter opens an iterator over [lo, hi) on r; done releases it.
func openIter(r pebble.Reader, lo, hi []byte) (*pebble.Iterator, func() error, error) {
	if p, ok := r.(iterPool); ok {
		return p.acquire(lo, hi)
	}
	it, err := r.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: hi})
	if err != nil {
		return nil, nil, fmt.Errorf("%w: iterator: %w", ErrStorage, err)
	}
	return it, it.Close, nil
}

// Scan exposes scan for other packages' tools and tests.
func Scan(r pebble.Reader, lo, hi []byte, fn func(k, v []byte) error) error {
	return scan(r, lo, hi, fn)
}
