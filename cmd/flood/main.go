package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

type options struct {
	opMessages, opBytes           int
	deepLetters, deepDepth, views int
	hubEdges, waits               int
	backlog, backlogTenants       int
	json                          bool
	keep                          bool
	only                          string
}

// Flood is one flood's figures.
type Flood struct {
	Name              string         `json:"name"`
	What              string         `json:"what"`
	Seconds           float64        `json:"seconds"`
	RSSBeforeMB       float64        `json:"rss_before_mb"`
	PeakRSSGrowthMB   float64        `json:"peak_rss_growth_mb"`
	Answers           map[string]int `json:"answers,omitempty"`
	MetricsBytes      int            `json:"metrics_bytes,omitempty"`
	PageBytesMax      int            `json:"page_bytes_max,omitempty"`
	PageSecondsMax    float64        `json:"page_seconds_max,omitempty"`
	GoroutinesPeak    int            `json:"goroutines_peak,omitempty"`
	GoroutinesAfter   int            `json:"goroutines_after,omitempty"`
	GoHeapPeakMB      float64        `json:"go_heap_peak_mb,omitempty"`
	DeadLettersStored int            `json:"dead_letters_stored,omitempty"`
}

// Report is the whole run.
type Report struct {
	GoVersion string  `json:"go_version"`
	CPUs      int     `json:"cpus"`
	Floods    []Flood `json:"floods"`
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	o := &options{}
	fs := flag.NewFlagSet("flood", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.IntVar(&o.opMessages, "op-messages", 1000, "requests of the op flood")
	fs.IntVar(&o.opBytes, "op-bytes", 200_000, "length of each flood request's op")
	fs.IntVar(&o.deepLetters, "deep-letters", 4, "deeply nested dead letters")
	fs.IntVar(&o.deepDepth, "deep-depth", 10_000, "their nesting depth")
	fs.IntVar(&o.views, "deep-views", 10, "views of the dead-letter page (each with and without a tenant filter)")
	fs.IntVar(&o.hubEdges, "hub-edges", 200_000, "edges of the hub whose cascade fences the waits")
	fs.IntVar(&o.waits, "waits", 5000, "concurrent ?wait=30 reads")
	fs.IntVar(&o.backlog, "backlog", 300_000, "requests of the backlog flood (not in the default set: --floods backlog)")
	fs.IntVar(&o.backlogTenants, "backlog-tenants", 5000, "tenants the backlog is spread over")
	fs.BoolVar(&o.json, "json", false, "one JSON object on stdout")
	fs.BoolVar(&o.keep, "keep", false, "keep the worker's temp dir")
	fs.StringVar(&o.only, "floods", "ops,deep,waits", "the floods to run, in order")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if o.opMessages < 1 || o.opBytes < 1 || o.deepLetters < 1 || o.deepDepth < 1 || o.views < 1 || o.hubEdges < 1 || o.waits < 1 || o.backlog < 1 || o.backlogTenants < 1 {
		fmt.Fprintln(stderr, "flood: every count must be at least 1")
		return 2
	}
	rep, err := runAll(ctx, o, stderr)
	if rep != nil {
		if o.json {
			_ = json.NewEncoder(stdout).Encode(rep)
		} else {
			printReport(stdout, rep)
		}
	}
	if err != nil {
		fmt.Fprintln(stderr, "flood:", err)
		return 1
	}
	return 0
}

// worker is the worker process under test.
type worker struct {
	cmd      *exec.Cmd
	pid      int
	http     string // http://127.0.0.1:port
	natsURL  string
	exited   chan error
	logPath  string
	hc       *http.Client
	dir      string
	stderrTo io.Writer
}

func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

func startWorker(ctx context.Context, dir string, stderr io.Writer) (*worker, error) {
	bin := filepath.Join(dir, "worker")
	build := exec.CommandContext(ctx, "go", "build", "-o", bin, "./cmd/worker")
	build.Stdout, build.Stderr = stderr, stderr
	if err := build.Run(); err != nil {
		return nil, fmt.Errorf("build ./cmd/worker (run flood from the repository root): %w", err)
	}
	hp, err := freePort()
	if err != nil {
		return nil, err
	}
	np, err := freePort()
	if err != nil {
		return nil, err
	}
	w := &worker{http: fmt.Sprintf("http://127.0.0.1:%d", hp), natsURL: fmt.Sprintf("nats://127.0.0.1:%d", np),
		exited: make(chan error, 1), logPath: filepath.Join(dir, "worker.log"), dir: dir, stderrTo: stderr,
		hc: &http.Client{Timeout: 60 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 512, MaxConnsPerHost: 0}}}
	logf, err := os.Create(w.logPath)
	if err != nil {
		return nil, err
	}
	w.cmd = exec.Command(bin, "--data-dir", filepath.Join(dir, "data"), "--http-addr", fmt.Sprintf("127.0.0.1:%d", hp),
		"--nats-listen", fmt.Sprintf("127.0.0.1:%d", np), "--log-level", "warn")
	w.cmd.Env = cleanEnv()
	w.cmd.Stdout, w.cmd.Stderr = logf, logf
	if err := w.cmd.Start(); err != nil {
		return nil, err
	}
	w.pid = w.cmd.Process.Pid
	go func() { w.exited <- w.cmd.Wait(); logf.Close() }()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		resp, err := w.hc.Get(w.http + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return w, nil
			}
		}
		select {
		case err := <-w.exited:
			return nil, fmt.Errorf("worker exited before ready: %v (log %s)", err, w.logPath)
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(100 * time.Millisecond): // polling readiness, with a deadline
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("worker not ready within 2m (log %s)", w.logPath)
		}
	}
}

// cleanEnv is the environment without TELHA_ variables, so the worker runs
// on its embedded default whatever the caller exported.
func cleanEnv() []string {
	var out []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "TELHA_") {
			out = append(out, kv)
		}
	}
	return out
}

func (w *worker) stop() error {
	select {
	case err := <-w.exited:
		return fmt.Errorf("worker had exited: %v", err)
	default:
	}
	_ = w.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-w.exited:
		return err
	case <-time.After(90 * time.Second):
		_ = w.cmd.Process.Kill()
		return errors.New("worker did not stop within 90s of SIGTERM")
	}
}

func (w *worker) alive() error {
	select {
	case err := <-w.exited:
		w.exited <- err
		return fmt.Errorf("the worker died: %v (log %s)", err, w.logPath)
	default:
		return nil
	}
}

// memKB reads a field (VmRSS, VmHWM) of /proc/<pid>/status in kB.
func (w *worker) memKB(field string) (int, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", w.pid))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), field+":"); ok {
			return strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(rest), " kB"))
		}
	}
	return 0, fmt.Errorf("no %s in /proc/%d/status", field, w.pid)
}

// resetPeak resets VmHWM to the current RSS and returns it in MB.
func (w *worker) resetPeak() (float64, error) {
	runtime.GC()
	if err := os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", w.pid), []byte("5"), 0); err != nil {
		return 0, fmt.Errorf("reset the peak RSS (/proc/%d/clear_refs): %w", w.pid, err)
	}
	kb, err := w.memKB("VmRSS")
	return float64(kb) / 1024, err
}

func (w *worker) peakGrowth(before float64) float64 {
	kb, err := w.memKB("VmHWM")
	if err != nil {
		return -1
	}
	return float64(kb)/1024 - before
}

func (w *worker) get(ctx context.Context, path string) (int, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, w.http+path, nil)
	if err != nil {
		return 0, nil, err
	}
	resp, err := w.hc.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, body, err
}

// metric reads one unlabelled sample (or the sum of a family's samples) from /metrics.
func (w *worker) metric(ctx context.Context, name string) (float64, int, error) {
	code, body, err := w.get(ctx, "/metrics")
	if err != nil || code != 200 {
		return 0, 0, fmt.Errorf("/metrics: %d %v", code, err)
	}
	var sum float64
	for _, line := range strings.Split(string(body), "\n") {
		if strings.HasPrefix(line, name+" ") || strings.HasPrefix(line, name+"{") {
			f := strings.Fields(line)
			v, _ := strconv.ParseFloat(f[len(f)-1], 64)
			sum += v
		}
	}
	return sum, len(body), nil
}

func runAll(ctx context.Context, o *options, stderr io.Writer) (*Report, error) {
	dir, err := os.MkdirTemp("", "telha-flood-")
	if err != nil {
		return nil, err
	}
	if !o.keep {
		defer os.RemoveAll(dir)
	}
	fmt.Fprintf(stderr, "flood: building and starting the worker in %s\n", dir)
	w, err := startWorker(ctx, dir, stderr)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err := w.stop(); err != nil {
			fmt.Fprintln(stderr, "flood: stopping the worker:", err)
		}
	}()
	nc, err := nats.Connect(w.natsURL, nats.Name("telha-flood"))
	if err != nil {
		return nil, err
	}
	defer nc.Close()
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(256))
	if err != nil {
		return nil, err
	}
	rep := &Report{GoVersion: runtime.Version(), CPUs: runtime.NumCPU()}
	all := map[string]func(context.Context, *options, *worker, jetstream.JetStream, io.Writer) (Flood, error){"ops": floodOps, "deep": floodDeep, "waits": floodWaits, "backlog": floodBacklog}
	for _, name := range strings.Split(o.only, ",") {
		f, ok := all[strings.TrimSpace(name)]
		if !ok {
			return rep, fmt.Errorf("--floods: no flood %q (ops, deep, waits, backlog)", name)
		}
		fl, err := f(ctx, o, w, js, stderr)
		if err == nil {
			err = w.alive()
		}
		if err != nil {
			return rep, fmt.Errorf("%s: %w", fl.Name, err)
		}
		rep.Floods = append(rep.Floods, fl)
		fmt.Fprintf(stderr, "flood: %s done: peak RSS growth %.1f MB\n", fl.Name, fl.PeakRSSGrowthMB)
	}
	return rep, nil
}

// publishAll publishes bodies on subject with async acks, waiting out a
// full ack window.
func publishAll(ctx context.Context, js jetstream.JetStream, subject string, bodies [][]byte) error {
	for _, b := range bodies {
		m := nats.NewMsg(subject)
		m.Data = b
		_, err := js.PublishMsgAsync(m)
		for errors.Is(err, jetstream.ErrTooManyStalledMsgs) {
			select {
			case <-js.PublishAsyncComplete():
			case <-ctx.Done():
				return ctx.Err()
			}
			_, err = js.PublishMsgAsync(m)
		}
		if err != nil {
			return err
		}
	}
	select {
	case <-js.PublishAsyncComplete():
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// waitDLQ waits until the dead-letter stream holds at least n messages on subject.
func waitDLQ(ctx context.Context, js jetstream.JetStream, subject string, n int) (int, error) {
	s, err := js.Stream(ctx, "TELHA_DLQ")
	if err != nil {
		return 0, err
	}
	deadline := time.Now().Add(5 * time.Minute)
	for {
		info, err := s.Info(ctx, jetstream.WithSubjectFilter(subject))
		if err != nil {
			return 0, err
		}
		got := int(info.State.Subjects[subject])
		if got >= n {
			return got, nil
		}
		if time.Now().After(deadline) {
			return got, fmt.Errorf("%d of %d dead letters on %s within 5m", got, n, subject)
		}
		select {
		case <-ctx.Done():
			return got, ctx.Err()
		case <-time.After(200 * time.Millisecond): // polling another process's state, with a deadline
		}
	}
}

func letters(rng *rand.Rand, n int) string {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte('a' + rng.IntN(26))
	}
	return string(b)
}

// floodOps: requests whose op is a long random string.
func floodOps(ctx context.Context, o *options, w *worker, js jetstream.JetStream, stderr io.Writer) (Flood, error) {
	fl := Flood{Name: "ops", What: fmt.Sprintf("%d requests with a %d-byte random op, then one /metrics scrape", o.opMessages, o.opBytes)}
	before, err := w.resetPeak()
	if err != nil {
		return fl, err
	}
	fl.RSSBeforeMB = before
	rng := rand.New(rand.NewPCG(1, 2))
	bodies := make([][]byte, o.opMessages)
	for i := range bodies {
		bodies[i] = []byte(fmt.Sprintf(`{"request_id":"op-%d","op":%q,"tenant":"flood","id":%q}`, i, letters(rng, o.opBytes), uuid.NewString()))
	}
	start := time.Now()
	if err := publishAll(ctx, js, "telha.req.flood", bodies); err != nil {
		return fl, err
	}
	bodies = nil
	n, err := waitDLQ(ctx, js, "telha.dlq.flood", o.opMessages)
	if err != nil {
		return fl, err
	}
	fl.DeadLettersStored = n
	_, size, err := w.metric(ctx, "telha_requests_total")
	if err != nil {
		return fl, err
	}
	fl.Seconds = time.Since(start).Seconds()
	fl.MetricsBytes = size
	fl.PeakRSSGrowthMB = w.peakGrowth(before)
	return fl, nil
}

// floodDeep: deeply nested dead letters viewed on the status page.
func floodDeep(ctx context.Context, o *options, w *worker, js jetstream.JetStream, stderr io.Writer) (Flood, error) {
	fl := Flood{Name: "deep", What: fmt.Sprintf("%d dead letters nested %d deep, the dead-letter page viewed %d times with and %d without a tenant filter",
		o.deepLetters, o.deepDepth, o.views, o.views), Answers: map[string]int{}}
	bodies := make([][]byte, o.deepLetters)
	for i := range bodies {
		bodies[i] = []byte(fmt.Sprintf(`{"request_id":"deep-%d","op":"put_node","tenant":"deep","id":%q,"props":{"x":%s%s}}`,
			i, uuid.NewString(), strings.Repeat("[", o.deepDepth), strings.Repeat("]", o.deepDepth)))
	}
	if err := publishAll(ctx, js, "telha.req.deep", bodies); err != nil {
		return fl, err
	}
	if _, err := waitDLQ(ctx, js, "telha.dlq.deep", o.deepLetters); err != nil {
		return fl, err
	}
	before, err := w.resetPeak()
	if err != nil {
		return fl, err
	}
	fl.RSSBeforeMB = before
	start := time.Now()
	for i := 0; i < o.views; i++ {
		for _, path := range []string{"/ui/dlq?tenant=deep", "/ui/dlq"} {
			t0 := time.Now()
			code, body, err := w.get(ctx, path)
			if err != nil {
				return fl, fmt.Errorf("GET %s: %w", path, err)
			}
			fl.Answers[strconv.Itoa(code)]++
			fl.PageBytesMax = max(fl.PageBytesMax, len(body))
			fl.PageSecondsMax = max(fl.PageSecondsMax, time.Since(t0).Seconds())
			if code != 200 {
				return fl, fmt.Errorf("GET %s: %d %.200s", path, code, body)
			}
		}
	}
	fl.Seconds = time.Since(start).Seconds()
	fl.PeakRSSGrowthMB = w.peakGrowth(before)
	return fl, nil
}

// floodWaits: concurrent ?wait=30 reads of a node fenced by its cascade.
func floodWaits(ctx context.Context, o *options, w *worker, js jetstream.JetStream, stderr io.Writer) (Flood, error) {
	fl := Flood{Name: "waits", What: fmt.Sprintf("%d concurrent ?wait=30 reads of a hub while its %d-edge cascade runs", o.waits, o.hubEdges), Answers: map[string]int{}}
	hub := uuid.NewString()
	spoke := uuid.NewString()
	bodies := [][]byte{
		[]byte(fmt.Sprintf(`{"request_id":"hub","op":"put_node","tenant":"waits","id":%q}`, hub)),
		[]byte(fmt.Sprintf(`{"request_id":"spoke","op":"put_node","tenant":"waits","id":%q}`, spoke)),
	}
	for i := 0; i < o.hubEdges; i++ {
		bodies = append(bodies, []byte(fmt.Sprintf(`{"request_id":"e-%d","op":"put_edge","tenant":"waits","id":%q,"src":%q,"dst":%q}`, i, uuid.NewString(), hub, spoke)))
	}
	fmt.Fprintf(stderr, "flood: waits: building a hub of %d edges\n", o.hubEdges)
	if err := publishAll(ctx, js, "telha.req.waits", bodies); err != nil {
		return fl, err
	}
	// Wait until the last edge is applied: its request lookup answers.
	deadline := time.Now().Add(5 * time.Minute)
	for {
		code, _, err := w.get(ctx, fmt.Sprintf("/v1/tenants/waits/requests/e-%d", o.hubEdges-1))
		if err == nil && code == 200 {
			break
		}
		if time.Now().After(deadline) {
			return fl, fmt.Errorf("the hub's edges were not applied within 5m (%d %v)", code, err)
		}
		select {
		case <-ctx.Done():
			return fl, ctx.Err()
		case <-time.After(200 * time.Millisecond): // polling another process, with a deadline
		}
	}
	before, err := w.resetPeak()
	if err != nil {
		return fl, err
	}
	fl.RSSBeforeMB = before
	if err := publishAll(ctx, js, "telha.req.waits", [][]byte{[]byte(fmt.Sprintf(`{"request_id":"del-hub","op":"tombstone_node","tenant":"waits","id":%q}`, hub))}); err != nil {
		return fl, err
	}
	// Wait for the journal to be in flight, so the reads meet a fence.
	for {
		code, body, err := w.get(ctx, "/v1/tenants/waits/requests/del-hub")
		if err == nil && code == 200 && strings.Contains(string(body), `"in_flight"`) {
			break
		}
		if err == nil && code == 200 {
			fmt.Fprintln(stderr, "flood: waits: the hub's cascade finished before the reads began; raise --hub-edges for a longer fence")
			break
		}
		if time.Now().After(deadline) {
			return fl, fmt.Errorf("the hub's delete was not seen within 5m")
		}
		select {
		case <-ctx.Done():
			return fl, ctx.Err()
		case <-time.After(20 * time.Millisecond): // polling another process, with a deadline
		}
	}
	start := time.Now()
	var mu sync.Mutex
	var wg sync.WaitGroup
	peakG := 0
	stopG := make(chan struct{})
	go func() { // sample the worker's goroutines while the reads are out
		for {
			if g, _, err := w.metric(ctx, "go_goroutines"); err == nil {
				mu.Lock()
				peakG = max(peakG, int(g))
				mu.Unlock()
			}
			select {
			case <-stopG:
				return
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	for i := 0; i < o.waits; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			code, _, err := w.get(ctx, "/v1/tenants/waits/nodes/"+hub+"?wait=30")
			key := strconv.Itoa(code)
			if err != nil {
				key = "error"
			}
			mu.Lock()
			fl.Answers[key]++
			mu.Unlock()
		}()
	}
	wg.Wait()
	close(stopG)
	fl.Seconds = time.Since(start).Seconds()
	fl.PeakRSSGrowthMB = w.peakGrowth(before)
	fl.GoroutinesPeak = peakG
	if g, _, err := w.metric(ctx, "go_goroutines"); err == nil {
		fl.GoroutinesAfter = int(g)
	}
	for k := range fl.Answers {
		switch k {
		case "200", "404", "503":
		default:
			return fl, fmt.Errorf("answers the contract does not allow to a read: %v", fl.Answers)
		}
	}
	return fl, nil
}

func printReport(out io.Writer, rep *Report) {
	fmt.Fprintf(out, "telha-cascade floods (%s, %d CPUs)\n\n", rep.GoVersion, rep.CPUs)
	fmt.Fprintf(out, "%-6s %9s %11s %16s  %s\n", "flood", "seconds", "RSS MB", "peak growth MB", "answers and figures")
	for _, f := range rep.Floods {
		var extra []string
		keys := make([]string, 0, len(f.Answers))
		for k := range f.Answers {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			extra = append(extra, fmt.Sprintf("%s×%d", k, f.Answers[k]))
		}
		if f.MetricsBytes > 0 {
			extra = append(extra, fmt.Sprintf("/metrics %d bytes", f.MetricsBytes))
		}
		if f.DeadLettersStored > 0 {
			extra = append(extra, fmt.Sprintf("%d dead letters", f.DeadLettersStored))
		}
		if f.PageBytesMax > 0 {
			extra = append(extra, fmt.Sprintf("page ≤ %d bytes, ≤ %.3f s", f.PageBytesMax, f.PageSecondsMax))
		}
		if f.GoHeapPeakMB > 0 {
			extra = append(extra, fmt.Sprintf("Go heap in use peak %.0f MB", f.GoHeapPeakMB))
		}
		if f.GoroutinesPeak > 0 {
			extra = append(extra, fmt.Sprintf("goroutines peak %d, after %d", f.GoroutinesPeak, f.GoroutinesAfter))
		}
		fmt.Fprintf(out, "%-6s %9.2f %11.1f %16.1f  %s\n", f.Name, f.Seconds, f.RSSBeforeMB, f.PeakRSSGrowthMB, strings.Join(extra, ", "))
		fmt.Fprintf(out, "       (%s)\n", f.What)
	}
}

// floodBacklog: requests over many tenants published as fast as the
// server takes them, while the worker applies them; the worker process's
// peak RSS (the embedded NATS server included) and its Go heap, sampled.
func floodBacklog(ctx context.Context, o *options, w *worker, js jetstream.JetStream, stderr io.Writer) (Flood, error) {
	fl := Flood{Name: "backlog", What: fmt.Sprintf("%d put_node requests over %d tenants, published as fast as the server takes them", o.backlog, o.backlogTenants)}
	before, err := w.resetPeak()
	if err != nil {
		return fl, err
	}
	fl.RSSBeforeMB = before
	stop := make(chan struct{})
	var heapPeak float64
	var mu sync.Mutex
	go func() {
		for {
			if h, _, err := w.metric(ctx, "go_memstats_heap_inuse_bytes"); err == nil {
				mu.Lock()
				heapPeak = max(heapPeak, h/(1<<20))
				mu.Unlock()
			}
			select {
			case <-stop:
				return
			case <-time.After(500 * time.Millisecond):
			}
		}
	}()
	start := time.Now()
	fmt.Fprintf(stderr, "flood: backlog: publishing %d requests\n", o.backlog)
	const batch = 10_000
	for i := 0; i < o.backlog; i += batch {
		bodies := make([][]byte, 0, batch)
		for j := i; j < min(i+batch, o.backlog); j++ {
			t := fmt.Sprintf("t%d", j%o.backlogTenants)
			bodies = append(bodies, []byte(fmt.Sprintf(`{"request_id":"b-%d","op":"put_node","tenant":%q,"id":%q}`, j, t, uuid.NewString())))
		}
		for k, b := range bodies {
			j := i + k
			m := nats.NewMsg(fmt.Sprintf("telha.req.t%d", j%o.backlogTenants))
			m.Data = b
			_, err := js.PublishMsgAsync(m)
			for errors.Is(err, jetstream.ErrTooManyStalledMsgs) {
				select {
				case <-js.PublishAsyncComplete():
				case <-ctx.Done():
					close(stop)
					return fl, ctx.Err()
				}
				_, err = js.PublishMsgAsync(m)
			}
			if err != nil {
				close(stop)
				return fl, err
			}
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-ctx.Done():
		close(stop)
		return fl, ctx.Err()
	}
	// Wait until the worker has applied the last request of each tenant:
	// the stream is empty (a work queue deletes what is acked).
	s, err := js.Stream(ctx, "TELHA_REQ")
	if err != nil {
		close(stop)
		return fl, err
	}
	deadline := time.Now().Add(20 * time.Minute)
	for {
		info, err := s.Info(ctx)
		if err == nil && info.State.Msgs == 0 {
			break
		}
		if time.Now().After(deadline) {
			close(stop)
			return fl, fmt.Errorf("the backlog was not drained within 20m")
		}
		select {
		case <-ctx.Done():
			close(stop)
			return fl, ctx.Err()
		case <-time.After(500 * time.Millisecond): // polling another process, with a deadline
		}
	}
	close(stop)
	fl.Seconds = time.Since(start).Seconds()
	fl.PeakRSSGrowthMB = w.peakGrowth(before)
	mu.Lock()
	fl.GoHeapPeakMB = heapPeak
	mu.Unlock()
	fl.Answers = map[string]int{"drained": o.backlog}
	return fl, nil
}
