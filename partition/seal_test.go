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
	"github.com/telha/telha-cascade/internal/testnats"
)

// TestSealedTablesAreShreddedByTheirKeys: tables saved through the
// bucket OpenCheckpoints returns reach NATS sealed (no server file holds
// a stored value); collecting a table destroys its key (no server file
// holds the key's bytes after) and deletes its object, and the store
// still restores from the newer checkpoint.
func TestSealedTablesAreShreddedByTheirKeys(t *testing.T) {
	ctx := testCtx(t, time.Minute)
	srv := testnats.Start(t)
	js := connectJS(t, srv.ClientURL())
	obs, err := OpenCheckpoints(ctx, js, CheckpointConfig{})
	if err != nil {
		t.Fatal(err)
	}
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
	if len(oldKeys) != old.Tables {
		t.Fatalf("%d data keys for %d tables", len(oldKeys), old.Tables)
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
	if destroyed != n {
		t.Fatalf("%d keys destroyed for %d tables collected", destroyed, n)
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
	ctx := testCtx(t, time.Minute)
	js := startJS(t)
	obs, err := OpenCheckpoints(ctx, js, CheckpointConfig{})
	if err != nil {
		t.Fatal(err)
	}
	b := obs.(*Bucket)
	src, err := pebble.Open(t.TempDir(), storeOpts())
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
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
	for name := range lister.Keys() {
		if !tables[name] {
			t.Errorf("the data key of %s outlived its table", name)
		}
		keys++
	}
	if keys != saved.Tables {
		t.Fatalf("%d data keys for the %d tables kept", keys, saved.Tables)
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
