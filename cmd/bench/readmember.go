package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/telha/telha-cascade/app"
	"github.com/telha/telha-cascade/queue"
	"github.com/telha/telha-cascade/queue/client"
	"github.com/telha/telha-cascade/slot"
)

// The read_member phase (issue 30 item 8, "Cost"): a read through any
// member of a dynamic group against the same read on a static replica, and
// the NATS connections a member holds.
//
//	A  a static replica (--partition-owner 0/1, --changelog jetstream) on
//	   a NATS server of its own (R1, fsync always)
//	B  --read-members (3) members of --partition-owner dynamic/<slots>
//	   (--member-slots: 6, quick 3), --standbys 1, --changelog jetstream,
//	   --stream-replicas 3, on a 3-server cluster in this process; member i
//	   is given server i's URL only, so the connections on server i named
//	   "telha-cascade" are member i's
//
// Both hold the same data set, loaded through the queue (put_node, then
// put_edge, every result awaited): tenants spread evenly over the
// partitions (so every slot owns some), nodes per tenant, two out-edges per
// node (four edges on each node's list). Then --read-concurrency
// goroutines read for --read-duration per target, each read a uniformly
// random node: GET /v1/tenants/<t>/nodes/<id> and GET .../nodes/<id>/edges,
// alternately, on keep-alive connections. The four targets are A's HTTP
// address, one member's ("any": about (slots-owned)/slots of its reads are
// forwarded to the owner's member over HTTP), per read the member that
// owns the tenant's slot ("owner": every read local), and client.Reader
// given the "any" member as its Base ("reader": it routes each read to
// its owner by /v1/partitions, as an upstream service would). The
// duration is cut into slices run in turn (A, any, owner, reader; any,
// owner, reader, A; ...), so a disturbance of the machine falls on all
// four alike. Reads never touch NATS: A's R1
// server and B's cluster differ only in what the writes (the load) cost.
//
// Reported: reads/s, p50, p90, p99, max of each target; of "any", the
// same split into its local and forwarded reads; the ratios any/A,
// owner/A and reader/A (reads/s and p99); and the NATS client connections of every
// member (and of A), after the load and again after the reads.

// ReadMemberReport is the read_member phase.
type ReadMemberReport struct {
	Members          int     `json:"members"`
	Slots            int     `json:"slots"`
	Partitions       int     `json:"partitions"`
	Standbys         int     `json:"standbys"`
	Tenants          int     `json:"tenants"`
	Nodes            int     `json:"nodes"`
	Edges            int     `json:"edges"`
	Concurrency      int     `json:"concurrency"`
	SecondsPerTarget float64 `json:"seconds_per_target"`
	Slices           int     `json:"slices"`
	Mix              string  `json:"mix"`
	NATS             string  `json:"nats"`
	AnyMember        string  `json:"any_member"`
	AnyOwns          []int   `json:"any_member_owns"`
	// StartSeconds: the members' start until every slot is owned, ready,
	// balanced and has its standby tailing; Load*Seconds: the data set
	// through the queue, every result awaited.
	StartSeconds       float64 `json:"members_start_seconds"`
	LoadStaticSeconds  float64 `json:"load_static_seconds"`
	LoadMembersSeconds float64 `json:"load_members_seconds"`

	Static *readStats `json:"static"`
	Any    *readStats `json:"any"`
	Owner  *readStats `json:"owner"`
	// Reader: reads through client.Reader given the "any" member as its
	// Base (it routes each read to its owner by /v1/partitions).
	Reader *readStats `json:"reader"`
	// ReaderAtOwner, ReaderAtBase, ReaderFellBack: where the reader's
	// reads went (client.ReaderStats, warm-up included).
	ReaderAtOwner  uint64 `json:"reader_at_owner"`
	ReaderAtBase   uint64 `json:"reader_at_base"`
	ReaderFellBack uint64 `json:"reader_fell_back"`

	AnyVsStatic       float64 `json:"any_vs_static"`
	AnyP99VsStatic    float64 `json:"any_p99_vs_static"`
	OwnerVsStatic     float64 `json:"owner_vs_static"`
	OwnerP99VsStatic  float64 `json:"owner_p99_vs_static"`
	ReaderVsStatic    float64 `json:"reader_vs_static"`
	ReaderP99VsStatic float64 `json:"reader_p99_vs_static"`
	// SliceAnyVsStatic and SliceOwnerVsStatic: the reads/s ratios of each
	// slice (one slice of every target, run back to back), and their
	// medians: less moved by a burst of other work on the machine than the
	// ratios of the totals.
	SliceAnyVsStatic          []float64 `json:"slice_any_vs_static"`
	SliceOwnerVsStatic        []float64 `json:"slice_owner_vs_static"`
	SliceReaderVsStatic       []float64 `json:"slice_reader_vs_static"`
	MedianSliceAnyVsStatic    float64   `json:"median_slice_any_vs_static"`
	MedianSliceOwnerVsStatic  float64   `json:"median_slice_owner_vs_static"`
	MedianSliceReaderVsStatic float64   `json:"median_slice_reader_vs_static"`

	Connections       []memberConns `json:"connections"`
	MaxConnsPerMember int           `json:"max_nats_connections_per_member"`
	StaticConns       int           `json:"static_nats_connections"`
	WorkerLog         workerLog     `json:"worker_log"`
}

// readStats is one target's reads.
type readStats struct {
	Target  string  `json:"target"`
	Reads   int     `json:"reads"`
	Errors  int     `json:"errors"`
	Seconds float64 `json:"seconds"`
	PerSec  float64 `json:"per_sec"`
	P50ms   float64 `json:"p50_ms"`
	P90ms   float64 `json:"p90_ms"`
	P99ms   float64 `json:"p99_ms"`
	MaxMs   float64 `json:"max_ms"`
	// Of "any": its reads its member answered itself, and those it
	// forwarded to the owner's member.
	Local     *latStats `json:"local,omitempty"`
	Forwarded *latStats `json:"forwarded,omitempty"`
	// NodeGet and EdgeList split the reads by kind.
	NodeGet  *latStats `json:"node_get"`
	EdgeList *latStats `json:"edge_list"`
	CPU      cpuUse    `json:"cpu"`
	// CPUMicrosPerRead: this process's CPU (readers, servers, members,
	// NATS) over the reads, in microseconds a read.
	CPUMicrosPerRead float64 `json:"cpu_us_per_read"`
	// FirstError is the first failed read's status and body.
	FirstError string `json:"first_error,omitempty"`
}

type latStats struct {
	Reads int     `json:"reads"`
	Share float64 `json:"share"`
	P50ms float64 `json:"p50_ms"`
	P99ms float64 `json:"p99_ms"`
}

// memberConns is one member's NATS client connections, seen by the server
// it was given.
type memberConns struct {
	Member string `json:"member"`
	Owns   []int  `json:"owns"`
	Stands []int  `json:"standby_of"`
	// AfterLoad and AfterReads: its connections then.
	AfterLoad  int `json:"after_load"`
	AfterReads int `json:"after_reads"`
	// Subscriptions on its connections after the reads.
	Subscriptions uint32 `json:"subscriptions"`
}

// ---- the data set ----

type rmTenant struct {
	name  string
	slot  int
	nodes []uuid.UUID
}

type rmData struct {
	tenants []rmTenant
	edges   int
}

// makeReadData picks tenant names spread evenly over the partitions (so
// every slot owns tenants) and their nodes.
func makeReadData(partitions, slots, perPartition, nodesPerTenant int) *rmData {
	d := &rmData{}
	count := make([]int, partitions)
	for k := 0; len(d.tenants) < partitions*perPartition; k++ {
		name := fmt.Sprintf("rm%d", k)
		p := queue.Partition(name, partitions)
		if count[p] >= perPartition {
			continue
		}
		count[p]++
		t := rmTenant{name: name, slot: p % slots}
		for range nodesPerTenant {
			t.nodes = append(t.nodes, uuid.New())
		}
		d.tenants = append(d.tenants, t)
		d.edges += 2 * nodesPerTenant
	}
	return d
}

func (d *rmData) nodes() int {
	n := 0
	for _, t := range d.tenants {
		n += len(t.nodes)
	}
	return n
}

// edgeDst is the destination of node i's k-th out-edge (k 0 or 1): to node i+1 and i+3.
func edgeDst(i, k, n int) int { return (i + 1 + 2*k) % n }

// loadReadData puts d through the queue at url: every node, every result
// awaited, then every edge. It returns the time it took.
func loadReadData(ctx context.Context, url string, d *rmData, tag string) (time.Duration, error) {
	nc, err := nats.Connect(url, nats.Name("bench-loader"))
	if err != nil {
		return 0, err
	}
	defer nc.Close()
	cli, err := client.New(nc, client.Config{}, jetstream.WithPublishAsyncMaxPending(2048))
	if err != nil {
		return 0, err
	}
	var (
		mu       sync.Mutex
		answered = map[string]bool{}
		bad      []string
		progress = make(chan struct{}, 1)
	)
	sub, err := nc.Subscribe("telha.res.>", func(m *nats.Msg) {
		var r client.Result
		if json.Unmarshal(m.Data, &r) != nil || !strings.HasPrefix(r.RequestID, tag) {
			return
		}
		mu.Lock()
		if !answered[r.RequestID] {
			answered[r.RequestID] = true
			if r.Status != client.StatusOK && len(bad) < 5 {
				bad = append(bad, strings.TrimSpace(string(m.Data)))
			}
		}
		mu.Unlock()
		select {
		case progress <- struct{}{}:
		default:
		}
	})
	if err != nil {
		return 0, err
	}
	defer sub.Unsubscribe()
	if err := nc.Flush(); err != nil {
		return 0, err
	}
	wait := func(want int) error {
		last, lastN := time.Now(), -1
		for {
			mu.Lock()
			n, b := len(answered), append([]string(nil), bad...)
			mu.Unlock()
			if len(b) > 0 {
				return fmt.Errorf("requests not ok: %s", strings.Join(b, " | "))
			}
			if n >= want {
				return nil
			}
			if n != lastN {
				last, lastN = time.Now(), n
			} else if time.Since(last) > 90*time.Second {
				return fmt.Errorf("%d of %d results, none in 90s", n, want)
			}
			select {
			case <-progress:
			case <-time.After(100 * time.Millisecond):
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	}
	publish := func(tenant, rid string, body []byte) error {
		for {
			_, err := cli.PublishAsync(tenant, rid, body)
			if !errors.Is(err, jetstream.ErrTooManyStalledMsgs) {
				return err
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	t0 := time.Now()
	want := 0
	for _, t := range d.tenants {
		for i, id := range t.nodes {
			rid := fmt.Sprintf("%s-n-%s-%d", tag, t.name, i)
			body := fmt.Sprintf(`{"request_id":%q,"op":"put_node","tenant":%q,"id":%q,"props":{"name":"node %d","tenant":%q}}`, rid, t.name, id, i, t.name)
			if err := publish(t.name, rid, []byte(body)); err != nil {
				return 0, err
			}
			want++
		}
	}
	if err := wait(want); err != nil {
		return 0, fmt.Errorf("nodes: %w", err)
	}
	for _, t := range d.tenants {
		n := len(t.nodes)
		for i, src := range t.nodes {
			for k := range 2 {
				rid := fmt.Sprintf("%s-e-%s-%d-%d", tag, t.name, i, k)
				body := fmt.Sprintf(`{"request_id":%q,"op":"put_edge","tenant":%q,"id":%q,"src":%q,"dst":%q,"label":"knows","props":{"k":%d}}`,
					rid, t.name, uuid.New(), src, t.nodes[edgeDst(i, k, n)], k)
				if err := publish(t.name, rid, []byte(body)); err != nil {
					return 0, err
				}
				want++
			}
		}
	}
	if err := wait(want); err != nil {
		return 0, fmt.Errorf("edges: %w", err)
	}
	return time.Since(t0), nil
}

// ---- the group ----

type partitionsView struct {
	Members []struct {
		ID  string `json:"id"`
		URL string `json:"url"`
	} `json:"members"`
	Assignments []struct {
		Slot     int               `json:"slot"`
		Owner    string            `json:"owner"`
		Ready    bool              `json:"owner_ready"`
		Standbys []string          `json:"standbys"`
		Standby  map[string]uint64 `json:"standby_applied"`
		Lag      map[string]uint64 `json:"standby_lag"`
		Applied  uint64            `json:"owner_applied"`
	} `json:"assignments"`
}

func getJSON(hc *http.Client, url string, v any) (int, error) {
	resp, err := hc.Get(url)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, resp.Body)
		return resp.StatusCode, nil
	}
	return resp.StatusCode, json.NewDecoder(resp.Body).Decode(v)
}

// settled: every slot owned by a ready owner, the owners balanced over the
// members, each slot with its standbys tailing and caught up (lag 0), and
// every member ready.
func settled(hc *http.Client, bases []string, ids []string, slots, standbys int) (partitionsView, string) {
	var v partitionsView
	for _, b := range bases {
		if code, err := getJSON(hc, b+"/readyz", &struct{}{}); code != http.StatusOK {
			return v, fmt.Sprintf("%s /readyz %d %v", b, code, err)
		}
	}
	if code, err := getJSON(hc, bases[0]+"/v1/partitions", &v); code != http.StatusOK || err != nil {
		return v, fmt.Sprintf("/v1/partitions %d %v", code, err)
	}
	if len(v.Members) != len(ids) || len(v.Assignments) != slots {
		return v, fmt.Sprintf("%d members, %d slots", len(v.Members), len(v.Assignments))
	}
	owned := map[string]int{}
	for _, a := range v.Assignments {
		if a.Owner == "" || !a.Ready {
			return v, fmt.Sprintf("slot %d not served", a.Slot)
		}
		owned[a.Owner]++
		if len(a.Standbys) != standbys || len(a.Standby) != standbys {
			return v, fmt.Sprintf("slot %d: standbys %v, tailing %v", a.Slot, a.Standbys, a.Standby)
		}
		for sb, lag := range a.Lag {
			if lag != 0 {
				return v, fmt.Sprintf("slot %d: standby %s %d behind", a.Slot, sb, lag)
			}
		}
	}
	lo, hi := slots, 0
	for _, id := range ids {
		lo, hi = min(lo, owned[id]), max(hi, owned[id])
	}
	if hi-lo > 1 {
		return v, fmt.Sprintf("not balanced: %v", owned)
	}
	return v, ""
}

func waitSettled(ctx context.Context, hc *http.Client, bases, ids []string, slots, standbys int, limit time.Duration) (partitionsView, error) {
	deadline := time.Now().Add(limit)
	for {
		v, why := settled(hc, bases, ids, slots, standbys)
		if why == "" {
			return v, nil
		}
		if time.Now().After(deadline) {
			return v, fmt.Errorf("the group did not settle within %s: %s", limit, why)
		}
		select {
		case <-ctx.Done():
			return v, ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
}

func freeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

// conns counts the worker's client connections on s (named
// "telha-cascade", and "telha-cascade change-feed": queue.FeedConn), and
// their subscriptions.
func conns(s *server.Server) (int, uint32, error) {
	cz, err := s.Connz(&server.ConnzOptions{Limit: 4096, Subscriptions: false})
	if err != nil {
		return 0, 0, err
	}
	n, subs := 0, uint32(0)
	for _, c := range cz.Conns {
		if c.Name == "telha-cascade" || c.Name == "telha-cascade change-feed" {
			n++
			subs += c.NumSubs
		}
	}
	return n, subs, nil
}

// ---- the reads ----

type rmTarget struct {
	name string
	// base returns the URL base a read of tenant t goes to, and whether
	// that member answers it itself (always true but for "any").
	base func(t *rmTenant) (string, bool)
	// get, when set, makes the read instead (client.Reader).
	get func(ctx context.Context, path string) (*http.Response, error)
}

// readSample is one read: its latency, whether it was a local read, its
// kind.
type readSample struct {
	ns    int64
	local bool
	edges bool
}

type readAcc struct {
	samples         []readSample
	errors          int
	firstError      string
	seconds         float64
	procSec, othSec float64
	cores           int
}

// readFor reads through tgt with conc goroutines for d.
// It returns the reads/s of this run.
func readFor(ctx context.Context, hc *http.Client, data *rmData, tgt rmTarget, conc int, d time.Duration, acc *readAcc) float64 {
	n0 := len(acc.samples)
	var wg sync.WaitGroup
	var mu sync.Mutex
	stop := time.Now().Add(d)
	c0 := sampleCPU()
	t0 := time.Now()
	var seq atomic.Int64
	for g := range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(seq.Add(1)), uint64(time.Now().UnixNano())))
			var local []readSample
			errs, first := 0, ""
			buf := make([]byte, 32<<10)
			for k := g; time.Now().Before(stop) && ctx.Err() == nil; k++ {
				t := &data.tenants[rng.IntN(len(data.tenants))]
				id := t.nodes[rng.IntN(len(t.nodes))]
				base, isLocal := tgt.base(t)
				edges := k%2 == 1
				path := "/v1/tenants/" + t.name + "/nodes/" + id.String()
				if edges {
					path += "/edges"
				}
				url := base + path
				s := time.Now()
				var resp *http.Response
				var err error
				if tgt.get != nil {
					resp, err = tgt.get(ctx, path)
				} else {
					resp, err = hc.Get(url)
				}
				ok := err == nil && resp.StatusCode == http.StatusOK
				var body []byte
				if err == nil {
					for {
						n, rerr := resp.Body.Read(buf)
						if !ok && len(body) < 512 {
							body = append(body, buf[:n]...)
						}
						if rerr != nil {
							break
						}
					}
					resp.Body.Close()
				}
				el := time.Since(s)
				if !ok {
					errs++
					if first == "" {
						if err != nil {
							first = err.Error()
						} else {
							first = fmt.Sprintf("%s: %d %s", url, resp.StatusCode, strings.TrimSpace(string(body)))
						}
					}
					continue
				}
				local = append(local, readSample{ns: int64(el), local: isLocal, edges: edges})
			}
			mu.Lock()
			acc.samples = append(acc.samples, local...)
			acc.errors += errs
			if acc.firstError == "" {
				acc.firstError = first
			}
			mu.Unlock()
		}()
	}
	wg.Wait()
	secs := time.Since(t0).Seconds()
	u := cpuSince(c0, acc.cores)
	acc.seconds += secs
	acc.procSec += u.Process * secs
	acc.othSec += u.Others * secs
	return float64(len(acc.samples)-n0) / secs
}

func latOf(ns []int64, total int) *latStats {
	if len(ns) == 0 {
		return nil
	}
	slices.Sort(ns)
	p := func(q float64) float64 {
		return round3(float64(ns[max(0, int(math.Ceil(q*float64(len(ns))))-1)]) / 1e6)
	}
	return &latStats{Reads: len(ns), Share: round3(float64(len(ns)) / float64(total)), P50ms: p(0.5), P99ms: p(0.99)}
}

func (acc *readAcc) stats(name string, split bool) *readStats {
	all := make([]int64, 0, len(acc.samples))
	var loc, fwd, node, edge []int64
	for _, s := range acc.samples {
		all = append(all, s.ns)
		if s.local {
			loc = append(loc, s.ns)
		} else {
			fwd = append(fwd, s.ns)
		}
		if s.edges {
			edge = append(edge, s.ns)
		} else {
			node = append(node, s.ns)
		}
	}
	r := &readStats{Target: name, Reads: len(all), Errors: acc.errors, Seconds: round3(acc.seconds), FirstError: acc.firstError,
		NodeGet: latOf(node, len(all)), EdgeList: latOf(edge, len(all))}
	if acc.seconds > 0 {
		r.PerSec = round3(float64(len(all)) / acc.seconds)
		r.CPU = cpuUse{Process: round3(acc.procSec / acc.seconds), Others: round3(acc.othSec / acc.seconds), Cores: acc.cores}
		if len(all) > 0 {
			r.CPUMicrosPerRead = round3(acc.procSec / float64(len(all)) * 1e6)
		}
	}
	if split {
		r.Local, r.Forwarded = latOf(loc, len(all)), latOf(fwd, len(all))
	}
	if len(all) > 0 {
		slices.Sort(all)
		p := func(q float64) float64 {
			return round3(float64(all[max(0, int(math.Ceil(q*float64(len(all))))-1)]) / 1e6)
		}
		r.P50ms, r.P90ms, r.P99ms, r.MaxMs = p(0.5), p(0.9), p(0.99), p(1)
	}
	return r
}

// ---- the phase ----

func runReadMember(ctx context.Context, o *options, pg progress, root string) (*ReadMemberReport, error) {
	const members, standbys = 3, 1
	slots := o.memberSlots
	partitions := 2 * slots
	perPartition, nodesPerTenant := 4, 100
	if o.quick {
		perPartition, nodesPerTenant = 4, 40
	}
	data := makeReadData(partitions, slots, perPartition, nodesPerTenant)
	// A multiple of the four targets: each starts as many slices.
	slices_ := 12
	if o.quick {
		slices_ = 4
	}
	rep := &ReadMemberReport{Members: members, Slots: slots, Partitions: partitions, Standbys: standbys,
		Tenants: len(data.tenants), Nodes: data.nodes(), Edges: data.edges, Concurrency: o.readConcurrency,
		SecondsPerTarget: o.readDuration.Seconds(), Slices: slices_,
		Mix:  "uniform random node; GET /v1/tenants/<t>/nodes/<id> and GET .../nodes/<id>/edges (4 edges) alternately",
		NATS: "A: a NATS server of its own (R1, fsync always); B: a 3-server cluster in this process (R3 streams, fsync always), member i given server i's URL only"}
	logs := &logCounter{}
	defer func() {
		logs.mu.Lock()
		rep.WorkerLog = workerLog{Warnings: logs.warn, Errors: logs.errs, First: logs.first}
		logs.mu.Unlock()
	}()
	hc := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
		MaxIdleConns: 4 * o.readConcurrency, MaxIdleConnsPerHost: 2 * o.readConcurrency, IdleConnTimeout: time.Minute, DisableCompression: true}}
	defer hc.CloseIdleConnections()

	// A: the static replica.
	nsA, err := startNATSWith(filepath.Join(root, "nats-a"), true)
	if err != nil {
		return rep, err
	}
	defer nsA.stop()
	cfgA, err := app.ParseFlags([]string{"--data-dir", filepath.Join(root, "static"), "--http-addr", "127.0.0.1:0", "--nats-url", nsA.url,
		"--partitions", fmt.Sprint(partitions), "--changelog", "jetstream", "--checkpoint-schedule", "@every 1h", "--reaper-schedule", "@every 1h"},
		os.Getenv, io.Discard)
	if err != nil {
		return rep, err
	}
	actx, stopA := context.WithCancel(context.Background())
	doneA := make(chan error, 1)
	readyA := make(chan *slot.Slot, 1)
	go func() {
		doneA <- app.Run(actx, cfgA, logs.logger(o.workerLog).With("side", "static"), app.Options{OnReady: func(a *slot.Slot) { readyA <- a }})
	}()
	defer func() {
		stopA()
		select {
		case <-doneA:
		case <-time.After(90 * time.Second):
			pg.printf("read_member: the static replica did not stop within 90s")
		}
	}()
	var aApp *slot.Slot
	select {
	case aApp = <-readyA:
	case err := <-doneA:
		return rep, fmt.Errorf("static replica exited before ready: %v", err)
	case <-time.After(60 * time.Second):
		return rep, errors.New("static replica not ready within 60s")
	}
	baseA := "http://" + aApp.HTTPAddr()
	pg.printf("read_member: static replica ready (http %s, %d partitions)", baseA, partitions)

	// B: the members.
	cl, err := startNATSCluster(filepath.Join(root, "nats-b"), 3)
	if err != nil {
		return rep, err
	}
	defer cl.stop()
	servers := append([]*server.Server{cl.s}, cl.more...)
	ids := make([]string, members)
	bases := make([]string, members)
	var doneB []chan error
	var stopB []context.CancelFunc
	defer func() {
		for _, s := range stopB {
			s()
		}
		for i, d := range doneB {
			select {
			case <-d:
			case <-time.After(90 * time.Second):
				pg.printf("read_member: member %s did not stop within 90s", ids[i])
			}
		}
	}()
	t0 := time.Now()
	for i := range members {
		addr, err := freeAddr()
		if err != nil {
			return rep, err
		}
		ids[i], bases[i] = fmt.Sprintf("m%d", i), "http://"+addr
		cfg, err := app.ParseFlags([]string{"--data-dir", filepath.Join(root, ids[i]), "--http-addr", addr, "--advertise-url", bases[i],
			"--nats-url", servers[i%len(servers)].ClientURL(), "--stream-replicas", "3",
			"--partitions", fmt.Sprint(partitions), "--partition-owner", fmt.Sprintf("dynamic/%d", slots), "--changelog", "jetstream",
			"--member-id", ids[i], "--standbys", fmt.Sprint(standbys),
			"--checkpoint-schedule", "@every 1h", "--reaper-schedule", "@every 1h"},
			os.Getenv, io.Discard)
		if err != nil {
			return rep, err
		}
		mctx, stop := context.WithCancel(context.Background())
		done := make(chan error, 1)
		stopB, doneB = append(stopB, stop), append(doneB, done)
		go func() { done <- app.Run(mctx, cfg, logs.logger(o.workerLog).With("side", ids[i]), app.Options{}) }()
	}
	view, err := waitSettled(ctx, hc, bases, ids, slots, standbys, 5*time.Minute)
	if err != nil {
		return rep, err
	}
	rep.StartSeconds = round3(time.Since(t0).Seconds())
	pg.printf("read_member: %d members of dynamic/%d settled in %.1fs", members, slots, rep.StartSeconds)

	// The same data set into both.
	dA, err := loadReadData(ctx, nsA.url, data, "rmA")
	if err != nil {
		return rep, fmt.Errorf("loading the static replica: %w", err)
	}
	rep.LoadStaticSeconds = round3(dA.Seconds())
	dB, err := loadReadData(ctx, cl.url, data, "rmB")
	if err != nil {
		return rep, fmt.Errorf("loading the members: %w", err)
	}
	rep.LoadMembersSeconds = round3(dB.Seconds())
	pg.printf("read_member: %d tenants, %d nodes, %d edges loaded: static %.1fs, members %.1fs", rep.Tenants, rep.Nodes, rep.Edges, rep.LoadStaticSeconds, rep.LoadMembersSeconds)
	// The standbys catch up before the reads (their tail would be part of
	// the figures otherwise).
	if view, err = waitSettled(ctx, hc, bases, ids, slots, standbys, 2*time.Minute); err != nil {
		return rep, err
	}

	owner := map[int]string{}
	url := map[string]string{}
	for i, id := range ids {
		url[id] = bases[i]
	}
	rep.Connections = make([]memberConns, members)
	for i, id := range ids {
		rep.Connections[i].Member = id
	}
	for _, a := range view.Assignments {
		owner[a.Slot] = a.Owner
		for i, id := range ids {
			if a.Owner == id {
				rep.Connections[i].Owns = append(rep.Connections[i].Owns, a.Slot)
			}
			if slices.Contains(a.Standbys, id) {
				rep.Connections[i].Stands = append(rep.Connections[i].Stands, a.Slot)
			}
		}
	}
	count := func(after func(*memberConns, int, uint32)) error {
		for i := range ids {
			n, subs, err := conns(servers[i%len(servers)])
			if err != nil {
				return err
			}
			after(&rep.Connections[i], n, subs)
		}
		return nil
	}
	if err := count(func(c *memberConns, n int, _ uint32) { c.AfterLoad = n }); err != nil {
		return rep, err
	}
	if rep.StaticConns, _, err = conns(nsA.s); err != nil {
		return rep, err
	}

	anyID := ids[1%members]
	rep.AnyMember, rep.AnyOwns = anyID, rep.Connections[1%members].Owns
	reader := &client.Reader{Base: url[anyID], HTTP: hc}
	targets := []rmTarget{
		{"static", func(*rmTenant) (string, bool) { return baseA, true }, nil},
		{"any", func(t *rmTenant) (string, bool) { return url[anyID], owner[t.slot] == anyID }, nil},
		{"owner", func(t *rmTenant) (string, bool) { return url[owner[t.slot]], true }, nil},
		{"reader", func(*rmTenant) (string, bool) { return url[anyID], true }, reader.Get},
	}
	// Warm-up (not measured): connections, caches.
	warm := time.Second
	if !o.quick {
		warm = 2 * time.Second
	}
	for _, tgt := range targets {
		readFor(ctx, hc, data, tgt, o.readConcurrency, warm, &readAcc{cores: runtime.NumCPU()})
	}
	waitIdle(o.waitIdle, runtime.NumCPU(), pg)
	accs := make([]*readAcc, len(targets))
	for i := range accs {
		accs[i] = &readAcc{cores: runtime.NumCPU()}
	}
	slice := o.readDuration / time.Duration(slices_)
	for k := range slices_ {
		rate := make([]float64, len(targets))
		for j := range targets { // each slice starts at another target
			i := (k + j) % len(targets)
			rate[i] = readFor(ctx, hc, data, targets[i], o.readConcurrency, slice, accs[i])
		}
		if rate[0] > 0 {
			rep.SliceAnyVsStatic = append(rep.SliceAnyVsStatic, round3(rate[1]/rate[0]))
			rep.SliceOwnerVsStatic = append(rep.SliceOwnerVsStatic, round3(rate[2]/rate[0]))
			rep.SliceReaderVsStatic = append(rep.SliceReaderVsStatic, round3(rate[3]/rate[0]))
		}
	}
	median := func(xs []float64) float64 {
		if len(xs) == 0 {
			return 0
		}
		ys := slices.Clone(xs)
		slices.Sort(ys)
		if len(ys)%2 == 1 {
			return ys[len(ys)/2]
		}
		return round3((ys[len(ys)/2-1] + ys[len(ys)/2]) / 2)
	}
	rep.MedianSliceAnyVsStatic, rep.MedianSliceOwnerVsStatic = median(rep.SliceAnyVsStatic), median(rep.SliceOwnerVsStatic)
	rep.MedianSliceReaderVsStatic = median(rep.SliceReaderVsStatic)
	if ctx.Err() != nil {
		return rep, ctx.Err()
	}
	rep.Static, rep.Any, rep.Owner = accs[0].stats("static", false), accs[1].stats("any", true), accs[2].stats("owner", false)
	rep.Reader = accs[3].stats("reader", false)
	rs := reader.Stats()
	rep.ReaderAtOwner, rep.ReaderAtBase, rep.ReaderFellBack = rs.AtOwner, rs.AtBase, rs.FellBack
	if o.profileDir != "" {
		// Outside the figures: CPU profiles of reads through each target
		// alone (go tool pprof -top read_member_any.cpu.pprof).
		for _, tgt := range targets {
			prof, err := startProfile(o.profileDir, "read_member_"+tgt.name)
			if err != nil {
				return rep, err
			}
			readFor(ctx, hc, data, tgt, o.readConcurrency, max(slice, 3*time.Second), &readAcc{cores: runtime.NumCPU()})
			if err := prof.stop(); err != nil {
				return rep, err
			}
		}
	}
	if err := count(func(c *memberConns, n int, subs uint32) { c.AfterReads, c.Subscriptions = n, subs }); err != nil {
		return rep, err
	}
	for _, c := range rep.Connections {
		rep.MaxConnsPerMember = max(rep.MaxConnsPerMember, c.AfterLoad, c.AfterReads)
	}
	ratio := func(a, b float64) float64 {
		if a <= 0 || b <= 0 {
			return 0
		}
		return round3(a / b)
	}
	rep.AnyVsStatic, rep.AnyP99VsStatic = ratio(rep.Any.PerSec, rep.Static.PerSec), ratio(rep.Any.P99ms, rep.Static.P99ms)
	rep.OwnerVsStatic, rep.OwnerP99VsStatic = ratio(rep.Owner.PerSec, rep.Static.PerSec), ratio(rep.Owner.P99ms, rep.Static.P99ms)
	rep.ReaderVsStatic, rep.ReaderP99VsStatic = ratio(rep.Reader.PerSec, rep.Static.PerSec), ratio(rep.Reader.P99ms, rep.Static.P99ms)
	for _, r := range []*readStats{rep.Static, rep.Any, rep.Owner, rep.Reader} {
		pg.printf("read_member: %-6s %d reads in %.1fs: %.0f/s, p50 %.2f ms, p99 %.2f ms, %d errors (cpu %.2f cores, %.0f us a read; others %.2f)",
			r.Target, r.Reads, r.Seconds, r.PerSec, r.P50ms, r.P99ms, r.Errors, r.CPU.Process, r.CPUMicrosPerRead, r.CPU.Others)
		if r.FirstError != "" {
			pg.printf("read_member: %s: first failed read: %s", r.Target, r.FirstError)
		}
	}
	if l, f := rep.Any.Local, rep.Any.Forwarded; l != nil && f != nil {
		pg.printf("read_member: through %s (owns slots %v): local %.0f%% p50 %.2f p99 %.2f ms; forwarded %.0f%% p50 %.2f p99 %.2f ms",
			anyID, rep.AnyOwns, 100*l.Share, l.P50ms, l.P99ms, 100*f.Share, f.P50ms, f.P99ms)
	}
	pg.printf("read_member: slice by slice, any/static %v (median %.3f), owner/static %v (median %.3f), reader/static %v (median %.3f)",
		rep.SliceAnyVsStatic, rep.MedianSliceAnyVsStatic, rep.SliceOwnerVsStatic, rep.MedianSliceOwnerVsStatic, rep.SliceReaderVsStatic, rep.MedianSliceReaderVsStatic)
	pg.printf("read_member: any/static %.3f (p99 x%.2f), owner/static %.3f (p99 x%.2f), reader/static %.3f (p99 x%.2f); NATS connections per member %s, max %d; the static replica %d",
		rep.AnyVsStatic, rep.AnyP99VsStatic, rep.OwnerVsStatic, rep.OwnerP99VsStatic, rep.ReaderVsStatic, rep.ReaderP99VsStatic, connsLine(rep.Connections), rep.MaxConnsPerMember, rep.StaticConns)
	if rep.Static.Errors+rep.Any.Errors+rep.Owner.Errors+rep.Reader.Errors > 0 {
		return rep, fmt.Errorf("failed reads: static %d, any %d, owner %d, reader %d", rep.Static.Errors, rep.Any.Errors, rep.Owner.Errors, rep.Reader.Errors)
	}
	return rep, nil
}

func connsLine(cs []memberConns) string {
	var parts []string
	for _, c := range cs {
		parts = append(parts, fmt.Sprintf("%s=%d", c.Member, max(c.AfterLoad, c.AfterReads)))
	}
	sort.Strings(parts)
	return strings.Join(parts, " ")
}

// printReadMember is the read_member section of the table.
func printReadMember(w io.Writer, r *ReadMemberReport) {
	if r == nil || r.Static == nil {
		return
	}
	fmt.Fprintf(w, "\nread_member: %d members of dynamic/%d (%d partitions, --standbys %d) against a static replica; %d tenants, %d nodes, %d edges; %d readers, %.0fs per target in %d slices\n",
		r.Members, r.Slots, r.Partitions, r.Standbys, r.Tenants, r.Nodes, r.Edges, r.Concurrency, r.SecondsPerTarget, r.Slices)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "reads through\treads/s\tp50 ms\tp90 ms\tp99 ms\tmax ms\treads\terrors\tx static (p99)\tcpu cores (others)\tcpu us/read")
	row := func(name string, s *readStats, x, xp float64) {
		xs := ""
		if x > 0 {
			xs = fmt.Sprintf("%.3f (%.2f)", x, xp)
		}
		fmt.Fprintf(tw, "%s\t%.0f\t%.2f\t%.2f\t%.2f\t%.2f\t%d\t%d\t%s\t%.2f (%.2f)\t%.0f\n", name, s.PerSec, s.P50ms, s.P90ms, s.P99ms, s.MaxMs, s.Reads, s.Errors, xs, s.CPU.Process, s.CPU.Others, s.CPUMicrosPerRead)
	}
	row("A: static replica", r.Static, 0, 0)
	row("B: member "+r.AnyMember+" (any)", r.Any, r.AnyVsStatic, r.AnyP99VsStatic)
	if l := r.Any.Local; l != nil {
		fmt.Fprintf(tw, "  of which local (%.0f%%)\t\t%.2f\t\t%.2f\t\t%d\t\t\t\t\n", 100*l.Share, l.P50ms, l.P99ms, l.Reads)
	}
	if f := r.Any.Forwarded; f != nil {
		fmt.Fprintf(tw, "  of which forwarded (%.0f%%)\t\t%.2f\t\t%.2f\t\t%d\t\t\t\t\n", 100*f.Share, f.P50ms, f.P99ms, f.Reads)
	}
	row("B: the tenant's owner", r.Owner, r.OwnerVsStatic, r.OwnerP99VsStatic)
	if r.Reader != nil {
		row("B: client.Reader, Base "+r.AnyMember, r.Reader, r.ReaderVsStatic, r.ReaderP99VsStatic)
	}
	tw.Flush()
	if r.Reader != nil {
		fmt.Fprintf(w, "client.Reader's reads (warm-up included): %d at their owners, %d at Base, of which %d fell back\n", r.ReaderAtOwner, r.ReaderAtBase, r.ReaderFellBack)
	}
	fmt.Fprintf(w, "reads/s ratios slice by slice: any/static %v (median %.3f), owner/static %v (median %.3f), reader/static %v (median %.3f)\n",
		r.SliceAnyVsStatic, r.MedianSliceAnyVsStatic, r.SliceOwnerVsStatic, r.MedianSliceOwnerVsStatic, r.SliceReaderVsStatic, r.MedianSliceReaderVsStatic)
	fmt.Fprintf(w, "NATS client connections per member (owner of / standby of): ")
	for i, c := range r.Connections {
		if i > 0 {
			fmt.Fprint(w, ", ")
		}
		fmt.Fprintf(w, "%s %d after the load, %d after the reads (%v / %v)", c.Member, c.AfterLoad, c.AfterReads, c.Owns, c.Stands)
	}
	fmt.Fprintf(w, "; the static replica %d\n", r.StaticConns)
	if r.WorkerLog.Warnings+r.WorkerLog.Errors > 0 {
		fmt.Fprintf(w, "read_member log: %d warnings, %d errors\n", r.WorkerLog.Warnings, r.WorkerLog.Errors)
		for _, l := range r.WorkerLog.First {
			fmt.Fprintln(w, "  "+l)
		}
	}
}
