package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net"
	"net/url"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/telha/telha-cascade/queue"
)

// ---- embedded NATS ----

type natsServer struct {
	s    *server.Server
	more []*server.Server // the other servers of a cluster
	url  string
	once sync.Once
}

func startNATS(dir string) (*natsServer, error) { return startNATSWith(dir, false) }

// startNATSWith starts the bench's server; syncAlways fsyncs every
// JetStream write before its ack (sync_interval: always).
func startNATSWith(dir string, syncAlways bool) (*natsServer, error) {
	o := &server.Options{ServerName: "telha-bench", Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: dir, NoLog: true, NoSigs: true, SyncAlways: syncAlways}
	s, err := server.NewServer(o)
	if err != nil {
		return nil, fmt.Errorf("nats server: %w", err)
	}
	go s.Start()
	if !s.ReadyForConnections(30 * time.Second) {
		s.Shutdown()
		return nil, errors.New("nats server did not start")
	}
	port := s.Addr().(*net.TCPAddr).Port
	return &natsServer{s: s, url: fmt.Sprintf("nats://127.0.0.1:%d", port)}, nil
}

func (n *natsServer) stop() {
	n.once.Do(func() {
		for _, s := range append([]*server.Server{n.s}, n.more...) {
			s.Shutdown()
			s.WaitForShutdown()
		}
	})
}

// startNATSCluster starts n clustered JetStream servers in this process,
// each fsyncing every write (sync_interval: always, as docs/DEPLOY.md
// configures a cluster), and waits until JetStream answers.
func startNATSCluster(dir string, n int) (*natsServer, error) {
	var routePorts []int
	for i := 0; i < n; i++ {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		routePorts = append(routePorts, ln.Addr().(*net.TCPAddr).Port)
		ln.Close()
	}
	var routes []*url.URL
	for _, p := range routePorts {
		routes = append(routes, &url.URL{Scheme: "nats-route", Host: fmt.Sprintf("127.0.0.1:%d", p)})
	}
	ns := &natsServer{}
	var urls []string
	for i := 0; i < n; i++ {
		o := &server.Options{ServerName: fmt.Sprintf("bench-%d", i), Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: filepath.Join(dir, fmt.Sprint(i)),
			NoLog: true, NoSigs: true, SyncAlways: true, Routes: routes,
			Cluster: server.ClusterOpts{Name: "telha-bench", Host: "127.0.0.1", Port: routePorts[i]}}
		s, err := server.NewServer(o)
		if err != nil {
			ns.stop()
			return nil, fmt.Errorf("nats server: %w", err)
		}
		go s.Start()
		if ns.s == nil {
			ns.s = s
		} else {
			ns.more = append(ns.more, s)
		}
		if !s.ReadyForConnections(30 * time.Second) {
			ns.stop()
			return nil, errors.New("nats server did not start")
		}
		urls = append(urls, s.ClientURL())
	}
	ns.url = strings.Join(urls, ",")
	nc, err := nats.Connect(ns.url)
	if err != nil {
		ns.stop()
		return nil, err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		ns.stop()
		return nil, err
	}
	for deadline := time.Now().Add(30 * time.Second); ; {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := js.AccountInfo(ctx)
		cancel()
		if err == nil {
			return ns, nil
		}
		if time.Now().After(deadline) {
			ns.stop()
			return nil, fmt.Errorf("nats cluster: no JetStream meta leader: %w", err)
		}
		time.Sleep(100 * time.Millisecond) // waiting for a Raft election, with a deadline
	}
}

// ---- the requests ----

// spec is one delete request of the small, pipeline and naive runs. Its
// target exists in the small run's graph: a standalone edge (edges < 0,
// tombstone_edge) or a node with `edges` edges (tombstone_node).
type spec struct {
	tenant string
	id     uuid.UUID // edge or node to delete
	edges  int       // -1: tombstone_edge
	// graph of a node target: neighbours and edge ids; out[i] says whether
	// edge i goes node->neighbour.
	nbrs, eids []uuid.UUID
	src, dst   uuid.UUID // endpoints of an edge target
}

const (
	benchLabel  = "knows"
	benchActor  = "bench"
	benchReason = "benchmark delete"
	benchSource = "cmd/bench"
)

// specSet holds every target: warm-up, saturation and light-load requests
// of the small run (the pipeline and naive runs reuse the shapes and bodies
// of the first ones).
type specSet struct {
	all     []spec
	warm    []spec
	sat     []spec
	light   []spec
	mixed   []spec // the mixed phase's small requests (in its own store)
	tenants []string
}

// makeSpecs builds the targets. Request i of a run is a tombstone_edge when
// i is even, else a tombstone_node of a node with (i/2)%9 edges: 0..8, 4 on
// average.
func makeSpecs(o *options) *specSet {
	warm := min(1000, max(100, o.requests/20))
	light := int(math.Ceil(o.lightDuration.Seconds() * float64(o.lightRate)))
	n := warm + o.requests + light
	s := &specSet{}
	for t := 0; t < o.tenants; t++ {
		s.tenants = append(s.tenants, fmt.Sprintf("bench%d", t))
	}
	s.all = make([]spec, n)
	mk := func(part []spec) {
		for i := range part {
			sp := spec{tenant: s.tenants[i%len(s.tenants)], id: uuid.New()}
			if i%2 == 0 {
				sp.edges = -1
				sp.src, sp.dst = uuid.New(), uuid.New()
			} else {
				sp.edges = (i / 2) % 9
				for range sp.edges {
					sp.nbrs = append(sp.nbrs, uuid.New())
					sp.eids = append(sp.eids, uuid.New())
				}
			}
			part[i] = sp
		}
	}
	s.warm = s.all[:warm]
	s.sat = s.all[warm : warm+o.requests]
	s.light = s.all[warm+o.requests:]
	mk(s.warm)
	mk(s.sat)
	mk(s.light)
	s.mixed = make([]spec, int(math.Ceil(o.mixedDuration.Seconds()*float64(o.lightRate))))
	mk(s.mixed)
	return s
}

func (sp *spec) op() string {
	if sp.edges < 0 {
		return "tombstone_edge"
	}
	return "tombstone_node"
}

// body is the CONTRACT §5 request JSON.
func (sp *spec) body(requestID string) []byte {
	b, _ := json.Marshal(map[string]any{
		"request_id": requestID,
		"op":         sp.op(),
		"tenant":     sp.tenant,
		"id":         sp.id.String(),
		"provenance": map[string]string{"actor": benchActor, "reason": benchReason, "source": benchSource},
	})
	return b
}

// ---- the load driver ----

// driver publishes requests with one prefix's subjects and times their
// results.
type driver struct {
	pubNC, resNC *nats.Conn
	js           jetstream.JetStream
	client       *queue.Client
	prefix       string
	pubErrs      atomic.Int64
}

func newDriver(url, prefix string) (*driver, error) {
	pubNC, err := nats.Connect(url, nats.Name("bench-publisher"))
	if err != nil {
		return nil, err
	}
	resNC, err := nats.Connect(url, nats.Name("bench-results"))
	if err != nil {
		pubNC.Close()
		return nil, err
	}
	d := &driver{pubNC: pubNC, resNC: resNC, prefix: prefix}
	d.js, err = jetstream.New(pubNC,
		jetstream.WithPublishAsyncMaxPending(8192),
		jetstream.WithPublishAsyncErrHandler(func(_ jetstream.JetStream, _ *nats.Msg, err error) { d.pubErrs.Add(1) }))
	if err != nil {
		d.close()
		return nil, err
	}
	d.client, err = queue.NewClient(pubNC, queue.Config{Prefix: prefix})
	if err != nil {
		d.close()
		return nil, err
	}
	return d, nil
}

func (d *driver) close() {
	d.pubNC.Close()
	d.resNC.Close()
}

// load is how a run publishes: closed loop (publishers x window
// outstanding) or open loop at a fixed rate.
type load struct {
	publishers, window int
	rate               int // > 0: open loop, one publisher at this rate
}

// runStats is the outcome of one timed run.
type runStats struct {
	Requests   int            `json:"requests"`
	Seconds    float64        `json:"seconds"`
	PerSec     float64        `json:"per_sec"`
	P50ms      float64        `json:"p50_ms"`
	P90ms      float64        `json:"p90_ms"`
	P99ms      float64        `json:"p99_ms"`
	MaxMs      float64        `json:"max_ms"`
	Statuses   map[string]int `json:"statuses"`
	Duplicates int            `json:"duplicate_results,omitempty"`
	Wrong      int            `json:"wrong_edges_tombstoned,omitempty"`
	CPU        cpuUse         `json:"cpu"`
	// Per request: published and answered, in ns after base (the mixed
	// phase picks the requests published while its cascade ran).
	base      time.Time
	sent, got []int64
}

var runSeq atomic.Int64

// run publishes specs (request ids <tag>-<n>-<i>) and waits for every
// result. It fails when a result is missing (no progress for stall), not
// "ok", or reports the wrong edge count.
func (d *driver) run(ctx context.Context, tag string, specs []spec, l load, stall time.Duration) (*runStats, error) {
	n := len(specs)
	runID := fmt.Sprintf("%s-%d-", tag, runSeq.Add(1))
	msgs := make([]*nats.Msg, n)
	for i := range specs {
		rid := runID + strconv.Itoa(i)
		msgs[i] = d.client.RequestMsg(specs[i].tenant, rid, specs[i].body(rid))
	}
	sent := make([]int64, n)
	got := make([]int64, n)
	cpu0 := sampleCPU()
	base := time.Now()

	pubs := l.publishers
	if l.rate > 0 {
		pubs = 1
	}
	slots := make([]chan struct{}, pubs)
	for p := range slots {
		slots[p] = make(chan struct{}, max(1, l.window))
	}
	var (
		mu       sync.Mutex
		received int
		dups     int
		wrong    int
		statuses = map[string]int{}
		firstBad string
		done     = make(chan struct{})
		progress atomic.Int64
	)
	sub, err := d.resNC.Subscribe(d.prefix+".res.*", func(m *nats.Msg) {
		now := time.Since(base).Nanoseconds()
		var r struct {
			RequestID string `json:"request_id"`
			Status    string `json:"status"`
			Error     string `json:"error"`
			Edges     int    `json:"edges_tombstoned"`
		}
		if err := json.Unmarshal(m.Data, &r); err != nil {
			return
		}
		rest, ok := strings.CutPrefix(r.RequestID, runID)
		if !ok {
			return // another run's straggler
		}
		i, err := strconv.Atoi(rest)
		if err != nil || i < 0 || i >= n {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		if got[i] != 0 {
			dups++
			return
		}
		got[i] = now
		statuses[r.Status]++
		if r.Status != "ok" && firstBad == "" {
			firstBad = fmt.Sprintf("%s %s: %s %s", r.RequestID, specs[i].op(), r.Status, r.Error)
		}
		if r.Status == "ok" && specs[i].edges >= 0 && r.Edges != specs[i].edges {
			wrong++
			if firstBad == "" {
				firstBad = fmt.Sprintf("%s: edges_tombstoned %d, want %d", r.RequestID, r.Edges, specs[i].edges)
			}
		}
		if l.rate <= 0 {
			<-slots[i%pubs]
		}
		received++
		progress.Add(1)
		if received == n {
			close(done)
		}
	})
	if err != nil {
		return nil, err
	}
	defer sub.Unsubscribe()
	_ = sub.SetPendingLimits(-1, -1)
	if err := d.resNC.Flush(); err != nil {
		return nil, err
	}

	abort := make(chan struct{})
	var abortOnce sync.Once
	stopPublishers := func() { abortOnce.Do(func() { close(abort) }) }
	defer stopPublishers()
	var wg sync.WaitGroup
	var pubErr atomic.Value
	publish := func(i int) bool {
		sent[i] = time.Since(base).Nanoseconds()
		if _, err := d.js.PublishMsgAsync(msgs[i]); err != nil {
			pubErr.CompareAndSwap(nil, err)
			stopPublishers()
			return false
		}
		return true
	}
	labels := pprof.Labels("side", "client")
	if l.rate > 0 {
		wg.Add(1)
		go pprof.Do(ctx, labels, func(context.Context) {
			defer wg.Done()
			interval := time.Second / time.Duration(l.rate)
			start := time.Now()
			for i := 0; i < n; i++ {
				if w := time.Until(start.Add(time.Duration(i) * interval)); w > 0 {
					select {
					case <-time.After(w):
					case <-abort:
						return
					}
				}
				if !publish(i) {
					return
				}
			}
		})
	} else {
		for p := 0; p < pubs; p++ {
			wg.Add(1)
			go pprof.Do(ctx, labels, func(context.Context) {
				defer wg.Done()
				for i := p; i < n; i += pubs {
					select {
					case slots[p] <- struct{}{}:
					case <-abort:
						return
					}
					if !publish(i) {
						return
					}
				}
			})
		}
	}

	// Wait for every result, failing on a stall.
	var waitErr error
	tick := time.NewTicker(500 * time.Millisecond)
	last, lastChange := int64(0), time.Now()
wait:
	for {
		select {
		case <-done:
			break wait
		case <-ctx.Done():
			waitErr = ctx.Err()
			break wait
		case <-tick.C:
			if e, _ := pubErr.Load().(error); e != nil {
				waitErr = fmt.Errorf("publish: %w", e)
				break wait
			}
			if p := progress.Load(); p != last {
				last, lastChange = p, time.Now()
			} else if time.Since(lastChange) > stall {
				waitErr = fmt.Errorf("results missing: %d of %d received, none for %s", p, n, stall)
				break wait
			}
		}
	}
	tick.Stop()
	cpu := cpuSince(cpu0, runtime.NumCPU())
	stopPublishers()
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	if waitErr != nil {
		return nil, waitErr
	}
	if e := d.pubErrs.Load(); e > 0 {
		return nil, fmt.Errorf("%d async publishes failed", e)
	}
	if dropped, _ := sub.Dropped(); dropped > 0 {
		return nil, fmt.Errorf("result subscription dropped %d messages", dropped)
	}
	lat := make([]float64, n)
	first, lastGot := int64(math.MaxInt64), int64(0)
	for i := range n {
		lat[i] = float64(got[i]-sent[i]) / 1e6
		first = min(first, sent[i])
		lastGot = max(lastGot, got[i])
	}
	slices.Sort(lat)
	pct := func(p float64) float64 { return round3(lat[int(math.Ceil(p*float64(n)))-1]) }
	secs := float64(lastGot-first) / 1e9
	st := &runStats{
		Requests: n, Seconds: round3(secs), PerSec: math.Round(float64(n) / secs),
		P50ms: pct(0.50), P90ms: pct(0.90), P99ms: pct(0.99), MaxMs: round3(lat[n-1]),
		Statuses: statuses, Duplicates: dups, Wrong: wrong, CPU: cpu,
		base: base, sent: sent, got: got,
	}
	if firstBad != "" {
		return st, fmt.Errorf("unexpected results (%v, %d wrong edge counts), first: %s", statuses, wrong, firstBad)
	}
	return st, nil
}

func round3(f float64) float64 { return math.Round(f*1000) / 1000 }
