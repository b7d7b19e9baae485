package partition

import (
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/telha/telha-cascade/internal/testnats"
)

// On a 3-server cluster with an R3 changelog: lost acks are retried without
// duplicates (a clustered stream answers the retry as a duplicate), a
// zombie is fenced, and after the stream's leader server is shut down the
// owner's appends go on (retried through the leader election) and replay
// still reproduces the owner's store.
func TestClusterR3AppendsSurviveServerLoss(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-server cluster")
	}
	c := testnats.StartCluster(t, 3)
	js := connectJS(t, c.URLs(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	ctx := testCtx(t, 3*time.Minute)
	cfg := Config{Partition: 7, Replicas: 3, AttemptTimeout: 2 * time.Second, MaxPartBytes: 16 << 10}
	cl, err := Open(ctx, js, cfg)
	if err != nil {
		t.Fatal(err)
	}
	info, err := cl.stream.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.Config.Replicas != 3 || info.Cluster == nil || len(info.Cluster.Replicas) != 2 {
		t.Fatalf("stream replicas: config %d, cluster %+v", info.Config.Replicas, info.Cluster)
	}
	src := openDB(t, "")
	o := newOwner(t, cl, src, 7)

	cl.dropAck = func(attempt int) bool { return attempt == 0 }
	o.mustCommit(ctx, 0)
	o.mustCommit(ctx, 40<<10) // three parts, each ack lost once
	cl.dropAck = nil
	if st := streamState(t, cl); st.Msgs != 4 || st.LastSeq != cl.Last() {
		t.Fatalf("after lost acks: %d messages up to %d, want 4 up to %d", st.Msgs, st.LastSeq, cl.Last())
	}

	for i := range 20 {
		o.mustCommit(ctx, (i%5)*10<<10)
	}
	zombie, err := Open(ctx, js, cfg)
	if err != nil {
		t.Fatal(err)
	}
	o.mustCommit(ctx, 0)
	if _, err := zombie.Append(ctx, batchRepr(t, "zombie")); !errors.Is(err, ErrFenced) {
		t.Fatalf("R3 zombie append: %v, want ErrFenced", err)
	}

	leaderOf := func() int {
		info, err := cl.stream.Info(ctx)
		if err != nil || info.Cluster == nil {
			t.Fatalf("stream info: %v", err)
		}
		return c.Index(info.Cluster.Leader)
	}
	leader := leaderOf()
	if leader < 0 {
		t.Fatal("no stream leader")
	}
	before := cl.Last()
	c.Servers[leader].Stop()
	t.Logf("stopped %s, the leader of %s, at sequence %d", c.Servers[leader].Name(), cl.Config().StreamName(), before)
	start := time.Now()
	o.mustCommit(ctx, 0)
	t.Logf("first append after losing the leader took %s", time.Since(start))
	for i := range 20 {
		o.mustCommit(ctx, (i%3)*10<<10)
	}
	if cl.Last() <= before {
		t.Fatalf("no appends after the server loss: last %d", cl.Last())
	}
	if now := leaderOf(); now < 0 || now == leader {
		t.Fatalf("stream leader after the loss: %d (was %d)", now, leader)
	}

	dst := openDB(t, "")
	var n int
	if err := cl.Replay(ctx, 1, applyAll(dst, &n)); err != nil {
		t.Fatal(err)
	}
	if n != 2+20+1+1+20 {
		t.Fatalf("replayed %d write-sets, want 44", n)
	}
	assertSameStore(t, src, dst)
}
