package app

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/telha/telha-cascade/internal/testnats"
	"github.com/telha/telha-cascade/partition"
	"github.com/telha/telha-cascade/queue"
	"github.com/telha/telha-cascade/slot"
	"github.com/telha/telha-cascade/storage"
)

// changelogFlags run a worker with the changelog on; the hub of mixLoad
// (12 edges) is journaled at --max-batch-ops 8, in chunks of 4.
var changelogFlags = []string{"--changelog", "jetstream", "--checkpoint-schedule", "@every 1h", "--max-batch-ops", "8", "--journal-chunk-ops", "4"}

// acked is what the upstream was told: every request that got an ok
// result, and every path whose answer must survive the disk.
type acked struct {
	tenant   string
	requests []string
	paths    []string
	lastTx   string
}

func (a *acked) ok(t *testing.T, b *bus, body map[string]any) queue.Result {
	t.Helper()
	r := mustOK(t, b.wait(b.send(a.tenant, body)))
	a.requests = append(a.requests, r.RequestID)
	if r.TxTime > a.lastTx {
		a.lastTx = r.TxTime
	}
	return r
}

// entity records the reads of one node or edge: now, at the result's
// tx_time, and its history.
func (a *acked) entity(kind, id, tx string) {
	p := "/v1/tenants/" + a.tenant + "/" + kind + "/" + id
	a.paths = append(a.paths, p+"?valid="+fixedValid, p+"?valid="+fixedValid+"&tx="+tx, p+"/history?valid="+fixedValid)
}

// fixedValid pins the valid time of the reads compared (the default is
// "now", which an answer echoes).
const fixedValid = "2099-01-01T00:00:00Z"

// mixLoad sends puts, tombstones (edge, inline node), a journaled hub
// cascade and an erase, each waited for, and records what must survive.
func mixLoad(t *testing.T, b *bus, a *acked) {
	t.Helper()
	n := ids(4)
	for _, id := range n {
		r := a.ok(t, b, withMarker(node(id), "n"+id[:8]))
		a.entity("nodes", id, r.TxTime)
	}
	e := ids(3)
	for i, id := range e {
		r := a.ok(t, b, withMarker(edge(id, n[i], n[i+1]), "e"+id[:8]))
		a.entity("edges", id, r.TxTime)
	}
	r := a.ok(t, b, tombEdge(e[0]))
	a.entity("edges", e[0], r.TxTime)
	r = a.ok(t, b, tombNode(n[3])) // inline: one edge
	a.entity("nodes", n[3], r.TxTime)
	a.entity("edges", e[2], r.TxTime)

	hub := uuid.NewString()
	r = a.ok(t, b, node(hub))
	a.entity("nodes", hub, r.TxTime)
	var spokes []string
	for range 12 {
		m, eid := uuid.NewString(), uuid.NewString()
		a.ok(t, b, node(m))
		a.ok(t, b, edge(eid, hub, m))
		spokes = append(spokes, eid)
	}
	r = a.ok(t, b, tombNode(hub))
	if !r.Journaled || r.EdgesTombstoned != 12 {
		t.Fatalf("hub cascade %+v: want journaled, 12 edges", r)
	}
	a.entity("nodes", hub, r.TxTime)
	for _, eid := range spokes {
		a.entity("edges", eid, r.TxTime)
	}
	a.paths = append(a.paths, "/v1/tenants/"+a.tenant+"/nodes/"+n[0]+"/edges?dir=both&valid="+fixedValid)

	r = a.ok(t, b, eraseNode(n[1], "GDPR art. 17"))
	a.entity("nodes", n[1], r.TxTime)
	a.paths = append(a.paths, "/v1/tenants/"+a.tenant+"/erasures/"+r.RequestID)
	for _, rid := range a.requests {
		a.paths = append(a.paths, "/v1/tenants/"+a.tenant+"/requests/"+rid)
	}
}

// answers reads every path and returns "code body" per path.
func answers(t *testing.T, w *running, paths []string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, p := range paths {
		resp, err := http.Get(w.base + p)
		if err != nil {
			t.Fatalf("GET %s: %v", p, err)
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		out[p] = fmt.Sprintf("%d %s", resp.StatusCode, body)
	}
	return out
}

func sameAnswers(t *testing.T, before, after map[string]string) {
	t.Helper()
	var keys []string
	for k := range before {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	ok200 := 0
	for _, k := range keys {
		if before[k] != after[k] {
			t.Errorf("%s\n before: %s\n after:  %s", k, before[k], after[k])
		}
		if strings.HasPrefix(before[k], "200 ") {
			ok200++
		}
	}
	if ok200 < len(keys)/2 {
		t.Fatalf("only %d of %d reads answered 200 before: the comparison proves little", ok200, len(keys))
	}
}

// loseDisk deletes the worker's Pebble directory (its PVC, lost).
func loseDisk(t *testing.T, dir string) {
	t.Helper()
	if err := os.RemoveAll(filepath.Join(dir, "pebble")); err != nil {
		t.Fatal(err)
	}
}

// newRequestsWork checks that new requests are answered, above every
// earlier tx_time.
func newRequestsWork(t *testing.T, b *bus, a *acked) {
	t.Helper()
	before := a.lastTx
	for range 3 {
		r := a.ok(t, b, node(uuid.NewString()))
		if r.TxTime <= before {
			t.Fatalf("new tx_time %s is not above the last acknowledged one %s", r.TxTime, before)
		}
		before = r.TxTime
	}
}

func changelogStream(t *testing.T, js jetstream.JetStream, name string) jetstream.StreamInfo {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return *info
}

// TestChangelogLoseDiskLoseNothing: a worker with --changelog jetstream
// answers a mix (puts, tombstones, a journaled hub, an erase); it stops
// and its Pebble directory is deleted; restarted on the empty directory it
// restores the checkpoint its erase took (issue 21 item 6), replays the
// changelog's tail and answers every read and request lookup exactly as
// before, and new requests get tx_times above every earlier one.
func TestChangelogLoseDiskLoseNothing(t *testing.T) {
	ns := testnats.Start(t)
	dir := t.TempDir()
	w := startWorker(t, ns, dir, Options{}, changelogFlags...)
	b := newBus(t, ns)
	a := &acked{tenant: "lose"}
	mixLoad(t, b, a)
	// mixLoad ends with an erase, which checkpoints the store and purges
	// the changelog below (issue 21 item 6): these are the log's tail.
	tail := len(a.requests)
	for _, id := range ids(3) {
		r := a.ok(t, b, node(id))
		a.entity("nodes", id, r.TxTime)
	}
	tail = len(a.requests) - tail
	before := answers(t, w, a.paths)
	st := w.app.ChangelogStatus()
	if st.Stream != "TELHA_LOG_STATIC1_0" || st.ClaimSeq == 0 || st.EraseScrubs != 1 {
		t.Fatalf("status %+v, want one erase's scrub of the copies", st)
	}
	cp := st.LastCheckpoint
	if err := w.stop(); err != nil {
		t.Fatal(err)
	}

	loseDisk(t, dir)
	w = startWorker(t, ns, dir, Options{}, changelogFlags...)
	st = w.app.ChangelogStatus()
	if !st.Restored || st.RestoredSeq != cp.Seq || st.ReplayFrom != cp.Seq+1 || st.Replayed < tail {
		t.Fatalf("restart on an empty disk: %+v, want the erase's checkpoint at %d restored and a replay of at least %d write-sets", st, cp.Seq, tail)
	}
	sameAnswers(t, before, answers(t, w, a.paths))
	newRequestsWork(t, b, a)
}

// TestChangelogRestoreFromCheckpointAfterPurge: a checkpoint is taken and
// the changelog purged below it; more writes follow; the disk is lost:
// the restart restores the checkpoint, replays only the tail, and answers
// as before.
func TestChangelogRestoreFromCheckpointAfterPurge(t *testing.T) {
	ns := testnats.Start(t)
	dir := t.TempDir()
	flags := append(append([]string{}, changelogFlags...), "--checkpoints-keep", "1")
	w := startWorker(t, ns, dir, Options{}, flags...)
	b := newBus(t, ns)
	a := &acked{tenant: "ckpt"}
	mixLoad(t, b, a)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cp, err := w.app.Checkpoint(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// A second one, so keep=1 prunes the first and the purge moves up.
	more := &acked{tenant: "ckpt2"}
	for range 3 {
		r := more.ok(t, b, node(uuid.NewString()))
		_ = r
	}
	cp, err = w.app.Checkpoint(ctx)
	if err != nil {
		t.Fatal(err)
	}
	info := changelogStream(t, b.js, w.app.ChangelogStatus().Stream)
	if info.State.FirstSeq != cp.Seq+1 {
		t.Fatalf("changelog starts at %d after a checkpoint at %d: not purged below it", info.State.FirstSeq, cp.Seq)
	}
	if cps, err := partition.ListCheckpoints(ctx, mustObs(t, b.js, "TELHA_CKPT_STATIC1"), 0); err != nil || len(cps) != 1 {
		t.Fatalf("checkpoints kept: %v %v, want 1", cps, err)
	}
	// The tail the restore must replay.
	// mixLoad's erase checkpoints too (its scrub of the copies), and keep=1
	// leaves that one only: the tail is what comes after it.
	tail := &acked{tenant: "tail"}
	mixLoad(t, b, tail)
	cp = w.app.ChangelogStatus().LastCheckpoint
	// (A feed round that committed during the scrub makes the erase's
	// checkpoint a tail, kept with its base: DECISIONS 88.)
	if cps, err := partition.ListCheckpoints(ctx, mustObs(t, b.js, "TELHA_CKPT_STATIC1"), 0); err != nil || len(cps) == 0 || cps[len(cps)-1].Seq != cp.Seq ||
		len(cps) != 1 && (len(cps) != 2 || cps[0].Name != cp.Base) {
		t.Fatalf("checkpoints kept after the erase: %v %v, want the erase's at %d only (and its base, if it is a tail)", cps, err, cp.Seq)
	}
	n0 := len(tail.requests)
	for _, id := range ids(3) {
		r := tail.ok(t, b, node(id))
		tail.entity("nodes", id, r.TxTime)
	}
	before := answers(t, w, append(append([]string{}, a.paths...), tail.paths...))
	if err := w.stop(); err != nil {
		t.Fatal(err)
	}

	loseDisk(t, dir)
	w = startWorker(t, ns, dir, Options{}, flags...)
	st := w.app.ChangelogStatus()
	if !st.Restored || st.RestoredSeq != cp.Seq || st.ReplayFrom != cp.Seq+1 || st.Replayed < len(tail.requests)-n0 {
		t.Fatalf("restart after a purge: %+v, want a restore at %d and a replay of the tail (%d requests)", st, cp.Seq, len(tail.requests)-n0)
	}
	sameAnswers(t, before, answers(t, w, append(append([]string{}, a.paths...), tail.paths...)))
	tail.lastTx = max(tail.lastTx, a.lastTx)
	newRequestsWork(t, b, tail)
}

func mustObs(t *testing.T, js jetstream.JetStream, bucket string) jetstream.ObjectStore {
	t.Helper()
	// The bucket as the worker opens it: sealed tables read through it.
	obs, err := partition.OpenCheckpoints(context.Background(), js, partition.CheckpointConfig{Bucket: bucket})
	if err != nil {
		t.Fatal(err)
	}
	return obs
}

// TestChangelogZombieIsFenced: a second worker for the same owner slice
// (a replacement started while the first still runs) catches up and claims
// the changelog; the first one's next commit is refused, it stops with a
// fatal error, and commits nothing more; every request is answered once,
// by the second.
func TestChangelogZombieIsFenced(t *testing.T) {
	ns := testnats.Start(t)
	flags := append(append([]string{}, changelogFlags...), "--ack-wait", "2s")
	// The zombie without a change feed: the replacement claims while the
	// zombie is idle. A zombie that appends while the replacement catches
	// up (the feed saves its cursors within 500 ms of a commit) makes the
	// replacement's claim lose: it exits, fenced, and its restart claims
	// (a race this test does not look at).
	oldDir := t.TempDir()
	old := startWorker(t, ns, oldDir, Options{}, append(flags, "--change-feed=false")...)
	b := newBus(t, ns)
	a := &acked{tenant: "zombie"}
	for range 3 {
		a.ok(t, b, node(uuid.NewString()))
	}
	oldStore := old.app.Store()

	repl := startWorker(t, ns, t.TempDir(), Options{}, flags...)
	claim := repl.app.ChangelogStatus().ClaimSeq
	_, err := oldStore.PutNode(context.Background(), storage.MustScope("zombie"), storage.NodeWrite{ID: uuid.New(), ValidFrom: storage.NoTs, ValidTo: storage.NoTs})
	if !errors.Is(err, storage.ErrFatal) || !errors.Is(err, partition.ErrFenced) {
		t.Fatalf("the zombie's commit after the claim: %v, want fatal and fenced", err)
	}
	select {
	case err := <-old.done:
		old.cancel = nil
		if !errors.Is(err, storage.ErrFatal) {
			t.Fatalf("the zombie's Run: %v, want ErrFatal", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the fenced worker did not stop")
	}
	for range 5 {
		rid := b.send("zombie", node(uuid.NewString()))
		mustOK(t, b.wait(rid))
		if n := len(b.storedResults(rid)); n != 1 {
			t.Fatalf("request %s has %d results", rid, n)
		}
		var req map[string]any
		if code := repl.get("/v1/tenants/zombie/requests/"+rid, &req); code != http.StatusOK {
			t.Fatalf("request %s not on the replacement: %d", rid, code)
		}
	}
	// The fenced store was closed when its worker stopped (a member runs
	// the slot again in the same process): its directory opens again.
	reopened, err := storage.OpenStore(filepath.Join(oldDir, "pebble"), storage.Options{})
	if err != nil {
		t.Fatalf("the fenced store's directory after its run ended: %v", err)
	}
	defer reopened.Close()
	applied, err := partition.AppliedSeq(reopened.DB())
	if err != nil {
		t.Fatal(err)
	}
	if applied >= claim {
		t.Fatalf("the zombie applied sequence %d, at or after the replacement's claim %d", applied, claim)
	}
	for _, rid := range a.requests {
		if code := repl.get("/v1/tenants/zombie/requests/"+rid, nil); code != http.StatusOK {
			t.Fatalf("the zombie's acknowledged request %s is not on the replacement: %d", rid, code)
		}
	}
}

// TestChangelogUpgradeSeedsTheLog: a data directory written with
// --changelog off is restarted with --changelog jetstream: it seeds the
// changelog with a checkpoint at sequence 0 and loses nothing; more
// writes, an erase among them (which checkpoints the store and deletes the
// seed); then its disk is lost: the restart restores the erase's
// checkpoint, replays the rest, and answers everything as before.
func TestChangelogUpgradeSeedsTheLog(t *testing.T) {
	ns := testnats.Start(t)
	dir := t.TempDir()
	w := startWorker(t, ns, dir, Options{}, "--max-batch-ops", "8", "--journal-chunk-ops", "4")
	b := newBus(t, ns)
	a := &acked{tenant: "upgrade"}
	mixLoad(t, b, a)
	before := answers(t, w, a.paths)
	if err := w.stop(); err != nil {
		t.Fatal(err)
	}

	w = startWorker(t, ns, dir, Options{}, changelogFlags...)
	if st := w.app.ChangelogStatus(); !st.Seeded || st.Restored {
		t.Fatalf("upgrade start: %+v, want seeded", st)
	}
	sameAnswers(t, before, answers(t, w, a.paths))
	later := &acked{tenant: "upgrade2", lastTx: a.lastTx}
	mixLoad(t, b, later)
	if later.requests[0] == "" || later.lastTx <= a.lastTx {
		t.Fatalf("tx after the upgrade %s not above %s", later.lastTx, a.lastTx)
	}
	// later's erase checkpoints the store and deletes the seed (it held the
	// erased data); the writes after it are the tail.
	cp := w.app.ChangelogStatus().LastCheckpoint
	if cp.Seq == 0 {
		t.Fatalf("no checkpoint after the erase: %+v", w.app.ChangelogStatus())
	}
	n0 := len(later.requests)
	for _, id := range ids(3) {
		r := later.ok(t, b, node(id))
		later.entity("nodes", id, r.TxTime)
	}
	paths := append(append([]string{}, a.paths...), later.paths...)
	before = answers(t, w, paths)
	if err := w.stop(); err != nil {
		t.Fatal(err)
	}

	loseDisk(t, dir)
	w = startWorker(t, ns, dir, Options{}, changelogFlags...)
	if st := w.app.ChangelogStatus(); !st.Restored || st.RestoredSeq != cp.Seq || st.Replayed < len(later.requests)-n0 {
		t.Fatalf("restart after the upgrade and a lost disk: %+v, want the erase's checkpoint (%d) restored and the rest replayed", st, cp.Seq)
	}
	sameAnswers(t, before, answers(t, w, paths))
	newRequestsWork(t, b, later)
}

// TestAppliedKeyIsPartitions: storage writes the applied sequence under
// partition's key without importing partition.
func TestAppliedKeyIsPartitions(t *testing.T) {
	if !bytes.Equal(storage.AppliedSeqKey(), partition.AppliedKey()) {
		t.Fatalf("storage.AppliedSeqKey %x, partition.AppliedKey %x", storage.AppliedSeqKey(), partition.AppliedKey())
	}
}

// TestChangelogFlags: the flags, their environment variables and their
// refusals (exit 2 with usage).
func TestChangelogFlags(t *testing.T) {
	cfg, err := ParseFlags(nil, func(string) string { return "" }, io.Discard)
	// --stream-replicas 0: settled when the worker connects (ResolveReplicas).
	if err != nil || cfg.Changelog != slot.ChangelogOff || cfg.CheckpointSchedule != "@every 10m" || cfg.CheckpointsKeep != 2 || cfg.LogReplicas() != 0 {
		t.Fatalf("defaults: %+v %v", cfg, err)
	}
	if n, _ := cfg.ResolveReplicas(5); n != 3 || cfg.LogReplicas() != 3 {
		t.Fatalf("auto replicas with 5 servers known: %d, want 3", n)
	}
	env := map[string]string{"TELHA_CHANGELOG": "jetstream", "TELHA_CHANGELOG_REPLICAS": "3", "TELHA_CHECKPOINT_SCHEDULE": "@every 1m", "TELHA_CHECKPOINTS_KEEP": "4"}
	cfg, err = ParseFlags([]string{"--stream-replicas", "1", "--partitions", "4", "--partition-owner", "2/4"}, func(k string) string { return env[k] }, io.Discard)
	if err != nil || cfg.Changelog != slot.ChangelogJetStream || cfg.LogReplicas() != 3 || cfg.CheckpointsKeep != 4 {
		t.Fatalf("from the environment: %+v %v", cfg, err)
	}
	if pc, cc := cfg.ChangelogConfig(), cfg.CheckpointConfig(); pc.StreamName() != "TELHA_LOG_STATIC4_2" || pc.Subject() != "telha.static4.log.2" || cc.Bucket != "TELHA_CKPT_STATIC4" {
		t.Fatalf("names %s %s %s", pc.StreamName(), pc.Subject(), cc.Bucket)
	}
	cfg, _ = ParseFlags([]string{"--stream-replicas", "3"}, func(string) string { return "" }, io.Discard)
	if cfg.LogReplicas() != 3 {
		t.Fatalf("--changelog-replicas 0 follows --stream-replicas: %d", cfg.LogReplicas())
	}
	for _, args := range [][]string{
		{"--changelog", "kafka"}, {"--changelog-replicas", "6"}, {"--changelog-replicas", "-1"},
		{"--checkpoint-schedule", "every ten minutes"}, {"--checkpoints-keep", "0"},
	} {
		var usage bytes.Buffer
		if _, err := ParseFlags(args, func(string) string { return "" }, &usage); !errors.Is(err, ErrUsage) || !strings.Contains(usage.String(), "-changelog") {
			t.Errorf("%v: %v (usage printed: %t), want a usage error", args, err, usage.Len() > 0)
		}
	}
}

// TestChangelogPurgeWaitsForStandbys: a scheduled checkpoint purges the
// changelog below the oldest kept checkpoint and below what each tailing
// standby still needs (its applied sequence + 1), never past a standby.
func TestChangelogPurgeWaitsForStandbys(t *testing.T) {
	ns := testnats.Start(t)
	var standby atomic.Uint64
	standby.Store(3)
	flags := append(append([]string{}, changelogFlags...), "--checkpoints-keep", "1")
	w := startWorker(t, ns, t.TempDir(), Options{standbyApplied: func() []uint64 { return []uint64{standby.Load()} }}, flags...)
	b := newBus(t, ns)
	a := &acked{tenant: "floor"}
	for range 6 {
		a.ok(t, b, node(uuid.NewString()))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cp, err := w.app.Checkpoint(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if cp.Seq <= 4 {
		t.Fatalf("checkpoint at %d: the test needs more write-sets before it", cp.Seq)
	}
	info := changelogStream(t, b.js, w.app.ChangelogStatus().Stream)
	if info.State.FirstSeq != 4 {
		t.Fatalf("changelog starts at %d with a standby at 3 and a checkpoint at %d: want 4 (the standby's next)", info.State.FirstSeq, cp.Seq)
	}
	standby.Store(cp.Seq + 10) // caught up (and beyond): the checkpoint sets the floor again
	if cp, err = w.app.Checkpoint(ctx); err != nil {
		t.Fatal(err)
	}
	if info = changelogStream(t, b.js, w.app.ChangelogStatus().Stream); info.State.FirstSeq != cp.Seq+1 {
		t.Fatalf("changelog starts at %d after a checkpoint at %d with the standby caught up: want %d", info.State.FirstSeq, cp.Seq, cp.Seq+1)
	}
}
