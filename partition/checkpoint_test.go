package partition

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Three checkpoints taken while the owner appends; Prune keeps the newest
// two and names the lowest sequence still needed; the changelog is purged
// below it (the purge floor also honours a standby); Restore into an empty
// directory plus Replay from the checkpoint's sequence reproduces the
// owner's store exactly; replay from the oldest kept checkpoint still
// works, and older sequences are gone (ErrTruncated).
func TestCheckpointPruneRestoreReplay(t *testing.T) {
	ctx := testCtx(t, 2*time.Minute)
	js := startJS(t)
	cl, err := Open(ctx, js, Config{Partition: 4, MaxPartBytes: 8 << 10})
	if err != nil {
		t.Fatal(err)
	}
	obs, err := OpenCheckpoints(ctx, js, CheckpointConfig{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Restore(ctx, obs, 4, filepath.Join(t.TempDir(), "none")); !errors.Is(err, ErrNoCheckpoint) {
		t.Fatalf("restore with no checkpoint: %v, want ErrNoCheckpoint", err)
	}
	if need, err := Prune(ctx, obs, 4, 2); err != nil || need != 1 {
		t.Fatalf("prune with no checkpoint = %d, %v; want 1 (the whole log)", need, err)
	}

	src := openDB(t, "")
	o := newOwner(t, cl, src, 4)
	var cps []CheckpointInfo
	for round := range 3 {
		for i := range 15 {
			big := 0
			if i == 5 {
				big = 20 << 10
			}
			o.mustCommit(ctx, big)
		}
		cp, err := SaveCheckpoint(ctx, obs, 4, src)
		if err != nil {
			t.Fatal(err)
		}
		if cp.Seq != cl.Last() || cp.Name != CheckpointName(4, cl.Last()) || cp.Size == 0 {
			t.Fatalf("round %d: checkpoint %+v, want seq %d", round, cp, cl.Last())
		}
		cps = append(cps, cp)
	}
	// A checkpoint of another partition in the same bucket is not ours.
	other := openDB(t, "")
	if err := ApplyTo(other, 1000, batchRepr(t, "other"), false); err != nil {
		t.Fatal(err)
	}
	if _, err := SaveCheckpoint(ctx, obs, 5, other); err != nil {
		t.Fatal(err)
	}
	for range 7 {
		o.mustCommit(ctx, 0) // the tail after the newest checkpoint
	}

	need, err := Prune(ctx, obs, 4, 2)
	if err != nil {
		t.Fatal(err)
	}
	if need != cps[1].Seq+1 {
		t.Fatalf("prune needs %d, want %d (oldest kept checkpoint + 1)", need, cps[1].Seq+1)
	}
	kept, err := ListCheckpoints(ctx, obs, 4)
	if err != nil {
		t.Fatal(err)
	}
	if len(kept) != 2 || kept[0].Seq != cps[1].Seq || kept[1].Seq != cps[2].Seq {
		t.Fatalf("kept %+v, want the two newest", kept)
	}
	if others, _ := ListCheckpoints(ctx, obs, 5); len(others) != 1 || others[0].Seq != 1000 {
		t.Fatalf("partition 5's checkpoints %+v, want one at 1000", others)
	}
	// A standby far behind holds the floor down; one ahead does not.
	if f := PurgeFloor(need, cps[0].Seq); f != cps[0].Seq+1 {
		t.Fatalf("purge floor with a lagging standby = %d, want %d", f, cps[0].Seq+1)
	}
	floor := PurgeFloor(need, cl.Last())
	if floor != need {
		t.Fatalf("purge floor = %d, want %d", floor, need)
	}
	if err := cl.PurgeBelow(ctx, cl.Last()+2); err == nil {
		t.Fatal("purge above the log's end accepted")
	}
	if err := cl.PurgeBelow(ctx, floor); err != nil {
		t.Fatal(err)
	}
	if st := streamState(t, cl); st.FirstSeq != floor {
		t.Fatalf("log starts at %d after the purge, want %d", st.FirstSeq, floor)
	}

	// Restore on an empty disk and catch up.
	dir := filepath.Join(t.TempDir(), "restored")
	if err := os.Mkdir(dir, 0o755); err != nil { // exists and empty: allowed
		t.Fatal(err)
	}
	seq, err := Restore(ctx, obs, 4, dir)
	if err != nil {
		t.Fatal(err)
	}
	if seq != cps[2].Seq {
		t.Fatalf("restored seq %d, want the newest checkpoint's %d", seq, cps[2].Seq)
	}
	dst := openDB(t, dir)
	if a, err := AppliedSeq(dst); err != nil || a != seq {
		t.Fatalf("restored store's applied seq = %d, %v; want %d", a, err, seq)
	}
	var n int
	if err := cl.Replay(ctx, seq+1, applyAll(dst, &n)); err != nil {
		t.Fatal(err)
	}
	if n != 7 {
		t.Fatalf("replayed %d write-sets after the checkpoint, want 7", n)
	}
	assertSameStore(t, src, dst)

	// From the oldest kept checkpoint the log is intact; below it, gone.
	n = 0
	if err := cl.Replay(ctx, need, func(uint64, []byte) error { n++; return nil }); err != nil {
		t.Fatalf("replay from the oldest kept checkpoint: %v", err)
	}
	if n != 15+7 {
		t.Fatalf("replay from %d read %d write-sets, want 22", need, n)
	}
	if err := cl.Replay(ctx, 1, func(uint64, []byte) error { return nil }); !errors.Is(err, ErrTruncated) {
		t.Fatalf("replay from 1 after the purge: %v, want ErrTruncated", err)
	}
	if err := cl.Replay(ctx, cps[0].Seq+1, func(uint64, []byte) error { return nil }); !errors.Is(err, ErrTruncated) {
		t.Fatalf("replay from the pruned checkpoint: %v, want ErrTruncated", err)
	}

	// Restore refuses a non-empty directory.
	if _, err := Restore(ctx, obs, 4, dir); err == nil {
		t.Fatal("restore into a non-empty directory accepted")
	}
}

func TestCheckpointNames(t *testing.T) {
	for _, c := range []struct {
		p   int
		seq uint64
	}{{0, 0}, {3, 17}, {1024, 1<<64 - 1}} {
		p, seq, ok := parseCheckpointName(CheckpointName(c.p, c.seq))
		if !ok || p != c.p || seq != c.seq {
			t.Fatalf("round trip of (%d, %d) = (%d, %d, %t)", c.p, c.seq, p, seq, ok)
		}
	}
	for _, bad := range []string{"", "partition-1/seq-1.tar", "partition-01/seq-00000000000000000001.tar",
		"partition-x/seq-00000000000000000001.tar", "partition-1/seq-0000000000000000000a.tar", "other"} {
		if _, _, ok := parseCheckpointName(bad); ok {
			t.Fatalf("parsed %q", bad)
		}
	}
	if CheckpointName(1, 9) >= CheckpointName(1, 10) {
		t.Fatal("names do not sort by sequence")
	}
}

// TestCheckpointAtTheSameSequenceIsKept: a second SaveCheckpoint with
// nothing committed since the first keeps the stored object (same chunks)
// rather than replacing it: a replacement would purge the first one's
// chunks without overwriting them (erase.go).
func TestCheckpointAtTheSameSequenceIsKept(t *testing.T) {
	ctx := testCtx(t, time.Minute)
	js := startJS(t)
	cl, err := Open(ctx, js, Config{Partition: 1})
	if err != nil {
		t.Fatal(err)
	}
	obs, err := OpenCheckpoints(ctx, js, CheckpointConfig{})
	if err != nil {
		t.Fatal(err)
	}
	src := openDB(t, "")
	o := newOwner(t, cl, src, 1)
	o.mustCommit(ctx, 0)
	first, err := SaveCheckpoint(ctx, obs, 1, src)
	if err != nil || first.Existed {
		t.Fatalf("first checkpoint %+v %v", first, err)
	}
	before, err := obs.GetInfo(ctx, first.Name)
	if err != nil {
		t.Fatal(err)
	}
	second, err := SaveCheckpoint(ctx, obs, 1, src)
	if err != nil || !second.Existed || second.Seq != first.Seq {
		t.Fatalf("second checkpoint at the same sequence %+v %v, want the first kept", second, err)
	}
	after, err := obs.GetInfo(ctx, first.Name)
	if err != nil || after.NUID != before.NUID {
		t.Fatalf("the object was replaced: nuid %s -> %s (%v)", before.NUID, after.NUID, err)
	}
	o.mustCommit(ctx, 0)
	if third, err := SaveCheckpoint(ctx, obs, 1, src); err != nil || third.Existed || third.Seq != first.Seq+1 {
		t.Fatalf("checkpoint after a commit %+v %v", third, err)
	}
}

// TestListSinceSeesEveryWriter: a listing brought up to date from the
// bucket's meta messages after its position equals a new listing,
// whatever wrote since (puts, a replaced object, deletes, an object put
// and deleted), with its metadata, sizes and times as a listing gives
// them; read again from an older position it is the same (each meta
// message is the object's whole state); with nothing new it reads
// nothing.
func TestListSinceSeesEveryWriter(t *testing.T) {
	ctx, _, js, obs := startBucket(t)
	plain := obs.(*Bucket).ObjectStore
	put := func(name, body string) {
		t.Helper()
		if _, err := plain.Put(ctx, jetstream.ObjectMeta{Name: name, Metadata: map[string]string{metaFormat: "f-" + body}}, strings.NewReader(body)); err != nil {
			t.Fatal(err)
		}
	}
	del := func(name string) {
		t.Helper()
		if err := plain.Delete(ctx, name); err != nil {
			t.Fatal(err)
		}
	}
	for _, n := range []string{"a", "b", "c"} {
		put("partition-0/"+n, n)
	}
	at0, err := BucketStateOf(ctx, js, "TELHA_CKPT")
	if err != nil {
		t.Fatal(err)
	}
	l0, err := List(ctx, obs)
	if err != nil {
		t.Fatal(err)
	}
	if l, err := ListSince(ctx, js, "TELHA_CKPT", l0, at0.LastSeq); err != nil || !maps.Equal(describeAll(l), describeAll(l0)) {
		t.Fatalf("nothing new: %v (%v); want the listing as it was at %d", describeAll(l), err, at0.LastSeq)
	}
	put("partition-0/d", "dd")
	put("partition-0/a", "a-again")
	del("partition-0/b")
	put("partition-1/e", "e")
	del("partition-1/e")
	put("partition-1/f", "ffff")
	want, err := List(ctx, obs)
	if err != nil {
		t.Fatal(err)
	}
	l1, err := ListSince(ctx, js, "TELHA_CKPT", l0, at0.LastSeq)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := describeAll(l1), describeAll(want); !maps.Equal(got, want) {
		t.Fatalf("brought up to date:\n%v\na new listing:\n%v", got, want)
	}
	again, err := ListSince(ctx, js, "TELHA_CKPT", l1, at0.LastSeq)
	if err != nil || !maps.Equal(describeAll(again), describeAll(want)) {
		t.Fatalf("read again from the older position: %v, %v", describeAll(again), err)
	}
}

// describeAll is each object of l: its size, metadata and time.
func describeAll(l Listing) map[string]string {
	out := map[string]string{}
	for _, o := range l {
		out[o.Name] = fmt.Sprint(o.Size, " ", o.Metadata, " ", o.ModTime.UnixNano(), " ", o.Deleted)
	}
	return out
}

// lagView is a JetStream whose ordered consumers sit on a replica that
// has not applied the stream's latest messages when asked (its info: no
// message pending), and deliver them once asked for the next one: what
// the server does when it places a consumer on a replica that lags
// behind the leader (a server just restarted or continued).
type lagView struct{ jetstream.JetStream }

func (j lagView) OrderedConsumer(ctx context.Context, stream string, cfg jetstream.OrderedConsumerConfig) (jetstream.Consumer, error) {
	c, err := j.JetStream.OrderedConsumer(ctx, stream, cfg)
	return nothingPendingYet{c}, err
}

type nothingPendingYet struct{ jetstream.Consumer }

func (c nothingPendingYet) Info(ctx context.Context) (*jetstream.ConsumerInfo, error) {
	ci, err := c.Consumer.Info(ctx)
	if err != nil {
		return nil, err
	}
	lagging := *ci
	lagging.NumPending = 0
	return &lagging, nil
}

// A listing brought up to date reads on to the last meta message the
// stream's leader has, whatever the consumer's replica says is pending.
// Before, it trusted that replica: one that lagged left the objects
// stored lately out of the listing.
func TestListSinceReadsPastALaggingReplica(t *testing.T) {
	ctx, _, js, obs := startBucket(t)
	plain := obs.(*Bucket).ObjectStore
	if _, err := plain.PutString(ctx, "partition-0/a", "a"); err != nil {
		t.Fatal(err)
	}
	at0, err := BucketStateOf(ctx, js, "TELHA_CKPT")
	if err != nil {
		t.Fatal(err)
	}
	l0, err := List(ctx, obs)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"b", "c"} {
		if _, err := plain.PutString(ctx, "partition-0/"+n, n); err != nil {
			t.Fatal(err)
		}
	}
	want, err := List(ctx, obs)
	if err != nil {
		t.Fatal(err)
	}
	got, err := ListSince(ctx, lagView{js}, "TELHA_CKPT", l0, at0.LastSeq)
	if err != nil {
		t.Fatal(err)
	}
	if g, w := describeAll(got), describeAll(want); !maps.Equal(g, w) {
		t.Fatalf("brought up to date through a lagging replica:\n%v\nthe bucket:\n%v", g, w)
	}
}
