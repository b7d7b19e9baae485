package slot

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/robfig/cron/v3"
	"github.com/telha/telha-cascade/partition"
	"github.com/telha/telha-cascade/reaper"
	"github.com/telha/telha-cascade/storage"
)

// The changelog, step A of issue 21: "lose a pod's disk, lose nothing" for
// the static --partition-owner i/N layout.
//
// With --changelog jetstream, the slot's store (every partition of its
// owner slice, one Pebble) is backed by one changelog:
//
//	stream   TELHA_LOG_STATIC<N>_<i>     subject telha.static<N>.log.<i>
//	bucket   TELHA_CKPT_STATIC<N>        objects partition-<i>/seq-<020d>.tar
//
// "STATIC<N>" names the layout: the owner slice i of N is this step's
// "partition". A later per-partition layout uses TELHA_LOG_<p> and
// TELHA_CKPT, so the two never collide, and a migration can restore the
// static slice's newest checkpoint, replay its log, and re-append the
// result per partition. A change of N starts new logs (and the store
// re-seeds them: see prepare).
//
// Start (prepare, before the store is served; /readyz says "changelog"):
//
//	inspect the local Pebble: empty? applied sequence? which log?
//	  empty, or stale below the log's purge ── restore the newest
//	                                           checkpoint, inspect again
//	  data, no log yet, the log empty ──────── seed: attach, checkpoint at 0
//	  data of another log, this log empty ──── re-seed (the log was lost)
//	  data of another log, this log not empty  refuse (an operator decides)
//	replay applied+1 .. the log's end (ApplyTo, one batch per write-set)
//	claim: append a marker write-set ──────── fences the previous writer now
//	open the store with the changelog as its Durable (storage/durable.go)
//
// The TxClock of the store opened after the replay starts above every tx
// in the replayed data: the store derives its high-water mark from its
// tx-index and journal keys (Store.readHWM), which the write-sets carry.
//
// An erase reaches the changelog and the checkpoints before its result
// (issue 21 item 6; ScrubCopies below): once the local scrub is done, the
// store commits a marker, and the changelog checkpoints the scrubbed store
// beside the writer, holds the writer only to store what committed since
// (a tail checkpoint) and purge the whole stream, and deletes every older
// checkpoint but the tail's base, its chunks overwritten
// (partition.DeleteCheckpoint; the scheduled prune deletes the same way).

// Changelog modes of --changelog.
const (
	ChangelogOff       = "off"
	ChangelogJetStream = "jetstream"
)

// ChangelogStatus is what this slot knows of its changelog: how it
// started, and its checkpoints since. The metrics package is another
// engineer's; until it carries these, they are logged and kept here.
type ChangelogStatus struct {
	Mode      string // off or jetstream
	Stream    string
	Subject   string
	Bucket    string
	Partition int // the owner slice index i; the checkpoint objects' partition number
	LogID     string

	// Start.
	Restored    bool   // a checkpoint was restored
	RestoredSeq uint64 // its sequence
	Seeded      bool   // the local data seeded the log (an upgrade, or a lost log)
	Discarded   bool   // the local store was stale below the log's purge and replaced
	ReplayFrom  uint64 // the first sequence replayed
	Replayed    int    // write-sets replayed
	ClaimSeq    uint64 // the sequence of this process's claim marker
	InPlace     bool   // the store opened on a standby's copy, still open (promoted in place)
	StartTook   time.Duration

	// Checkpoints.
	Checkpoints    int // taken by this process
	LastCheckpoint partition.CheckpointInfo
	LastAt         time.Time
	LastErr        string
	PurgedBelow    uint64
	// EraseScrubs counts the erases that reached the changelog and the
	// checkpoints (ScrubCopies), and LastScrub is the last one's cost.
	EraseScrubs int
	LastScrub   ScrubStatus
}

// ScrubStatus is what one scrub of the copies cost.
type ScrubStatus struct {
	Marker          uint64        // the erase marker's sequence
	Took            time.Duration // from the call to the end (the erase's result waits for it)
	WriterHeld      time.Duration // step 3, the only one on the writer
	BytesUploaded   uint64        // sent to the checkpoint bucket
	TablesCollected int           // table objects deleted (a sealed one by destroying its key)
	BytesCollected  uint64
	// TailWriteSets: the write-sets step 3 stored as a tail checkpoint
	// (0 when it saved whole, or found nothing committed since step 1).
	TailWriteSets int
}

// Changelog is the running changelog of a slot (the owner's), or the
// catch-up of a standby's copy (CatchUp).
type Changelog struct {
	cfg  Config
	log  *slog.Logger
	js   jetstream.JetStream
	cl   *partition.Changelog
	obs  jetstream.ObjectStore
	part int

	// FS is the filesystem the copy's Pebble opens on (nil: the OS's);
	// tests inject faults with it (Options.FS).
	FS vfs.FS
	// OnFatal receives a Pebble fatal error of a copy this changelog
	// opens, or is handed open (a standby's, promoted in place), until a
	// store opens on it (storage.OpenStoreOn takes them over). Like
	// Pebble's Fatalf it must not return. nil: the error panics the
	// process.
	OnFatal func(msg string)

	// standbys returns the applied sequences of the slot's tailing
	// standbys (dynamic mode; nil otherwise).
	standbys func() []uint64

	// run admits one checkpoint or copy scrub at a time; it is taken with
	// the caller's context (lock), so a scrub bounded to a minute never
	// waits out a scheduled checkpoint's ten (issue 29 item 5).
	run      chan struct{}
	tables   partition.TableDigests // digests of the open store's tables
	chunk    uint32                 // object chunk size (partition.ChunkSizeFor)
	staging  string                 // the data directory: checkpoints stage on its filesystem
	scrubbed uint64                 // the highest erase marker a finished scrub covered (under run)
	// inv is the checkpoint bucket as the last scrub or checkpoint left
	// it, when the bucket's stream stood at invAt (under run; inventory).
	// listings counts the whole listings inventory made.
	inv      partition.Listing
	invAt    partition.BucketState
	invOK    bool
	listings int
	// scrubStep and scrubbedHook are Options.CopyScrubStep and
	// Options.CopyScrubbed.
	scrubStep    func(step string)
	scrubbedHook func(ScrubStatus)
	// scrubFailed is told of each failed scrub of the copies (metrics).
	scrubFailed func()
	// beforeClaim, a test hook (nil in production), runs before each
	// claim attempt of a start.
	beforeClaim func(attempt int)

	mu     sync.Mutex // guards status
	status ChangelogStatus
	db     atomic.Pointer[pebble.DB]
	cron   *cron.Cron
	ctx    context.Context
	stop   context.CancelFunc
}

// ChangelogStatus returns the slot's changelog status (Mode "off"
// when --changelog off).
func (a *Slot) ChangelogStatus() ChangelogStatus {
	if a.changelog == nil {
		return ChangelogStatus{Mode: ChangelogOff}
	}
	a.changelog.mu.Lock()
	defer a.changelog.mu.Unlock()
	return a.changelog.status
}

// Checkpoint takes a checkpoint now (as the schedule does): tests, and an
// operator's "checkpoint before maintenance".
func (a *Slot) Checkpoint(ctx context.Context) (partition.CheckpointInfo, error) {
	if a.changelog == nil {
		return partition.CheckpointInfo{}, errors.New("--changelog off: no checkpoints")
	}
	return a.changelog.checkpoint(ctx)
}

// openChangelog opens the slot's changelog (OpenChangelog).
func (a *Slot) openChangelog(ctx context.Context) (*Changelog, error) {
	c, err := OpenChangelog(ctx, a.nc, a.cfg, a.log, a.standbyApplied, a.setPhase)
	if c != nil {
		c.FS = a.opts.FS
		if f := a.opts.OnCopyFatal; f != nil {
			c.OnFatal = func(msg string) {
				f(fmt.Errorf("%w: %w: the catch-up of slot %d's copy: %s", storage.ErrFatal, storage.ErrEngine, c.part, msg))
			}
		}
	}
	return c, err
}

// OpenChangelog opens the changelog stream of cfg's slot (a member's
// slot) and the checkpoint bucket, retrying while NATS is unreachable (an
// external cluster may start after the worker), and saying so through
// setPhase. standbys (nil: none) lists the applied sequences of the
// slot's tailing standbys. It returns nil, nil when ctx ends first.
func OpenChangelog(ctx context.Context, nc *nats.Conn, cfg Config, log *slog.Logger, standbys func() []uint64, setPhase func(string)) (*Changelog, error) {
	// 30 s: the bound of a request made without a deadline, each chunk
	// of an upload among them (partition.uploadContext).
	js, err := jetstream.New(nc, jetstream.WithDefaultTimeout(30*time.Second))
	if err != nil {
		return nil, fmt.Errorf("changelog: %w", err)
	}
	pc, cc := cfg.ChangelogConfig(), cfg.CheckpointConfig()
	// Short attempts: a JetStream cluster answers concurrent creates of one
	// stream (an owner and its standby starting at once) late or never
	// (nats-server#3677); the stream exists, and the retry binds it.
	delay := 200 * time.Millisecond
	for {
		octx, cancel := context.WithTimeout(ctx, 5*time.Second)
		cl, err := partition.Open(octx, js, pc)
		var obs jetstream.ObjectStore
		if err == nil {
			obs, err = partition.OpenCheckpoints(octx, js, cc)
		}
		cancel()
		if err == nil {
			c := &Changelog{cfg: cfg, log: log, js: js, cl: cl, obs: obs, part: pc.Partition, standbys: standbys,
				run: make(chan struct{}, 1), chunk: partition.ChunkSizeFor(nc.MaxPayload()), staging: cfg.DataDir}
			c.status = ChangelogStatus{Mode: ChangelogJetStream, Stream: cl.Config().StreamName(), Subject: cl.Config().Subject(),
				Bucket: cc.Bucket, Partition: pc.Partition}
			return c, nil
		}
		if ctx.Err() != nil {
			return nil, nil
		}
		log.Warn("opening the changelog failed; retrying", "stream", pc.StreamName(), "err", err, "in", delay)
		setPhase(fmt.Sprintf("changelog: opening %s and the bucket %s failed, retrying in %s: %v", pc.StreamName(), cc.Bucket, delay, err))
		select {
		case <-ctx.Done():
			return nil, nil
		case <-time.After(delay):
		}
		delay = min(2*delay, 10*time.Second)
	}
}

// logIdentity is the identity of the changelog stream as it exists now:
// its name and creation time (a stream deleted and created again is
// another log), with its first and last sequences.
func (c *Changelog) LogIdentity(ctx context.Context) (id string, first, last uint64, err error) {
	return LogIdentity(ctx, c.js, c.status.Stream)
}

// LogIdentity is the identity of the changelog stream named stream as it
// exists now (Changelog.LogIdentity), without opening it.
func LogIdentity(ctx context.Context, js jetstream.JetStream, stream string) (id string, first, last uint64, err error) {
	ctx, cancel := context.WithTimeout(ctx, startCallTimeout)
	defer cancel()
	s, err := js.Stream(ctx, stream)
	if err != nil {
		return "", 0, 0, fmt.Errorf("changelog %s: %w", stream, err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		return "", 0, 0, fmt.Errorf("changelog %s: %w", stream, err)
	}
	return stream + "@" + info.Created.UTC().Format(time.RFC3339Nano), info.State.FirstSeq, info.State.LastSeq, nil
}

// errChangelogConflict: the local store and the changelog disagree in a
// way only an operator can settle. The worker exits (not a usage error).
var errChangelogConflict = errors.New("changelog conflict")

// prepare brings the Pebble in dir up to the changelog's end before the
// store opens on it, and fences any earlier writer (see the file comment).
// It returns that Pebble, open, for the store (storage.OpenStoreOn): no
// close and reopen between the catch-up and the serving. kept, when not
// nil, is the slot's Pebble already open (a standby promoted in place):
// it is caught up from where it stands. A Pebble fatal error here goes to
// OnFatal (no store to record it yet; nil: it panics, and the
// supervisor's restart tries again).
func (c *Changelog) prepare(ctx context.Context, dir string, sizes storage.Sizes, kept *storage.PebbleEngine) (*storage.PebbleEngine, error) {
	start := time.Now()
	pe, err := c.catchUp(ctx, dir, sizes, false, kept)
	if err != nil {
		return nil, err
	}
	seq, err := c.claim(ctx, pe.DB)
	if err != nil {
		_ = pe.Close()
		return nil, err
	}
	c.status.ClaimSeq = seq
	c.status.StartTook = time.Since(start)
	c.status.InPlace = kept != nil
	c.log.Info("changelog: caught up", "stream", c.status.Stream, "restored", c.status.Restored, "restored_seq", c.status.RestoredSeq,
		"seeded", c.status.Seeded, "replayed", c.status.Replayed, "claim_seq", seq, "in_place", kept != nil, "took", c.status.StartTook)
	return pe, nil
}

// claimAttempts bounds the claims of one start. A claim is fenced when
// the previous writer appended after this start read the log's end: an
// owner whose lease lapsed while it still ran (cut off from the KV, or
// paused) and that saved a feed cursor or finished a group just then. Its
// write-sets are in the log, acknowledged: the copy reads on to the new
// end and claims again, and the previous writer's next append is the one
// refused. Only a writer that keeps appending through every attempt makes
// the start fail (fenced; the host starts the slot again).
const claimAttempts = 5

// claim appends the claim, a write-set of log data only (no key), so
// that a previous writer still running (a zombie) is fenced at once
// rather than at our first request, and applies it to db.
func (c *Changelog) claim(ctx context.Context, db *pebble.DB) (uint64, error) {
	host, _ := os.Hostname()
	for attempt := 1; ; attempt++ {
		if c.beforeClaim != nil {
			c.beforeClaim(attempt)
		}
		b := db.NewBatch()
		_ = b.LogData([]byte(fmt.Sprintf("telha claim host=%s pid=%d at=%s", host, os.Getpid(), time.Now().UTC().Format(time.RFC3339Nano))), nil)
		ws := bytes.Clone(b.Repr())
		_ = b.Close()
		seq, err := c.cl.Append(ctx, ws)
		if err == nil {
			if err := partition.ApplyTo(db, seq, ws, true); err != nil {
				return 0, fmt.Errorf("changelog: claim: %w", err)
			}
			return seq, nil
		}
		if !errors.Is(err, partition.ErrFenced) || attempt == claimAttempts || ctx.Err() != nil {
			return 0, fmt.Errorf("%w: changelog: claim (attempt %d): %w", storage.ErrFatal, attempt, err)
		}
		c.log.Warn("changelog: the claim was fenced by the previous writer's append; reading on to the log's new end and claiming again",
			"stream", c.status.Stream, "attempt", attempt, "err", err)
		// A fenced partition.Changelog is done (its error is terminal):
		// a new one reads the log's end as its expectation.
		octx, cancel := context.WithTimeout(ctx, startCallTimeout)
		cl, err := partition.Open(octx, c.js, c.cl.Config())
		cancel()
		if err != nil {
			return 0, fmt.Errorf("changelog: reopening after a fenced claim: %w", err)
		}
		c.cl = cl
		if err := c.replayOnto(ctx, db); err != nil {
			return 0, err
		}
	}
}

// ErrStandbySeed: a standby found a log to seed; only an owner seeds.
var ErrStandbySeed = errors.New("changelog: a standby does not seed a changelog (its owner does)")

// CatchUp is prepare up to the claim: it returns the Pebble in dir, open,
// at the changelog's end (a standby goes on with Tail from there). A
// standby never seeds the log from its local data.
func (c *Changelog) CatchUp(ctx context.Context, dir string, sizes storage.Sizes, standby bool) (*storage.PebbleEngine, error) {
	return c.catchUp(ctx, dir, sizes, standby, nil)
}

// catchUp is CatchUp, starting from kept when it is not nil (the Pebble
// of dir, already open: it is inspected as if just opened, and closed on
// an error like one it opened).
func (c *Changelog) catchUp(ctx context.Context, dir string, sizes storage.Sizes, standby bool, kept *storage.PebbleEngine) (*storage.PebbleEngine, error) {
	// A Pebble that raised a fatal error is never closed (its goroutine
	// is parked inside it, holding its locks: a Close would wait for good)
	// and never used again.
	var broke atomic.Bool
	onFatal := c.OnFatal
	if f := c.OnFatal; f != nil {
		onFatal = func(msg string) {
			broke.Store(true)
			f(msg)
		}
	}
	var pe *storage.PebbleEngine
	closeDB := func() error {
		if pe == nil || broke.Load() {
			pe = nil
			return nil
		}
		err := pe.Close()
		pe = nil
		return err
	}
	pe = kept
	if kept != nil && onFatal != nil {
		// A standby's copy promoted in place: its fatal errors were its
		// tail's, whose run has ended; they are this catch-up's now.
		kept.SetFatal(onFatal)
	}
	defer closeDB()
	if !bytes.Equal(storage.AppliedSeqKey(), partition.AppliedKey()) {
		return nil, fmt.Errorf("changelog: storage writes the applied sequence at %x, partition reads it at %x", storage.AppliedSeqKey(), partition.AppliedKey())
	}
	id, first, last, err := c.LogIdentity(ctx)
	if err != nil {
		return nil, err
	}
	c.status.LogID = id
	// A save or a restore cut short by a crash leaves a whole copy of the
	// store in a staging directory; no erase would ever reach it.
	if removed, err := partition.RemoveStaging(c.staging); err != nil {
		return nil, fmt.Errorf("changelog: removing staging directories in %s: %w", c.staging, err)
	} else if len(removed) > 0 {
		c.log.Info("changelog: removed staging directories a crash left", "dir", c.staging, "removed", removed)
	}
	restored := false
	for {
		if pe == nil {
			// The slot's logger, and no fatal handler yet: the store that
			// opens on this Pebble takes its fatal errors (OpenStoreOn).
			if pe, err = storage.OpenPebble(dir, c.FS, c.log, onFatal, nil, sizes); err != nil {
				return nil, err
			}
		}
		db := pe.DB
		empty, err := IsEmpty(db)
		if err != nil {
			return nil, err
		}
		applied, err := partition.AppliedSeq(db)
		if err != nil {
			return nil, err
		}
		lid, attached, err := partition.LogID(db)
		if err != nil {
			return nil, err
		}
		stale := attached && lid == id && first > 1 && applied+1 < first
		if (empty || stale) && !restored {
			if stale {
				c.log.Info("changelog: the local store is older than the changelog's purge; replacing it from the newest checkpoint",
					"applied", applied, "log_first", first)
				c.status.Discarded = true
			}
			if err := closeDB(); err != nil {
				return nil, err
			}
			var seq uint64
			found, err := c.anyCheckpoint(ctx)
			switch {
			case err != nil:
			case found:
				seq, err = c.restore(ctx, dir)
			default:
				err = partition.ErrNoCheckpoint
			}
			switch {
			case errors.Is(err, partition.ErrNoCheckpoint) && empty:
				// Nothing to restore: the whole log replays onto an empty store.
			case errors.Is(err, partition.ErrNoCheckpoint):
				return nil, fmt.Errorf("%w: %s has applied sequence %d, the changelog %s starts at %d, and %s holds no checkpoint to bridge the gap",
					errChangelogConflict, dir, applied, c.status.Stream, first, c.status.Bucket)
			case err != nil:
				return nil, err
			default:
				c.status.Restored, c.status.RestoredSeq = true, seq
			}
			restored = true
			continue // inspect what the restore left
		}
		switch {
		case empty:
			if first > 1 {
				return nil, fmt.Errorf("%w: the changelog %s starts at sequence %d (purged below) and %s holds no checkpoint: this replica's data cannot be rebuilt",
					errChangelogConflict, c.status.Stream, first, c.status.Bucket)
			}
			if err := partition.AttachLog(db, id, 0); err != nil {
				return nil, err
			}
		case !attached && last == 0, attached && lid != id && last == 0, attached && lid == id && last == 0 && applied == 0:
			// An upgrade (data written with --changelog off), or a store whose
			// log is gone (deleted, another N, a NATS without its data): the
			// local data is the only copy, so it seeds the new log. The third
			// case is a seed interrupted after AttachLog (a finished start
			// always leaves applied >= 1 with its claim): its checkpoint at
			// sequence 0 may be missing, so the seed runs again (its steps
			// are idempotent).
			c.log.Info("changelog: seeding the changelog from the local store (checkpoint at sequence 0)",
				"stream", c.status.Stream, "previous_log", lid)
			if standby {
				return nil, fmt.Errorf("%w: %s holds data and the changelog %s is empty", ErrStandbySeed, dir, c.status.Stream)
			}
			if err := partition.AttachLog(db, id, 0); err != nil {
				return nil, err
			}
			// Checkpoints of a previous log count in its sequences, not the
			// new one's: one of them restored (it would be the newest) would
			// skip the new log's first write-sets.
			if err := c.dropCheckpoints(ctx); err != nil {
				return nil, err
			}
			info, err := partition.SaveCheckpointWith(ctx, c.obs, c.part, db, c.saveOptions())
			if err != nil {
				return nil, fmt.Errorf("changelog: seed checkpoint: %w", err)
			}
			c.status.Seeded = true
			c.log.Info("changelog: seeded", "checkpoint", info.Name, "bytes", info.Size)
		case !attached:
			return nil, fmt.Errorf("%w: %s holds data that is in no changelog (written with --changelog off?) while the changelog %s already holds %d write-sets; "+
				"to keep the local data, delete the stream %s (and the checkpoints partition-%d/ in %s) so it seeds a new one; to keep the changelog's, move %s aside",
				errChangelogConflict, dir, c.status.Stream, last, c.status.Stream, c.part, c.status.Bucket, dir)
		case lid != id:
			return nil, fmt.Errorf("%w: %s follows the changelog %s, but NATS holds %s with %d write-sets; "+
				"to keep the local data, delete the stream %s so it seeds a new one; to keep the changelog's, move %s aside",
				errChangelogConflict, dir, lid, id, last, c.status.Stream, dir)
		case applied > last:
			return nil, fmt.Errorf("%w: %s has applied sequence %d but the changelog %s ends at %d: the changelog lost acknowledged write-sets "+
				"(a NATS server lost its unsynced tail?); this replica refuses to fork it. Move %s aside to serve the changelog's state, "+
				"or delete the stream to re-seed it from this disk",
				errChangelogConflict, dir, applied, c.status.Stream, last, dir)
		case first > 1 && applied+1 < first:
			return nil, fmt.Errorf("%w: %s has applied sequence %d, the changelog %s starts at %d, and the newest checkpoint does not bridge the gap",
				errChangelogConflict, dir, applied, c.status.Stream, first)
		}
		if err := c.replayOnto(ctx, db); err != nil {
			return nil, err
		}
		out := pe
		pe = nil // not closed by the defer: the caller's
		return out, nil
	}
}

// replayOnto applies to db every write-set of the changelog after db's
// applied sequence, up to the log's end now, and compacts the ranges of
// the erases among them before the copy serves or tails: a catch-up
// scrubs like the tail (issue 29 item 4).
func (c *Changelog) replayOnto(ctx context.Context, db *pebble.DB) error {
	applied, err := partition.AppliedSeq(db)
	if err != nil {
		return err
	}
	if c.status.ReplayFrom == 0 {
		c.status.ReplayFrom = applied + 1
	}
	err = c.cl.Replay(ctx, applied+1, func(seq uint64, ws []byte) error {
		c.status.Replayed++
		return partition.ApplyTo(db, seq, ws, false)
	})
	if err != nil {
		return fmt.Errorf("changelog: replay from %d: %w", applied+1, err)
	}
	if n, err := partition.ScrubPending(ctx, db); err != nil {
		return fmt.Errorf("changelog: an erase's compaction after the replay: %w", err)
	} else if n > 0 {
		c.log.Info("changelog: compacted the ranges of erases the replay applied", "erases", n)
	}
	return nil
}

// startCallTimeout bounds one JetStream call of a start (catchUp): a
// slot's context has no deadline, and a call that is never answered would
// hold its slot's start, silently, for good.
const startCallTimeout = 5 * time.Second

// anyCheckpoint reports whether the bucket holds a checkpoint of this
// slot's slice, retrying (and saying why) until ctx ends. Each listing
// is bounded: the client's List of an empty bucket waits for its context
// when its first read of the bucket goes unanswered (a bucket just
// created, whose direct gets have no responder yet: "no responders"), and
// a start's context has no deadline.
func (c *Changelog) anyCheckpoint(ctx context.Context) (bool, error) {
	for delay := 200 * time.Millisecond; ; delay = min(2*delay, 5*time.Second) {
		lctx, cancel := context.WithTimeout(ctx, startCallTimeout)
		cps, err := partition.ListCheckpoints(lctx, c.obs, c.part)
		cancel()
		if err == nil {
			return len(cps) > 0, nil
		}
		if ctx.Err() != nil {
			return false, fmt.Errorf("changelog: listing the checkpoints in %s: %w", c.status.Bucket, ctx.Err())
		}
		c.log.Warn("changelog: listing the checkpoints failed; retrying", "bucket", c.status.Bucket, "partition", c.part, "bound", startCallTimeout, "err", err, "in", delay)
		select {
		case <-ctx.Done():
			return false, fmt.Errorf("changelog: listing the checkpoints in %s: %w", c.status.Bucket, ctx.Err())
		case <-time.After(delay):
		}
	}
}

// restore replaces dir by the newest checkpoint.
func (c *Changelog) restore(ctx context.Context, dir string) (uint64, error) {
	cps, err := partition.ListCheckpoints(ctx, c.obs, c.part)
	if err != nil {
		return 0, err
	}
	if len(cps) == 0 {
		return 0, partition.ErrNoCheckpoint
	}
	if err := os.RemoveAll(dir); err != nil {
		return 0, fmt.Errorf("changelog: clear %s for the restore: %w", dir, err)
	}
	t0 := time.Now()
	r, err := partition.RestoreNewest(ctx, c.obs, c.part, dir)
	if err != nil {
		return 0, err
	}
	for _, err := range r.Skipped {
		c.log.Warn("changelog: a newer checkpoint did not restore and was passed over; if the replay then finds the changelog purged above the one restored, this is why",
			"restored", r.Name, "err", err)
	}
	c.log.Info("changelog: restored a checkpoint", "seq", r.Seq, "name", r.Name, "took", time.Since(t0))
	return r.Seq, nil
}

// dropCheckpoints deletes every checkpoint of this slot's slice.
func (c *Changelog) dropCheckpoints(ctx context.Context) error {
	cps, err := partition.ListCheckpoints(ctx, c.obs, c.part)
	if err != nil {
		return err
	}
	for _, cp := range cps {
		c.log.Warn("changelog: deleting a checkpoint of a previous changelog", "name", cp.Name, "seq", cp.Seq)
		if err := c.deleteCheckpoint(ctx, cp.Name); err != nil {
			return fmt.Errorf("changelog: delete %s: %w", cp.Name, err)
		}
	}
	return nil
}

// deleteCheckpoint deletes a checkpoint so that its bytes leave the NATS
// server's files too (partition.DeleteCheckpoint): a checkpoint pruned
// before an erase would otherwise keep the erased data in the bucket's
// block files.
func (c *Changelog) deleteCheckpoint(ctx context.Context, name string) error {
	return partition.DeleteCheckpoint(ctx, c.js, c.obs, c.status.Bucket, name)
}

func IsEmpty(db *pebble.DB) (bool, error) {
	it, err := db.NewIter(nil)
	if err != nil {
		return false, err
	}
	ok := it.First()
	return !ok, errors.Join(it.Error(), it.Close())
}

// start runs checkpoints of db on the schedule until stopCheckpoints.
func (c *Changelog) start(db *pebble.DB) error {
	c.tables.Reset() // another Pebble: its table names say nothing of the last one's
	c.db.Store(db)
	sched, err := reaper.ParseSchedule(c.cfg.CheckpointSchedule)
	if err != nil {
		return err
	}
	c.ctx, c.stop = context.WithCancel(context.Background())
	c.cron = cron.New(cron.WithLocation(time.UTC))
	var running atomic.Bool
	c.cron.Schedule(sched, cron.FuncJob(func() {
		// One at a time: a tick while the last checkpoint still runs (a
		// slow NATS) is skipped, not queued behind its lock.
		if !running.CompareAndSwap(false, true) {
			c.log.Debug("changelog: the last checkpoint still runs; this tick is skipped")
			return
		}
		defer running.Store(false)
		ctx, cancel := context.WithTimeout(c.ctx, 10*time.Minute)
		defer cancel()
		_, _ = c.checkpoint(ctx)
	}))
	c.cron.Start()
	return nil
}

// stopCheckpoints stops the schedule; wait: also wait for a checkpoint
// that is running (not after a fatal storage error: it may never end).
func (c *Changelog) stopCheckpoints(wait bool) {
	if c.cron == nil {
		return
	}
	c.stop()
	done := c.cron.Stop().Done()
	if wait {
		<-done
	}
}

// lock takes c.run, or fails when ctx ends first.
func (c *Changelog) lock(ctx context.Context) error {
	select {
	case c.run <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (c *Changelog) unlock() { <-c.run }

// saveOptions are the options of every save of this changelog's store.
func (c *Changelog) saveOptions() partition.SaveOptions {
	return partition.SaveOptions{Staging: c.staging, Tables: &c.tables, ChunkSize: c.chunk}
}

// pacedSaveOptions is saveOptions for a save beside a serving slot (a
// scheduled checkpoint, an erase's first save): paced at
// --checkpoint-upload-rate.
func (c *Changelog) pacedSaveOptions() partition.SaveOptions {
	o := c.saveOptions()
	o.Rate = c.cfg.CheckpointUploadRate
	return o
}

// checkpoint saves one checkpoint, prunes to --checkpoints-keep, purges
// the changelog below the oldest kept and below what each tailing standby
// still needs (dynamic mode), and collects the tables no kept checkpoint
// holds.
func (c *Changelog) checkpoint(ctx context.Context) (partition.CheckpointInfo, error) {
	// The standbys' positions are read before the lock: the member that
	// reports them takes its own lock, and may hold it while it reads this
	// changelog's status. Positions read earlier are only lower (safer).
	var standbys []uint64
	if c.standbys != nil {
		standbys = c.standbys()
	}
	if err := c.lock(ctx); err != nil {
		return partition.CheckpointInfo{}, fmt.Errorf("changelog: checkpoint: waiting for the one in progress: %w", err)
	}
	defer c.unlock()
	db := c.db.Load()
	if db == nil {
		return partition.CheckpointInfo{}, errors.New("changelog: store not open")
	}
	t0 := time.Now()
	// The bucket as the last scrub or checkpoint left it, brought up to
	// date (or listed): the save, the prune and the collection derive
	// what they need from it (each listed the bucket before, 0.5-4 s at a
	// gigabyte on three servers), and it is kept for the next.
	inv, err := c.inventory(ctx)
	var info partition.CheckpointInfo
	if err == nil {
		err = c.owned(ctx, "saving a checkpoint")
	}
	if err == nil {
		opts := c.pacedSaveOptions()
		opts.Stored = inv.Tables(c.part)
		info, err = partition.SaveCheckpointWith(ctx, c.obs, c.part, db, opts)
	}
	var floor uint64
	var collected int
	if err == nil {
		inv = inv.With(info)
		err = c.owned(ctx, "pruning the checkpoints")
	}
	if err == nil {
		var need uint64
		var pruned []partition.CheckpointInfo
		need, pruned, err = partition.PruneIn(ctx, inv.Checkpoints(c.part), c.part, c.cfg.CheckpointsKeep, c.deleteCheckpoint)
		for _, cp := range pruned {
			inv = inv.Without(partition.DeletedNames(cp)...)
		}
		if err == nil {
			floor = partition.PurgeFloor(need, standbys...)
			err = c.cl.PurgeBelow(ctx, floor)
		}
		if err == nil {
			err = c.owned(ctx, "collecting the tables")
		}
		if err == nil {
			var gone []string
			gone, _, err = partition.CollectTablesIn(ctx, c.js, c.obs, c.status.Bucket, c.part, inv.Checkpoints(c.part), inv, info.Stored)
			collected = len(gone)
			inv = inv.Without(gone...)
		}
		if err == nil {
			c.keepInventory(ctx, inv)
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.status.LastAt = time.Now()
	if err != nil {
		c.status.LastErr = err.Error()
		c.log.Warn("changelog: checkpoint failed (the next one retries; the changelog is not purged meanwhile)", "err", err)
		return info, err
	}
	c.status.Checkpoints++
	c.status.LastCheckpoint, c.status.LastErr, c.status.PurgedBelow = info, "", floor
	c.log.Info("changelog: checkpoint", "name", info.Name, "seq", info.Seq, "bytes", info.Size, "uploaded_bytes", info.BytesUploaded,
		"tables", info.Tables, "tables_uploaded", info.TablesUploaded, "tables_collected", collected, "purged_below", floor, "took", time.Since(t0))
	return info, nil
}

// copyScrubTimeout bounds one scrub of the copies. The writer is not held
// while it runs (only its last step holds it), but the erase's result
// waits for it: a NATS that does not answer fails the erase's attempt
// (retried after a backoff).
const copyScrubTimeout = 2 * time.Minute

// standbyCatchUpWait bounds how long a scrub waits for the standbys to
// apply its checkpoint's sequence before it purges the changelog anyway
// (a standby overtaken by the purge catches up from that checkpoint).
const standbyCatchUpWait = 10 * time.Second

// ScrubCopies makes an erase reach the changelog, the checkpoints and the
// standbys (storage.CopyScrubber; issue 29). The store calls it after its
// own scrub and after committing the erase's marker at sequence marker;
// the writer is free, and other groups commit while it runs:
//
//	1 beside the writer  checkpoint the store (incremental: the tables
//	                     written since the last one, among them the erase's
//	                     compaction outputs); its sequence C >= marker
//	2 beside the writer  wait (bounded) until every standby has applied C
//	3 on the writer      the log stands still at L >= C: if L > C, store
//	                     what the groups of steps 1-2 wrote (C, L] as a
//	                     tail checkpoint of C (partition.SaveTail: the
//	                     write-sets recorded as they were appended, no
//	                     table linked; a whole save when the tail cannot
//	                     be: one holds an erase marker, the recording
//	                     outgrew its bound, the read-back failed), then
//	                     purge the changelog whole,
//	                     below L + 1 (the server deletes every block file:
//	                     a purge inside a block would keep the purged
//	                     messages' bytes, erase.go)
//	4 beside the writer  delete every older checkpoint (but the tail's
//	                     base) and collect the
//	                     tables no kept checkpoint holds, each overwritten
//	                     in place by the server (partition.DeleteObject)
//
// Batched: a scrub that finishes covers every marker below its purge, so
// an erase whose marker a later scrub already covered returns at once.
// The older checkpoints are deleted only once the new one is stored, so a
// restore at any point finds a clean one; the changelog is purged only
// once a checkpoint at its last sequence is stored.
func (c *Changelog) ScrubCopies(ctx context.Context, marker uint64, onWriter func(context.Context, func() error) error) (err error) {
	ctx, cancel := context.WithTimeout(ctx, copyScrubTimeout)
	defer cancel()
	// Every failure counts (telha_erase_scrub_failures_total), a wait for
	// the checkpoint in progress that ran out too (a black-box probe saw
	// four such failures in 10 minutes counted as none).
	defer func() {
		if err != nil {
			c.mu.Lock()
			c.status.LastErr = err.Error()
			c.mu.Unlock()
			if c.scrubFailed != nil {
				c.scrubFailed()
			}
			c.log.Error("changelog: an erase could not reach the changelog or the checkpoints: they may still hold its data; "+
				"its result waits, and it is retried after a backoff", "stream", c.status.Stream, "bucket", c.status.Bucket, "err", err)
		}
	}()
	if err := c.lock(ctx); err != nil {
		return fmt.Errorf("changelog: an erase's scrub waited for the checkpoint in progress: %w", err)
	}
	defer c.unlock()
	if c.scrubbed >= marker {
		return nil
	}
	t0 := time.Now()
	db := c.db.Load()
	if db == nil {
		return errors.New("changelog: store not open")
	}
	// One view of the bucket for the whole scrub: the lock is held, so
	// nothing else of this slot saves or deletes until it ends, and a
	// listing reads every block of the bucket's stream that holds a meta
	// message (seconds at a gigabyte of tables), so the view kept from
	// the last scrub or checkpoint is brought up to date instead.
	listing, err := c.inventory(ctx)
	if err != nil {
		return fmt.Errorf("changelog: an erase's scrub: %w", err)
	}
	tListed := time.Since(t0)
	// A former owner paused since before the erase would upload what it
	// erased again; its successor would delete it only at its own next
	// checkpoint or scrub.
	if err := c.owned(ctx, "an erase's checkpoint"); err != nil {
		return err
	}
	// Every write-set appended from now on is kept for step 3's tail; the
	// ones appended before and not yet in the checkpoint are read back
	// from the log beside the writer (readTail).
	rec := c.cl.Record(maxTailBytes)
	defer c.cl.StopRecording(rec)
	opts := c.pacedSaveOptions()
	opts.Stored = listing.Tables(c.part)
	first, err := partition.SaveCheckpointWith(ctx, c.obs, c.part, db, opts)
	if err != nil {
		return fmt.Errorf("changelog: checkpoint after an erase: %w", err)
	}
	if first.Seq < marker {
		return fmt.Errorf("changelog: the checkpoint after an erase reflects sequence %d, below the erase's marker %d", first.Seq, marker)
	}
	c.step("checkpointed")
	tSaved := time.Since(t0)
	c.cl.Trim(rec, first.Seq) // in the checkpoint: not the tail's
	c.waitStandbys(ctx, first.Seq)
	before, readBack, err := c.readTail(ctx, first.Seq, rec.From())
	if err != nil {
		return err
	}
	// A former owner waking from a pause stops here, before it purges or
	// deletes anything by its stale view (owned).
	if err := c.owned(ctx, "an erase's purge of the changelog"); err != nil {
		return err
	}
	final, purged := first, uint64(0)
	var held time.Duration
	err = onWriter(ctx, func() error {
		h0 := time.Now()
		defer func() { held = time.Since(h0) }()
		last := c.cl.Last()
		// Nothing commits while the writer is held: a healthy store
		// reflects exactly the log's last sequence, and the recording holds
		// every write-set after rec.From() through it. A store stopped by a
		// failed append may not (the log moved, the store did not): then
		// nothing is saved or purged, and the erase waits for the slot's
		// next owner.
		if applied, err := partition.AppliedSeq(db); err != nil || applied != last {
			return fmt.Errorf("changelog: the store reflects sequence %d, the changelog ends at %d (%v): not saved, not purged", applied, last, err)
		}
		after, recorded := c.cl.Recorded(rec)
		c.cl.StopRecording(rec)
		if last == first.Seq {
			return c.purgeAll(ctx, last, &purged)
		}
		if recorded && readBack {
			tail, err := partition.SaveTail(ctx, c.obs, c.part, first, last, append(before, after...), c.chunk)
			if err == nil {
				final = tail
				return c.purgeAll(ctx, last, &purged)
			}
			if !errors.Is(err, partition.ErrNoTail) {
				return fmt.Errorf("changelog: tail checkpoint after an erase: %w", err)
			}
			c.log.Info("changelog: an erase's last save is whole", "reason", err)
		}
		opts := c.saveOptions()
		opts.Seq = last
		opts.Stored = first.Stored // the lock is held since: nothing was deleted
		if final, err = partition.SaveCheckpointWith(ctx, c.obs, c.part, db, opts); err != nil {
			return fmt.Errorf("changelog: checkpoint after an erase: %w", err)
		}
		return c.purgeAll(ctx, last, &purged)
	})
	if err != nil {
		return err
	}
	c.step("purged")
	tPurged := time.Since(t0)
	// The checkpoints now: those listed, the first save and the last.
	var doomed, kept []partition.CheckpointInfo
	seen := map[string]bool{} // first and final may be one, or listed
	for _, cp := range append(listing.Checkpoints(c.part), first, final) {
		switch {
		case seen[cp.Name]:
		case cp.Seq >= final.Seq || cp.Name == final.Base:
			kept = append(kept, cp) // the new checkpoint, or the base of its tail
		default:
			doomed = append(doomed, cp)
		}
		seen[cp.Name] = true
	}
	if err := c.owned(ctx, "an erase's deletes of the older checkpoints"); err != nil {
		return err
	}
	if err := partition.DeleteEach(ctx, len(doomed), func(ctx context.Context, i int) error {
		if err := c.deleteCheckpoint(ctx, doomed[i].Name); err != nil {
			return fmt.Errorf("changelog: delete checkpoint %s after an erase: %w", doomed[i].Name, err)
		}
		return nil
	}); err != nil {
		return err
	}
	deleted := len(doomed)
	stored := first.Stored
	if final.Stored != nil {
		stored = final.Stored // a last save that was whole uploaded more
	}
	if err := c.owned(ctx, "an erase's collection of the tables"); err != nil {
		return err
	}
	gone, collectedBytes, err := partition.CollectTablesIn(ctx, c.js, c.obs, c.status.Bucket, c.part, kept, listing, stored)
	if err != nil {
		return fmt.Errorf("changelog: collect tables after an erase: %w", err)
	}
	collected := len(gone)
	inv := listing.With(first).With(final).Without(gone...)
	for _, cp := range doomed {
		inv = inv.Without(partition.DeletedNames(cp)...)
	}
	c.keepInventory(ctx, inv)
	c.scrubbed = purged - 1
	c.mu.Lock()
	c.status.Checkpoints++
	c.status.LastCheckpoint, c.status.LastAt, c.status.LastErr, c.status.PurgedBelow = final, time.Now(), "", purged
	c.status.EraseScrubs++
	c.status.LastScrub = ScrubStatus{Marker: marker, Took: time.Since(t0), WriterHeld: held,
		BytesUploaded: first.BytesUploaded + ifNew(final, first).BytesUploaded, TablesCollected: collected, BytesCollected: collectedBytes,
		TailWriteSets: final.TailWriteSets}
	last := c.status.LastScrub
	c.mu.Unlock()
	if c.scrubbedHook != nil {
		c.scrubbedHook(last)
	}
	c.log.Info("changelog: an erase reached the changelog and the checkpoints", "checkpoint", final.Name, "seq", final.Seq,
		"uploaded_bytes", first.BytesUploaded+ifNew(final, first).BytesUploaded, "purged_below", purged, "checkpoints_deleted", deleted,
		"tables_collected", collected, "bytes_collected", collectedBytes, "tail_write_sets", final.TailWriteSets,
		"writer_held", held, "took", time.Since(t0),
		"took_list", tListed, "took_save", tSaved-tListed, "took_to_purge", tPurged-tSaved, "took_collect", time.Since(t0)-tPurged)
	return nil
}

// owned fails unless this slot is still its changelog's writer (no other
// writer has appended since its last append: partition.Changelog.Owned).
// A scrub or a checkpoint asks it before it saves and before each step
// that deletes from the bucket or purges the changelog: a former owner
// paused since before an erase would upload the erased data again, and
// one waking from a pause inside one would delete by its stale view of
// the bucket the checkpoints and tables its successor's newer
// checkpoints name and the data keys of the tables its successor stored
// since (DECISIONS 96). The answer holds when the stream gave it: the
// window left is the one step.
func (c *Changelog) owned(ctx context.Context, before string) error {
	if err := c.cl.Owned(ctx); err != nil {
		return fmt.Errorf("changelog: not sure this slot still owns its changelog, so nothing is stored or deleted (before %s): %w", before, err)
	}
	return nil
}

// inventory returns a listing of the checkpoint bucket as it is now (run
// held): the one the last scrub or checkpoint of this changelog left, as
// it is when the bucket's stream has had no message since (one stream
// info), brought up to date from the meta messages stored since when it
// has (partition.ListSince: another slot of the bucket, a former owner
// waking from a pause, an operator), or a new listing when none is kept,
// the stream was made again, or that read failed. Either way the one kept
// is dropped until the scrub or checkpoint that uses it ends well
// (keepInventory).
func (c *Changelog) inventory(ctx context.Context) (partition.Listing, error) {
	inv, ok := c.inv, c.invOK
	c.inv, c.invOK = nil, false
	now, err := partition.BucketStateOf(ctx, c.js, c.status.Bucket)
	if err != nil {
		return nil, err
	}
	if ok && now.Created.Equal(c.invAt.Created) {
		if now.LastSeq == c.invAt.LastSeq {
			return inv, nil
		}
		// Reading the blocks written since costs about what they hold
		// (0.3-0.5 s after a scrub's 30 MB at R3 1 GB, seconds when
		// cold): a lone slot's own writes are not read back.
		l, err := partition.ListSince(ctx, c.js, c.status.Bucket, inv, c.invAt.LastSeq)
		if err == nil {
			return l, nil
		}
		c.log.Info("changelog: the kept listing of the checkpoint bucket could not be brought up to date; listing it whole", "bucket", c.status.Bucket, "err", err)
	}
	c.listings++
	return partition.List(ctx, c.obs)
}

// keepInventory keeps inv, the bucket as this changelog's last scrub or
// checkpoint left it, for the next, with where the bucket's stream stands
// now. Whatever another writer stores after that moves the sequence, and
// the next reads it (inventory); a write landing between this one's last
// delete and this read would go unseen (a slot's owner is the only writer
// of its partition's objects; scrubs and checkpoints run under one lock,
// and a former owner stops before it deletes: owned).
func (c *Changelog) keepInventory(ctx context.Context, inv partition.Listing) {
	now, err := partition.BucketStateOf(ctx, c.js, c.status.Bucket)
	if err != nil {
		return // the next scrub lists
	}
	c.inv, c.invAt, c.invOK = inv, now, true
}

// maxTailBytes bounds what an erase's scrub keeps of the write-sets
// appended while it runs (the tail of step 3); past it the last save is
// whole.
const maxTailBytes = 64 << 20

// readTail returns the whole write-sets of the log after seq through
// from (those committed before the recording began and not in the
// checkpoint at seq), read back beside the writer. ok is false (and the
// error nil) when they cannot be read: the last save is then whole.
func (c *Changelog) readTail(ctx context.Context, seq, from uint64) (_ []partition.TailEntry, ok bool, _ error) {
	var out []partition.TailEntry
	if from <= seq {
		return nil, true, nil
	}
	err := c.cl.ReadRange(ctx, seq+1, from, func(s uint64, ws []byte) error {
		out = append(out, partition.TailEntry{Seq: s, WriteSet: bytes.Clone(ws)})
		return nil
	})
	if err != nil {
		if ctx.Err() != nil {
			return nil, false, ctx.Err()
		}
		c.log.Warn("changelog: an erase's scrub could not read back what committed before its checkpoint; its last save is whole", "err", err)
		return nil, false, nil
	}
	return out, true, nil
}

// purgeAll purges the changelog whole, below last + 1 (on the writer).
func (c *Changelog) purgeAll(ctx context.Context, last uint64, purged *uint64) error {
	if err := c.cl.PurgeBelow(ctx, last+1); err != nil {
		return fmt.Errorf("changelog: purge after an erase: %w", err)
	}
	*purged = last + 1
	return nil
}

func (c *Changelog) step(name string) {
	if c.scrubStep != nil {
		c.scrubStep(name)
	}
}

// ifNew returns b when it is another save than a, and the zero info when
// it is the same one (step 3 saved nothing new).
func ifNew(b, a partition.CheckpointInfo) partition.CheckpointInfo {
	if b.Name == a.Name {
		return partition.CheckpointInfo{}
	}
	return b
}

// waitStandbys waits, bounded by standbyCatchUpWait, until every ready
// standby of the slot reports an applied sequence of at least seq.
func (c *Changelog) waitStandbys(ctx context.Context, seq uint64) {
	if c.standbys == nil {
		return
	}
	deadline := time.Now().Add(standbyCatchUpWait)
	for {
		behind := false
		for _, a := range c.standbys() {
			if a < seq {
				behind = true
			}
		}
		if !behind {
			return
		}
		if time.Now().After(deadline) {
			c.log.Warn("changelog: a standby is behind an erase's checkpoint; the purge goes on and that standby catches up from the checkpoint",
				"seq", seq, "waited", standbyCatchUpWait)
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Log is the changelog stream the slot appends to (or a standby tails).
func (c *Changelog) Log() *partition.Changelog { return c.cl }

// feedOwned is the change feed's ownership check (queue.FeedHooks.Owned):
// no other writer may have appended to the changelog since this slot's
// writer (partition.Changelog.Owned). A fenced answer
// stops st as a fenced append would (the slot ends, its host decides
// whether to start it again), rather than leave a zombie whose feed skips
// rounds until a request of its own reaches the changelog.
func (c *Changelog) feedOwned(st *storage.Store) func(context.Context) error {
	return func(ctx context.Context) error {
		err := c.cl.Owned(ctx)
		if errors.Is(err, partition.ErrFenced) {
			st.Stop(fmt.Errorf("%w: the change feed found another writer on the changelog: %w", storage.ErrStorage, err))
		}
		return err
	}
}

// Status is what the changelog knows of its start and checkpoints.
func (c *Changelog) Status() ChangelogStatus {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.status
}

// ChangelogLast is the last sequence the slot's changelog appended or
// replayed (0 with --changelog off).
func (a *Slot) ChangelogLast() uint64 {
	if a.changelog == nil {
		return 0
	}
	return a.changelog.cl.Last()
}
