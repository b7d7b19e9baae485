package slot

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/telha/telha-cascade/internal/testnats"
	"github.com/telha/telha-cascade/partition"
	"github.com/telha/telha-cascade/queue"
	"github.com/telha/telha-cascade/storage"
)

// TestAFencedClaimReadsOnAndClaimsAgain: the previous writer (an owner
// whose lease lapsed while it still ran) appends after this start read
// the log's end and before its claim. The claim is fenced; the start
// reads on to the log's new end (the previous writer's write-set is
// applied: it was acknowledged), claims again, and the previous writer's
// next append is the one refused. Before, the start failed fenced and a
// static worker exited. A writer that appends before every attempt still
// wins: the start fails fenced after claimAttempts.
func TestAFencedClaimReadsOnAndClaimsAgain(t *testing.T) {
	for _, always := range []bool{false, true} {
		ctx, cfg, c, js := openTestChangelog(t)
		previous, err := partition.Open(ctx, js, cfg.ChangelogConfig())
		if err != nil {
			t.Fatal(err)
		}
		appended := 0
		c.beforeClaim = func(attempt int) {
			if attempt > 1 && !always {
				return
			}
			if _, err := previous.Append(ctx, writeSet(t, "previous", "v")); err != nil {
				t.Errorf("the previous writer's append before claim %d: %v", attempt, err)
				return
			}
			appended++
		}
		pe, err := c.prepare(ctx, filepath.Join(cfg.DataDir, "pebble"), storage.Sizes{CacheBytes: 8 << 20, MemTableBytes: 4 << 20}, nil)
		if always {
			if !errors.Is(err, partition.ErrFenced) || !errors.Is(err, storage.ErrFatal) || appended != claimAttempts {
				t.Fatalf("a writer appending before each of %d claims: %v (it appended %d times), want a fatal ErrFenced", claimAttempts, err, appended)
			}
			continue
		}
		if err != nil {
			t.Fatalf("start with one append of the previous writer before its claim: %v", err)
		}
		v, closer, err := pe.DB.Get([]byte("previous"))
		if err != nil || string(v) != "v" {
			t.Fatalf("the previous writer's acknowledged write-set is not applied: %q %v", v, err)
		}
		_ = closer.Close()
		if got := c.status.ClaimSeq; got != 2 {
			t.Errorf("claim at sequence %d, want 2 (after the previous writer's)", got)
		}
		if _, err := previous.Append(ctx, writeSet(t, "previous", "w")); !errors.Is(err, partition.ErrFenced) {
			t.Errorf("the previous writer's append after the claim: %v, want ErrFenced", err)
		}
		_ = pe.Close()
	}
}

// openTestChangelog opens slot 0's changelog (R1) on an embedded NATS
// server, not prepared yet; js reaches the same server (another writer).
func openTestChangelog(t *testing.T) (context.Context, Config, *Changelog, jetstream.JetStream) {
	t.Helper()
	ns := testnats.Start(t)
	nc := testnats.Connect(t, ns.ClientURL())
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	cfg := Config{DataDir: t.TempDir(), Partitions: 1, Owner: queue.Owner{Index: 0, Count: 1}, Changelog: "jetstream", StreamReplicas: 1}
	c, err := OpenChangelog(ctx, nc, cfg, slog.New(slog.DiscardHandler), nil, func(string) {})
	if err != nil || c == nil {
		t.Fatalf("open the changelog: %v", err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return ctx, cfg, c, js
}

// openServingChangelog is openTestChangelog caught up and claimed, its
// store open (closed at the test's end) as a serving slot's: what an
// erase's scrub runs on.
func openServingChangelog(t *testing.T) (context.Context, *Changelog, *storage.PebbleEngine, jetstream.JetStream) {
	t.Helper()
	ctx, cfg, c, js := openTestChangelog(t)
	pe, err := c.prepare(ctx, filepath.Join(cfg.DataDir, "pebble"), storage.Sizes{CacheBytes: 8 << 20, MemTableBytes: 4 << 20}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pe.Close() })
	c.db.Store(pe.DB)
	return ctx, c, pe, js
}

// writeSet is a Pebble batch's representation setting key to value.
func writeSet(t *testing.T, key, value string) []byte {
	t.Helper()
	db, err := pebble.Open("", &pebble.Options{FS: vfs.NewMem(), Logger: quietPebble{}})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	b := db.NewBatch()
	defer b.Close()
	if err := b.Set([]byte(key), []byte(value), nil); err != nil {
		t.Fatal(err)
	}
	return append([]byte(nil), b.Repr()...)
}

type quietPebble struct{}

func (quietPebble) Infof(string, ...any)  {}
func (quietPebble) Errorf(string, ...any) {}
func (quietPebble) Fatalf(format string, args ...any) {
	panic(fmt.Sprintf(format, args...))
}

// TestTheFeedOfAFencedOwnerStopsItsStore: the change feed's ownership
// check (feedOwned) answers nil while this slot's writer is the
// changelog's last, and once another writer has appended it answers
// ErrFenced and stops the store as a fenced append would (Fatal closes,
// the slot ends), instead of leaving a zombie whose feed retries until a
// request reaches its changelog.
func TestTheFeedOfAFencedOwnerStopsItsStore(t *testing.T) {
	ctx, cfg, c, js := openTestChangelog(t)
	dir := filepath.Join(cfg.DataDir, "pebble")
	pe, err := c.prepare(ctx, dir, storage.Sizes{CacheBytes: 8 << 20, MemTableBytes: 4 << 20}, nil)
	if err != nil {
		t.Fatal(err)
	}
	st, err := storage.OpenStoreOn(pe, dir, storage.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	owned := c.feedOwned(st)
	if err := owned(ctx); err != nil || st.FatalErr() != nil {
		t.Fatalf("the owner's check: %v (store: %v), want nil", err, st.FatalErr())
	}
	next, err := partition.Open(ctx, js, cfg.ChangelogConfig())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := next.Append(ctx, writeSet(t, "next", "v")); err != nil {
		t.Fatal(err)
	}
	if err := owned(ctx); !errors.Is(err, partition.ErrFenced) {
		t.Fatalf("the check after another writer's append: %v, want ErrFenced", err)
	}
	select {
	case <-st.Fatal():
	default:
		t.Fatal("the fenced check left the store open for commits")
	}
	if err := st.FatalErr(); !errors.Is(err, storage.ErrFatal) || !errors.Is(err, partition.ErrFenced) {
		t.Fatalf("the store's fatal error: %v, want ErrFatal wrapping ErrFenced", err)
	}
}

// TestAScrubThatWaitedOutTheCheckpointCounts: an erase's scrub of the
// copies that gives up waiting for the checkpoint in progress is a failed
// scrub like any other (telha_erase_scrub_failures_total). A black-box
// probe saw a scheduled checkpoint hang for 10 minutes behind a paused
// NATS server, and the four scrubs that waited it out counted as none.
func TestAScrubThatWaitedOutTheCheckpointCounts(t *testing.T) {
	ctx, _, c, _ := openTestChangelog(t)
	failed := 0
	c.scrubFailed = func() { failed++ }
	if err := c.lock(ctx); err != nil { // a checkpoint in progress
		t.Fatal(err)
	}
	defer c.unlock()
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	err := c.ScrubCopies(short, 1, func(context.Context, func() error) error { return errors.New("not reached") })
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a scrub behind a checkpoint that outlasts it: %v, want its deadline", err)
	}
	if failed != 1 {
		t.Fatalf("%d scrub failures counted, want 1", failed)
	}
}

// TestTheHeldStepRefusesAStoreBehindItsLog: a store stopped by a failed
// multi-part append lags its changelog (the log took the write-set, the
// store did not). An erase's scrub must then neither store a tail nor
// purge: the tail would hold a write-set the store never applied, and the
// purge would drop the only copy of it. Here the log moves past the store
// while the scrub's first save uploads; the held step refuses.
func TestTheHeldStepRefusesAStoreBehindItsLog(t *testing.T) {
	ctx, c, pe, _ := openServingChangelog(t)
	marker, err := partition.AppliedSeq(pe.DB)
	if err != nil {
		t.Fatal(err)
	}
	c.scrubStep = func(step string) {
		if step != "checkpointed" {
			return
		}
		if _, err := c.cl.Append(ctx, writeSet(t, "committed-to-the-log-only", "v")); err != nil {
			t.Errorf("the append the store never applied: %v", err)
		}
	}
	held := false
	err = c.ScrubCopies(ctx, marker, func(ctx context.Context, f func() error) error { held = true; return f() })
	if err == nil || !strings.Contains(err.Error(), "not saved, not purged") || !held {
		t.Fatalf("a scrub whose store lags its log: %v (held step reached: %v), want the held step's refusal", err, held)
	}
	_, first, last, err := c.LogIdentity(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if first != 1 || last != marker+1 {
		t.Fatalf("the log spans %d-%d after the refusal, want 1-%d: nothing purged", first, last, marker+1)
	}
	cps, err := partition.ListCheckpoints(ctx, c.obs, c.part)
	if err != nil {
		t.Fatal(err)
	}
	for _, cp := range cps {
		if cp.Base != "" || cp.Seq > marker {
			t.Errorf("checkpoint %s (base %q) stored: the store does not reflect sequence %d", cp.Name, cp.Base, cp.Seq)
		}
	}
}

// TestScrubsKeepTheBucketsListing: an erase's scrub lists the checkpoint
// bucket once, and the next scrub (or scheduled checkpoint) takes the
// listing the last one kept up to date when the bucket's stream has had no
// message since; a message
// from anyone else (another writer's object) makes it list again. Each
// scrub's checkpoint restores, and the tables the older ones held are
// collected from the kept listing as from a new one.
func TestScrubsKeepTheBucketsListing(t *testing.T) {
	ctx, c, pe, js := openServingChangelog(t)
	held := func(ctx context.Context, f func() error) error { return f() }
	scrub := func(i int) {
		t.Helper()
		ws := writeSet(t, fmt.Sprintf("key-%d", i), strings.Repeat("v", 10<<10))
		seq, err := c.cl.Append(ctx, ws)
		if err == nil {
			err = partition.ApplyTo(pe.DB, seq, ws, true)
		}
		if err == nil {
			err = pe.DB.Flush() // a table of its own: every save uploads one
		}
		if err != nil {
			t.Fatal(err)
		}
		if err := c.ScrubCopies(ctx, seq, held); err != nil {
			t.Fatalf("scrub %d: %v", i, err)
		}
		dst := filepath.Join(t.TempDir(), "restored")
		if got, err := partition.Restore(ctx, c.obs, c.part, dst); err != nil || got != seq {
			t.Fatalf("restore after scrub %d = %d, %v; want %d", i, got, err, seq)
		}
		db, err := pebble.Open(dst, &pebble.Options{Logger: quietPebble{}})
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		for j := 0; j <= i; j++ {
			if _, closer, err := db.Get([]byte(fmt.Sprintf("key-%d", j))); err != nil {
				t.Fatalf("restore after scrub %d lacks key-%d: %v", i, j, err)
			} else {
				closer.Close()
			}
		}
		if cps, err := partition.ListCheckpoints(ctx, c.obs, c.part); err != nil || len(cps) != 1 {
			t.Fatalf("after scrub %d the bucket holds checkpoints %+v (%v), want only the scrub's", i, cps, err)
		}
	}
	scrub(0)
	scrub(1)
	// A scheduled checkpoint between two scrubs takes the listing and
	// keeps it too (it prunes to two checkpoints and collects).
	c.cfg.CheckpointsKeep = 2
	ws := writeSet(t, "between", "v")
	seq, err := c.cl.Append(ctx, ws)
	if err == nil {
		err = partition.ApplyTo(pe.DB, seq, ws, true)
	}
	if err != nil {
		t.Fatal(err)
	}
	if info, err := c.checkpoint(ctx); err != nil || info.Seq != seq {
		t.Fatalf("a scheduled checkpoint between scrubs: %+v, %v", info, err)
	}
	scrub(2)
	if c.listings != 1 {
		t.Fatalf("three scrubs and a checkpoint listed the bucket %d times, want once", c.listings)
	}
	// Another writer's objects: the next scrub reads them from the
	// bucket's stream without listing it whole (before: a listing). One is this slot's own kind, a
	// checkpoint a former owner waking from a pause stored at a sequence
	// long passed: the scrub sees it and deletes it (it would otherwise
	// keep whatever that owner's store held, erased values among them).
	obs, err := js.ObjectStore(ctx, c.status.Bucket)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := obs.PutString(ctx, "someone-else", "x"); err != nil {
		t.Fatal(err)
	}
	stray := partition.CheckpointName(c.part, 1)
	if _, err := obs.PutString(ctx, stray, "a zombie's checkpoint"); err != nil {
		t.Fatal(err)
	}
	scrub(3)
	if c.listings != 1 {
		t.Fatalf("a scrub after another writer's objects: %d listings in all, want 1 (read from the stream)", c.listings)
	}
	if _, err := obs.GetInfo(ctx, "someone-else"); err != nil {
		t.Fatalf("the other writer's object: %v", err)
	}
	if _, err := obs.GetInfo(ctx, stray); !errors.Is(err, jetstream.ErrObjectNotFound) {
		t.Fatalf("the stray checkpoint after the scrub: %v; want it deleted", err)
	}
	// What the bucket holds is what the kept listing says.
	l, err := partition.List(ctx, c.obs)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := l.Tables(c.part), c.inv.Tables(c.part); !maps.Equal(got, want) || !c.invOK || len(got) == 0 {
		t.Fatalf("the bucket holds the tables %v, the kept listing %v (kept: %v)", got, want, c.invOK)
	}
	if got, want := l.Checkpoints(c.part), c.inv.Checkpoints(c.part); len(got) != 1 || len(want) != 1 || got[0].Name != want[0].Name {
		t.Fatalf("the bucket holds the checkpoints %+v, the kept listing %+v", got, want)
	}
}

// TestAFormerOwnerDeletesNothing: a slot whose changelog another writer
// has appended to since (its successor, while it was paused) neither
// prunes, collects nor purges when it wakes inside a checkpoint or an
// erase's scrub: by its stale view of the bucket it would delete what its
// successor's checkpoints name (DECISIONS 96). Before, both ran to the end.
func TestAFormerOwnerDeletesNothing(t *testing.T) {
	ctx, c, pe, js := openServingChangelog(t)
	c.cfg.CheckpointsKeep = 1
	commit := func(key string) uint64 {
		t.Helper()
		ws := writeSet(t, key, strings.Repeat("v", 10<<10))
		seq, err := c.cl.Append(ctx, ws)
		if err == nil {
			err = partition.ApplyTo(pe.DB, seq, ws, true)
		}
		if err == nil {
			err = pe.DB.Flush()
		}
		if err != nil {
			t.Fatal(err)
		}
		return seq
	}
	commit("a")
	if _, err := c.checkpoint(ctx); err != nil {
		t.Fatal(err)
	}
	last := commit("b")
	obs, err := js.ObjectStore(ctx, c.status.Bucket)
	if err != nil {
		t.Fatal(err)
	}
	stray := fmt.Sprintf("partition-%d/sst/stray.sst", c.part)
	if _, err := obs.PutString(ctx, stray, "a table no checkpoint names"); err != nil {
		t.Fatal(err)
	}
	// The successor appends: this slot is a former owner from now on.
	next, err := partition.Open(ctx, js, c.cfg.ChangelogConfig())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := next.Append(ctx, writeSet(t, "successor", "v")); err != nil {
		t.Fatal(err)
	}
	logStream, err := js.Stream(ctx, c.status.Stream)
	if err != nil {
		t.Fatal(err)
	}
	firstBefore := logStream.CachedInfo().State.FirstSeq
	before, err := partition.ListCheckpoints(ctx, c.obs, c.part)
	if err != nil || len(before) != 1 {
		t.Fatalf("checkpoints before: %+v, %v", before, err)
	}
	if _, err := c.checkpoint(ctx); !errors.Is(err, partition.ErrFenced) {
		t.Fatalf("a former owner's checkpoint: %v, want ErrFenced", err)
	}
	held := func(ctx context.Context, f func() error) error { return f() }
	if err := c.ScrubCopies(ctx, last, held); !errors.Is(err, partition.ErrFenced) {
		t.Fatalf("a former owner's scrub: %v, want ErrFenced", err)
	}
	after, err := partition.ListCheckpoints(ctx, c.obs, c.part)
	if err != nil {
		t.Fatal(err)
	}
	for _, cp := range before {
		if !slices.ContainsFunc(after, func(a partition.CheckpointInfo) bool { return a.Name == cp.Name }) {
			t.Errorf("the former owner deleted checkpoint %s", cp.Name)
		}
	}
	// Nor does it store one: a former owner paused since before an erase
	// would upload the erased data again (its successor deletes it, but
	// only at its own next checkpoint or scrub).
	for _, cp := range after {
		if !slices.ContainsFunc(before, func(b partition.CheckpointInfo) bool { return b.Name == cp.Name }) {
			t.Errorf("the former owner stored checkpoint %s", cp.Name)
		}
	}
	if _, err := obs.GetInfo(ctx, stray); err != nil {
		t.Errorf("the former owner collected a table: %v", err)
	}
	now, err := logStream.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if first := now.State.FirstSeq; first != firstBefore {
		t.Errorf("the former owner purged the changelog below %d (it began at %d)", first, firstBefore)
	}
}
