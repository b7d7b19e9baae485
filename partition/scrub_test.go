package partition

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/telha/telha-cascade/internal/diskscan"
	"github.com/telha/telha-cascade/internal/scrubmark"
)

// markerWS is a write-set that overwrites key with clean and carries an
// erase marker for [key, key+1).
func markerWS(t testing.TB, db *pebble.DB, key []byte, clean string) []byte {
	t.Helper()
	b := db.NewBatch()
	defer b.Close()
	if err := b.Set(key, []byte(clean), nil); err != nil {
		t.Fatal(err)
	}
	end := append(bytes.Clone(key), 0)
	p, err := scrubmark.Encode([]scrubmark.Range{{Start: key, End: end}})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.LogData(p, nil); err != nil {
		t.Fatal(err)
	}
	return bytes.Clone(b.Repr())
}

func setWS(t testing.TB, db *pebble.DB, key []byte, value string) []byte {
	t.Helper()
	b := db.NewBatch()
	defer b.Close()
	if err := b.Set(key, []byte(value), nil); err != nil {
		t.Fatal(err)
	}
	return bytes.Clone(b.Repr())
}

func pendingScrubs(t testing.TB, db *pebble.DB) int {
	t.Helper()
	it, err := db.NewIter(&pebble.IterOptions{LowerBound: pendingScrubPrefix, UpperBound: []byte{0xF0, 0x04}})
	if err != nil {
		t.Fatal(err)
	}
	defer it.Close()
	n := 0
	for ok := it.First(); ok; ok = it.Next() {
		n++
	}
	return n
}

// TestReplayedMarkerScrubsTheCopy: a copy that applies an erase marker
// with ApplyTo (a standby's tail and a catch-up's replay alike) holds a
// pending scrub until ScrubPending compacts the marker's range, and then
// no file of the copy holds the old value. A copy that stops between the
// apply and the compaction still has the pending record when it opens
// again (the interrupted compaction is redone).
func TestReplayedMarkerScrubsTheCopy(t *testing.T) {
	dir := t.TempDir()
	// No automatic compaction: only ScrubPending's may drop the old value.
	opts := &pebble.Options{Logger: quietLogger{}, DisableAutomaticCompactions: true}
	db, err := pebble.Open(dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	key := []byte{0x01, 'n', 'o', 'd', 'e'}
	const secret = "SECRET-erased-props-7f3a"
	if err := ApplyTo(db, 1, setWS(t, db, key, secret), true); err != nil {
		t.Fatal(err)
	}
	if err := db.Flush(); err != nil { // the old value in a table, as on a long-lived copy
		t.Fatal(err)
	}
	if err := ApplyTo(db, 2, markerWS(t, db, key, "{}"), true); err != nil {
		t.Fatal(err)
	}
	if n := pendingScrubs(t, db); n != 1 {
		t.Fatalf("%d pending scrubs after applying a marker, want 1", n)
	}
	// The copy stops before it compacts.
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	db, err = pebble.Open(dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if n := pendingScrubs(t, db); n != 1 {
		t.Fatalf("%d pending scrubs after a restart, want 1 (the compaction must be redone)", n)
	}
	files, err := diskscan.FilesContaining(dir, secret)
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatal("the test's premise: the old value should still be on disk before the scrub")
	}
	n, err := ScrubPending(context.Background(), db)
	if err != nil || n != 1 {
		t.Fatalf("ScrubPending = %d, %v; want 1, nil", n, err)
	}
	if n := pendingScrubs(t, db); n != 0 {
		t.Fatalf("%d pending scrubs after ScrubPending", n)
	}
	// Pebble deletes obsolete files in the background: poll.
	waitNoFiles(t, dir, secret)
	if n, err := ScrubPending(context.Background(), db); n != 0 || err != nil {
		t.Fatalf("a second ScrubPending = %d, %v; want 0, nil", n, err)
	}
}

// TestLegacyMarkerStillScrubs: a changelog written by the release before
// the typed marker still makes a copy compact (everything).
func TestLegacyMarkerStillScrubs(t *testing.T) {
	db := openDB(t, "")
	b := db.NewBatch()
	_ = b.LogData(legacyMarker, nil)
	ws := bytes.Clone(b.Repr())
	_ = b.Close()
	rs, ok, err := FindScrubMarker(ws)
	if err != nil || !ok || len(rs) != 1 || !bytes.Equal(rs[0].End, reservedStart) {
		t.Fatalf("legacy marker: %v %v %v", rs, ok, err)
	}
}

// FuzzNoForgedMarker: whatever a tenant puts in a key or a value (the
// marker's payload itself, the legacy sentence), a write-set of sets and
// deletes carries no erase marker, so no tenant can make every copy
// compact.
func FuzzNoForgedMarker(f *testing.F) {
	p, _ := scrubmark.Encode([]scrubmark.Range{{Start: []byte{0}, End: []byte{0xEF}}})
	f.Add([]byte{0x01, 'k'}, p)
	f.Add(p, legacyMarker)
	f.Add(legacyMarker, []byte("props: telha erase: scrub of the copies"))
	db, err := pebble.Open("", &pebble.Options{FS: vfs.NewMem(), Logger: quietLogger{}})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { db.Close() })
	f.Fuzz(func(t *testing.T, key, value []byte) {
		b := db.NewBatch()
		defer b.Close()
		_ = b.Set(key, value, nil)
		_ = b.Delete(value, nil)
		_ = b.Set(value, key, nil)
		ws := b.Repr()
		if ValidateWriteSet(ws) != nil {
			return // refused before anything reads it (the reserved keyspace)
		}
		if _, ok, err := FindScrubMarker(ws); ok || err != nil {
			t.Fatalf("tenant data made a marker: ok %v err %v", ok, err)
		}
	})
}

// waitNoFiles waits (bounded) until no file under dir holds s: Pebble
// deletes obsolete tables and WAL files in the background.
func waitNoFiles(t testing.TB, dir, s string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		files, err := diskscan.FilesContaining(dir, s)
		if err != nil {
			t.Fatal(err)
		}
		if len(files) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("files still holding %q: %v", s, files)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestIdleReaderNoticesAPurgeThatOvertookIt (issue 29 item 3): a tailing
// reader whose client buffer holds part of the log when the owner purges
// past it drains the buffer and then, idle, finds the gap itself: Tail
// returns ErrTruncated (its standby catches up from a checkpoint and is not
// ready meanwhile) instead of waiting, ready, on a copy that holds what the
// purge removed.
func TestIdleReaderNoticesAPurgeThatOvertookIt(t *testing.T) {
	ctx := testCtx(t, time.Minute)
	js := startJS(t)
	cl, err := Open(ctx, js, Config{Partition: 2})
	if err != nil {
		t.Fatal(err)
	}
	reader, err := Open(ctx, js, Config{Partition: 2, IdleCheck: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	src := openDB(t, "")
	o := newOwner(t, cl, src, 2)
	o.mustCommit(ctx, 0)
	gate := make(chan struct{})
	first := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		n := 0
		done <- reader.Tail(ctx, 1, func(uint64, []byte) error {
			n++
			if n == 1 {
				close(first)
				<-gate // hold the reader while the owner runs ahead
			}
			return nil
		})
	}()
	<-first
	for range 1000 { // more than the reader's buffer (512 messages)
		o.mustCommit(ctx, 0)
	}
	if err := cl.PurgeBelow(ctx, cl.Last()+1); err != nil {
		t.Fatal(err)
	}
	close(gate)
	select {
	case err := <-done:
		if !errors.Is(err, ErrTruncated) {
			t.Fatalf("Tail returned %v, want ErrTruncated", err)
		}
	case <-ctx.Done():
		t.Fatal("the overtaken reader never noticed the purge")
	}
}
