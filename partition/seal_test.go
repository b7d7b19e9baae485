package partition

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/telha/telha-cascade/internal/diskscan"
	"github.com/telha/telha-cascade/internal/sealed"
)

// TestSealedTablesAreShreddedByTheirKeys: tables saved through the
// bucket OpenCheckpoints returns reach NATS sealed (no server file holds
// a stored value); collecting a table destroys its key (no server file
// holds the key's bytes after) and deletes its object, and the store
// still restores from the newer checkpoint.
func TestSealedTablesAreShreddedByTheirKeys(t *testing.T) {
	ctx, srv, js, obs := startBucket(t)
	b := obs.(*Bucket)
	src, err := pebble.Open(t.TempDir(), storeOpts())
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	opts := SaveOptions{ChunkSize: ChunkSizeFor(js.Conn().MaxPayload())}
	const secret = "SECRET-in-a-sealed-table-9b2e"
	for i := range 3 {
		fill(t, src, "keep"+string(rune('a'+i)), 100, 800)
	}
	victim := []byte("\x01victim")
	if err := src.Set(victim, []byte(secret), pebble.Sync); err != nil {
		t.Fatal(err)
	}
	fill(t, src, "tail", 10, 100) // flushed: the secret is in a table, not a WAL
	applied(t, src, 1)
	old, err := SaveCheckpointWith(ctx, obs, 0, src, opts)
	if err != nil {
		t.Fatal(err)
	}
	if files, err := diskscan.FilesContaining(srv.Opts.StoreDir, secret); err != nil || len(files) != 0 {
		t.Fatalf("NATS files hold a value of a sealed table: %v, %v", files, err)
	}
	oldKeys := map[string][]byte{}
	lister, err := b.keys.ListKeys(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for name := range lister.Keys() {
		k, err := sealed.Key(ctx, b.keys, name)
		if err != nil {
			t.Fatal(err)
		}
		oldKeys[name] = k
	}
	// Every object of the save is sealed: its tables, its archive and its
	// table list (DECISIONS 94), each with a key of its own.
	listed, err := List(ctx, obs)
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range listed {
		if o.Metadata[sealed.Meta] != sealed.V1 {
			t.Errorf("%s is stored unsealed (metadata %v)", o.Name, o.Metadata)
		}
		if _, ok := oldKeys[o.Name]; !ok {
			t.Errorf("%s has no data key", o.Name)
		}
	}
	if len(oldKeys) != old.Tables+2 || len(listed) != len(oldKeys) {
		t.Fatalf("%d data keys for %d objects (%d tables, the archive, its list)", len(oldKeys), len(listed), old.Tables)
	}
	eraseLocally(t, src, victim, 2)
	if _, err := SaveCheckpointWith(ctx, obs, 0, src, opts); err != nil {
		t.Fatal(err)
	}
	if err := DeleteCheckpoint(ctx, js, obs, "TELHA_CKPT", old.Name); err != nil {
		t.Fatal(err)
	}
	n, _, err := CollectTables(ctx, js, obs, "TELHA_CKPT", 0)
	if err != nil || n == 0 {
		t.Fatalf("collected %d, %v", n, err)
	}
	destroyed := 0
	for name, k := range oldKeys {
		_, err := sealed.Key(ctx, b.keys, name)
		if errors.Is(err, sealed.ErrKeyDestroyed) {
			destroyed++
			if files, err := diskscan.FilesContaining(srv.Opts.StoreDir, string(k)); err != nil || len(files) != 0 {
				t.Fatalf("the destroyed key of %s is still in %v (%v)", name, files, err)
			}
		} else if err != nil {
			t.Fatal(err)
		}
	}
	if destroyed != n+2 {
		t.Fatalf("%d keys destroyed for %d tables collected and the deleted checkpoint's archive and list", destroyed, n)
	}
	for _, name := range DeletedNames(old) {
		if _, err := sealed.Key(ctx, b.keys, name); !errors.Is(err, sealed.ErrKeyDestroyed) {
			t.Fatalf("the key of the deleted %s: %v; want it destroyed", name, err)
		}
	}
	db := restoreOpen(t, ctx, obs, 2)
	if v, c, err := db.Get(victim); err != nil || string(v) != "{}" {
		t.Fatalf("restored victim = %q, %v", v, err)
	} else {
		c.Close()
	}
}

// TestCollectFromAListingBeforeASave: an erase's scrub lists the bucket
// once, before its save, and collects from that listing after it. The
// tables the save uploaded are not in the listing: their data keys must
// survive (the save's Stored says they are live), or the checkpoint just
// stored would not restore; the tables only the older checkpoint held go,
// keys and all.
func TestCollectFromAListingBeforeASave(t *testing.T) {
	ctx, js, b, src := openSealed(t)
	obs := jetstream.ObjectStore(b)
	opts := SaveOptions{ChunkSize: ChunkSizeFor(js.Conn().MaxPayload())}
	for i := range 3 {
		fill(t, src, "keep"+string(rune('a'+i)), 100, 800)
	}
	victim := []byte("\x01keepa-000001")
	applied(t, src, 1)
	old, err := SaveCheckpointWith(ctx, obs, 0, src, opts)
	if err != nil {
		t.Fatal(err)
	}
	listing, err := List(ctx, obs)
	if err != nil {
		t.Fatal(err)
	}
	eraseLocally(t, src, victim, 2) // rewrites the victim's table
	opts.Stored = listing.Tables(0)
	saved, err := SaveCheckpointWith(ctx, obs, 0, src, opts)
	if err != nil {
		t.Fatal(err)
	}
	if saved.TablesUploaded == 0 {
		t.Fatal("the save after the erase uploaded no table")
	}
	if err := DeleteCheckpoint(ctx, js, obs, "TELHA_CKPT", old.Name); err != nil {
		t.Fatal(err)
	}
	kept := []CheckpointInfo{saved}
	deleted, _, err := CollectTablesIn(ctx, js, obs, "TELHA_CKPT", 0, kept, listing, saved.Stored)
	if err != nil || len(deleted) == 0 {
		t.Fatalf("collected %v, %v; want the tables the erase replaced", deleted, err)
	}
	// Every table of the kept checkpoint keeps its key, so it restores.
	db := restoreOpen(t, ctx, obs, 2)
	assertSameStore(t, src, db)
	// What the listing held and no checkpoint names is gone, keys too.
	after, err := List(ctx, obs)
	if err != nil {
		t.Fatal(err)
	}
	// The listing kept up to date by its one writer is the bucket's.
	kept2 := listing.With(saved).Without(DeletedNames(old)...).Without(deleted...)
	if got, want := describe(kept2), describe(after); !maps.Equal(got, want) {
		t.Fatalf("the listing kept up to date:\n%v\nthe bucket's:\n%v", got, want)
	}
	tables := after.Tables(0)
	if len(tables) != saved.Tables {
		t.Fatalf("%d table objects after the collection, the kept checkpoint holds %d", len(tables), saved.Tables)
	}
	lister, err := b.keys.ListKeys(ctx)
	if err != nil {
		t.Fatal(err)
	}
	keys := 0
	live := after.names("partition-0/")
	for name := range lister.Keys() {
		if !live[name] {
			t.Errorf("the data key of %s outlived its object", name)
		}
		keys++
	}
	if keys != len(live) || len(live) != saved.Tables+2 {
		t.Fatalf("%d data keys for the %d objects kept (%d tables, the archive, its list)", keys, len(live), saved.Tables)
	}
}

// restoreOpen restores partition 0's newest checkpoint, which must reflect
// seq, and opens it (closed at the test's end).
func restoreOpen(t *testing.T, ctx context.Context, obs jetstream.ObjectStore, seq uint64) *pebble.DB {
	t.Helper()
	dst := filepath.Join(t.TempDir(), "restored")
	if got, err := Restore(ctx, obs, 0, dst); err != nil || got != seq {
		t.Fatalf("restore = %d, %v; want %d", got, err, seq)
	}
	db, err := pebble.Open(dst, storeOpts())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// describe maps each object of l to what a scrub reads of it: its format
// and base, and its size for a table.
func describe(l Listing) map[string]string {
	out := map[string]string{}
	for _, o := range l {
		if o.Deleted {
			continue
		}
		d := o.Metadata[metaFormat] + " " + o.Metadata[metaBase]
		if strings.Contains(o.Name, "/sst/") {
			d = fmt.Sprint(o.Size)
		}
		out[o.Name] = d
	}
	return out
}

// TestATailIsShreddedByItsKey: a tail checkpoint holds tenant write-sets
// in full; it is sealed like every object of the bucket (DECISIONS 94),
// so no NATS file holds its plaintext, it restores through its key, and
// deleting it destroys that key (whose bytes are then in no NATS file)
// instead of overwriting its chunks.
func TestATailIsShreddedByItsKey(t *testing.T) {
	ctx, srv, js, obs := startBucket(t)
	b := obs.(*Bucket)
	db := openDB(t, "")
	saveAt(t, obs, db, 5)
	base := saveAt(t, obs, db, 6)
	const secret = "SECRET-in-a-tail-4c1d"
	tail, err := SaveTail(ctx, obs, 1, base, 7, []TailEntry{{Seq: 7, WriteSet: batchRepr(t, secret)}}, 0)
	if err != nil {
		t.Fatal(err)
	}
	if files, err := diskscan.FilesContaining(srv.Opts.StoreDir, secret); err != nil || len(files) != 0 {
		t.Fatalf("NATS files hold a tail's write-set in the clear: %v, %v", files, err)
	}
	key, err := sealed.Key(ctx, b.keys, tail.Name)
	if err != nil {
		t.Fatalf("the tail's data key: %v", err)
	}
	dst := filepath.Join(t.TempDir(), "r")
	if seq, err := Restore(ctx, obs, 1, dst); err != nil || seq != 7 {
		t.Fatalf("restore = %d, %v; want the tail at 7", seq, err)
	}
	restored := openDB(t, dst)
	if v, c, err := restored.Get([]byte{0x01, 'v'}); err != nil || string(v) != secret {
		t.Fatalf("the tail's write-set restored as %q, %v", v, err)
	} else {
		c.Close()
	}
	if err := DeleteCheckpoint(ctx, js, obs, "TELHA_CKPT", tail.Name); err != nil {
		t.Fatal(err)
	}
	if _, err := sealed.Key(ctx, b.keys, tail.Name); !errors.Is(err, sealed.ErrKeyDestroyed) {
		t.Fatalf("the deleted tail's key: %v; want it destroyed", err)
	}
	if files, err := diskscan.FilesContaining(srv.Opts.StoreDir, string(key)); err != nil || len(files) != 0 {
		t.Fatalf("the destroyed key of the tail is still in %v (%v)", files, err)
	}
	if seq, err := Restore(ctx, obs, 1, filepath.Join(t.TempDir(), "r2")); err != nil || seq != 6 {
		t.Fatalf("restore after the tail's delete = %d, %v; want its base at 6", seq, err)
	}
}

// TestCollectDestroysTheKeysOfCutShortUploads: a process killed inside a
// save leaves the data key of the object it was uploading (stored first)
// and the sealed chunks it sent. The collection destroys the partition's
// keys whose objects are not in the bucket, archives, table lists and
// tails as well as tables, so those chunks can be read by no one; the
// kept checkpoint's keys stay (it restores), and neither another
// partition's keys nor those of checkpoints above the writer's newest
// (a successor's, to a former owner) are touched.
func TestCollectDestroysTheKeysOfCutShortUploads(t *testing.T) {
	ctx, js, b, src := openSealed(t)
	obs := jetstream.ObjectStore(b)
	fill(t, src, "keep", 100, 800)
	applied(t, src, 1)
	listing, err := List(ctx, obs)
	if err != nil {
		t.Fatal(err)
	}
	saved, err := SaveCheckpointWith(ctx, obs, 0, src, SaveOptions{ChunkSize: ChunkSizeFor(js.Conn().MaxPayload())})
	if err != nil {
		t.Fatal(err)
	}
	cutShort := []string{CheckpointName(0, 0), TablesName(0, 0), "partition-0/sst/000099.sst"}
	// Keys this writer cannot tell from a successor's upload in progress:
	// another partition's, and its own partition's above its newest
	// checkpoint (a former owner's stale view must not destroy them).
	others := []string{CheckpointName(1, 5), CheckpointName(0, 77), TablesName(0, 77)}
	for _, name := range append(cutShort, others...) {
		if _, err := b.newKey(ctx, name); err != nil {
			t.Fatal(err)
		}
	}
	// The listing predates the save, as a scrub's does: the save's own
	// objects are live by cps and stored.
	if _, _, err := CollectTablesIn(ctx, js, obs, "TELHA_CKPT", 0, []CheckpointInfo{saved}, listing, saved.Stored); err != nil {
		t.Fatal(err)
	}
	keys := map[string]bool{}
	lister, err := b.keys.ListKeys(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for name := range lister.Keys() {
		keys[name] = true
	}
	for _, name := range cutShort {
		if keys[name] {
			t.Errorf("the data key of %s, an upload cut short, outlived the collection", name)
		}
	}
	for _, name := range others {
		if !keys[name] {
			t.Errorf("the data key of %s, not this writer's to judge, was destroyed", name)
		}
	}
	after, err := List(ctx, obs)
	if err != nil {
		t.Fatal(err)
	}
	for name := range after.names("partition-0/") {
		if !keys[name] {
			t.Errorf("the data key of %s, a kept object, was destroyed", name)
		}
	}
	assertSameStore(t, src, restoreOpen(t, ctx, obs, 1))
}

// openSealed starts a JetStream server with a checkpoint bucket (sealed)
// and opens an empty Pebble store to save from (closed at the test's end).
func openSealed(t *testing.T) (context.Context, jetstream.JetStream, *Bucket, *pebble.DB) {
	t.Helper()
	ctx := testCtx(t, time.Minute)
	js := startJS(t)
	obs, err := OpenCheckpoints(ctx, js, CheckpointConfig{})
	if err != nil {
		t.Fatal(err)
	}
	src, err := pebble.Open(t.TempDir(), storeOpts())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = src.Close() })
	return ctx, js, obs.(*Bucket), src
}

// A table an older kept checkpoint names keeps its data key, even when
// the listing the collection was given misses it: a listing read from a
// replica that lags behind the stream's leader (a server just restarted
// or continued; the server places the listing's consumer on any replica)
// is such a listing. Before, the key sweep counted as live only what the
// listing, the newest save and the kept checkpoints' own names held, and
// destroyed the keys of the older checkpoint's tables: that checkpoint
// could no longer be restored.
func TestCollectKeepsTheKeysOfEveryKeptCheckpointsTables(t *testing.T) {
	ctx, js, b, src := openSealed(t)
	obs := jetstream.ObjectStore(b)
	opts := SaveOptions{ChunkSize: ChunkSizeFor(js.Conn().MaxPayload())}
	fill(t, src, "a", 100, 800)
	fill(t, src, "b", 100, 800)
	applied(t, src, 1)
	older, err := SaveCheckpointWith(ctx, obs, 0, src, opts)
	if err != nil {
		t.Fatal(err)
	}
	// Rewrite every table: the newer checkpoint shares none with the older.
	fill(t, src, "c", 100, 800)
	if err := src.Compact(ctx, []byte{0}, []byte{0xff}, false); err != nil {
		t.Fatal(err)
	}
	applied(t, src, 2)
	// The save's view of the bucket is the lagging listing's too: none of
	// the older's tables (it uploads what it does not see).
	opts.Stored = map[string]bool{}
	newer, err := SaveCheckpointWith(ctx, obs, 0, src, opts)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := ReadObject(ctx, obs, TablesName(0, older.Seq))
	if err != nil {
		t.Fatal(err)
	}
	list, err := decodeTableList(raw)
	if err != nil {
		t.Fatal(err)
	}
	onlyOlder := 0
	for _, tb := range list.Tables {
		if !newer.Stored[tb.Object] {
			onlyOlder++
		}
	}
	if onlyOlder == 0 {
		t.Fatalf("the newer checkpoint stores every table of the older (the test is wrong)")
	}
	// A listing that predates both saves: what a lagging replica answers.
	if _, _, err := CollectTablesIn(ctx, js, obs, "TELHA_CKPT", 0, []CheckpointInfo{older, newer}, Listing{}, newer.Stored); err != nil {
		t.Fatal(err)
	}
	for _, tb := range list.Tables {
		if _, err := b.keys.Get(ctx, tb.Object); err != nil {
			t.Errorf("the data key of %s, a table of the kept checkpoint %s, was destroyed (%v)", tb.Object, older.Name, err)
		}
	}
}
