package partition

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/telha/telha-cascade/internal/diskscan"
)

// fill writes n keys of about size bytes each under prefix and flushes, so
// they land in tables of their own.
func fill(t testing.TB, db *pebble.DB, prefix string, n, size int) {
	t.Helper()
	b := db.NewBatch()
	for i := range n {
		v := bytes.Repeat([]byte{byte('a' + i%26)}, size)
		if err := b.Set([]byte(fmt.Sprintf("\x01%s-%06d", prefix, i)), v, nil); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.Commit(pebble.Sync); err != nil {
		t.Fatal(err)
	}
	if err := db.Flush(); err != nil {
		t.Fatal(err)
	}
}

// eraseLocally is an erase as the store does it, of key victim: its value
// rewritten, applied up to seq, the memtable flushed and the victim's
// range compacted (only it).
func eraseLocally(t testing.TB, db *pebble.DB, victim []byte, seq uint64) {
	t.Helper()
	if err := db.Set(victim, []byte("{}"), pebble.Sync); err != nil {
		t.Fatal(err)
	}
	applied(t, db, seq)
	if err := db.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := db.Compact(context.Background(), victim, append(bytes.Clone(victim), 0), true); err != nil {
		t.Fatal(err)
	}
}

// applied bumps db's applied sequence so each save has a name of its own.
func applied(t testing.TB, db *pebble.DB, seq uint64) {
	t.Helper()
	b := db.NewBatch()
	if err := MarkApplied(b, seq); err != nil {
		t.Fatal(err)
	}
	if err := b.Commit(pebble.Sync); err != nil {
		t.Fatal(err)
	}
}

// TestIncrementalCheckpoints: a save uploads only the tables written since
// the last one; a restore of a format-2 checkpoint gives the same store;
// the staging directory is the one asked for (the store's filesystem), and
// nothing is left in it.
func TestIncrementalCheckpoints(t *testing.T) {
	ctx := testCtx(t, time.Minute)
	js := startJS(t)
	obs, err := OpenCheckpoints(ctx, js, CheckpointConfig{})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	src, err := pebble.Open(filepath.Join(dir, "pebble"), storeOpts())
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	var digests TableDigests
	opts := SaveOptions{Staging: dir, Tables: &digests, ChunkSize: ChunkSizeFor(js.Conn().MaxPayload())}
	for i := range 4 {
		fill(t, src, "base"+strconv.Itoa(i), 200, 1000)
	}
	applied(t, src, 10)
	first, err := SaveCheckpointWith(ctx, obs, 0, src, opts)
	if err != nil {
		t.Fatal(err)
	}
	if first.Tables < 4 || first.TablesUploaded != first.Tables {
		t.Fatalf("first save: %+v; want every table (>= 4) uploaded", first)
	}
	fill(t, src, "more", 50, 1000)
	applied(t, src, 20)
	// The second save is told what the bucket holds (an erase's last save,
	// under the writer, does not list it): the first save's Stored, which
	// must be exactly the bucket's table objects.
	listed, err := objectNames(ctx, obs, "partition-0/sst/")
	if err != nil || !maps.Equal(listed, first.Stored) {
		t.Fatalf("first save's Stored %v, the bucket's tables %v (%v)", first.Stored, listed, err)
	}
	opts2 := opts
	opts2.Stored = first.Stored
	second, err := SaveCheckpointWith(ctx, obs, 0, src, opts2)
	if err != nil {
		t.Fatal(err)
	}
	if second.Tables != first.Tables+1 || second.TablesUploaded != 1 {
		t.Fatalf("second save: %+v; want %d tables, 1 uploaded", second, first.Tables+1)
	}
	if second.BytesUploaded >= first.BytesUploaded/2 {
		t.Fatalf("second save sent %d bytes, the first %d: not incremental", second.BytesUploaded, first.BytesUploaded)
	}
	if left, _ := os.ReadDir(dir); len(left) != 1 {
		t.Fatalf("the staging directory holds %d entries after the saves, want only pebble/", len(left))
	}
	dst := filepath.Join(t.TempDir(), "restored")
	seq, err := Restore(ctx, obs, 0, dst)
	if err != nil || seq != 20 {
		t.Fatalf("restore = %d, %v; want 20", seq, err)
	}
	got, err := pebble.Open(dst, &pebble.Options{Logger: quietLogger{}})
	if err != nil {
		t.Fatal(err)
	}
	defer got.Close()
	assertSameStore(t, src, got)
	if _, err := os.Stat(filepath.Join(dst, tablesFile)); !os.IsNotExist(err) {
		t.Fatalf("the table list was left in the restored store: %v", err)
	}
}

// TestFormat1CheckpointStillRestores: a checkpoint stored by the release
// before incremental checkpoints (every file in one tar) restores.
func TestFormat1CheckpointStillRestores(t *testing.T) {
	ctx := testCtx(t, time.Minute)
	js := startJS(t)
	obs, err := OpenCheckpoints(ctx, js, CheckpointConfig{})
	if err != nil {
		t.Fatal(err)
	}
	src := openDB(t, "")
	fill(t, src, "old", 100, 500)
	applied(t, src, 7)
	dir := filepath.Join(t.TempDir(), "ckpt")
	if err := src.Checkpoint(dir, pebble.WithFlushedWAL()); err != nil {
		t.Fatal(err)
	}
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(writeTar(pw, dir, nil)) }()
	if _, err := obs.Put(ctx, jetstream.ObjectMeta{Name: CheckpointName(0, 7), Metadata: map[string]string{metaFormat: formatTarV1}}, pr); err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(t.TempDir(), "restored")
	if seq, err := Restore(ctx, obs, 0, dst); err != nil || seq != 7 {
		t.Fatalf("restore of a format-1 checkpoint = %d, %v", seq, err)
	}
	got, err := pebble.Open(dst, &pebble.Options{Logger: quietLogger{}})
	if err != nil {
		t.Fatal(err)
	}
	defer got.Close()
	assertSameStore(t, src, got)
	// Collecting with a format-1 checkpoint stored deletes nothing of it.
	if n, _, err := CollectTables(ctx, js, obs, "TELHA_CKPT", 0); err != nil || n != 0 {
		t.Fatalf("CollectTables = %d, %v; want 0", n, err)
	}
}

// TestCollectTablesDeletesWhatNoCheckpointHolds: after an erase compacts
// the range of an old value and a new checkpoint is saved, deleting the
// older checkpoint and collecting deletes exactly the tables that only it
// held, securely: no file of the NATS server holds the old value, while
// every table of the new checkpoint is kept (it restores). The old
// checkpoint is saved unsealed, as a release before sealed tables saved
// it (the upgrade: its plain tables are overwritten when collected, and
// restore beside sealed ones).
func TestCollectTablesDeletesWhatNoCheckpointHolds(t *testing.T) {
	ctx, srv, js, obs := startBucket(t)
	src, err := pebble.Open(t.TempDir(), storeOpts())
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	opts := SaveOptions{ChunkSize: ChunkSizeFor(js.Conn().MaxPayload())}
	const secret = "SECRET-in-a-table-5d1c"
	for i := range 3 {
		fill(t, src, "keep"+strconv.Itoa(i), 100, 800)
	}
	victim := []byte("\x01victim")
	if err := src.Set(victim, []byte(secret), pebble.Sync); err != nil {
		t.Fatal(err)
	}
	fill(t, src, "tail", 10, 100) // the victim's table also holds these
	applied(t, src, 1)
	plain := obs.(*Bucket).ObjectStore // no key bucket: tables go unsealed
	old, err := SaveCheckpointWith(ctx, plain, 0, src, opts)
	if err != nil {
		t.Fatal(err)
	}
	if files, _ := diskscan.FilesContaining(srv.Opts.StoreDir, secret); len(files) == 0 {
		t.Fatal("the unsealed save stored no plain table: the test proves nothing")
	}
	eraseLocally(t, src, victim, 2)
	cur, err := SaveCheckpointWith(ctx, obs, 0, src, opts)
	if err != nil {
		t.Fatal(err)
	}
	if cur.TablesUploaded >= cur.Tables {
		t.Fatalf("the save after a narrow compaction uploaded %d of %d tables", cur.TablesUploaded, cur.Tables)
	}
	if err := DeleteCheckpoint(ctx, js, obs, "TELHA_CKPT", old.Name); err != nil {
		t.Fatal(err)
	}
	n, _, err := CollectTables(ctx, js, obs, "TELHA_CKPT", 0)
	if err != nil {
		t.Fatal(err)
	}
	if n == 0 || n >= old.Tables {
		t.Fatalf("collected %d tables of the old checkpoint's %d; want the replaced ones only", n, old.Tables)
	}
	files, err := diskscan.FilesContaining(srv.Opts.StoreDir, secret)
	if err != nil {
		t.Fatal(err)
	}
	if len(files) != 0 {
		t.Fatalf("NATS files still hold the erased value: %v", files)
	}
	if n, _, err := CollectTables(ctx, js, obs, "TELHA_CKPT", 0); err != nil || n != 0 {
		t.Fatalf("a second collection = %d, %v; want 0", n, err)
	}
	dst := filepath.Join(t.TempDir(), "restored")
	if seq, err := Restore(ctx, obs, 0, dst); err != nil || seq != 2 {
		t.Fatalf("restore after the collection = %d, %v", seq, err)
	}
}

// TestRestoreFallsBackWhenATableIsGone: the newest checkpoint missing a
// table (a zombie's save raced a collection) is passed over for the next
// older one.
func TestRestoreFallsBackWhenATableIsGone(t *testing.T) {
	ctx := testCtx(t, time.Minute)
	js := startJS(t)
	obs, err := OpenCheckpoints(ctx, js, CheckpointConfig{})
	if err != nil {
		t.Fatal(err)
	}
	src := openDB(t, "")
	fill(t, src, "a", 50, 500)
	applied(t, src, 1)
	if _, err := SaveCheckpoint(ctx, obs, 0, src); err != nil {
		t.Fatal(err)
	}
	fill(t, src, "b", 50, 500)
	applied(t, src, 2)
	newest, err := SaveCheckpoint(ctx, obs, 0, src)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := ReadObject(ctx, obs, TablesName(0, newest.Seq))
	if err != nil {
		t.Fatal(err)
	}
	list, err := decodeTableList(raw)
	if err != nil {
		t.Fatal(err)
	}
	if err := obs.Delete(ctx, list.Tables[len(list.Tables)-1].Object); err != nil {
		t.Fatal(err)
	}
	seq, err := Restore(ctx, obs, 0, filepath.Join(t.TempDir(), "r"))
	if err != nil || seq != 1 {
		t.Fatalf("restore = %d, %v; want the older checkpoint (1)", seq, err)
	}
}

func TestRemoveStaging(t *testing.T) {
	dir := t.TempDir()
	for _, d := range []string{".checkpoint-123/ckpt", ".restore-9", "pebble", ".checkpointish"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	removed, err := RemoveStaging(dir)
	if err != nil || len(removed) != 2 {
		t.Fatalf("RemoveStaging = %v, %v", removed, err)
	}
	left, _ := os.ReadDir(dir)
	if len(left) != 2 {
		t.Fatalf("left %v", left)
	}
}

// FuzzTableList: no table list panics the decoder, and one it accepts
// names only tables inside the directory.
func FuzzTableList(f *testing.F) {
	f.Add([]byte(`{"format":2,"tables":[{"name":"000005.sst","object":"partition-0/sst/` + fmt.Sprintf("%064x", 1) + `.sst","size":3,"sha256":"` + fmt.Sprintf("%064x", 1) + `"}]}`))
	f.Add([]byte(`{"format":2,"tables":[{"name":"../x.sst"}]}`))
	f.Fuzz(func(t *testing.T, raw []byte) {
		list, err := decodeTableList(raw)
		if err != nil {
			return
		}
		for _, tb := range list.Tables {
			if !filepath.IsLocal(tb.Name) || !isTable(tb.Name) {
				t.Fatalf("accepted %q", tb.Name)
			}
		}
	})
}

// storeOpts are the store's options that matter here: no WAL recycling,
// and no automatic compaction (only the test's compactions drop values).
func storeOpts() *pebble.Options {
	return &pebble.Options{Logger: quietLogger{}, DisableAutomaticCompactions: true, Cleaner: noRecycle{}}
}

var _ = context.Background

// TestPaceStaysWithinItsBudget: the pace is the rate asked for, unless
// the bytes to upload would then take longer than uploadBudget; 0 is
// unpaced.
func TestPaceStaysWithinItsBudget(t *testing.T) {
	const mib = 1 << 20
	if newPace(0, 100*mib) != nil {
		t.Fatal("rate 0 paced the upload")
	}
	for _, c := range []struct {
		rate, bytes int64
		want        float64
	}{
		{16 * mib, 1 * mib, 16 * mib},
		{16 * mib, 32 * mib, 16 * mib},
		{16 * mib, 100 * mib, 100 * mib / uploadBudget.Seconds()},
	} {
		if got := newPace(c.rate, c.bytes).rate; got != c.want {
			t.Errorf("newPace(%d, %d).rate = %.0f, want %.0f", c.rate, c.bytes, got, c.want)
		}
	}
}
