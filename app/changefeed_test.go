package app

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/telha/telha-cascade/internal/testnats"
	"github.com/telha/telha-cascade/queue/client"
)

// readChanges reads tenant's feed from its start until done says so (or
// the deadline), acking each change.
func readChanges(t *testing.T, b *bus, tenant string, done func([]client.Change) bool) []client.Change {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := client.New(b.nc, client.Config{})
	if err != nil {
		t.Fatal(err)
	}
	r, err := c.OpenChanges(ctx, client.ChangesConfig{Tenant: tenant})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	var out []client.Change
	for !done(out) {
		m, err := r.Next(ctx)
		if err != nil {
			t.Fatalf("after %d changes: %v", len(out), err)
		}
		out = append(out, m.Change)
		if err := m.Ack(); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

// hubEdges gives hub n edges, each from a node of its own, and waits for
// every answer.
func hubEdges(t *testing.T, b *bus, tenant, hub string, n int) {
	t.Helper()
	var reqs []string
	for i := 0; i < n; i++ {
		x := uuid.NewString()
		reqs = append(reqs, b.send(tenant, node(x)), b.send(tenant, edge(uuid.NewString(), x, hub)))
	}
	for _, id := range reqs {
		mustOK(t, b.wait(id))
	}
}

// A journaled cascade on the feed: every edge's put, then every edge's
// tombstone with the hub as cause, the hub's tombstone last, each exactly
// once, in tx order; props ride on puts; an erase comes after the
// changes it followed, carries no props, and deletes the erased puts from
// the feed before it is published.
func TestChangeFeedOfAJournaledCascade(t *testing.T) {
	ns := testnats.Start(t)
	startWorker(t, ns, t.TempDir(), Options{}, "--max-batch-ops", "64", "--journal-chunk-ops", "64")
	b := newBus(t, ns)
	const tenant, n = "feed", 300
	hub := uuid.NewString()
	mustOK(t, b.wait(b.send(tenant, map[string]any{"op": "put_node", "id": hub, "props": map[string]any{"name": "hub"}})))
	hubEdges(t, b, tenant, hub, n)
	tomb := b.send(tenant, tombNode(hub))
	if r := mustOK(t, b.wait(tomb)); !r.Journaled || r.EdgesTombstoned != n {
		t.Fatalf("tombstone of the hub: %+v, want journaled with %d edges", r, n)
	}
	other := uuid.NewString()
	mustOK(t, b.wait(b.send(tenant, map[string]any{"op": "put_node", "id": other, "props": map[string]any{"email": "x@example.com"}})))
	erase := b.send(tenant, map[string]any{"op": "erase_node", "id": other, "provenance": map[string]any{"reason": "gdpr"}})
	mustOK(t, b.wait(erase))

	got := readChanges(t, b, tenant, func(cs []client.Change) bool {
		return len(cs) > 0 && cs[len(cs)-1].Op == client.ChangeErase
	})
	seen := map[string]bool{}
	var last string
	tombs, hubTomb := 0, -1
	for i, c := range got {
		key := fmt.Sprintf("%s/%s/%s/%s", c.Kind, c.Op, c.ID, c.TxTime)
		if seen[key] {
			t.Fatalf("change %d %s twice", i, key)
		}
		seen[key] = true
		if c.Tenant != tenant || c.RequestID == "" {
			t.Fatalf("change %d: %+v", i, c)
		}
		if c.Op != client.ChangeErase {
			if c.TxTime < last {
				t.Fatalf("change %d at %s after one at %s", i, c.TxTime, last)
			}
			last = c.TxTime
		}
		switch {
		case c.Kind == client.KindEdge && c.Op == client.ChangeTombstone:
			tombs++
			if c.Cause != hub || c.RequestID != tomb || c.Src == "" || c.Dst != hub {
				t.Fatalf("edge tombstone %d: %+v, want cause %s and request %s", i, c, hub, tomb)
			}
			if hubTomb >= 0 {
				t.Fatalf("edge tombstone %d after the hub's", i)
			}
		case c.Kind == client.KindNode && c.Op == client.ChangeTombstone && c.ID == hub:
			hubTomb = i
		case c.Op == client.ChangePut && c.ID == hub:
			if string(c.Props) != `{"name":"hub"}` {
				t.Fatalf("the hub's put carries props %s", c.Props)
			}
		}
	}
	if tombs != n || hubTomb < 0 {
		t.Fatalf("%d edge tombstones (want %d), hub tombstone at %d", tombs, n, hubTomb)
	}
	// Puts, tombstones, the other's tombstone and erase: the other's put,
	// props and all, left the feed before the erase was on it.
	// Unless the feed's round published the other's put only after the
	// erase had committed: then it is on the feed without its props,
	// marked erased (CONTRACT, "Change feed", Erasure), and stays.
	late := 0
	for _, c := range got {
		if c.ID == other && c.Op == client.ChangePut {
			if !c.Erased || (len(c.Props) != 0 && string(c.Props) != "{}") {
				t.Fatalf("the erased node's put is still on the feed: %+v", c)
			}
			late++
			t.Logf("the other's put was published after its erase: %+v", c)
		}
	}
	if want := 1 + 2*n + n + 1 + 1 + 1 + late; len(got) != want {
		kinds := map[string]int{}
		for _, c := range got {
			kinds[fmt.Sprintf("%s/%s", c.Kind, c.Op)]++
		}
		t.Fatalf("%d changes, want %d: %v", len(got), want, kinds)
	}
	e := got[len(got)-1]
	if e.ID != other || e.RequestID != erase || e.Props != nil || e.VersionsErased == nil {
		t.Fatalf("erase change: %+v", e)
	}
}

// While a tenant's journal runs, that tenant's feed waits at the tx below
// it (a write committed after the journal's head is not published before
// the cascade's tombstones), and another tenant's feed goes on.
func TestChangeFeedWaitsForAJournalOfItsTenantOnly(t *testing.T) {
	ns := testnats.Start(t)
	hold, opts := newChunkHold()
	startWorker(t, ns, t.TempDir(), opts, "--max-batch-ops", "64", "--journal-chunk-ops", "64")
	b := newBus(t, ns)
	const tenant, other, n = "held", "free", 40
	hub := uuid.NewString()
	mustOK(t, b.wait(b.send(tenant, node(hub))))
	hubEdges(t, b, tenant, hub, n)
	hold.arm()
	tomb := b.send(tenant, tombNode(hub))
	<-hold.held
	late := uuid.NewString()
	mustOK(t, b.wait(b.send(tenant, node(late)))) // committed after the journal's head
	mustOK(t, b.wait(b.send(other, node(uuid.NewString()))))

	// The other tenant's put is published while the journal is held.
	readChanges(t, b, other, func(cs []client.Change) bool { return len(cs) == 1 })
	// The held tenant's feed holds everything before the journal's tx, and
	// nothing after it.
	before := readChanges(t, b, tenant, func(cs []client.Change) bool { return len(cs) == 1+2*n })
	c, err := client.New(b.nc, client.Config{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r, err := c.OpenChanges(ctx, client.ChangesConfig{Tenant: tenant, Durable: "held-reader"})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < len(before); i++ { // the durable reader takes what is there
		m, err := r.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		_ = m.Ack()
	}
	if p, err := r.Pending(ctx); err != nil || p != 0 {
		t.Fatalf("the feed of %s holds %d more changes while its journal is held (err %v)", tenant, p, err)
	}
	close(hold.release)
	mustOK(t, b.wait(tomb))
	var after []client.Change
	for len(after) < n+2 {
		m, err := r.Next(ctx)
		if err != nil {
			t.Fatalf("after %d changes: %v", len(after), err)
		}
		after = append(after, m.Change)
		_ = m.Ack()
	}
	r.Close()
	for i, c := range after[:n] {
		if c.Kind != client.KindEdge || c.Op != client.ChangeTombstone || c.Cause != hub {
			t.Fatalf("change %d after the release: %+v, want an edge tombstone caused by the hub", i, c)
		}
	}
	if c := after[n]; c.ID != hub || c.Op != client.ChangeTombstone {
		t.Fatalf("change %d: %+v, want the hub's tombstone", n, c)
	}
	if c := after[n+1]; c.ID != late || c.Op != client.ChangePut {
		t.Fatalf("change %d: %+v, want the put committed while the journal ran", n+1, c)
	}
}

// A consumer that fell behind resyncs: it lists the tenant's live nodes as
// of a tx (the read API's listing), then follows the feed from the next
// microsecond; what it holds then is the store's live set, with no change
// missed or applied twice.
func TestChangeFeedResyncFromTheListing(t *testing.T) {
	ns := testnats.Start(t)
	w := startWorker(t, ns, t.TempDir(), Options{})
	b := newBus(t, ns)
	const tenant = "resync"
	var first []string
	for i := 0; i < 30; i++ {
		first = append(first, b.send(tenant, node(uuid.NewString())))
	}
	for _, id := range first {
		mustOK(t, b.wait(id))
	}
	type page struct {
		Nodes []struct {
			ID string `json:"id"`
		} `json:"nodes"`
		Next   *string `json:"next"`
		AsOfTx string  `json:"as_of_tx"`
	}
	list := func(q string) (map[string]bool, string) {
		live, next, at := map[string]bool{}, "", ""
		for {
			var pg page
			p := "/v1/tenants/" + tenant + "/nodes?limit=7" + q
			if next != "" {
				p += "&cursor=" + next
			}
			if code := w.get(p, &pg); code != 200 {
				t.Fatalf("GET %s: %d", p, code)
			}
			at = pg.AsOfTx
			for _, n := range pg.Nodes {
				live[n.ID] = true
			}
			if pg.Next == nil {
				return live, at
			}
			next = *pg.Next
		}
	}
	held, at := list("")
	// Meanwhile: more nodes, and some of the listed ones die.
	var later []string
	for i := 0; i < 20; i++ {
		later = append(later, b.send(tenant, node(uuid.NewString())))
	}
	i := 0
	for id := range held {
		if i++; i > 10 {
			break
		}
		later = append(later, b.send(tenant, tombNode(id)))
	}
	for _, id := range later {
		mustOK(t, b.wait(id))
	}
	tx, err := time.Parse(time.RFC3339Nano, at)
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.New(b.nc, client.Config{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r, err := c.OpenChanges(ctx, client.ChangesConfig{Tenant: tenant, From: tx.Add(time.Microsecond)})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	for applied := 0; applied < len(later); applied++ {
		m, err := r.Next(ctx)
		if err != nil {
			t.Fatalf("after %d changes: %v", applied, err)
		}
		switch m.Op {
		case client.ChangePut:
			if held[m.ID] {
				t.Fatalf("the feed after %s repeats the put of %s, which the listing held", at, m.ID)
			}
			held[m.ID] = true
		case client.ChangeTombstone:
			if !held[m.ID] {
				t.Fatalf("the feed tombstones %s, which the listing did not hold", m.ID)
			}
			delete(held, m.ID)
		}
		_ = m.Ack()
	}
	now, _ := list("")
	if len(now) != len(held) {
		t.Fatalf("the listing now holds %d nodes; the resynced consumer %d", len(now), len(held))
	}
	for id := range now {
		if !held[id] {
			t.Fatalf("node %s is live but the resynced consumer does not hold it", id)
		}
	}
}

// An erase is answered ahead of its tenant's feed backlog: the feed is
// paced to 50 changes/s and 3,000 puts of the tenant wait behind it
// (60 s). A round publishes up to 1,024 before it paces, so the backlog
// lasts until about 40 s after the first put: the puts take 9 s to be
// answered here under -race, and at 200/s (10 s) a loaded CI answered
// them after the whole backlog was out. The erase's result comes while the backlog is still being
// published (its own message is not on the feed yet), with the erased
// node's put already gone from the feed; the erase is then published in
// order, after every change committed before it, and every put of the
// backlog is there. Before, the result waited for the feed to reach the
// erase.
func TestEraseIsAnsweredAheadOfItsFeedBacklog(t *testing.T) {
	ns := testnats.Start(t)
	startWorker(t, ns, t.TempDir(), Options{}, "--change-feed-max-rate", "50")
	b := newBus(t, ns)
	const tenant, n = "slowfeed", 3000
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	stream, err := b.js.Stream(ctx, "TELHA_CHG")
	if err != nil {
		t.Fatal(err)
	}
	count := func(subject string) uint64 {
		t.Helper()
		info, err := stream.Info(ctx, jetstream.WithSubjectFilter(subject))
		if err != nil {
			t.Fatal(err)
		}
		return info.State.Subjects[subject]
	}
	x := uuid.NewString()
	mustOK(t, b.wait(b.send(tenant, map[string]any{"op": "put_node", "id": x, "props": map[string]any{"email": "x@example.com"}})))
	testnats.Eventually(t, 30*time.Second, "the node's put on the feed", func() bool { return count("telha.chg.slowfeed.node.put") == 1 })
	var reqs []string
	for i := 0; i < n; i++ {
		reqs = append(reqs, b.send(tenant, node(uuid.NewString())))
	}
	for _, id := range reqs {
		mustOK(t, b.wait(id))
	}
	erase := b.send(tenant, map[string]any{"op": "erase_node", "id": x, "provenance": map[string]any{"reason": "gdpr"}})
	mustOK(t, b.wait(erase))
	puts, erases := count("telha.chg.slowfeed.node.put"), count("telha.chg.slowfeed.node.erase")
	if erases != 0 || puts >= n {
		t.Fatalf("when the erase was answered the feed held %d puts and %d erases: no backlog left to answer ahead of", puts, erases)
	}
	got := readChanges(t, b, tenant, func(cs []client.Change) bool {
		return len(cs) > 0 && cs[len(cs)-1].Op == client.ChangeErase
	})
	if len(got) != n+2 {
		t.Fatalf("%d changes on the feed, want the %d puts, the node's tombstone (the erase's) and the erase", len(got), n)
	}
	for _, c := range got {
		if c.ID == x && c.Op == client.ChangePut {
			t.Fatalf("the erased node's put is on the feed: %+v", c)
		}
	}
	t.Logf("the erase was answered with %d of the %d puts behind it on the feed", puts, n)
}

// feedBodies returns the body of every message TELHA_CHG keeps for
// tenant, and how many are puts published without props.
func feedBodies(t *testing.T, b *bus, tenant string) (bodies []string, propless int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	stream, err := b.js.Stream(ctx, "TELHA_CHG")
	if err != nil {
		t.Fatal(err)
	}
	cons, err := stream.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{FilterSubjects: []string{"telha.chg." + tenant + ".>"}})
	if err != nil {
		t.Fatal(err)
	}
	for {
		m, err := cons.Next(jetstream.FetchMaxWait(time.Second))
		if errors.Is(err, jetstream.ErrNoMessages) || errors.Is(err, nats.ErrTimeout) {
			return bodies, propless
		}
		if err != nil {
			t.Fatal(err)
		}
		bodies = append(bodies, string(m.Data()))
		if m.Headers().Get(client.ChangeNoPropsHeader) == "none" {
			propless++
		}
		if md, err := m.Metadata(); err == nil && md.NumPending == 0 {
			return bodies, propless
		}
	}
}

// TestAnEraseScrubsTheFeedWhateverItsFlags: puts published with props
// while the feed was on are deleted from TELHA_CHG by an erase made later
// with --change-feed-props=false, or with --change-feed=false, before the
// erase is answered. A black-box probe found both left on the feed (the
// erase answered ok in 40 ms), readable by every consumer until a start
// with the feed and props on again, or for --change-feed-max-age.
func TestAnEraseScrubsTheFeedWhateverItsFlags(t *testing.T) {
	ns := testnats.Start(t)
	dir := t.TempDir()
	const tenant = "flags"
	x, y, w, e := uuid.NewString(), uuid.NewString(), uuid.NewString(), uuid.NewString()
	put := func(b *bus, id, secret string) {
		mustOK(t, b.wait(b.send(tenant, map[string]any{"op": "put_node", "id": id, "props": map[string]any{"secret": secret}})))
	}
	erase := func(b *bus, id string) {
		mustOK(t, b.wait(b.send(tenant, map[string]any{"op": "erase_node", "id": id, "request_id": "erase-" + id,
			"provenance": map[string]any{"reason": "gdpr"}})))
	}
	leaks := func(b *bus, secrets ...string) []string {
		bodies, _ := feedBodies(t, b, tenant)
		var found []string
		for _, body := range bodies {
			for _, s := range secrets {
				if strings.Contains(body, s) {
					found = append(found, s)
				}
			}
		}
		return found
	}

	w1 := startWorker(t, ns, dir, Options{})
	b := newBus(t, ns)
	put(b, x, "XSECRET")
	put(b, y, "YSECRET")
	put(b, w, "WSECRET")
	mustOK(t, b.wait(b.send(tenant, map[string]any{"op": "put_edge", "id": e, "src": x, "dst": y, "label": "knows",
		"props": map[string]any{"secret": "EDGESECRET"}})))
	readChanges(t, b, tenant, func(cs []client.Change) bool { return len(cs) == 4 })
	if err := w1.stop(); err != nil {
		t.Fatal(err)
	}

	// Props off: x's put and its edge's were published with props.
	w2 := startWorker(t, ns, dir, Options{}, "--change-feed-props=false")
	z := uuid.NewString()
	put(b, z, "ZSECRET") // published without its props, and kept by the erase below
	readChanges(t, b, tenant, func(cs []client.Change) bool { return len(cs) == 5 })
	erase(b, x)
	if got := leaks(b, "XSECRET", "EDGESECRET"); len(got) > 0 {
		t.Fatalf("--change-feed-props=false: after x's erase was answered, TELHA_CHG still holds %v", got)
	}
	if _, propless := feedBodies(t, b, tenant); propless != 1 {
		t.Fatalf("%d puts published without props on the feed, want z's (kept)", propless)
	}
	if err := w2.stop(); err != nil {
		t.Fatal(err)
	}

	// The feed off: w's put was published while it was on.
	startWorker(t, ns, dir, Options{}, "--change-feed=false")
	erase(b, w)
	if got := leaks(b, "WSECRET"); len(got) > 0 {
		t.Fatalf("--change-feed=false: after w's erase was answered, TELHA_CHG still holds %v", got)
	}
	if got := leaks(b, "YSECRET"); len(got) != 1 {
		t.Fatalf("y's put (never erased): found %v, want it kept", got)
	}
}

// A durable reader closed and opened again goes on at once: the change
// the server had delivered after the last ack, and the reader had not
// returned, is given back at Close. Before, it stayed in flight until the
// consumer's ack wait (30 s) ran out, and the reader opened again waited
// that long for it (a black-box probe: 3 of 8 reopens).
func TestADurableReaderOpenedAgainGoesOnAtOnce(t *testing.T) {
	ns := testnats.Start(t)
	startWorker(t, ns, t.TempDir(), Options{})
	b := newBus(t, ns)
	const tenant = "reopen"
	var ids []string
	for range 8 {
		ids = append(ids, b.send(tenant, node(uuid.NewString())))
	}
	for _, id := range ids {
		mustOK(t, b.wait(id))
	}
	readChanges(t, b, tenant, func(cs []client.Change) bool { return len(cs) == len(ids) })
	c, err := client.New(b.nc, client.Config{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cfg := client.ChangesConfig{Tenant: tenant, Durable: "reopened"}
	r, err := c.OpenChanges(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	var last uint64
	for range 3 {
		m, err := r.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		last = m.Seq
		if err := m.Ack(); err != nil {
			t.Fatal(err)
		}
	}
	// The fourth change is delivered to the reader, not returned yet.
	js, err := jetstream.New(b.nc)
	if err != nil {
		t.Fatal(err)
	}
	cons, err := js.Consumer(ctx, "TELHA_CHG", "reopened")
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; {
		info, err := cons.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if info.NumAckPending == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the fourth change was not delivered to the reader in 10 s (%d in flight)", info.NumAckPending)
		}
		time.Sleep(20 * time.Millisecond) // polling the consumer, with a deadline
	}
	r.Close()
	r, err = c.OpenChanges(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	// Well inside the consumer's 30 s ack wait.
	nctx, ncancel := context.WithTimeout(ctx, 10*time.Second)
	defer ncancel()
	m, err := r.Next(nctx)
	if err != nil {
		t.Fatalf("the reader opened again: %v (the change in flight at Close was not given back)", err)
	}
	if m.Seq <= last {
		t.Fatalf("the reader opened again read sequence %d, at or before its last ack %d", m.Seq, last)
	}
}
