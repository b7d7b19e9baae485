package app

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"
	"github.com/google/uuid"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/telha/telha-cascade/cascade"
	"github.com/telha/telha-cascade/internal/testnats"
	"github.com/telha/telha-cascade/member"
	"github.com/telha/telha-cascade/partition"
	"github.com/telha/telha-cascade/queue"
	"github.com/telha/telha-cascade/queue/client"
	"github.com/telha/telha-cascade/slot"
	"github.com/telha/telha-cascade/storage"
)

// member is a dynamic member running in this process (so -race sees the
// member's own code; crashtest runs members as processes).
type memberUnderTest struct {
	id, base string
	cancel   context.CancelFunc
	done     chan error
}

func startMember(t *testing.T, ns *testnats.Server, id string, onReady ...func(*slot.Slot)) *memberUnderTest {
	t.Helper()
	return startMemberIn(t, ns, id, t.TempDir(), 1, onReady...)
}

// startMemberIn is startMember on data directory dir with standbys
// standbys per slot.
func startMemberIn(t *testing.T, ns *testnats.Server, id, dir string, standbys int, onReady ...func(*slot.Slot)) *memberUnderTest {
	t.Helper()
	return startMemberURL(t, ns.ClientURL(), id, dir, standbys, onReady...)
}

// startMemberURL is startMemberIn against the NATS server at url.
func startMemberURL(t *testing.T, url, id, dir string, standbys int, onReady ...func(*slot.Slot)) *memberUnderTest {
	t.Helper()
	opts := Options{}
	if len(onReady) > 0 {
		opts.OnReady = onReady[0]
	}
	return startMemberOpts(t, url, id, dir, standbys, opts)
}

// startMemberOpts is startMemberURL with opts and more flags (given last:
// they override the defaults).
func startMemberOpts(t *testing.T, url, id, dir string, standbys int, opts Options, flags ...string) *memberUnderTest {
	t.Helper()
	addr := testnats.FreeAddr(t)
	cfg, err := ParseFlags(append([]string{"--data-dir", dir, "--http-addr", addr, "--advertise-url", "http://" + addr, "--nats-url", url,
		"--partitions", "4", "--partition-owner", "dynamic/2", "--changelog", "jetstream", "--member-id", id, "--member-ttl", "2s",
		"--standbys", fmt.Sprint(standbys), "--auth", "off", "--reaper-schedule", "@every 1h", "--checkpoint-schedule", "@every 1h", "--shutdown-grace", "10s"},
		flags...),
		func(string) string { return "" }, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	m := &memberUnderTest{id: id, base: "http://" + addr, cancel: cancel, done: make(chan error, 1)}
	log := keptLog(t, id)
	go func() { m.done <- Run(ctx, cfg, log, opts) }()
	t.Cleanup(func() {
		cancel()
		stopping := time.Now()
		select {
		case <-m.done:
			t.Logf("member %s stopped in %s", id, time.Since(stopping).Round(time.Millisecond))
		case <-time.After(60 * time.Second):
			t.Errorf("member %s did not stop within 60 s; what this module's goroutines wait on:\n%s", id, moduleGoroutines())
		}
	})
	return m
}

type dynView struct {
	Members     []struct{ ID string } `json:"members"`
	Assignments []struct {
		Slot     int      `json:"slot"`
		Owner    string   `json:"owner"`
		Ready    bool     `json:"owner_ready"`
		Standbys []string `json:"standbys"`
		Epoch    uint64   `json:"epoch"`
	} `json:"assignments"`
}

func (m *memberUnderTest) view() (dynView, int) {
	var v dynView
	resp, err := http.Get(m.base + "/v1/partitions")
	if err != nil {
		return v, 0
	}
	defer resp.Body.Close()
	_ = json.NewDecoder(resp.Body).Decode(&v)
	return v, resp.StatusCode
}

// settledOn waits until m sees every slot owned (ready) by one of ids and
// exactly len(ids) members, with standbys when there is more than one.
func (m *memberUnderTest) settledOn(t *testing.T, ids ...string) dynView {
	t.Helper()
	var v dynView
	testnats.Eventually(t, 60*time.Second, fmt.Sprintf("%s settles on %v", m.id, ids), func() bool {
		var code int
		v, code = m.view()
		if code != 200 || len(v.Members) != len(ids) || len(v.Assignments) != 2 {
			return false
		}
		owners := map[string]bool{}
		for _, a := range v.Assignments {
			owners[a.Owner] = true
		}
		if len(owners) != min(len(ids), 2) { // balanced: one slot each
			return false
		}
		for _, a := range v.Assignments {
			owned := false
			for _, id := range ids {
				owned = owned || a.Owner == id
			}
			if !owned || !a.Ready || (len(ids) > 1 && len(a.Standbys) != 1) {
				return false
			}
		}
		return true
	})
	return v
}

// TestMembersInProcessHandOff: two members share two slots (one each, each
// the other's standby); requests for tenants of both slots are answered
// once and read through either member; SIGTERM of one (its context) hands
// its slot to the other, which then answers new requests and every read.
func TestMembersInProcessHandOff(t *testing.T) {
	ns := testnats.Start(t)
	// A TTL well above a loaded machine's pauses: the hand-off is m0's
	// SIGTERM, and a renewal missed under load would make m0 expire and
	// rejoin, moving the slots back and forth (a promotion interrupted in
	// its catch-up then reopens the copy instead of taking it open).
	ttl := []string{"--member-ttl", "10s"}
	m0 := startMemberOpts(t, ns.ClientURL(), "m0", t.TempDir(), 1, Options{}, ttl...)
	m0.settledOn(t, "m0")
	var coresMu sync.Mutex
	cores := map[int]*slot.Slot{} // m1's slots, the latest of each
	m1 := startMemberOpts(t, ns.ClientURL(), "m1", t.TempDir(), 1, Options{OnReady: func(a *slot.Slot) {
		coresMu.Lock()
		cores[a.Config().Owner.Index] = a
		coresMu.Unlock()
	}}, ttl...)
	v := m1.settledOn(t, "m0", "m1")
	if v.Assignments[0].Owner == v.Assignments[1].Owner {
		t.Fatalf("not balanced: %+v", v.Assignments)
	}

	nc := testnats.Connect(t, ns.ClientURL())
	c, err := client.New(nc, client.Config{})
	if err != nil {
		t.Fatal(err)
	}
	var tenants []string
	for i := 0; len(tenants) < 4; i++ { // two tenants of each slot
		name := fmt.Sprintf("acme%d", i)
		if n := len(tenants); queue.Partition(name, 4)%2 == n%2 {
			tenants = append(tenants, name)
		}
	}
	var mu sync.Mutex
	results := map[string][]client.Result{}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		_ = c.Results(ctx, tenants, time.Now().Add(-time.Second), func(r client.Result) bool {
			mu.Lock()
			results[r.RequestID] = append(results[r.RequestID], r)
			mu.Unlock()
			return true
		})
	}()
	type node struct{ tenant, id string }
	var nodes []node
	publish := func(round int) {
		for i := 0; i < 10; i++ {
			for _, tn := range tenants {
				id := uuid.NewString()
				rid := fmt.Sprintf("r%d-%d-%s", round, i, tn)
				if _, err := c.PublishRequest(ctx, &client.Request{RequestID: rid, Op: "put_node", Tenant: tn, ID: id, ValidFrom: "2026-01-01T00:00:00Z",
					Props: json.RawMessage(`{}`), Provenance: &client.Provenance{Actor: "t", Reason: "r"}}); err != nil {
					t.Fatal(err)
				}
				nodes = append(nodes, node{tn, id})
			}
		}
		testnats.Eventually(t, 60*time.Second, "every request answered", func() bool {
			mu.Lock()
			defer mu.Unlock()
			return len(results) == len(nodes)
		})
	}
	read := func(m *memberUnderTest) {
		t.Helper()
		for _, n := range nodes {
			resp, err := http.Get(fmt.Sprintf("%s/v1/tenants/%s/nodes/%s", m.base, n.tenant, n.id))
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != 200 {
				t.Fatalf("%s/%s through %s: %d", n.tenant, n.id, m.id, resp.StatusCode)
			}
		}
	}
	publish(0)
	read(m0)
	read(m1)

	m0.cancel()
	select {
	case err := <-m0.done:
		if err != nil {
			t.Fatalf("m0 after SIGTERM: %v", err)
		}
		m0.done <- nil // for the cleanup
	case <-time.After(60 * time.Second):
		t.Fatal("m0 did not hand off and stop within 60 s")
	}
	m1.settledOn(t, "m1")
	// The slot m0 handed off was promoted from m1's warm standby in place:
	// the slot took the standby's Pebble, still open, and replayed only the
	// tail, no restore and no reopen.
	moved := 0
	if v.Assignments[0].Owner == "m1" {
		moved = 1
	}
	coresMu.Lock()
	promoted := cores[moved]
	coresMu.Unlock()
	if promoted == nil {
		t.Fatalf("no core of slot %d on m1", moved)
	}
	if st := promoted.ChangelogStatus(); st.Restored || st.ReplayFrom <= 1 || !st.InPlace {
		t.Fatalf("slot %d on m1 started with restored=%v, replay from %d, in place %v: not on its warm standby's open copy", moved, st.Restored, st.ReplayFrom, st.InPlace)
	}
	publish(1)
	read(m1)
	// The status page (the lowest slot m1 owns) lists every slot of the group.
	resp, err := http.Get(m1.base + "/ui/")
	if err != nil {
		t.Fatal(err)
	}
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(page), `id="slots"`) || strings.Count(string(page), "<td>m1</td>") != 2 {
		t.Errorf("/ui/ through m1: %d, want the slots table with m1 owning both:\n%s", resp.StatusCode, page)
	}
	mu.Lock()
	defer mu.Unlock()
	for rid, rs := range results {
		if len(rs) != 1 || rs[0].Status != "ok" {
			t.Errorf("request %s: %+v, want one ok result", rid, rs)
		}
	}
	if resp, err := http.Get(m1.base + "/metrics"); err != nil {
		t.Fatal(err)
	} else {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		for _, want := range []string{`telha_partition_role{role="owner",slot="0"} 1`, `telha_partition_role{role="owner",slot="1"} 1`,
			`telha_requests_total{op="put_node",slot="0",status="ok"}`, "telha_member_live_members 1"} {
			if !strings.Contains(string(b), want) {
				t.Errorf("/metrics of m1 lacks %s", want)
			}
		}
	}
}

// TestLostClaimIsNotFatal: a core whose claim was fenced before it served
// lost a race (the slot restarts); one fenced after it served is a zombie
// (the member exits 3).
func TestLostClaimIsNotFatal(t *testing.T) {
	claim := fmt.Errorf("%w: changelog: claim: %w", storage.ErrFatal, fmt.Errorf("%w: partition 1 expected last sequence 184", partition.ErrFenced))
	if !lostClaim(claim, false) {
		t.Fatal("a fenced claim before serving is not a lost race")
	}
	if lostClaim(claim, true) {
		t.Fatal("a fence after serving is a lost race; it must end the member")
	}
	if lostClaim(fmt.Errorf("%w: disk", storage.ErrFatal), false) || lostClaim(nil, false) {
		t.Fatal("a fatal error other than a fence, or none, is a lost claim")
	}
}

// TestRolelessCopyIsRemoved (issue 29, audit item 1): a member that
// restarts on its old disk and is given no role for a slot it held removes
// that slot's copy (no erase would ever reach it), and keeps the copy of
// the slot it owns.
func TestRolelessCopyIsRemoved(t *testing.T) {
	ns := testnats.Start(t)
	dirA := t.TempDir()
	a := startMemberIn(t, ns, "a", dirA, 0)
	a.settledOn(t, "a")
	for _, s := range []int{0, 1} {
		if _, err := os.Stat(filepath.Join(dirA, "slots", fmt.Sprint(s), "pebble")); err != nil {
			t.Fatalf("a owned slot %d but has no copy: %v", s, err)
		}
	}
	a.cancel()
	err := <-a.done
	a.done <- err // for its cleanup
	if err != nil {
		t.Fatal(err)
	}
	b := startMemberIn(t, ns, "b", t.TempDir(), 0)
	b.settledOn(t, "b")
	a = startMemberIn(t, ns, "a", dirA, 0)
	var v dynView
	testnats.Eventually(t, 60*time.Second, "a and b own a slot each", func() bool {
		var code int
		v, code = a.view()
		if code != 200 || len(v.Members) != 2 || len(v.Assignments) != 2 {
			return false
		}
		return v.Assignments[0].Owner != v.Assignments[1].Owner && v.Assignments[0].Ready && v.Assignments[1].Ready &&
			v.Assignments[0].Owner != "" && v.Assignments[1].Owner != ""
	})
	owned := -1
	for _, as := range v.Assignments {
		if as.Owner == "a" {
			owned = as.Slot
		}
	}
	if owned < 0 {
		t.Fatalf("a owns no slot: %+v", v)
	}
	other := 1 - owned
	testnats.Eventually(t, 30*time.Second, "a removes the copy of the slot it holds no role of", func() bool {
		_, err := os.Stat(filepath.Join(dirA, "slots", fmt.Sprint(other)))
		return errors.Is(err, os.ErrNotExist)
	})
	if _, err := os.Stat(filepath.Join(dirA, "slots", fmt.Sprint(owned), "pebble")); err != nil {
		t.Fatalf("the copy of the slot a owns: %v", err)
	}
}

// TestMemberCutOffFromNATSServesNoStaleRead (issue 30 item 4, reads under
// a lease): a member whose NATS connection is cut loses its slots to the
// other member after the TTL; from then on, a read through the cut-off
// member of a node written after the move never answers 404, and of a
// node tombstoned after the move never answers 200: it answers 503, and
// its /readyz is not 200.
func TestMemberCutOffFromNATSServesNoStaleRead(t *testing.T) {
	ns := testnats.Start(t)
	proxy := testnats.StartProxy(t, strings.TrimPrefix(ns.ClientURL(), "nats://"))
	a := startMemberURL(t, proxy.URL(), "a", t.TempDir(), 1)
	a.settledOn(t, "a")
	b := startMemberIn(t, ns, "b", t.TempDir(), 1)
	v := b.settledOn(t, "a", "b")
	_, tenant := ownedTenant(t, v, "a")
	bus := newBus(t, ns)
	old := uuid.NewString()
	mustOK(t, bus.wait(bus.send(tenant, node(old))))
	get := func(m *memberUnderTest, path string) int {
		resp, err := http.Get(m.base + path)
		if err != nil {
			return 0
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	oldPath := "/v1/tenants/" + tenant + "/nodes/" + old
	testnats.Eventually(t, 30*time.Second, "a reads its own node", func() bool { return get(a, oldPath) == 200 })

	proxy.Cut()
	b.settledOn(t, "b")
	// After the move: a node written, the old one tombstoned, both by b.
	fresh := uuid.NewString()
	mustOK(t, bus.wait(bus.send(tenant, node(fresh))))
	mustOK(t, bus.wait(bus.send(tenant, tombNode(old))))
	freshPath := "/v1/tenants/" + tenant + "/nodes/" + fresh
	if code := get(b, freshPath); code != 200 {
		t.Fatalf("b reads the node it wrote: %d", code)
	}
	for i := 0; i < 20; i++ {
		if code := get(a, freshPath); code != http.StatusServiceUnavailable {
			t.Fatalf("through the cut-off member, a node written after the move answered %d, want 503", code)
		}
		if code := get(a, oldPath); code != http.StatusServiceUnavailable {
			t.Fatalf("through the cut-off member, a node tombstoned after the move answered %d, want 503", code)
		}
		if code := get(a, "/readyz"); code == 200 {
			t.Fatal("the cut-off member's /readyz answered 200")
		}
		time.Sleep(50 * time.Millisecond) // reads spread over a second, not a synchronisation
	}

	// Reconnected, a renews its record (it expired: a Put creates it
	// again) and only then reads the assignment that moved its slot. Its
	// lease must not count from that renewal before it knows what it
	// still owns: reads hammered at it from the moment NATS is back
	// answer 503 or b's answer, never its stale copy's 404 (a black-box
	// probe saw one, 68 ms after a paused member was continued).
	proxy.SetCut(false)
	var stale atomic.Int32
	var wg sync.WaitGroup
	done := make(chan struct{})
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-done:
					return
				default:
				}
				if get(a, freshPath) == http.StatusNotFound {
					stale.Add(1)
				}
			}
		}()
	}
	testnats.Eventually(t, 60*time.Second, "a rejoined, and forwards the read to b", func() bool { return get(a, freshPath) == 200 })
	close(done)
	wg.Wait()
	if n := stale.Load(); n > 0 {
		t.Fatalf("a answered %d reads of a node written after its slot moved with 404 from its stale copy, after it rejoined", n)
	}
}

// TestDuplicateMemberIDExits (issue 30 item 5): a second process started
// with a live member's --member-id stops with a usage error (exit 2)
// naming the duplicate, and the live member goes on serving.
func TestDuplicateMemberIDExits(t *testing.T) {
	ns := testnats.Start(t)
	a := startMember(t, ns, "a")
	a.settledOn(t, "a")
	addr := testnats.FreeAddr(t)
	cfg, err := ParseFlags([]string{"--data-dir", t.TempDir(), "--http-addr", addr, "--advertise-url", "http://" + addr, "--nats-url", ns.ClientURL(),
		"--partitions", "4", "--partition-owner", "dynamic/2", "--changelog", "jetstream", "--member-id", "a", "--member-ttl", "2s",
		"--standbys", "1", "--auth", "off"}, func(string) string { return "" }, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err = Run(ctx, cfg, testLog, Options{})
	if !errors.Is(err, ErrUsage) || !errors.Is(err, member.ErrDuplicateMember) {
		t.Fatalf("the second process with id a returned %v, want a usage error wrapping ErrDuplicateMember", err)
	}
	if v, code := a.view(); code != 200 || len(v.Members) != 1 {
		t.Fatalf("the live member after the duplicate stopped: %d %+v", code, v)
	}
	a.settledOn(t, "a")
}

// TestMemberHoldsTwoNATSConnections: a member's slots share the process's
// NATS connection (issue 30: 20 client connections for 3 members of 16
// slots), and their change feeds share one more, which never reconnects
// (queue.FeedConn): one member owning both slots holds two connections,
// however many slots it runs.
func TestMemberHoldsTwoNATSConnections(t *testing.T) {
	ns := testnats.Start(t)
	m0 := startMember(t, ns, "m0")
	m0.settledOn(t, "m0") // both slots owned and serving
	// The feed dials its connection at its first round (within a second
	// of the slot's start).
	var names []string
	testnats.Eventually(t, 10*time.Second, "the member's two NATS connections", func() bool {
		names = nil
		if cz, err := ns.Connz(nil); err == nil {
			for _, c := range cz.Conns {
				names = append(names, c.Name)
			}
		}
		return len(names) >= 2
	})
	slices.Sort(names)
	if len(names) != 2 || names[0] != "telha-cascade" || names[1] != "telha-cascade change-feed" {
		t.Fatalf("the member holds NATS connections %q, want the member's and its change feed's", names)
	}
}

// TestMembershipEvents: a member says when another joins, leaves (its
// record said leaving) or expires (its record vanished without leaving),
// naming the slots an expired member held; the first read of the group
// is no change.
func TestMembershipEvents(t *testing.T) {
	m := &memberRun{id: "m0", cfg: Config{Member: MemberConfig{TTL: 6 * time.Second}}}
	now := time.Now()
	m0 := member.Member{ID: "m0", URL: "http://a"}
	m1 := member.Member{ID: "m1", URL: "http://b", Renewed: now.Add(-7 * time.Second)}
	m2 := member.Member{ID: "m2", URL: "http://c"}
	if ev := m.noteMembership(nil, []member.Member{m0, m1}, now); len(ev) != 0 {
		t.Fatalf("first read: %+v, want no events", ev)
	}
	if ev := m.noteMembership([]member.Member{m0, m1}, []member.Member{m0, m1, m2}, now); len(ev) != 1 || ev[0].Kind != "joined" || ev[0].Member != "m2" {
		t.Fatalf("m2 joined: %+v", ev)
	}
	m.assign = []member.Assignment{{Slot: 0, Owner: "m0", Prev: "m1"}, {Slot: 1, Owner: "m2"}}
	ev := m.noteMembership([]member.Member{m0, m1, m2}, []member.Member{m0, m2}, now)
	if len(ev) != 1 || ev[0].Kind != "expired" || ev[0].Member != "m1" || !strings.Contains(ev[0].What, "[0]") {
		t.Fatalf("m1 expired: %+v", ev)
	}
	leaving := m2
	leaving.Leaving = true
	if ev := m.noteMembership([]member.Member{m0, leaving}, []member.Member{m0}, now); len(ev) != 1 || ev[0].Kind != "left" {
		t.Fatalf("m2 left: %+v", ev)
	}
	if len(m.events) != 3 {
		t.Fatalf("kept %d events, want 3", len(m.events))
	}
	for i := 0; i < eventsKept+5; i++ {
		m.noteMembership([]member.Member{m0}, []member.Member{m0, {ID: fmt.Sprint("x", i)}}, now)
	}
	if len(m.events) != eventsKept {
		t.Fatalf("kept %d events, want the newest %d", len(m.events), eventsKept)
	}
}

// TestGroupStatusPage: the status page of any member shows the whole
// group (issue 30 item 6): its members, whose figures the page shows, and
// a journal in flight on another member's slot, then finished there.
func TestGroupStatusPage(t *testing.T) {
	ns := testnats.Start(t)
	hold, opts := newChunkHold()
	m0 := startMember(t, ns, "m0")
	m0.settledOn(t, "m0")
	startMemberOpts(t, ns.ClientURL(), "m1", t.TempDir(), 1, opts, "--max-batch-ops", fmt.Sprint(cascade.MinMaxBatchOps))
	v := m0.settledOn(t, "m0", "m1")
	var slot1 int
	for _, a := range v.Assignments {
		if a.Owner == "m1" {
			slot1 = a.Slot
		}
	}
	tenant := ""
	for i := 0; tenant == ""; i++ {
		if c := fmt.Sprint("t", i); queue.Partition(c, 4)%2 == slot1 {
			tenant = c
		}
	}
	bus := newBus(t, ns)
	hub, del, release := journalHeld(t, bus, hold, tenant)
	defer release()
	get := func(path string) string {
		resp, err := http.Get(m0.base + path)
		if err != nil {
			return ""
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}
	testnats.Eventually(t, 20*time.Second, "m0's journals page lists the journal on m1's slot", func() bool {
		return strings.Contains(get("/ui/journals"), fmt.Sprintf(`class="group-journal" data-node="%s" data-slot="%d"`, hub, slot1))
	})
	page := get("/ui/")
	for _, want := range []string{`id="members"`, `data-member="m0"`, `data-member="m1"`, "m0 (this one)", `id="member-id">m0<`, "The figures above are this member"} {
		if !strings.Contains(page, want) {
			t.Errorf("m0's overview lacks %q", want)
		}
	}
	// Each slot m0 owns has its own queue and reaper line; m1's slot
	// leaves them to m1's page.
	slot0 := 1 - slot1
	testnats.Eventually(t, 20*time.Second, fmt.Sprintf("m0's slot %d row shows its queue", slot0), func() bool {
		row := slotRowOf(get("/ui/"), slot0)
		return strings.Contains(row, `<td class="slot-queue">pending `) && strings.Contains(row, `<td class="slot-reaper">`)
	})
	if row := slotRowOf(page, slot1); !strings.Contains(row, `<td class="slot-queue"></td>`) {
		t.Errorf("m1's slot %d row shows a queue on m0's page: %s", slot1, row)
	}
	release()
	res := mustOK(t, bus.wait(del))
	// Finished on m1's slot, it is listed under "recently finished" on
	// m0's page too, with its slot and member (before: only the journals
	// of the slot serving the page were).
	testnats.Eventually(t, 20*time.Second, "m0's journals page lists the journal finished on m1's slot", func() bool {
		page := get("/ui/journals")
		i := strings.Index(page, fmt.Sprintf(`<tr class="finished" data-request="%s">`, res.RequestID))
		if i < 0 {
			return false
		}
		row := page[i:]
		row = row[:strings.Index(row, "</tr>")]
		return strings.Contains(row, fmt.Sprintf(`<td class="num">%d</td><td class="id">m1</td>`, slot1))
	})
}

// TestStandbyAnswersReadsDuringAFailover (issue 30 item 3): when a slot's
// owner is cut off from NATS, a read through the member holding its
// standby is answered at once from the standby's copy (200, marked as
// such, with an as_of_tx at or above the write it reads) until that member
// owns the slot; no read of the node answers 404 or 5xx but a 503 while
// the standby is promoted.
func TestStandbyAnswersReadsDuringAFailover(t *testing.T) {
	ns := testnats.Start(t)
	proxy := testnats.StartProxy(t, strings.TrimPrefix(ns.ClientURL(), "nats://"))
	// A longer TTL than the other member tests: the owner's lease (4 s)
	// runs out 2 s before its record expires, the window in which only the
	// standby can answer.
	a := startMemberOpts(t, proxy.URL(), "a", t.TempDir(), 1, Options{}, "--member-ttl", "6s")
	a.settledOn(t, "a")
	b := startMemberOpts(t, ns.ClientURL(), "b", t.TempDir(), 1, Options{}, "--member-ttl", "6s")
	v := b.settledOn(t, "a", "b")
	slotA, tenant := ownedTenant(t, v, "a")
	bus := newBus(t, ns)
	id := uuid.NewString()
	put := mustOK(t, bus.wait(bus.send(tenant, node(id))))
	waitStandbyCaughtUp(t, b, slotA, "b") // b's standby has applied the put

	proxy.Cut()
	path := b.base + "/v1/tenants/" + tenant + "/nodes/" + id
	fromStandby, fromOwner := 0, 0
	testnats.Eventually(t, 60*time.Second, "reads through b answered by its standby, then by b as the owner", func() bool {
		resp, err := http.Get(path)
		if err != nil {
			t.Fatalf("read through b: %v", err)
		}
		defer resp.Body.Close()
		var body struct {
			AsOfTx string `json:"as_of_tx"`
		}
		_ = json.NewDecoder(resp.Body).Decode(&body)
		switch {
		case resp.StatusCode == http.StatusOK && resp.Header.Get(hdrReadFrom) == "standby":
			if body.AsOfTx < put.TxTime {
				t.Fatalf("the standby answered at as_of_tx %q, below the put's tx %q", body.AsOfTx, put.TxTime)
			}
			fromStandby++
		case resp.StatusCode == http.StatusOK:
			if fromStandby > 0 {
				fromOwner++ // the standby was promoted: b owns the slot
			}
		case resp.StatusCode == http.StatusServiceUnavailable:
		default:
			t.Fatalf("a read through b during the failover answered %d", resp.StatusCode)
		}
		return fromOwner > 0
	})
	t.Logf("%d reads answered by b's standby before b owned the slot", fromStandby)
}

// ownedTenant returns a slot that member id owns in v (2 slots of 4
// partitions) and a tenant of that slot.
func ownedTenant(t *testing.T, v dynView, id string) (int, string) {
	t.Helper()
	slot := -1
	for _, as := range v.Assignments {
		if as.Owner == id {
			slot = as.Slot
		}
	}
	if slot < 0 {
		t.Fatalf("%s owns no slot: %+v", id, v)
	}
	for i := 0; ; i++ {
		if name := fmt.Sprintf("acme%d", i); queue.Partition(name, 4)%2 == slot {
			return slot, name
		}
	}
}

// TestMemberSharesAuthAndTracer (issue 30 item 1: one auth, one tracer per
// process): a member checks every read once, with the one tokens file, and
// counts what it refuses in telha_api_denied_total (before, a member's
// refusals were counted nowhere); with --otlp-endpoint its slots' spans
// reach the collector (before, dynamic mode traced nothing).
func TestMemberSharesAuthAndTracer(t *testing.T) {
	ns := testnats.Start(t)
	var mu sync.Mutex
	posts := 0
	collector := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if r.Method == http.MethodPost && r.URL.Path == "/v1/traces" {
			mu.Lock()
			posts++
			mu.Unlock()
		}
		w.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(collector.Close)
	path := filepath.Join(t.TempDir(), "tokens.json")
	if err := os.WriteFile(path, []byte(`{"tokens": [{"name": "app", "token": "acme-reader-token-0001", "tenants": ["*"], "role": "read"}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	m := startMemberOpts(t, ns.ClientURL(), "a", t.TempDir(), 0, Options{},
		"--auth", "tokens", "--auth-tokens-file", path, "--otlp-endpoint", collector.URL)
	testnats.Eventually(t, 60*time.Second, "the member is ready", func() bool {
		resp, err := http.Get(m.base + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	})
	for i := 0; i < 3; i++ {
		resp, err := http.Get(m.base + "/v1/tenants/acme/nodes/" + uuid.NewString())
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Fatalf("a read without a token answered %d, want 401", resp.StatusCode)
		}
	}
	resp, err := http.Get(m.base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	denied := 0.0
	for _, line := range strings.Split(string(body), "\n") {
		if rest, ok := strings.CutPrefix(line, `telha_api_denied_total{reason="unauthenticated"`); ok {
			var f float64
			if _, err := fmt.Sscan(rest[strings.Index(rest, " ")+1:], &f); err != nil {
				t.Fatalf("%s: %v", line, err)
			}
			denied += f
		}
	}
	if denied != 3 {
		t.Fatalf("telha_api_denied_total{reason=\"unauthenticated\"} sums to %v over the member's series, want 3", denied)
	}
	if strings.Contains(string(body), `telha_api_denied_total{reason="unauthenticated",slot=`) {
		t.Fatal("a slot's telha_api_denied_total series is exported: the member counts refusals, a slot's would stay 0")
	}

	bus := newBus(t, ns)
	mustOK(t, bus.wait(bus.send("acme", node(uuid.NewString()))))
	testnats.Eventually(t, 30*time.Second, "the slot's spans reach the collector", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return posts > 0
	})
}

// slotRowOf returns the row of slot s in a status page's slots table.
func slotRowOf(page string, s int) string {
	i := strings.Index(page, fmt.Sprintf(`<tr class="slot" data-slot="%d">`, s))
	if i < 0 {
		return ""
	}
	row := page[i:]
	if j := strings.Index(row, "</tr>"); j >= 0 {
		row = row[:j]
	}
	return row
}

// TestStandbyReadSeesEveryAnsweredWrite: a standby's copy answers a read
// only once it has read the changelog as far as it reached when the read
// arrived. Held before it applies a put its owner already answered, with
// the owner then cut off from NATS, the standby's member answers a read of
// that node 503 (never 404, which the copy alone would say); released, the
// copy answers it 200.
func TestStandbyReadSeesEveryAnsweredWrite(t *testing.T) {
	ns := testnats.Start(t)
	proxy := testnats.StartProxy(t, strings.TrimPrefix(ns.ClientURL(), "nats://"))
	a := startMemberOpts(t, proxy.URL(), "a", t.TempDir(), 1, Options{}, "--member-ttl", "6s")
	a.settledOn(t, "a")
	var holding atomic.Bool
	held, release := make(chan struct{}, 1), make(chan struct{})
	var releaseOnce sync.Once
	t.Cleanup(func() { releaseOnce.Do(func() { close(release) }) }) // before the members stop
	slotA := -1
	var slotMu sync.Mutex
	b := startMemberOpts(t, ns.ClientURL(), "b", t.TempDir(), 1, Options{beforeStandbyApply: func(slot int, _ uint64) {
		slotMu.Lock()
		mine := slot == slotA
		slotMu.Unlock()
		if mine && holding.Load() {
			select {
			case held <- struct{}{}:
			default:
			}
			<-release
		}
	}}, "--member-ttl", "6s", "--forward-wait", "1s")
	v := b.settledOn(t, "a", "b")
	s, tenant := ownedTenant(t, v, "a")
	slotMu.Lock()
	slotA = s
	slotMu.Unlock()
	bus := newBus(t, ns)
	mustOK(t, bus.wait(bus.send(tenant, node(uuid.NewString()))))
	holding.Store(true)
	fresh := uuid.NewString()
	mustOK(t, bus.wait(bus.send(tenant, node(fresh)))) // answered by a
	select {
	case <-held:
	case <-time.After(30 * time.Second):
		t.Fatal("b's standby never reached the put")
	}
	proxy.Cut()
	path := b.base + "/v1/tenants/" + tenant + "/nodes/" + fresh
	read := func() (int, string) {
		resp, err := http.Get(path)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode, resp.Header.Get(hdrReadFrom)
	}
	// Until a's lease runs out, a answers (200); then only the held
	// standby could, and it must not.
	testnats.Eventually(t, 30*time.Second, "reads through b find no serving owner", func() bool {
		code, _ := read()
		if code == http.StatusNotFound {
			t.Fatal("a put answered ok read 404 through b while b's standby had not applied it")
		}
		return code == http.StatusServiceUnavailable
	})
	for i := 0; i < 3; i++ {
		if code, _ := read(); code != http.StatusServiceUnavailable {
			t.Fatalf("while b's standby is held, a read answered %d, want 503", code)
		}
	}
	holding.Store(false)
	releaseOnce.Do(func() { close(release) })
	testnats.Eventually(t, 60*time.Second, "the read answered 200 once the standby applied the put", func() bool {
		code, _ := read()
		if code == http.StatusNotFound {
			t.Fatal("a put answered ok read 404 through b")
		}
		return code == http.StatusOK
	})
}

// freezeProxy is a TCP proxy in front of a member's HTTP that a test can
// freeze, as SIGSTOP freezes a process: from then on it accepts
// connections and reads requests but passes nothing on either way, and
// never closes (until the test ends).
type freezeProxy struct {
	ln     net.Listener
	target atomic.Pointer[string]
	frozen chan struct{}
	once   sync.Once
	done   chan struct{}
	mu     sync.Mutex
	conns  []net.Conn
}

func startFreezeProxy(t *testing.T) *freezeProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &freezeProxy{ln: ln, frozen: make(chan struct{}), done: make(chan struct{})}
	t.Cleanup(func() {
		close(p.done)
		ln.Close()
		p.mu.Lock()
		defer p.mu.Unlock()
		for _, c := range p.conns {
			c.Close()
		}
	})
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			p.mu.Lock()
			p.conns = append(p.conns, c)
			p.mu.Unlock()
			target := p.target.Load()
			select {
			case <-p.frozen:
				continue // held open, never answered
			default:
			}
			if target == nil {
				c.Close()
				continue
			}
			u, err := net.Dial("tcp", *target)
			if err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, u)
			p.mu.Unlock()
			go p.pipe(u, c)
			go p.pipe(c, u)
		}
	}()
	return p
}

// pipe copies src to dst until either ends, or holds what it reads once
// the proxy is frozen.
func (p *freezeProxy) pipe(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			select {
			case <-p.frozen:
				<-p.done
				return
			default:
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			dst.Close()
			return
		}
	}
}

func (p *freezeProxy) URL() string { return "http://" + p.ln.Addr().String() }

func (p *freezeProxy) Freeze() { p.once.Do(func() { close(p.frozen) }) }

// waitStandbyCaughtUp waits until m sees member id's standby of slot at
// or past the owner's applied sequence.
func waitStandbyCaughtUp(t *testing.T, m *memberUnderTest, slot int, id string) {
	t.Helper()
	testnats.Eventually(t, 30*time.Second, id+"'s standby applies the owner's writes", func() bool {
		var pv struct {
			Assignments []struct {
				Slot           int               `json:"slot"`
				OwnerApplied   uint64            `json:"owner_applied"`
				StandbyApplied map[string]uint64 `json:"standby_applied"`
			} `json:"assignments"`
		}
		resp, err := http.Get(m.base + "/v1/partitions")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		if json.NewDecoder(resp.Body).Decode(&pv) != nil {
			return false
		}
		for _, as := range pv.Assignments {
			if as.Slot == slot {
				return as.OwnerApplied > 0 && as.StandbyApplied[id] >= as.OwnerApplied
			}
		}
		return false
	})
}

// TestMemberCutOffFromNATSExitsWithinTheGrace: --shutdown-grace bounds a
// member's whole exit (CONTRACT, flags), also when SIGTERM finds it cut off
// from NATS. Before, each step of the exit waited out its own bound in
// turn (the round in flight, the handoff, the drain, a flush, the record's
// delete): 21 s for a 10 s grace here, and past 60 s under a loaded CI.
func TestMemberCutOffFromNATSExitsWithinTheGrace(t *testing.T) {
	const grace = 4 * time.Second
	ns := testnats.Start(t)
	link := testnats.StartProxy(t, strings.TrimPrefix(ns.ClientURL(), "nats://"))
	a := startMemberOpts(t, link.URL(), "a", t.TempDir(), 1, Options{}, "--member-ttl", "6s", "--shutdown-grace", grace.String())
	a.settledOn(t, "a")
	bus := newBus(t, ns)
	v, _ := a.view()
	_, tenant := ownedTenant(t, v, "a")
	mustOK(t, bus.wait(bus.send(tenant, node(uuid.NewString()))))

	link.Cut()
	testnats.Eventually(t, 30*time.Second, "a's /readyz says it is not ready once cut off", func() bool {
		resp, err := http.Get(a.base + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode != http.StatusOK
	})
	sigterm := time.Now()
	a.cancel()
	select {
	case err := <-a.done:
		a.done <- err // for the cleanup
	case <-time.After(60 * time.Second):
		t.Fatalf("a member cut off from NATS did not exit within 60 s of SIGTERM (--shutdown-grace %s)", grace)
	}
	// The bound the flag gives, and a margin for what follows the drain
	// (closing the stores and the connections) on a loaded machine.
	took := time.Since(sigterm)
	t.Logf("cut off from NATS, a exited %s after SIGTERM (--shutdown-grace %s)", took.Round(time.Millisecond), grace)
	if took > grace+3*time.Second {
		t.Fatalf("a member cut off from NATS exited %s after SIGTERM, past --shutdown-grace %s", took.Round(time.Millisecond), grace)
	}
}

// TestMemberLeavesAPausedNATSServer: a member whose NATS server is paused
// (SIGSTOP, a frozen VM: its TCP connection open, nothing answered; here
// the proxy in front of it frozen) reconnects to another server of
// --nats-url and serves again. With nats.go's default pings (every 2
// minutes, 2 outstanding) it stayed on the paused server, out of the
// group, for about 6 minutes while the other server was up.
func TestMemberLeavesAPausedNATSServer(t *testing.T) {
	ns := testnats.Start(t)
	target := strings.TrimPrefix(ns.ClientURL(), "nats://")
	p1, p2 := testnats.StartProxy(t, target), testnats.StartProxy(t, target)
	// Two URLs of one server: --stream-replicas 1, or it would ask for 2.
	a := startMemberOpts(t, p1.URL()+","+p2.URL(), "a", t.TempDir(), 1, Options{}, "--stream-replicas", "1")
	a.settledOn(t, "a")
	bus := newBus(t, ns)
	v, _ := a.view()
	_, tenant := ownedTenant(t, v, "a")
	mustOK(t, bus.wait(bus.send(tenant, node(uuid.NewString()))))
	on, other := p1, p2
	if p1.Conns() == 0 {
		on, other = p2, p1
	}
	if on.Conns() == 0 || other.Conns() != 0 {
		t.Fatalf("a's connections: %d through one server, %d through the other; want them all through one", on.Conns(), other.Conns())
	}

	on.SetFrozen(true)
	paused := time.Now()
	// A put sent while a's server is paused is answered once a is back
	// in the group through the other server (the change feed's own
	// connection moves by itself, on its unanswered publishes: a's
	// answer is what says the member's connection moved too).
	id := bus.send(tenant, node(uuid.NewString()))
	testnats.Eventually(t, 90*time.Second, "a put sent while a's server is paused is answered", func() bool {
		bus.mu.Lock()
		defer bus.mu.Unlock()
		return len(bus.results[id]) > 0
	})
	t.Logf("a answered %s after its server was paused; the other server carries %d of its connections", time.Since(paused).Round(time.Millisecond), other.Conns())
	mustOK(t, bus.wait(id))
	a.settledOn(t, "a")
}

// TestReadsLeaveAFrozenOwner: an owner frozen as by SIGSTOP (its HTTP
// accepts and never answers, its NATS link is gone) holds no read through
// another member. An entity read is answered by the standby once the
// owner has been silent for 500 ms (before: it waited for the client to
// give up, even after the slot had moved); a read with wait, which only
// an owner answers, is routed again when the slot moves. /v1/journals
// names the frozen member rather than hanging with it.
func TestReadsLeaveAFrozenOwner(t *testing.T) {
	ns := testnats.Start(t)
	natsLink := testnats.StartProxy(t, strings.TrimPrefix(ns.ClientURL(), "nats://"))
	front := startFreezeProxy(t)
	a := startMemberOpts(t, natsLink.URL(), "a", t.TempDir(), 1, Options{}, "--member-ttl", "6s", "--advertise-url", front.URL())
	target := strings.TrimPrefix(a.base, "http://")
	front.target.Store(&target)
	a.settledOn(t, "a")
	b := startMemberOpts(t, ns.ClientURL(), "b", t.TempDir(), 1, Options{}, "--member-ttl", "6s")
	v := b.settledOn(t, "a", "b")
	slotA, tenant := ownedTenant(t, v, "a")
	bus := newBus(t, ns)
	id := uuid.NewString()
	put := mustOK(t, bus.wait(bus.send(tenant, node(id))))
	waitStandbyCaughtUp(t, b, slotA, "b")
	path := b.base + "/v1/tenants/" + tenant + "/nodes/" + id
	hc := &http.Client{Timeout: 5 * time.Second}
	resp, err := hc.Get(path)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Header.Get(hdrReadFrom) != "" {
		t.Fatalf("before the freeze, a read through b answered %d from %q, want 200 from the owner", resp.StatusCode, resp.Header.Get(hdrReadFrom))
	}

	// client.Reader sends the read to a (its owner) itself.
	reader := &client.Reader{Base: b.base, RefreshEvery: time.Hour}
	readerGet := func() (int, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		resp, err := reader.Get(ctx, "/v1/tenants/"+tenant+"/nodes/"+id)
		if err != nil {
			return 0, err
		}
		defer resp.Body.Close()
		_, err = io.Copy(io.Discard, resp.Body)
		return resp.StatusCode, err
	}
	if code, err := readerGet(); code != http.StatusOK {
		t.Fatalf("before the freeze, a read through client.Reader: %d %v", code, err)
	}

	front.Freeze()
	natsLink.Cut()
	frozenAt := time.Now()
	// The reader leaves the frozen owner after HedgeAfter for its Base (b),
	// which asks its standby.
	if code, err := readerGet(); code != http.StatusOK {
		t.Fatalf("a read through client.Reader at the frozen owner: %d %v", code, err)
	}
	// A read with wait: only the owner answers it; it must leave a when
	// the slot moves, not wait for the client.
	waited := make(chan error, 1)
	go func() {
		c := &http.Client{Timeout: 40 * time.Second}
		resp, err := c.Get(path + "?wait=1s")
		if err != nil {
			waited <- err
			return
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			waited <- fmt.Errorf("answered %d", resp.StatusCode)
			return
		}
		waited <- nil
	}()
	fromStandby, fromOwner := 0, 0
	testnats.Eventually(t, 60*time.Second, "reads through b answered by its standby, then by b as the owner", func() bool {
		start := time.Now()
		resp, err := hc.Get(path)
		if err != nil {
			t.Fatalf("a read through b %s after a froze: %v", time.Since(frozenAt).Round(time.Millisecond), err)
		}
		defer resp.Body.Close()
		var body struct {
			AsOfTx string `json:"as_of_tx"`
		}
		_ = json.NewDecoder(resp.Body).Decode(&body)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("a read through b %s after a froze answered %d", time.Since(frozenAt).Round(time.Millisecond), resp.StatusCode)
		}
		if resp.Header.Get(hdrReadFrom) == "standby" {
			if body.AsOfTx < put.TxTime {
				t.Fatalf("the standby answered at as_of_tx %q, below the put's tx %q", body.AsOfTx, put.TxTime)
			}
			fromStandby++
		} else if fromStandby > 0 || time.Since(start) < hedgeAfter {
			fromOwner++ // b owns the slot
		}
		return fromOwner > 0
	})
	if fromStandby == 0 {
		t.Fatal("no read was answered by b's standby while a was frozen")
	}
	select {
	case err := <-waited:
		if err != nil {
			t.Fatalf("a read with wait sent to the frozen owner: %v", err)
		}
	case <-time.After(40 * time.Second):
		t.Fatal("a read with wait sent to the frozen owner never ended")
	}

	var journals struct {
		Journals    []any `json:"journals"`
		Unreachable []struct {
			Member string `json:"member"`
		} `json:"unreachable"`
	}
	testnats.Eventually(t, 30*time.Second, "b's /v1/journals answers while a's record lives, or after", func() bool {
		resp, err := hc.Get(b.base + "/v1/journals")
		if err != nil {
			t.Fatalf("/v1/journals through b: %v", err)
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("/v1/journals through b answered %d", resp.StatusCode)
		}
		return json.NewDecoder(resp.Body).Decode(&journals) == nil
	})
	metricsBody := func() string {
		resp, err := hc.Get(b.base + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		raw, _ := io.ReadAll(resp.Body)
		return string(raw)
	}()
	if !strings.Contains(metricsBody, `telha_member_slow_owner_reads_total{answered="standby"}`) ||
		!strings.Contains(metricsBody, fmt.Sprintf(`telha_partition_standby_reads_total{slot="%d"}`, slotA)) {
		t.Fatalf("b's /metrics lacks the slow-owner or standby-read counts")
	}
	t.Logf("%d reads answered by b's standby, then b owned the slot; /v1/journals named %v", fromStandby, journals.Unreachable)
}

// TestMemberPageListsItsOtherSlotsJournals: a member's status page is
// served by the lowest slot it owns; a journal in flight on another of its
// slots is listed too (before: neither as a live row nor as the group's).
func TestMemberPageListsItsOtherSlotsJournals(t *testing.T) {
	m0, bus, hub, del, release := memberWithJournalOnSlot1(t)
	defer release()
	resp, err := http.Get(m0.base + "/ui/journals")
	if err != nil {
		t.Fatal(err)
	}
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if want := fmt.Sprintf(`class="group-journal" data-node="%s" data-slot="1"`, hub); !strings.Contains(string(page), want) {
		t.Fatalf("m0's journals page does not list the journal in flight on its slot 1 (%s)", want)
	}
	release()
	mustOK(t, bus.wait(del))
}

// TestMemberPageCardsSumItsSlots (issue 30 item 6): the overview's cards
// on a member are the member's, not those of the slot serving the page:
// a journal in flight on its other slot counts in "Journals in flight",
// the consumer card names every slot's consumer, and Pause pauses each of
// them (before: slot 0's only), Resume resumes them.
func TestMemberPageCardsSumItsSlots(t *testing.T) {
	m0, bus, _, del, release := memberWithJournalOnSlot1(t)
	defer release()
	pc := newPageClient(t, m0.base)
	if code, page := pc.get("/ui/"); code != 200 || !strings.Contains(page, `id="journals">1</b>`) ||
		!strings.Contains(page, "telha-worker-0, telha-worker-1: consuming") {
		t.Fatalf("m0's overview: %d, want the journal held on slot 1 counted and both consumers named:\n%s", code, page)
	}
	release()
	mustOK(t, bus.wait(del))

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	paused := func() (n int) {
		for s := range 2 {
			st, err := client.ConsumerPause(ctx, bus.js, "TELHA_REQ", client.ConsumerName(s))
			if err != nil {
				t.Fatal(err)
			}
			if st.Paused {
				n++
			}
		}
		return n
	}
	if code, page := pc.post("/ui/consumer/pause", url.Values{"for": {"1h"}}); code != 200 || !strings.Contains(page, `id="consumer-state" class="dead">paused`) {
		t.Fatalf("pause through m0's page: %d\n%s", code, page)
	}
	if n := paused(); n != 2 {
		t.Fatalf("%d of the 2 slots' consumers paused through m0's page, want both", n)
	}
	if code, _ := pc.post("/ui/consumer/resume", url.Values{}); code != 200 {
		t.Fatalf("resume through m0's page: %d", code)
	}
	if n := paused(); n != 0 {
		t.Fatalf("%d consumers still paused after Resume on m0's page", n)
	}
}

// memberWithJournalOnSlot1 starts one member, m0, owning both slots of
// two (slot 0 serves its page), and holds a journaled cascade of a
// tenant of slot 1 at its first chunk (journalHeld).
func memberWithJournalOnSlot1(t *testing.T) (m0 *memberUnderTest, b *bus, hub, del string, release func()) {
	t.Helper()
	ns := testnats.Start(t)
	hold, opts := newChunkHold()
	m0 = startMemberOpts(t, ns.ClientURL(), "m0", t.TempDir(), 1, opts, "--max-batch-ops", fmt.Sprint(cascade.MinMaxBatchOps))
	m0.settledOn(t, "m0") // owns both slots; slot 0 serves its page
	tenant := ""
	for i := 0; tenant == ""; i++ {
		if c := fmt.Sprint("t", i); queue.Partition(c, 4)%2 == 1 {
			tenant = c
		}
	}
	b = newBus(t, ns)
	hub, del, release = journalHeld(t, b, hold, tenant)
	return m0, b, hub, del, release
}

// journalHeld tombstones a new hub of tenant with enough edges to be
// journaled (--max-batch-ops cascade.MinMaxBatchOps) and returns once
// hold holds its first chunk: the hub, the request's id, and the release
// of the hold (idempotent).
func journalHeld(t *testing.T, bus *bus, hold *chunkHold, tenant string) (hub, del string, release func()) {
	t.Helper()
	hub = uuid.NewString()
	mustOK(t, bus.wait(bus.send(tenant, node(hub))))
	for i := 0; i < 3*cascade.MinMaxBatchOps; i++ {
		spoke := uuid.NewString()
		mustOK(t, bus.wait(bus.send(tenant, node(spoke))))
		mustOK(t, bus.wait(bus.send(tenant, edge(uuid.NewString(), hub, spoke))))
	}
	hold.arm()
	del = bus.send(tenant, tombNode(hub))
	var once sync.Once
	release = func() { once.Do(func() { close(hold.release) }) }
	select {
	case <-hold.held:
	case <-time.After(30 * time.Second):
		release()
		t.Fatal("the cascade was not journaled")
	}
	return hub, del, release
}

// TestReaderReadsAtTheOwner (issue 30 item 8): client.Reader sends each
// read to its tenant's owner as /v1/partitions says: with the member it
// was given (Base) frozen, reads of both members' slots are still
// answered; when a slot's owner leaves, its reads go through Base again
// and are answered by the new owner.
func TestReaderReadsAtTheOwner(t *testing.T) {
	ns := testnats.Start(t)
	m0 := startMember(t, ns, "m0")
	m0.settledOn(t, "m0")
	m1 := startMember(t, ns, "m1")
	v := m0.settledOn(t, "m0", "m1")
	_, t0 := ownedTenant(t, v, "m0")
	_, t1 := ownedTenant(t, v, "m1")
	bus := newBus(t, ns)
	ids := map[string]string{t0: uuid.NewString(), t1: uuid.NewString()}
	for tenant, id := range ids {
		mustOK(t, bus.wait(bus.send(tenant, node(id))))
	}
	read := func(r *client.Reader, tenant string, within time.Duration) (int, error) {
		ctx, cancel := context.WithTimeout(context.Background(), within)
		defer cancel()
		resp, err := r.Get(ctx, "/v1/tenants/"+tenant+"/nodes/"+ids[tenant])
		if err != nil {
			return 0, err
		}
		defer resp.Body.Close()
		_, err = io.Copy(io.Discard, resp.Body)
		return resp.StatusCode, err
	}

	front := startFreezeProxy(t)
	target := strings.TrimPrefix(m0.base, "http://")
	front.target.Store(&target)
	// No hedge to Base within the test's reads: an owner slower than the
	// default 500 ms on a loaded machine would be read at Base instead
	// (and, once Base is frozen, not at all).
	r := &client.Reader{Base: front.URL(), RefreshEvery: time.Hour, HedgeAfter: 10 * time.Second}
	for tenant := range ids {
		if code, err := read(r, tenant, 10*time.Second); code != http.StatusOK {
			t.Fatalf("read of %s through the reader: %d %v", tenant, code, err)
		}
	}
	front.Freeze()
	for tenant := range ids {
		if code, err := read(r, tenant, 5*time.Second); code != http.StatusOK {
			t.Fatalf("with Base frozen, the read of %s at its owner: %d %v", tenant, code, err)
		}
	}
	if st := r.Stats(); st.AtOwner != 4 || st.AtBase != 0 {
		t.Fatalf("the reader's reads: %+v, want all 4 at their owners", st)
	}

	r2 := &client.Reader{Base: m0.base, RefreshEvery: time.Hour}
	if code, err := read(r2, t1, 10*time.Second); code != http.StatusOK {
		t.Fatalf("read of %s at m1: %d %v", t1, code, err)
	}
	m1.cancel() // m1 leaves; its slot moves to m0
	select {
	case err := <-m1.done:
		m1.done <- err // for the cleanup
	case <-time.After(60 * time.Second):
		t.Fatal("m1 did not stop")
	}
	if code, err := read(r2, t1, 30*time.Second); code != http.StatusOK {
		t.Fatalf("after m1 left, the read of %s through the reader: %d %v", t1, code, err)
	}
	if st := r2.Stats(); st.FellBack != 1 {
		t.Fatalf("the reader's reads: %+v, want the one after m1 left fallen back to Base", st)
	}
}

// TestAFencedSlotRunsAgainInTheSameMember: a slot whose changelog append is
// refused (another writer appended: what a member paused past its TTL
// meets when it continues) stops alone, and the member's next round runs
// it again in the same process: it catches up, claims, and answers. Before,
// the stopped slot kept its Pebble open, so every later run of that slot
// in the member, as owner or standby, failed "lock held by current
// process" until the process exited (a black-box probe saw two slots
// without a serving owner for 5 minutes).
func TestAFencedSlotRunsAgainInTheSameMember(t *testing.T) { fencedSlotRunsAgain(t, 0) }

// TestAFencedSlotWhoseWorkerStopsLateRunsAgain: the same, when the
// slot's worker outlasts the slot's stop wait (here 1 ns; a black-box
// probe saw a worker cut off from NATS wait 10 s on its consumer's
// drain). The slot's store is closed once the worker is out. Before, it
// stayed open until the process exited: every later run of the slot in
// the member failed "lock held by current process", and the slot went
// unserved for good.
func TestAFencedSlotWhoseWorkerStopsLateRunsAgain(t *testing.T) {
	fencedSlotRunsAgain(t, time.Nanosecond)
}

func fencedSlotRunsAgain(t *testing.T, stopWait time.Duration) {
	ns := testnats.Start(t)
	var runs atomic.Int32 // slot runs that served, of both slots
	a := startMemberOpts(t, ns.ClientURL(), "a", t.TempDir(), 1, Options{OnReady: func(*slot.Slot) { runs.Add(1) }, slotStopWait: stopWait}, "--ack-wait", "2s")
	v := a.settledOn(t, "a")
	s, tenant := ownedTenant(t, v, "a")
	bus := newBus(t, ns)
	mustOK(t, bus.wait(bus.send(tenant, node(uuid.NewString()))))

	// Another writer appends to the slot's changelog: the slot's next
	// commit is refused (fenced). A log-data write-set changes no key.
	js, err := jetstream.New(testnats.Connect(t, ns.ClientURL()))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cfg := slot.Config{Owner: queue.Owner{Index: s, Count: 2}, StreamReplicas: 1}
	db, err := pebble.Open("", &pebble.Options{FS: vfs.NewMem()})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	wb := db.NewBatch()
	defer wb.Close()
	if err := wb.LogData([]byte("another writer"), nil); err != nil {
		t.Fatal(err)
	}
	// The member itself may append between this writer's read of the
	// log's end and its append (its feed saves cursors after a commit):
	// this writer is then the one fenced, and reads the end again.
	testnats.Eventually(t, 30*time.Second, "another writer's append to the slot's changelog", func() bool {
		other, err := partition.Open(ctx, js, cfg.ChangelogConfig())
		if err != nil {
			t.Fatal(err)
		}
		_, err = other.Append(ctx, wb.Repr())
		if err != nil && !errors.Is(err, partition.ErrFenced) {
			t.Fatal(err)
		}
		return err == nil
	})

	// The first put after it meets the fence (its slot stops); it and the
	// next are answered by the slot's next run in the same member.
	for i := range 2 {
		rid := bus.send(tenant, node(uuid.NewString()))
		res := bus.wait(rid)
		if res.Status != "ok" {
			t.Fatalf("put %d after the fence: %+v", i, res)
		}
	}
	if n := runs.Load(); n < 3 {
		t.Fatalf("%d slot runs served, want a third (the fenced slot's next run): the fence was never met", n)
	}
}

// membersOnAFailingDisk starts members a and b (2 slots, 1 standby each);
// after breakSlot(s), every MANIFEST write of a's copy of slot s fails
// (a Pebble fatal error at its next flush).
func membersOnAFailingDisk(t *testing.T, ns *testnats.Server) (a, b *memberUnderTest, breakSlot func(s int)) {
	dirA := t.TempDir()
	var failing atomic.Pointer[string] // writes to MANIFESTs under it fail
	inj := errorfs.InjectorFunc(func(op errorfs.Op) error {
		if p := failing.Load(); p != nil && op.Kind.ReadOrWrite() == errorfs.OpIsWrite &&
			strings.HasPrefix(op.Path, *p) && strings.Contains(filepath.Base(op.Path), "MANIFEST") {
			return errorfs.ErrInjected
		}
		return nil
	})
	a = startMemberOpts(t, ns.ClientURL(), "a", dirA, 1, Options{FS: errorfs.Wrap(vfs.Default, inj)}, "--ack-wait", "2s")
	b = startMemberOpts(t, ns.ClientURL(), "b", t.TempDir(), 1, Options{}, "--ack-wait", "2s")
	return a, b, func(s int) {
		dir := filepath.Join(dirA, "slots", strconv.Itoa(s)) + string(filepath.Separator)
		failing.Store(&dir)
	}
}

// TestABrokenSlotMovesToAnotherMember (issue 30 item 2, a broken slot):
// Pebble fails on one member's copy of a slot it owns (an erase's flush
// cannot write the MANIFEST: a fatal error, the copy stays locked until
// the process exits). Before,
// the member kept the slot and restarted it every few seconds against the
// lock, and its tenants were never answered. Now the member gives the
// slot up (its record lists it broken), the other member takes it and
// answers the request that met the failure, and the first member goes on
// serving its other slot.
func TestABrokenSlotMovesToAnotherMember(t *testing.T) {
	ns := testnats.Start(t)
	a, b, breakSlot := membersOnAFailingDisk(t, ns)
	v := a.settledOn(t, "a", "b")
	b.settledOn(t, "a", "b")
	s, tenant := ownedTenant(t, v, "a")
	_, other := ownedTenant(t, v, "b")
	bus := newBus(t, ns)
	victim := uuid.NewString()
	mustOK(t, bus.wait(bus.send(tenant, node(victim))))

	// An erase flushes the memtable (a MANIFEST write): Pebble fails.
	breakSlot(s)
	if res := bus.wait(bus.send(tenant, eraseNode(victim, "broken disk"))); res.Status != "ok" {
		t.Fatalf("the erase that broke a's copy of slot %d: %+v", s, res)
	}
	for i := range 3 {
		if res := bus.wait(bus.send(tenant, node(uuid.NewString()))); res.Status != "ok" {
			t.Fatalf("put %d after a's copy of slot %d broke: %+v", i, s, res)
		}
	}
	testnats.Eventually(t, 60*time.Second, fmt.Sprintf("slot %d owned by b, ready; a lists it broken", s), func() bool {
		var p struct {
			Members []struct {
				ID     string `json:"id"`
				Broken []int  `json:"broken"`
			} `json:"members"`
			Assignments []struct {
				Slot  int    `json:"slot"`
				Owner string `json:"owner"`
				Ready bool   `json:"owner_ready"`
			} `json:"assignments"`
		}
		resp, err := http.Get(b.base + "/v1/partitions")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		if json.NewDecoder(resp.Body).Decode(&p) != nil || len(p.Assignments) != 2 {
			return false
		}
		brokenOnA := false
		for _, m := range p.Members {
			brokenOnA = brokenOnA || (m.ID == "a" && slices.Equal(m.Broken, []int{s}))
		}
		return brokenOnA && p.Assignments[s].Owner == "b" && p.Assignments[s].Ready
	})
	// The member goes on: it takes the other slot (balance) and serves it.
	testnats.Eventually(t, 60*time.Second, "a owns and serves the other slot", func() bool {
		v, code := a.view()
		return code == 200 && len(v.Assignments) == 2 && v.Assignments[1-s].Owner == "a" && v.Assignments[1-s].Ready
	})
	for _, ten := range []string{tenant, other} {
		mustOK(t, bus.wait(bus.send(ten, node(uuid.NewString()))))
	}
	resp, err := http.Get(a.base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if body, want := string(raw), fmt.Sprintf(`telha_partition_role{role="broken",slot="%d"} 1`, s); !strings.Contains(body, want) {
		t.Fatalf("a's /metrics lacks %s", want)
	}
}

// TestABrokenStandbyCopyEndsOnlyItsRun: a member's standby copy hits a
// Pebble fatal error (its erase scrub cannot write the MANIFEST). The
// member gives that standby duty up and lists the slot broken; it goes on
// owning and serving its own slot, and the slot's owner answers on.
// Before, Pebble's fatal error in a standby panicked the whole process.
func TestABrokenStandbyCopyEndsOnlyItsRun(t *testing.T) {
	ns := testnats.Start(t)
	a, b, breakSlot := membersOnAFailingDisk(t, ns)
	v := a.settledOn(t, "a", "b")
	b.settledOn(t, "a", "b")
	s, tenant := ownedTenant(t, v, "b") // a stands by for it
	mine, own := ownedTenant(t, v, "a")
	bus := newBus(t, ns)
	victim := uuid.NewString()
	mustOK(t, bus.wait(bus.send(tenant, node(victim))))
	// b's view of the group: who lists which slots broken, and who
	// tails slot s's changelog as its standby.
	group := func() (broken map[string][]int, tailing map[string]bool) {
		var p struct {
			Members []struct {
				ID     string `json:"id"`
				Broken []int  `json:"broken"`
			} `json:"members"`
			Assignments []struct {
				Standbys []string          `json:"standbys"`
				Applied  map[string]uint64 `json:"standby_applied"`
			} `json:"assignments"`
		}
		resp, err := http.Get(b.base + "/v1/partitions")
		if err != nil {
			return nil, nil
		}
		defer resp.Body.Close()
		if json.NewDecoder(resp.Body).Decode(&p) != nil || len(p.Assignments) != 2 {
			return nil, nil
		}
		broken, tailing = map[string][]int{}, map[string]bool{}
		for _, m := range p.Members {
			broken[m.ID] = m.Broken
		}
		for _, id := range p.Assignments[s].Standbys {
			_, applied := p.Assignments[s].Applied[id]
			tailing[id] = applied
		}
		return broken, tailing
	}
	testnats.Eventually(t, 60*time.Second, fmt.Sprintf("a tails slot %d as its standby", s), func() bool {
		_, tailing := group()
		return tailing["a"]
	})

	// The erase's scrub flushes a's copy too (a MANIFEST write): Pebble
	// fails there, in a's standby.
	breakSlot(s)
	if res := bus.wait(bus.send(tenant, eraseNode(victim, "broken disk"))); res.Status != "ok" {
		t.Fatalf("the erase on b's slot %d: %+v", s, res)
	}
	testnats.Eventually(t, 60*time.Second, fmt.Sprintf("a lists slot %d broken and stands by for it no more", s), func() bool {
		broken, tailing := group()
		_, standing := tailing["a"]
		return broken != nil && slices.Equal(broken["a"], []int{s}) && !standing
	})
	// a goes on serving its own slot; b goes on serving its.
	for _, ten := range []string{own, tenant} {
		mustOK(t, bus.wait(bus.send(ten, node(uuid.NewString()))))
	}
	if v, code := a.view(); code != 200 || v.Assignments[mine].Owner != "a" || !v.Assignments[mine].Ready {
		t.Fatalf("a's own slot %d after its standby broke: %d %+v", mine, code, v.Assignments)
	}
}

// TestABrokenCopyInTheCatchUpEndsOnlyItsRun: a member starts on a
// changelog another member wrote and left, and Pebble fails on its copy
// of one slot while the catch-up replays that slot's changelog (a flush
// cannot write the MANIFEST: a fatal error, before the slot's store
// opens). The member gives that slot up and lists it broken; it serves
// the other. Before, the catch-up had no handler for Pebble's fatal
// errors: it panicked the whole process, every slot of the member with
// it.
func TestABrokenCopyInTheCatchUpEndsOnlyItsRun(t *testing.T) {
	ns := testnats.Start(t)
	b := startMemberOpts(t, ns.ClientURL(), "b", t.TempDir(), 0, Options{})
	v := b.settledOn(t, "b")
	s, tenant := ownedTenant(t, v, "b")
	other := ""
	for i := 0; other == ""; i++ {
		if name := fmt.Sprintf("acme%d", i); queue.Partition(name, 4)%2 != s {
			other = name
		}
	}
	bus := newBus(t, ns)
	// About 3 MB of write-sets in slot s's changelog, and no checkpoint.
	big := strings.Repeat("x", 30<<10)
	var ids []string
	for range 100 {
		n := node(uuid.NewString())
		n["props"] = map[string]any{"blob": big}
		ids = append(ids, bus.send(tenant, n))
	}
	for _, id := range ids {
		mustOK(t, bus.wait(id))
	}
	b.cancel()
	select {
	case err := <-b.done:
		b.done <- err // for the cleanup
	case <-time.After(60 * time.Second):
		t.Fatal("b did not stop")
	}

	dirA := t.TempDir()
	failing := filepath.Join(dirA, "slots", strconv.Itoa(s)) + string(filepath.Separator)
	inj := errorfs.InjectorFunc(func(op errorfs.Op) error {
		if op.Kind.ReadOrWrite() != errorfs.OpIsWrite || !strings.HasPrefix(op.Path, failing) ||
			!strings.Contains(filepath.Base(op.Path), "MANIFEST") {
			return nil
		}
		// Pebble's open writes a MANIFEST too: let it (an open that
		// fails returns an error, not the fatal error under test).
		stack := make([]byte, 64<<10)
		if strings.Contains(string(stack[:runtime.Stack(stack, false)]), "pebble/v2.Open(") {
			return nil
		}
		return errorfs.ErrInjected
	})
	// The replay of slot s (about 3 MB of write-sets) fills Pebble's
	// first memtables (they start at 256 KiB and grow): it flushes. With
	// --standbys 0, and b gone before a starts, a never tails slot s: it
	// catches s up as its owner.
	a := startMemberOpts(t, ns.ClientURL(), "a", dirA, 0, Options{FS: errorfs.Wrap(vfs.Default, inj)})
	testnats.Eventually(t, 60*time.Second, fmt.Sprintf("a lists slot %d broken", s), func() bool {
		var p struct {
			Members []struct {
				ID     string `json:"id"`
				Broken []int  `json:"broken"`
			} `json:"members"`
		}
		if !getJSON(a.base+"/v1/partitions", &p) {
			return false
		}
		for _, m := range p.Members {
			if m.ID == "a" && slices.Equal(m.Broken, []int{s}) {
				return true
			}
		}
		return false
	})
	// a serves the other slot. Its readiness reaches the registry's view
	// a little after its first answer (the member publishes it in its
	// round), so the view is polled, not read once.
	mustOK(t, bus.wait(bus.send(other, node(uuid.NewString()))))
	testnats.Eventually(t, 30*time.Second, fmt.Sprintf("a's slot %d ready after its catch-up of slot %d broke", 1-s, s), func() bool {
		v, code := a.view()
		return code == 200 && v.Assignments[1-s].Owner == "a" && v.Assignments[1-s].Ready
	})
}

// getJSON decodes the 200 answer of a GET of url into v, and says whether
// it could.
func getJSON(url string, v any) bool {
	resp, err := http.Get(url)
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	return resp.StatusCode == http.StatusOK && json.NewDecoder(resp.Body).Decode(v) == nil
}
