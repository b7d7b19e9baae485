package crashtest

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/telha/telha-cascade/queue/client"
)

// checkFeed (issue 31, "through a failover: no change missing or
// doubled"): every tenant's change feed holds the put of every node a
// request was answered ok for, at its result's tx_time, exactly once, and
// no version twice; per tenant in tx_time order. The one exception
// CONTRACT §5 allows, a change a server lost while it stored a later one
// of the same round, must have been reported: a tenant's changes out of
// order with no member's log saying so for it fail the check.
func checkFeed(t *testing.T, g *dynGroup, l *dynLoad, within time.Duration) {
	t.Helper()
	want := map[string]map[string]string{} // tenant -> node id -> tx_time
	l.mu.Lock()
	for rid, p := range l.published {
		if rs := l.results[rid]; p.op == "put_node" && len(rs) == 1 && rs[0].Status == "ok" {
			if want[p.tenant] == nil {
				want[p.tenant] = map[string]string{}
			}
			want[p.tenant][p.id.String()] = rs[0].TxTime
		}
	}
	l.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	total := 0
	for tenant, puts := range want {
		r, err := l.c.OpenChanges(ctx, client.ChangesConfig{Tenant: tenant})
		if err != nil {
			t.Fatalf("feed of %s: %v", tenant, err)
		}
		seen := map[string]bool{}
		found, last := 0, ""
		for {
			if found == len(puts) {
				// And the rest of what the feed holds, for doubles.
				if n, err := r.Pending(ctx); err != nil || n == 0 {
					break
				}
			}
			m, err := r.Next(ctx)
			if err != nil {
				r.Close()
				t.Fatalf("feed of %s: %d of %d answered puts found: %v", tenant, found, len(puts), err)
			}
			_ = m.Ack()
			key := fmt.Sprintf("%s/%s/%s/%s/%s", m.Kind, m.Op, m.ID, m.TxTime, m.ValidFrom)
			if seen[key] {
				t.Errorf("feed of %s: %s twice (the second at seq %d)", tenant, key, m.Seq)
			}
			seen[key] = true
			if m.TxTime < last {
				// The logs are read when it is found: a member may have
				// logged it while this check waited for the feed.
				if reportedReorders(t, g.logDir)[tenant] {
					t.Logf("feed of %s: %s at %s after a change at %s (a lost change its member reported)", tenant, m.ID, m.TxTime, last)
				} else {
					t.Errorf("feed of %s: %s at %s after a change at %s", tenant, m.ID, m.TxTime, last)
				}
			}
			last = m.TxTime
			if tx, ok := puts[m.ID]; ok && m.Op == client.ChangePut {
				if tx != m.TxTime {
					t.Errorf("feed of %s: put of %s at %s, its result says %s", tenant, m.ID, m.TxTime, tx)
				}
				found++
			}
		}
		r.Close()
		total += found
	}
	t.Logf("change feed: %d answered puts of %d tenants found once each, in tx order", total, len(want))
}

// reportedReorders: the tenants for which a member logged that a change
// of a round was lost while a later one was stored (and counted it in
// telha_change_feed_reordered_total).
func reportedReorders(t *testing.T, logDir string) map[string]bool {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(logDir, "*.log"))
	if err != nil {
		t.Fatal(err)
	}
	tenants := map[string]bool{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(b), "\n") {
			var e struct {
				Msg    string `json:"msg"`
				Tenant string `json:"tenant"`
			}
			if json.Unmarshal([]byte(line), &e) == nil && strings.HasPrefix(e.Msg, "change feed: a change was lost while a later one was stored") {
				tenants[e.Tenant] = true
			}
		}
	}
	return tenants
}
