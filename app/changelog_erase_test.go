package app

import (
	"bytes"
	"context"
	"errors"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/telha/telha-cascade/api"
	"github.com/telha/telha-cascade/internal/diskscan"
	"github.com/telha/telha-cascade/internal/sealed"
	"github.com/telha/telha-cascade/internal/testnats"
	"github.com/telha/telha-cascade/metrics"
	"github.com/telha/telha-cascade/partition"
	"github.com/telha/telha-cascade/queue"
	"github.com/telha/telha-cascade/reaper"
	"github.com/telha/telha-cascade/storage"
)

// objectsWith returns the objects of bucket (every partition's, deleted
// ones skipped) whose bytes contain s.
func objectsWith(t *testing.T, obs jetstream.ObjectStore, s string) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	infos, err := obs.List(ctx)
	if err != nil && err != jetstream.ErrNoObjectsFound {
		t.Fatal(err)
	}
	var hits []string
	for _, o := range infos {
		if o.Deleted {
			continue
		}
		b, err := partition.ReadObject(ctx, obs, o.Name)
		if errors.Is(err, sealed.ErrKeyDestroyed) {
			continue // shredded: nothing in it can be read
		}
		if err != nil {
			t.Fatalf("get %s: %v", o.Name, err)
		}
		if bytes.Contains(b, []byte(s)) {
			hits = append(hits, o.Name)
		}
	}
	return hits
}

// purgesPending lists the directories a JetStream file store moves a
// purged stream's blocks into and removes in the background.
func purgesPending(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == "__msgs__" || d.Name() == "__new_msgs__") {
			out = append(out, p)
		}
		return nil
	})
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	return out
}

// TestChangelogEraseReachesEveryCopy (issue 21 item 6): with --changelog
// jetstream, a node whose props carry a marker and an edge whose
// provenance reason carries another are written and checkpointed (so a
// kept checkpoint and the changelog's stream files hold both markers);
// erase_node of the node; after its result, no file under the NATS
// server's store directory, no object of the checkpoint bucket and no file
// of the local Pebble holds either marker, while a node not erased is still
// in the kept checkpoint. Then the disk is lost: the restore answers the
// erased state (the erasure record, erased versions) and holds no marker.
func TestChangelogEraseReachesEveryCopy(t *testing.T) {
	ns := testnats.Start(t)
	dir := t.TempDir()
	flags := append(append([]string{}, changelogFlags...), "--secure-delete-requests", "--checkpoints-keep", "2")
	w := startWorker(t, ns, dir, Options{}, flags...)
	b := newBus(t, ns)
	const tenant = "gdpr"
	nodeMark, edgeMark, keepMark := diskscan.Marker("NODE"), diskscan.Marker("EDGE"), diskscan.Marker("KEEP")
	n, m, keep, e := uuid.NewString(), uuid.NewString(), uuid.NewString(), uuid.NewString()
	mustOK(t, b.wait(b.send(tenant, map[string]any{"op": "put_node", "id": n,
		"props": map[string]any{"name": nodeMark}, "provenance": map[string]any{"actor": "crm", "reason": "signup"}})))
	mustOK(t, b.wait(b.send(tenant, node(m))))
	mustOK(t, b.wait(b.send(tenant, withMarker(node(keep), keepMark))))
	ed := edge(e, n, m)
	ed["provenance"] = map[string]any{"actor": "crm", "reason": edgeMark}
	mustOK(t, b.wait(b.send(tenant, ed)))

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := w.app.Checkpoint(ctx); err != nil {
		t.Fatal(err)
	}
	// New versions carrying the markers, after the checkpoint: the
	// changelog holds them too (the checkpoint purged it below itself).
	mustOK(t, b.wait(b.send(tenant, map[string]any{"op": "put_node", "id": n,
		"props": map[string]any{"name": nodeMark, "v": 2}, "provenance": map[string]any{"actor": "crm", "reason": "update"}})))
	ed2 := edge(e, n, m)
	ed2["props"] = map[string]any{"v": 2}
	ed2["provenance"] = map[string]any{"actor": "crm", "reason": edgeMark}
	mustOK(t, b.wait(b.send(tenant, ed2)))
	natsDir := ns.Opts.StoreDir
	pebbleDir := filepath.Join(dir, "pebble")
	obs := mustObs(t, b.js, "TELHA_CKPT_STATIC1")
	st := w.app.ChangelogStatus()
	logDir := filepath.Join(natsDir, "jetstream", "$G", "streams", st.Stream)
	// The scans must be able to see the markers, or their silence proves nothing.
	for _, mk := range []string{nodeMark, edgeMark} {
		if len(filesWith(t, logDir, mk)) == 0 {
			t.Fatalf("%s is in no file of the changelog stream before the erase", mk)
		}
		if len(objectsWith(t, obs, mk)) == 0 {
			t.Fatalf("%s is in no checkpoint before the erase", mk)
		}
	}

	rid := b.send(tenant, eraseNode(n, "GDPR art. 17, ticket 21"))
	r := mustOK(t, b.wait(rid))
	if r.VersionsErased == nil || *r.VersionsErased < 5 { // the node's puts and tombstone, the edge's puts and tombstone
		t.Fatalf("erase_node result: %+v", r)
	}
	// The SRE's view of it (dashboard row "Erasure"): one scrub, its bytes
	// uploaded, no failure.
	mt := w.app.Metrics()
	if n := histogramOf(t, mt, "telha_erase_scrub_seconds").GetSampleCount(); n < 1 {
		t.Errorf("telha_erase_scrub_seconds counted %d scrubs after an erase", n)
	}
	if up := testutil.ToFloat64(mt.ScrubBytes.WithLabelValues(metrics.ScrubUploaded)); up <= 0 {
		t.Errorf("telha_erase_scrub_bytes_total{kind=uploaded} = %v after an erase's scrub", up)
	}
	if f := testutil.ToFloat64(mt.ScrubFailures); f != 0 {
		t.Errorf("telha_erase_scrub_failures_total = %v", f)
	}

	// The server removes a purged stream's old blocks right after the purge
	// returns, in the background: give it a moment (RELIABILITY.md says so).
	deadline := time.Now().Add(5 * time.Second)
	for len(purgesPending(t, natsDir)) > 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	for _, mk := range []string{nodeMark, edgeMark} {
		if hits := filesWith(t, natsDir, mk); len(hits) > 0 {
			t.Errorf("after the erase's result, %s is still in NATS files %v", mk, hits)
		}
		if hits := objectsWith(t, obs, mk); len(hits) > 0 {
			t.Errorf("after the erase's result, %s is still in checkpoints %v", mk, hits)
		}
		if hits := filesWith(t, pebbleDir, mk); len(hits) > 0 {
			t.Errorf("after the erase's result, %s is still in Pebble files %v", mk, hits)
		}
	}
	if len(objectsWith(t, obs, keepMark)) == 0 {
		t.Fatal("the node not erased is in no kept checkpoint: the checkpoint scan is blind")
	}
	cps, err := partition.ListCheckpoints(ctx, obs, 0)
	if err != nil || len(cps) == 0 {
		t.Fatalf("checkpoints after the erase: %v %v", cps, err)
	}
	if t.Failed() {
		t.FailNow()
	}

	// Lose the disk: the restore has the erased state and no marker.
	if err := w.stop(); err != nil {
		t.Fatal(err)
	}
	loseDisk(t, dir)
	w = startWorker(t, ns, dir, Options{}, flags...)
	if st := w.app.ChangelogStatus(); !st.Restored {
		t.Fatalf("restart on an empty disk: %+v, want a restore", st)
	}
	var rec api.Erasure
	if code := w.get("/v1/tenants/"+tenant+"/erasures/"+rid, &rec); code != http.StatusOK || rec.State != "done" || rec.VersionsErased != *r.VersionsErased {
		t.Fatalf("erasure record after the restore: %d %+v", code, rec)
	}
	for _, path := range []string{"/nodes/" + n, "/edges/" + e} {
		var h struct{ Versions []api.Version }
		if code := w.get("/v1/tenants/"+tenant+path+"/history", &h); code != http.StatusOK || len(h.Versions) < 2 {
			t.Fatalf("history of %s after the restore: %d %+v", path, code, h)
		}
		for _, v := range h.Versions {
			if !v.Erased || string(v.Props) != "null" || v.Provenance.Reason != "" || v.Provenance.Actor != "" {
				t.Fatalf("%s after the restore: version not erased: %+v", path, v)
			}
		}
	}
	var kv api.Version
	if code := w.get("/v1/tenants/"+tenant+"/nodes/"+keep, &kv); code != http.StatusOK || !strings.Contains(string(kv.Props), keepMark) {
		t.Fatalf("node not erased, after the restore: %d %+v", code, kv)
	}
	for _, mk := range []string{nodeMark, edgeMark} {
		if hits := filesWith(t, pebbleDir, mk); len(hits) > 0 {
			t.Fatalf("the restored store holds %s in %v", mk, hits)
		}
	}
}

// TestChangelogEraseWaitsForItsCopies: with --changelog jetstream, while
// the checkpoint bucket refuses the erase's checkpoint, the erase's attempt
// fails (logged, in the changelog status), nothing is purged, no result is
// published and the erasure stays in flight; once the bucket accepts again,
// the retry (after its backoff) finishes the erase, publishes its result,
// and no NATS file holds the erased data.
func TestChangelogEraseWaitsForItsCopies(t *testing.T) {
	ns := testnats.Start(t)
	clock := storage.NewManualClock(time.Now())
	attempts := make(chan error, 32)
	w := startWorker(t, ns, t.TempDir(), Options{Clock: clock, ReaperHooks: reaper.Hooks{
		EraseFinished: func(_ *storage.EraseEntry, _ storage.Receipt, err error) { attempts <- err },
	}}, append(append([]string{}, changelogFlags...), "--secure-delete-requests")...)
	b := newBus(t, ns)
	const tenant = "gdpr"
	mark := diskscan.Marker("WAIT")
	n := uuid.NewString()
	mustOK(t, b.wait(b.send(tenant, withMarker(node(n), mark))))

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	objStream, err := b.js.Stream(ctx, "OBJ_TELHA_CKPT_STATIC1")
	if err != nil {
		t.Fatal(err)
	}
	ocfg := objStream.CachedInfo().Config
	refusing := ocfg
	refusing.MaxMsgSize = 16 // every chunk refused at once
	if _, err := b.js.UpdateStream(ctx, refusing); err != nil {
		t.Fatal(err)
	}
	rid := b.send(tenant, eraseNode(n, "GDPR art. 17"))
	next := func() error {
		t.Helper()
		select {
		case err := <-attempts:
			return err
		case <-ctx.Done():
			t.Fatal("no attempt at the erase")
			return nil
		}
	}
	if err := next(); err == nil || !strings.Contains(err.Error(), "changelog") {
		t.Fatalf("the erase's attempt with the bucket refusing: %v, want a changelog error", err)
	}
	if st := w.app.ChangelogStatus(); st.LastErr == "" || st.EraseScrubs != 0 {
		t.Fatalf("changelog status after the failed attempt: %+v", st)
	}
	b.mu.Lock()
	early := b.results[rid]
	b.mu.Unlock()
	if len(early) > 0 {
		t.Fatalf("a result was published while the copies still hold the data: %+v", early)
	}
	if rs := readStream[queue.Result](t, b.js, "TELHA_RES", func(r queue.Result) bool { return r.RequestID == rid }); len(rs) > 0 {
		t.Fatalf("a result is in the results stream while the copies still hold the data: %+v", rs)
	}
	var rec api.Erasure
	if code := w.get("/v1/tenants/"+tenant+"/erasures/"+rid, &rec); code != http.StatusOK || rec.State != "in_flight" {
		t.Fatalf("erasure while its copies wait: %d %+v", code, rec)
	}
	logDir := filepath.Join(ns.Opts.StoreDir, "jetstream", "$G", "streams", w.app.ChangelogStatus().Stream)
	if len(filesWith(t, logDir, mark)) == 0 {
		t.Fatal("the changelog was purged although no checkpoint was stored")
	}

	if _, err := b.js.UpdateStream(ctx, ocfg); err != nil {
		t.Fatal(err)
	}
	for {
		clock.Advance(11 * time.Minute) // past the backoff
		if err := next(); err == nil {
			break
		}
	}
	mustOK(t, b.wait(rid))
	deadline := time.Now().Add(5 * time.Second)
	for len(purgesPending(t, ns.Opts.StoreDir)) > 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if hits := filesWith(t, ns.Opts.StoreDir, mark); len(hits) > 0 {
		t.Fatalf("after the retried erase's result, NATS files %v hold the erased data", hits)
	}
}

// TestChangelogEraseDoesNotHoldTheWriter (issue 29 item 1): while an
// erase's scrub of the copies is held between its checkpoint and its purge,
// another tenant's put on the same store commits and is answered, and the
// erase's own result waits for its copies.
func TestChangelogEraseDoesNotHoldTheWriter(t *testing.T) {
	ns := testnats.Start(t)
	opts, reached, release := holdFirstScrub("checkpointed")
	w := startWorker(t, ns, t.TempDir(), opts, changelogFlags...)
	b := newBus(t, ns)
	n := uuid.NewString()
	mustOK(t, b.wait(b.send("gdpr", withMarker(node(n), diskscan.Marker("HOLD")))))
	rid := b.send("gdpr", eraseNode(n, "GDPR art. 17"))
	select {
	case <-reached:
	case <-time.After(time.Minute):
		t.Fatal("the erase's scrub never reached its checkpoint")
	}
	// The writer is free: another tenant's put is answered while the scrub
	// waits (were the writer held, this wait would time out).
	mustOK(t, b.wait(b.send("bystander", node(uuid.NewString()))))
	b.mu.Lock()
	early := b.results[rid]
	b.mu.Unlock()
	if len(early) > 0 {
		t.Fatalf("the erase was answered before its copies were scrubbed: %+v", early)
	}
	close(release)
	mustOK(t, b.wait(rid))
	if st := w.app.ChangelogStatus(); st.EraseScrubs != 1 || st.LastScrub.Marker == 0 {
		t.Fatalf("changelog status after the erase: %+v", st)
	}
}

// TestWritesDuringAScrubRestoreFromItsTail (issue 29, DECISIONS 88):
// puts committed while an erase's scrub runs are stored, under the writer,
// as a tail checkpoint of the scrub's first save, not a second save of the
// store: the erase's data is in no NATS file and no checkpoint after its
// result, and a worker that loses its disk restores the base and the tail
// and answers every put.
func TestWritesDuringAScrubRestoreFromItsTail(t *testing.T) {
	ns := testnats.Start(t)
	dir := t.TempDir()
	opts, reached, release := holdFirstScrub("checkpointed")
	w := startWorker(t, ns, dir, opts, changelogFlags...)
	b := newBus(t, ns)
	gone, kept := diskscan.Marker("GONE"), diskscan.Marker("KEPT")
	n := uuid.NewString()
	mustOK(t, b.wait(b.send("gdpr", withMarker(node(n), gone))))
	rid := b.send("gdpr", eraseNode(n, "GDPR art. 17"))
	select {
	case <-reached:
	case <-time.After(time.Minute):
		t.Fatal("the erase's scrub never reached its checkpoint")
	}
	// Puts sent together while the scrub waits (the worker commits them
	// in groups): the tail's write-sets.
	during := ids(6)
	var sent []string
	for _, id := range during {
		sent = append(sent, b.send("bystander", withMarker(node(id), kept)))
	}
	for _, r := range sent {
		mustOK(t, b.wait(r))
	}
	close(release)
	mustOK(t, b.wait(rid))
	st := w.app.ChangelogStatus()
	final := st.LastCheckpoint
	if st.LastScrub.TailWriteSets < 1 || final.Base == "" || st.PurgedBelow != final.Seq+1 {
		t.Fatalf("after the erase: last scrub %+v, checkpoint %+v, purged below %d; want a tail checkpoint and the log purged through it",
			st.LastScrub, final, st.PurgedBelow)
	}
	obs := mustObs(t, b.js, "TELHA_CKPT_STATIC1")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cps, err := partition.ListCheckpoints(ctx, obs, 0)
	if err != nil || len(cps) != 2 || cps[0].Name != final.Base || cps[1].Name != final.Name {
		t.Fatalf("checkpoints after the erase: %+v (%v), want the tail %s and its base %s", cps, err, final.Name, final.Base)
	}
	deadline := time.Now().Add(5 * time.Second)
	for len(purgesPending(t, ns.Opts.StoreDir)) > 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if hits := filesWith(t, ns.Opts.StoreDir, gone); len(hits) > 0 {
		t.Fatalf("after the erase's result, NATS files %v hold the erased data", hits)
	}
	if len(objectsWith(t, obs, kept)) == 0 {
		t.Fatal("the puts during the scrub are in no checkpoint: the scan is blind, or the tail lost them")
	}

	if err := w.stop(); err != nil {
		t.Fatal(err)
	}
	loseDisk(t, dir)
	w = startWorker(t, ns, dir, Options{}, changelogFlags...)
	if st := w.app.ChangelogStatus(); !st.Restored || st.RestoredSeq != final.Seq {
		t.Fatalf("restart on an empty disk: %+v, want the tail at %d restored", st, final.Seq)
	}
	for _, id := range during {
		var v api.Version
		if code := w.get("/v1/tenants/bystander/nodes/"+id, &v); code != http.StatusOK || !strings.Contains(string(v.Props), kept) {
			t.Fatalf("a put made during the scrub, after the restore: %d %+v", code, v)
		}
	}
	var rec api.Erasure
	if code := w.get("/v1/tenants/gdpr/erasures/"+rid, &rec); code != http.StatusOK || rec.State != "done" {
		t.Fatalf("erasure record after the restore: %d %+v", code, rec)
	}
	if hits := filesWith(t, filepath.Join(dir, "pebble"), gone); len(hits) > 0 {
		t.Fatalf("the restored store holds the erased data in %v", hits)
	}
}

// TestErasesArrivingDuringAScrubShareTheNext (issue 29, batched scrubs):
// three erases that arrive while an erase's scrub of the copies runs are
// answered after one more scrub between them, not three: each is prepared
// (its versions and the disk) before the first of them is finished.
func TestErasesArrivingDuringAScrubShareTheNext(t *testing.T) {
	ns := testnats.Start(t)
	opts, reached, release := holdFirstScrub("checkpointed")
	w := startWorker(t, ns, t.TempDir(), opts, changelogFlags...)
	b := newBus(t, ns)
	ids := make([]string, 4)
	var puts []string
	for i := range ids {
		ids[i] = uuid.NewString()
		puts = append(puts, b.send("gdpr", withMarker(node(ids[i]), diskscan.Marker("BATCH"))))
	}
	for _, rid := range puts {
		mustOK(t, b.wait(rid))
	}
	first := b.send("gdpr", eraseNode(ids[0], "GDPR art. 17"))
	select {
	case <-reached:
	case <-time.After(time.Minute):
		t.Fatal("the first erase's scrub never reached its checkpoint")
	}
	var later []string
	for _, id := range ids[1:] {
		later = append(later, b.send("gdpr", eraseNode(id, "GDPR art. 17")))
	}
	testnats.Eventually(t, time.Minute, "the later erases are in flight", func() bool {
		return len(w.app.Store().Erases().List()) == len(ids)
	})
	close(release)
	mustOK(t, b.wait(first))
	for _, rid := range later {
		mustOK(t, b.wait(rid))
	}
	if st := w.app.ChangelogStatus(); st.EraseScrubs != 2 {
		t.Fatalf("%d scrubs of the copies for %d erases, 3 of them arriving during the first's scrub; want 2 (the first's, and one shared)",
			st.EraseScrubs, len(ids))
	}
}

// holdFirstScrub returns Options that hold the first scrub of the copies
// at step: reached is closed when it gets there, and it goes on once
// release is closed.
func holdFirstScrub(step string) (opts Options, reached, release chan struct{}) {
	reached, release = make(chan struct{}), make(chan struct{})
	var once bool
	opts.CopyScrubStep = func(s string) {
		if s == step && !once {
			once = true
			close(reached)
			<-release
		}
	}
	return opts, reached, release
}
