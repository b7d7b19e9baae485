package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/telha/telha-cascade/internal/testnats"
	"github.com/telha/telha-cascade/queue"
)

// TestPartitionedReplicas: one nats-server, three worker processes with
// their own data dirs owning disjoint partitions, many tenants. Every
// request is applied exactly once, by its owner; while one replica is down
// its partitions' requests wait and are applied when it comes back.
func TestPartitionedReplicas(t *testing.T) {
	const (
		P       = 6
		N       = 3
		tenants = 45
	)
	ns := testnats.Start(t)
	dirs := make([]string, N)
	procs := make([]*proc, N)
	start := func(i int) {
		procs[i] = startProc(t, dirs[i], "--nats-url", ns.ClientURL(), "--partitions", fmt.Sprint(P), "--partition-owner", fmt.Sprintf("%d/%d", i, N))
	}
	for i := range procs {
		dirs[i] = t.TempDir()
		start(i)
	}
	nc := testnats.Connect(t, ns.ClientURL())
	c, err := queue.NewClient(nc, queue.Config{})
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu      sync.Mutex
		results = map[string][]queue.Result{}
	)
	sub, err := nc.Subscribe("telha.res.*", func(m *nats.Msg) {
		var r queue.Result
		_ = json.Unmarshal(m.Data, &r)
		mu.Lock()
		results[r.RequestID] = append(results[r.RequestID], r)
		mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	owner := func(tn string) int { return queue.Partition(tn, P) % N }
	type sent struct{ tenant, node, req string }
	publish := func(round int) []sent {
		var out []sent
		for k := 0; k < tenants; k++ {
			s := sent{tenant: fmt.Sprintf("tenant-%d", k), node: uuid.NewString(), req: uuid.NewString()}
			body := fmt.Sprintf(`{"request_id":%q,"op":"put_node","tenant":%q,"id":%q,"props":{"round":%d}}`, s.req, s.tenant, s.node, round)
			if _, err := c.Publish(context.Background(), s.tenant, s.req, []byte(body)); err != nil {
				t.Fatal(err)
			}
			out = append(out, s)
		}
		return out
	}
	answered := func(ss []sent, keep func(sent) bool) bool {
		mu.Lock()
		defer mu.Unlock()
		for _, s := range ss {
			if keep(s) && len(results[s.req]) == 0 {
				return false
			}
		}
		return true
	}
	all := func(sent) bool { return true }
	status := func(p *proc, tn, node string) int {
		resp, err := http.Get(p.http + "/v1/tenants/" + tn + "/nodes/" + node)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}

	round1 := publish(1)
	testnats.Eventually(t, 30*time.Second, "round 1 answered", func() bool { return answered(round1, all) })
	for _, s := range round1 {
		for i, p := range procs {
			want := 404
			if i == owner(s.tenant) {
				want = 200
			}
			if got := status(p, s.tenant, s.node); got != want {
				t.Fatalf("tenant %s (partition %d) on replica %d: %d, want %d", s.tenant, queue.Partition(s.tenant, P), i, got, want)
			}
		}
	}

	// Replica 1 dies; its partitions wait.
	_ = procs[1].cmd.Process.Kill()
	<-procs[1].done
	procs[1].done <- nil
	round2 := publish(2)
	testnats.Eventually(t, 30*time.Second, "round 2 answered by the live replicas", func() bool {
		return answered(round2, func(s sent) bool { return owner(s.tenant) != 1 })
	})
	mu.Lock()
	for _, s := range round2 {
		if owner(s.tenant) == 1 && len(results[s.req]) != 0 {
			t.Fatalf("tenant %s of the dead replica was answered by someone else", s.tenant)
		}
	}
	mu.Unlock()
	start(1)
	testnats.Eventually(t, 30*time.Second, "round 2 answered after the restart", func() bool { return answered(round2, all) })
	for _, s := range round2 {
		if got := status(procs[owner(s.tenant)], s.tenant, s.node); got != 200 {
			t.Fatalf("tenant %s not applied by its owner after the restart: %d", s.tenant, got)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	for _, s := range append(round1, round2...) {
		rs := results[s.req]
		if len(rs) != 1 || rs[0].Status != queue.StatusOK {
			t.Fatalf("request %s: results %+v, want exactly one ok", s.req, rs)
		}
	}
}
