package partition

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/telha/telha-cascade/internal/scrubmark"
)

// TestTailCheckpointRestores: a whole checkpoint at S, then write-sets
// appended while a recording runs, stored as a tail checkpoint at L; the
// changelog purged whole (as an erase's scrub does). Restore applies the
// base and the tail and reproduces the owner's store at L; a collection
// of the tables keeps the base's; Prune keeps a kept tail's base and
// counts only what a restore needs; a later whole checkpoint lets both go.
func TestTailCheckpointRestores(t *testing.T) {
	ctx := testCtx(t, 2*time.Minute)
	js := startJS(t)
	cl, err := Open(ctx, js, Config{Partition: 3, MaxPartBytes: 8 << 10})
	if err != nil {
		t.Fatal(err)
	}
	obs, err := OpenCheckpoints(ctx, js, CheckpointConfig{})
	if err != nil {
		t.Fatal(err)
	}
	src := openDB(t, "")
	o := newOwner(t, cl, src, 3)
	for range 20 {
		o.mustCommit(ctx, 0)
	}
	base, err := SaveCheckpoint(ctx, obs, 3, src)
	if err != nil {
		t.Fatal(err)
	}
	rec := cl.Record(1 << 20)
	for i := range 12 {
		big := 0
		if i == 4 {
			big = 20 << 10 // split in parts: recorded whole, at its last part
		}
		o.mustCommit(ctx, big)
	}
	es, ok := cl.Recorded(rec)
	if !ok || len(es) != 12 || rec.From() != base.Seq || es[len(es)-1].Seq != cl.Last() {
		t.Fatalf("recorded %d write-sets (ok %t) from %d through %d; want 12 from %d through %d",
			len(es), ok, rec.From(), es[len(es)-1].Seq, base.Seq, cl.Last())
	}
	cl.StopRecording(rec)
	last := cl.Last()
	tail, err := SaveTail(ctx, obs, 3, base, last, es, 0)
	if err != nil {
		t.Fatal(err)
	}
	if tail.Seq != last || tail.Base != base.Name || tail.TailWriteSets != 12 || tail.Name != CheckpointName(3, last) {
		t.Fatalf("tail checkpoint %+v, want one at %d on %s with 12 write-sets", tail, last, base.Name)
	}
	if err := cl.PurgeBelow(ctx, last+1); err != nil {
		t.Fatal(err)
	}
	cps, err := ListCheckpoints(ctx, obs, 3)
	if err != nil || len(cps) != 2 || cps[0].Base != "" || cps[1].Base != base.Name {
		t.Fatalf("checkpoints %+v (%v), want the base and its tail", cps, err)
	}
	// The base's tables are the tail's: a collection keeps them.
	if n, _, err := CollectTables(ctx, js, obs, "TELHA_CKPT", 3); err != nil || n != 0 {
		t.Fatalf("collection beside a tail deleted %d tables (%v), want 0", n, err)
	}
	dir := filepath.Join(t.TempDir(), "restored")
	seq, err := Restore(ctx, obs, 3, dir)
	if err != nil || seq != last {
		t.Fatalf("restore = %d, %v; want %d", seq, err, last)
	}
	dst := openDB(t, dir)
	if a, err := AppliedSeq(dst); err != nil || a != last {
		t.Fatalf("restored applied seq = %d, %v; want %d", a, err, last)
	}
	assertSameStore(t, src, dst)

	// Keep one: the tail, and its base with it; the log is needed from
	// the tail on, not from the base.
	need, err := Prune(ctx, obs, 3, 1)
	if err != nil || need != last+1 {
		t.Fatalf("prune = %d, %v; want %d", need, err, last+1)
	}
	if cps, err := ListCheckpoints(ctx, obs, 3); err != nil || len(cps) != 2 {
		t.Fatalf("after a prune to one: %+v (%v), want the tail and its base", cps, err)
	}
	for range 3 {
		o.mustCommit(ctx, 0)
	}
	whole, err := SaveCheckpoint(ctx, obs, 3, src)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Prune(ctx, obs, 3, 1); err != nil {
		t.Fatal(err)
	}
	if cps, err := ListCheckpoints(ctx, obs, 3); err != nil || len(cps) != 1 || cps[0].Name != whole.Name {
		t.Fatalf("after a whole checkpoint and a prune to one: %+v (%v), want %s alone", cps, err, whole.Name)
	}
}

// TestSaveTailRefuses: what cannot restore as a tail is refused with
// ErrNoTail, and nothing is stored: an erase marker in a write-set (the
// bytes it erased are in the base), a gap before the end, a base that is
// itself a tail.
func TestSaveTailRefuses(t *testing.T) {
	ctx, obs, db := bucketAndStore(t)
	base := saveAt(t, obs, db, 5)
	marked := db.NewBatch()
	mk, err := scrubmark.Encode([]scrubmark.Range{{Start: []byte{0x01}, End: []byte{0x02}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := marked.LogData(mk, nil); err != nil {
		t.Fatal(err)
	}
	put := TailEntry{Seq: 6, WriteSet: batchRepr(t, "six")}
	for name, c := range map[string]struct {
		base CheckpointInfo
		end  uint64
		es   []TailEntry
	}{
		"an erase marker":    {base, 7, []TailEntry{put, {Seq: 7, WriteSet: marked.Repr()}}},
		"short of the end":   {base, 9, []TailEntry{put}},
		"not above the base": {base, 6, []TailEntry{{Seq: 5, WriteSet: put.WriteSet}, put}},
		"nothing":            {base, 6, nil},
		"a tail as the base": {CheckpointInfo{Seq: 5, Name: base.Name, Base: CheckpointName(1, 2)}, 6, []TailEntry{put}},
	} {
		if _, err := SaveTail(ctx, obs, 1, c.base, c.end, c.es, 0); !errors.Is(err, ErrNoTail) {
			t.Errorf("%s: %v, want ErrNoTail", name, err)
		}
	}
	if cps, err := ListCheckpoints(ctx, obs, 1); err != nil || len(cps) != 1 {
		t.Fatalf("checkpoints after refused tails: %+v (%v), want the base alone", cps, err)
	}
}

// A recording past its bound keeps nothing and says so; one replaced by
// another says so too.
func TestRecordingBound(t *testing.T) {
	ctx := testCtx(t, time.Minute)
	js := startJS(t)
	cl, err := Open(ctx, js, Config{Partition: 2})
	if err != nil {
		t.Fatal(err)
	}
	o := newOwner(t, cl, openDB(t, ""), 2)
	rec := cl.Record(100)
	o.mustCommit(ctx, 200)
	if es, ok := cl.Recorded(rec); ok || es != nil {
		t.Fatalf("a recording past its bound returned %d write-sets, ok %t", len(es), ok)
	}
	rec = cl.Record(1 << 20)
	o.mustCommit(ctx, 0)
	next := cl.Record(1 << 20)
	if _, ok := cl.Recorded(rec); ok {
		t.Fatal("a replaced recording answered")
	}
	o.mustCommit(ctx, 0)
	cl.Trim(next, cl.Last()) // a checkpoint holds it: dropped
	if es, ok := cl.Recorded(next); !ok || len(es) != 0 {
		t.Fatalf("recording after a trim through its last: %d write-sets, ok %t", len(es), ok)
	}
	cl.StopRecording(rec) // not the recording: leaves next running
	o.mustCommit(ctx, 0)
	if es, ok := cl.Recorded(next); !ok || len(es) != 1 || es[0].Seq != cl.Last() {
		t.Fatalf("recording after a stale stop: %d write-sets, ok %t", len(es), ok)
	}
	if err := cl.ReadRange(ctx, 1, cl.Last(), func(uint64, []byte) error { return nil }); err != nil {
		t.Fatal(err)
	}
	n := 0
	if err := cl.ReadRange(ctx, 2, 2, func(uint64, []byte) error { n++; return nil }); err != nil || n != 1 {
		t.Fatalf("read range of one write-set: %d, %v", n, err)
	}
}

// TestATailWithoutItsBaseIsPassedOver: a tail whose base is gone does not
// restore; RestoreNewest restores the next older whole checkpoint and says
// why it passed the tail over.
func TestATailWithoutItsBaseIsPassedOver(t *testing.T) {
	ctx, obs, db := bucketAndStore(t)
	saveAt(t, obs, db, 5)
	base := saveAt(t, obs, db, 6)
	tail, err := SaveTail(ctx, obs, 1, base, 7, []TailEntry{{Seq: 7, WriteSet: batchRepr(t, "seven")}}, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := obs.Delete(ctx, base.Name); err != nil {
		t.Fatal(err)
	}
	r, err := RestoreNewest(ctx, obs, 1, filepath.Join(t.TempDir(), "r"))
	if err != nil || r.Seq != 5 || len(r.Skipped) != 1 || !strings.Contains(r.Skipped[0].Error(), tail.Name) {
		t.Fatalf("restore with the tail's base gone: %+v, %v; want the checkpoint at 5, the tail named as passed over", r, err)
	}
}

// bucketAndStore starts a NATS server with a checkpoint bucket, and opens
// an empty store.
func bucketAndStore(t *testing.T) (context.Context, jetstream.ObjectStore, *pebble.DB) {
	t.Helper()
	ctx := testCtx(t, time.Minute)
	obs, err := OpenCheckpoints(ctx, startJS(t), CheckpointConfig{})
	if err != nil {
		t.Fatal(err)
	}
	return ctx, obs, openDB(t, "")
}

// saveAt applies one put at seq to db and saves partition 1's checkpoint.
func saveAt(t *testing.T, obs jetstream.ObjectStore, db *pebble.DB, seq uint64) CheckpointInfo {
	t.Helper()
	if err := ApplyTo(db, seq, batchRepr(t, fmt.Sprint(seq)), false); err != nil {
		t.Fatal(err)
	}
	cp, err := SaveCheckpoint(testCtx(t, time.Minute), obs, 1, db)
	if err != nil {
		t.Fatal(err)
	}
	return cp
}

// TestRecordingRacesAppends: a recording begun while another goroutine
// appends holds exactly the write-sets after its From, each once and in
// order, as the log holds them: nothing appended in flight when it began
// is lost or doubled (run with -race).
func TestRecordingRacesAppends(t *testing.T) {
	ctx := testCtx(t, time.Minute)
	js := startJS(t)
	cl, err := Open(ctx, js, Config{Partition: 6, MaxPartBytes: 4 << 10})
	if err != nil {
		t.Fatal(err)
	}
	o := newOwner(t, cl, openDB(t, ""), 6)
	for round := range 5 {
		done := make(chan error, 1)
		go func() {
			for i := range 40 {
				big := 0
				if i%9 == 0 {
					big = 10 << 10 // in parts
				}
				if _, err := o.commit(ctx, o.batch(big)); err != nil {
					done <- err
					return
				}
			}
			done <- nil
		}()
		rec := cl.Record(64 << 20) // while the appends run
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		got, ok := cl.Recorded(rec)
		cl.StopRecording(rec)
		if !ok {
			t.Fatalf("round %d: the recording did not keep its write-sets", round)
		}
		var want []TailEntry
		if err := cl.ReadRange(ctx, rec.From()+1, cl.Last(), func(seq uint64, ws []byte) error {
			want = append(want, TailEntry{Seq: seq, WriteSet: bytes.Clone(ws)})
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		if len(got) != len(want) {
			t.Fatalf("round %d: recorded %d write-sets after %d, the log holds %d", round, len(got), rec.From(), len(want))
		}
		for i := range want {
			if got[i].Seq != want[i].Seq || !bytes.Equal(got[i].WriteSet, want[i].WriteSet) {
				t.Fatalf("round %d: write-set %d: recorded seq %d, the log's %d (same bytes: %t)",
					round, i, got[i].Seq, want[i].Seq, bytes.Equal(got[i].WriteSet, want[i].WriteSet))
			}
		}
	}
}
