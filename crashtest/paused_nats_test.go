package crashtest

import (
	"context"
	"fmt"
	"net/http"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/telha/telha-cascade/internal/testnats"
)

// TestDynamicANATSServerPaused: three members under load on a 3-server
// cluster; one NATS server is SIGSTOPped for 35 s (its sockets and routes
// stay open, nothing answers: a frozen VM) and then continued. Two of
// three servers are a quorum, so the group must go on: every member
// serves reads again while the server is still paused (a member
// connected to it finds its connection stale and moves within about
// 15 s), and every request is answered exactly once.
//
// Before registry requests were bounded per try, every member's rounds
// failed for the whole pause (a third of each round's direct gets went to
// the paused server's replica and waited out the round): their leases
// lapsed and every read through every member was refused until SIGCONT.
func TestDynamicANATSServerPaused(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: starts a NATS cluster and three worker processes")
	}
	const pause, recovered = 35 * time.Second, 25 * time.Second
	g, cl := newDynGroup(t)
	members := []*memberProc{g.start("w0", ""), g.start("w1", ""), g.start("w2", "")}
	g.settled(members[0], []string{"w0", "w1", "w2"}, true, 120*time.Second)
	tenants, slotOf := tenantsPerSlot()
	l := newDynLoad(t, g.urls, tenants, slotOf)
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); l.run(ctx, tenants, 25*time.Millisecond) }()
	tr := &timedReader{start: time.Now(), good: map[string][]time.Duration{}, bad: map[string][]string{}}
	for _, p := range members {
		wg.Add(1)
		go func() { defer wg.Done(); tr.run(ctx, l, p) }()
	}
	testnats.Eventually(t, 60*time.Second, "every member reading before the pause", func() bool {
		tr.mu.Lock()
		defer tr.mu.Unlock()
		for _, p := range members {
			if len(tr.good[p.id]) == 0 {
				return false
			}
		}
		return true
	})
	// The load's own connection is kept off the paused server: what is
	// measured is the members, not the test's publisher.
	victim := cl.Procs[0]
	for _, p := range cl.Procs {
		if l.nc.ConnectedUrl() != "nats://"+p.ClientAddr {
			victim = p
		}
	}
	pausedAt := time.Since(tr.start)
	victim.Pause()
	t.Cleanup(victim.Resume) // a test that fails mid-pause leaves no server stopped
	t.Logf("paused %s at %.1fs for %s (the load is on %s)", victim.Name, pausedAt.Seconds(), pause, l.nc.ConnectedUrl())
	time.Sleep(pause) // the pause itself: the readers and the load run through it
	victim.Resume()
	resumedAt := time.Since(tr.start)
	time.Sleep(5 * time.Second) // load and reads after SIGCONT (not a synchronisation)
	stop()
	wg.Wait()
	l.waitAnswered(180 * time.Second)
	l.checkOnce()

	// How long requests waited, by when they were published (logged: the
	// results stream's own leader change is the server's to bound).
	l.mu.Lock()
	byWhen := map[int][]float64{}
	for rid, p := range l.published {
		if f, ok := l.firstAt[rid]; ok {
			b := int(p.at.Sub(tr.start).Seconds()) / 10
			byWhen[b] = append(byWhen[b], f.Sub(p.at).Seconds())
		}
	}
	l.mu.Unlock()
	for b := 0; b < 10; b++ {
		if ds := byWhen[b]; len(ds) > 0 {
			sort.Float64s(ds)
			t.Logf("published %3d-%3ds: %4d requests, answered p50 %.2fs max %.2fs", b*10, b*10+10, len(ds), ds[len(ds)/2], ds[len(ds)-1])
		}
	}
	tr.mu.Lock()
	defer tr.mu.Unlock()
	for _, p := range members {
		late := 0
		for _, at := range tr.good[p.id] {
			if at > pausedAt+recovered && at < resumedAt {
				late++
			}
		}
		t.Logf("%s: %d reads 200 (%d in the pause's last %s), %d not: %s", p.id, len(tr.good[p.id]), late, pause-recovered, len(tr.bad[p.id]), summarize(tr.bad[p.id]))
		if late == 0 {
			t.Errorf("%s served no read in the last %s of a %s pause of one NATS server of three: %s", p.id, pause-recovered, pause, summarize(tr.bad[p.id]))
		}
	}
}

// timedReader reads acknowledged nodes through one member each, noting
// when each read was answered 200 and when not (5 s bound per read).
type timedReader struct {
	start time.Time
	mu    sync.Mutex
	good  map[string][]time.Duration // member -> when, since start
	bad   map[string][]string
}

func summarize(bad []string) string {
	if len(bad) == 0 {
		return "none"
	}
	return fmt.Sprintf("first %s, last %s", bad[0], bad[len(bad)-1])
}

func (tr *timedReader) run(ctx context.Context, l *dynLoad, p *memberProc) {
	c := http.Client{Timeout: 5 * time.Second}
	for i := 0; ctx.Err() == nil; i++ {
		n := l.acknowledged(i)
		if n == nil {
			time.Sleep(20 * time.Millisecond) // nothing to read yet
			continue
		}
		t0 := time.Now()
		resp, err := c.Get(fmt.Sprintf("%s/v1/tenants/%s/nodes/%s", p.base(), n.tenant, n.id))
		at := t0.Sub(tr.start)
		code := 0
		if err == nil {
			code = resp.StatusCode
			resp.Body.Close()
		}
		tr.mu.Lock()
		if code == 200 {
			tr.good[p.id] = append(tr.good[p.id], at)
		} else if ctx.Err() == nil {
			tr.bad[p.id] = append(tr.bad[p.id], fmt.Sprintf("%.1fs: %d %v", at.Seconds(), code, err))
		}
		tr.mu.Unlock()
		time.Sleep(50 * time.Millisecond) // a read every 50 ms or so per member
	}
}
