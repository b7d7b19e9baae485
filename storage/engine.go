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
	"github.com/cockroachdb/pebble/v2/bloom"
	"github.com/cockroachdb/pebble/v2/vfs"
)

// Engine is the seam between the store and Pebble. Reads go through
// pebble.Reader (the DB, a snapshot or an indexed batch); every write is a
// batch made durable by exactly one Commit call ("batch_write_durable").
//
// Fault injection wraps an Engine (FaultEngine) and fails or "crashes" at
// the Nth durable call; the store and the cascade never write any other way.
type Engine interface {
	pebble.Reader
	NewSnapshot() *pebble.Snapshot
	NewBatch(...pebble.BatchOption) *pebble.Batch
	NewIndexedBatch() *pebble.Batch
	// Commit applies b with fsync. It is the only durable call.
	Commit(b *pebble.Batch) error
	// CommitNoSync applies b without waiting for fsync: the store calls it
	// instead of Commit only when a Durable (a changelog) already holds b
	// (Store.commit), so a lost tail of the WAL is replayed from there.
	CommitNoSync(b *pebble.Batch) error
	Metrics() *pebble.Metrics
	// Flush and Compact serve erasure's scrub (Store.Scrub).
	Flush() error
	Compact(ctx context.Context, start, end []byte, parallelize bool) error
	// DiskUsage reports the bytes the engine occupies on disk.
	DiskUsage() uint64
}

// PebbleEngine is the production Engine.
type PebbleEngine struct {
	*pebble.DB
	stalls *StallCounter
	// fatal receives Pebble's fatal errors (OpenPebble's onFatal, or the
	// store's once one opens on the engine: OpenStoreOn).
	fatal *atomic.Pointer[func(string)]
	// log receives Pebble's lines (OpenPebble's log, or the store's once
	// one opens on the engine: a standby's copy promoted in place logs as
	// the owner it became, not as the standby that opened it).
	log *atomic.Pointer[slog.Logger]
}

// setLog routes Pebble's lines to l from now on (nil: kept as it is).
func (e *PebbleEngine) setLog(l *slog.Logger) {
	if l != nil {
		e.log.Store(l)
	}
}

// SetFatal routes Pebble's fatal errors to f from now on (a copy handed
// from one owner of it to another: a standby's to the slot that promotes
// it). Like Pebble's Fatalf, f must not return.
func (e *PebbleEngine) SetFatal(f func(string)) { e.fatal.Store(&f) }

// StallCounter counts Pebble's write stalls (for metrics).
type StallCounter struct {
	mu      sync.Mutex
	count   uint64
	total   time.Duration
	started time.Time
}

// Stats returns the number of write stalls and their total duration so far.
func (c *StallCounter) Stats() (uint64, time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	total := c.total
	if !c.started.IsZero() {
		total += time.Since(c.started)
	}
	return c.count, total
}

// Sizes of Pebble's memory. Zero fields take the defaults.
type Sizes struct {
	// CacheBytes is the block cache. Default 128 MiB: Pebble's own default
	// (8 MiB) misses on almost every receipt and liveness lookup of a busy
	// worker (cmd/bench, small path: 8 MiB ~4k req/s, 64 MiB ~8k, 128 MiB
	// ~11.8k, 256 MiB ~12.7k); a million-edge cascade fills it with the
	// hub's adjacency blocks, so it is part of that cascade's peak RSS
	// growth (about 220 MB at 128 MiB).
	CacheBytes int64
	// MemTableBytes is one memtable. Default 32 MiB: with Pebble's 4 MiB a
	// 100k-put chunk of a super-node cascade (about 10 MiB, over half a
	// memtable) is flushed on its own and writes stall; at 64 MiB every
	// lookup's seek through the memtable's skiplist costs more than the
	// flushes it saves (cmd/bench measured both).
	MemTableBytes uint64
}

// tune sets the options the store relies on: the comparer and bloom
// filters on its entity prefixes (below), the block cache and the memtable
// size.
func tune(opts *pebble.Options, sz Sizes) {
	opts.MemTableSize = sz.MemTableBytes
	opts.TargetFileSizes = targetFileSizes
	opts.MaxManifestFileSize = maxManifestBytes
	opts.Comparer = Comparer
	for i := range opts.Levels {
		opts.Levels[i].FilterPolicy = EntityBloom
	}
}

// targetFileSizes are the sizes Pebble cuts its tables at: L0, then the
// base level and each level below it. Pebble's defaults (2 MiB, doubling
// at each level) make the tables just above the bottom level 8 MiB on a
// 1 GB store, and an erase's compaction of one entity's key range drags
// in one such table and every bottom-level table under its span (the
// levels are ten times apart): about 80-100 MB rewritten, and uploaded to
// the checkpoint bucket, per erase. Smaller tables at the top (1 MiB
// for L0 and the base level, doubling below) cut that about four times
// (DECISIONS 86, BENCHMARKS "Smaller tables at the top"); the bottom
// levels keep tables of a few MiB, so a store holds about four times
// more tables than with the defaults, not eight (a checkpoint links
// every table; the last step of an erase's scrub, under the writer,
// links none since DECISIONS 88, unless it falls back to a whole save).
// A store written with other sizes opens as it is: a table's size is
// only where a compaction cuts its outputs.
var targetFileSizes = [7]int64{1 << 20, 1 << 20, 2 << 20, 4 << 20, 8 << 20, 16 << 20, 32 << 20}

// maxManifestBytes bounds Pebble's MANIFEST before it is rolled over
// (a new one starts from a snapshot of the current tables). Pebble's
// default, 128 MiB, lets every flush and compaction append its edit
// (about 190 bytes a flush with its compactions) for months, and every
// checkpoint carries the MANIFEST whole in its archive: a busy slot's
// saves, the first one of an erase's scrub among them, would upload
// tens of MB of old edits. 1 MiB keeps it at about
// the size of one snapshot (Pebble rolls over only once the edits
// outweigh the snapshot). BenchmarkManifestAfterFlushes measures both.
const maxManifestBytes = 1 << 20

// Comparer is the store's key order: Pebble's bytewise comparer, under its
// own name, with EntitySplit as its Split. The order and the name are what
// a Pebble store records and checks at open, and neither differs from
// Pebble's default, so any Pebble build (an older telha-cascade, a tool, a
// checkpoint opened read-only) still opens the store and reads it right.
// The Split only decides what the bloom filters hold (EntityBloom) and what
// a prefix iteration (SeekPrefixGE) covers.
var Comparer = func() *pebble.Comparer {
	c := *pebble.DefaultComparer
	c.Split = EntitySplit
	return &c
}()

// EntityBloom is the store's filter policy: Pebble's bloom filter (10 bits
// a key, about 1 % false positives) over EntitySplit prefixes, so a read of
// one entity's versions or one node's adjacency skips every table that
// holds nothing of it, and a receipt lookup for a new request id (a meta
// key, whole key as prefix) skips every table but the last level's.
//
// It has a name of its own because its filters hold other keys than the
// ones Pebble's bloom filter holds under its name
// ("rocksdb.BuiltinBloomFilter", the whole key): a table keeps the name of
// the policy that built its filter, and a reader uses a table's filter only
// under a policy of that name. So tables written before (whole-key filters)
// are read here without their filter until a compaction rewrites them, and
// an older build or a tool reads these tables without theirs: slower for a
// while, never wrong (TestStoreFiltersAcrossBuilds).
var EntityBloom pebble.FilterPolicy = entityBloom{}

type entityBloom struct{}

func (entityBloom) Name() string { return "telha.entity-bloom.v1" }

func (entityBloom) MayContain(ft pebble.FilterType, filter, key []byte) bool {
	return bloom.FilterPolicy(10).MayContain(ft, filter, key)
}

func (entityBloom) NewWriter(ft pebble.FilterType) pebble.FilterWriter {
	return bloom.FilterPolicy(10).NewWriter(ft)
}

// noRecycleCleaner deletes obsolete files, like Pebble's default cleaner,
// and turns off WAL recycling: Pebble recycles a cleaner's logs only when
// the cleaner does not need the files' contents (obsolete_files.go), and a
// recycled WAL keeps its old bytes (erased values among them) until it is
// overwritten, in a file that stays on disk. The marker method comes from
// the embedded ArchiveCleaner, one level down, so the DeleteCleaner's
// Clean and String win.
type noRecycleCleaner struct {
	pebble.DeleteCleaner
	needsContents
}

type needsContents struct{ pebble.ArchiveCleaner }

// OpenPebble opens (creating if needed) a Pebble database in dir. fs may be
// nil (the OS filesystem) or a fault-injecting vfs.FS. onFatal receives
// Pebble's fatal errors and must not return (nil: Pebble's fatal error
// panics, until a store opens on the engine: OpenStoreOn).
func OpenPebble(dir string, fs vfs.FS, log *slog.Logger, onFatal func(string), adjust func(*pebble.Options), sizes Sizes) (*PebbleEngine, error) {
	if sizes.CacheBytes == 0 {
		sizes.CacheBytes = 128 << 20
	}
	if sizes.MemTableBytes == 0 {
		sizes.MemTableBytes = 32 << 20
	}
	cache := pebble.NewCache(sizes.CacheBytes)
	defer cache.Unref() // the DB holds its own reference
	stalls := &StallCounter{}
	fatal := &atomic.Pointer[func(string)]{}
	if onFatal != nil {
		fatal.Store(&onFatal)
	}
	logp := &atomic.Pointer[slog.Logger]{}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	logp.Store(log)
	opts := &pebble.Options{
		Logger: pebbleLogger{log: logp, fatal: func(msg string) {
			if f := fatal.Load(); f != nil {
				(*f)(msg)
			}
		}},
		EventListener: &pebble.EventListener{
			WriteStallBegin: func(info pebble.WriteStallBeginInfo) {
				stalls.mu.Lock()
				stalls.count++
				stalls.started = time.Now()
				stalls.mu.Unlock()
				logp.Load().Warn("pebble write stall", "reason", info.Reason)
			},
			BackgroundError: func(err error) {
				logp.Load().Warn("pebble background error (retried)", "err", err)
			},
			WriteStallEnd: func() {
				stalls.mu.Lock()
				if !stalls.started.IsZero() {
					stalls.total += time.Since(stalls.started)
					stalls.started = time.Time{}
				}
				stalls.mu.Unlock()
			},
		},
	}
	if fs != nil {
		opts.FS = fs
	}
	opts.Cache = cache
	opts.Cleaner = noRecycleCleaner{}
	tune(opts, sizes)
	if adjust != nil {
		adjust(opts)
		if opts.Comparer != Comparer {
			// The reads iterate entity prefixes (scanPrefix): under another
			// Split they would find nothing.
			return nil, fmt.Errorf("%w: open pebble at %s: the options may not replace the store's comparer", ErrStorage, dir)
		}
	}
	db, err := pebble.Open(dir, opts)
	if err != nil {
		return nil, fmt.Errorf("%w: open pebble at %s: %w", ErrStorage, dir, err)
	}
	return &PebbleEngine{DB: db, stalls: stalls, fatal: fatal, log: logp}, nil
}

// Stalls returns the engine's write-stall counter.
func (e *PebbleEngine) Stalls() *StallCounter { return e.stalls }

// Commit applies b synchronously (fsync before returning).
func (e *PebbleEngine) Commit(b *pebble.Batch) error { return b.Commit(pebble.Sync) }

// CommitNoSync applies b without fsync (the changelog holds it).
func (e *PebbleEngine) CommitNoSync(b *pebble.Batch) error { return b.Commit(pebble.NoSync) }

// DiskUsage reports Pebble's own disk usage.
func (e *PebbleEngine) DiskUsage() uint64 { return e.DB.Metrics().DiskSpaceUsage() }

type pebbleLogger struct {
	log   *atomic.Pointer[slog.Logger]
	fatal func(string)
}

func (l pebbleLogger) Infof(format string, args ...any) {
	l.log.Load().Debug(fmt.Sprintf(format, args...), "component", "pebble")
}

func (l pebbleLogger) Errorf(format string, args ...any) {
	l.log.Load().Error(fmt.Sprintf(format, args...), "component", "pebble")
}

// Fatalf is Pebble's "cannot continue" (for example a failed WAL write:
// its commit pipeline is unusable afterwards). It must not return: the
// store records the error (Store.Fatal) and parks the goroutine.
func (l pebbleLogger) Fatalf(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	if l.fatal != nil {
		l.fatal(msg)
	}
	panic(msg)
}

// ErrInjected marks a failure injected by FaultEngine. It is wrapped in
// ErrStorage like any engine failure.
var ErrInjected = errors.New("injected fault")

// FaultEngine wraps a real Engine and injects failures at durable calls.
// Reads pass through untouched.
type FaultEngine struct {
	Engine

	mu    sync.Mutex
	calls int
	// inject, when set, is asked before durable call n (1-based); a non-nil
	// error fails the call without applying the batch.
	inject func(n int) error
	// after, when set, is called after durable call n landed.
	after func(n int)
	// observe, when set, sees every batch before durable call n.
	observe func(n int, b *pebble.Batch)
}

// SetObserve installs a hook that sees every batch (read-only) before its
// durable call: tests count its puts or tell whose it is.
func (f *FaultEngine) SetObserve(fn func(n int, b *pebble.Batch)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.observe = fn
}

// NewFaultEngine wraps e.
func NewFaultEngine(e Engine) *FaultEngine { return &FaultEngine{Engine: e} }

// SetInject installs the failure function (nil removes it).
func (f *FaultEngine) SetInject(fn func(n int) error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.inject = fn
}

// SetAfter installs a hook run after every durable call that landed.
func (f *FaultEngine) SetAfter(fn func(n int)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.after = fn
}

// CrashAfter makes every durable call after the first k fail, as if the
// process had died right after call k landed.
func (f *FaultEngine) CrashAfter(k int) {
	f.SetInject(func(n int) error {
		if n > k {
			return fmt.Errorf("%w: crash after durable call %d (call %d refused)", ErrInjected, k, n)
		}
		return nil
	})
}

// Calls returns the number of durable calls attempted so far.
func (f *FaultEngine) Calls() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls
}

// Commit counts the call, consults the injector, and commits for real.
func (f *FaultEngine) Commit(b *pebble.Batch) error { return f.commit(b, f.Engine.Commit) }

// CommitNoSync is Commit without fsync: the same count, injector and hooks.
func (f *FaultEngine) CommitNoSync(b *pebble.Batch) error { return f.commit(b, f.Engine.CommitNoSync) }

func (f *FaultEngine) commit(b *pebble.Batch, apply func(*pebble.Batch) error) error {
	f.mu.Lock()
	f.calls++
	n, inject, after, observe := f.calls, f.inject, f.after, f.observe
	f.mu.Unlock()
	if observe != nil {
		observe(n, b)
	}
	if inject != nil {
		if err := inject(n); err != nil {
			return err
		}
	}
	if err := apply(b); err != nil {
		return err
	}
	if after != nil {
		after(n)
	}
	return nil
}
