// The process-crash test of the worker: TestCrashKillRestart.
//
// Running it:
//
//	go test -race -count=1 ./crashtest                     # CI default: 20 kills, ~25-40 s on 2 cores
//	go test -count=1 ./crashtest -run Crash -kills 200 -v  # a longer run (~2 min)
//	TELHA_CRASH_KILLS=200 go test -count=1 ./crashtest     # the same, by environment
//
// Knobs (the flag wins over the environment variable):
//
//	-kills N     TELHA_CRASH_KILLS     SIGKILLs of the worker (default 20; 5 with -short)
//	-seed N      TELHA_CRASH_SEED      seed of every random choice of the load (default: clock)
//	-per-kill N  TELHA_CRASH_PER_KILL  requests published per kill cycle (default 150)
//
// The flags exist only in this package's test binary: pass them when
// testing ./crashtest alone (go test ./... -kills N fails in the other
// packages). The seed is logged at the start and on failure; -seed replays
// the same request stream (kill timing is not reproducible).
//
// What it does. It builds the real worker (go build ./cmd/worker, without
// -race, from the module root found with go env GOMOD), starts an embedded
// NATS JetStream server in the test process (so the broker survives every
// kill) and runs the worker binary on one data dir with --max-batch-ops 40
// (cascades of more than 7 edges are journaled), --reaper-schedule
// "@every 1s", --log-format json, --ack-wait 2s (messages a killed worker
// held come back quickly) and --max-deliver 1000 (each kill ends a delivery
// of every message the killed run held; with the default 5, a message held
// by five killed runs would never be delivered again). The load, published
// asynchronously with at most 128 publishes in flight, mixes puts of nodes
// and edges over three tenants ("a" and "ab" are prefixes of each other;
// node ids are reused across tenants), valid intervals from before 1970 to
// 2190 given in several RFC 3339 forms, self-loops, hubs of 10-60 edges
// whose cascades take the journaled path, requests racing those cascades
// (puts on the hub, its neighbours' cascades, tombstones of its edges),
// standalone edge tombstones and node cascades with past, present and
// future valid_ends (some narrowing an earlier future edge tombstone),
// requests for ids that never existed, invalid requests, and duplicates:
// the same Nats-Msg-Id again (the stream must drop it) and a new
// Nats-Msg-Id with the same request_id (the worker's exactly-once path).
// Meanwhile it SIGKILLs the worker (its own child, by pid) during startup
// (maybe mid-resume), as soon as /v1/journals lists a journal (mid-chunks),
// or at 100-800 ms after ready, and restarts it on the same data dir. After
// the last kill it starts it once more, waits until every request has a
// result, the request stream and the consumer are drained and /v1/journals
// is empty, and checks:
//
//   - results: every request has one outcome (copies and redeliveries
//     agree: same status, same tx_time), kept once in TELHA_RES; tx_time
//     set exactly on ok, RFC 3339 UTC with 6 fractional digits, strictly
//     increasing; invalid requests, and only those, are dead-lettered;
//   - the model: the ok results replayed in tx_time order are what the
//     rules allow (no resurrection, no edge on a dead endpoint, no double
//     tombstone; edges_tombstoned and journaled as CONTRACT §3 collects);
//     every refusal (not_found, already_tombstoned, endpoint_dead, invalid)
//     is what the model gives at some point of the serial order inside the
//     request's causal window (after the effects answered before it was
//     published, before those published after its answer);
//     cascade_in_flight needs a journaled cascade of a node it touches that
//     was committed before the answer and unfinished at the publish;
//   - exactly one effect: per request id, the versions carrying it in
//     provenance.request_id number 1 (puts, tombstone_edge) or
//     edges_tombstoned+1 (tombstone_node), all at its tx_time; none for
//     refusals; no version carries an unknown request id;
//   - the read API equals the model: whole histories of every entity (I2:
//     nothing before a cascade changed), point reads of nodes and edges and
//     node edge lists (out, in, both) at random coordinates (valid times
//     1880-2200 and around every version's bounds, tx times around every
//     ok tx_time, the server's defaults); I1: at sampled v >= valid_end,
//     t >= tx of every cascade, the node, every edge that ever touched it
//     and the edge lists of the node and its neighbours read it absent;
//   - histories on their own: ascending tx, nothing live after a
//     tombstone, at most one node tombstone, and a second edge tombstone
//     only if it starts strictly before the first (a cascade's narrowing);
//   - SIGTERM stops the last run with exit code 0.
//
// A request answered cascade_in_flight and applied on a redelivery of the
// same message (a kill between its result and its ack) fails the test:
// TELHA_RES keeps the first result per request id, so the stream would say
// "not applied" about an applied request. The same after the test's own
// second copy (same request_id), or a redelivery that ends in another
// refusal, is only noted.
//
// Each run's worker log (stderr, JSON) is a file in a temp dir; on failure
// the test prints the tails of the last runs and every ERROR/panic line.
package crashtest

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/telha/telha-cascade/internal/testnats"
	"github.com/telha/telha-cascade/queue"
)

var (
	flagKills   = flag.Int("kills", 0, "crashtest: number of SIGKILLs of the worker (default 20, or $TELHA_CRASH_KILLS)")
	flagSeed    = flag.Int64("seed", 0, "crashtest: seed of the load (default: from the clock, or $TELHA_CRASH_SEED)")
	flagPerKill = flag.Int("per-kill", 0, "crashtest: requests published per kill cycle (default 150, or $TELHA_CRASH_PER_KILL)")
	// flagLoseDisk runs the worker with --changelog jetstream and deletes
	// its Pebble directory after every third SIGKILL (issue 21: lose a
	// pod's disk, lose nothing): every check below must still hold.
	flagLoseDisk = flag.Bool("lose-disk", false, "crashtest: --changelog jetstream, and the Pebble directory deleted after every third kill (or $TELHA_CRASH_LOSE_DISK=1)")
)

const maxBatchOps = 40

func knob(flagVal int64, env string, def int64) int64 {
	if flagVal != 0 {
		return flagVal
	}
	if v := os.Getenv(env); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err == nil && n != 0 {
			return n
		}
	}
	return def
}

type resultObs struct {
	res queue.Result
	at  time.Time
}

type pubRec struct {
	kind      string
	msgID     string
	at        time.Time
	done      bool
	duplicate bool
	err       error
}

type reqState struct {
	req      *request
	firstPub time.Time
	pubs     []*pubRec
}

// harness is the upstream side: it publishes and records every result.
type harness struct {
	t      *testing.T
	client *queue.Client
	js     jetstream.JetStream

	mu      sync.Mutex
	reqs    map[string]*reqState
	order   []*reqState
	results map[string][]resultObs
	nres    int
	bad     []string

	sem        chan struct{}
	allowed    atomic.Int64
	published  atomic.Int64
	journalSig chan struct{}
	pubWG      sync.WaitGroup
}

func (h *harness) onResult(m *nats.Msg) {
	at := time.Now()
	var r queue.Result
	err := json.Unmarshal(m.Data, &r)
	h.mu.Lock()
	defer h.mu.Unlock()
	if err != nil {
		h.bad = append(h.bad, fmt.Sprintf("undecodable result on %s: %q", m.Subject, m.Data))
		return
	}
	h.results[r.RequestID] = append(h.results[r.RequestID], resultObs{res: r, at: at})
	h.nres++
}

// publishAll publishes total items, paced, never more than allowed.
func (h *harness) publishAll(g *generator, total int, pace time.Duration, stop <-chan struct{}) {
	for i := 0; i < total; i++ {
		for int64(i) >= h.allowed.Load() {
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
		}
		it := g.next()
		h.sem <- struct{}{}
		rec := &pubRec{kind: it.kind, msgID: it.msgID, at: time.Now()}
		h.mu.Lock()
		rs := h.reqs[it.req.rid]
		if rs == nil {
			rs = &reqState{req: it.req, firstPub: rec.at}
			h.reqs[it.req.rid] = rs
			h.order = append(h.order, rs)
		}
		rs.pubs = append(rs.pubs, rec)
		h.mu.Unlock()
		fut, err := h.client.PublishAsync(it.req.tenant, it.msgID, it.req.body)
		h.pubWG.Add(1)
		go h.await(rec, it, fut, err)
		h.published.Add(1)
		if it.req.hubCascade && it.kind == "orig" {
			select {
			case h.journalSig <- struct{}{}:
			default:
			}
		}
		select {
		case <-stop:
			return
		case <-time.After(pace):
		}
	}
}

func (h *harness) await(rec *pubRec, it *item, fut jetstream.PubAckFuture, err error) {
	defer h.pubWG.Done()
	defer func() { <-h.sem }()
	var ack *jetstream.PubAck
	if err == nil {
		select {
		case ack = <-fut.Ok():
		case err = <-fut.Err():
		}
	}
	for attempt := 0; err != nil && attempt < 10; attempt++ {
		time.Sleep(200 * time.Millisecond)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		ack, err = h.client.Publish(ctx, it.req.tenant, it.msgID, it.req.body)
		cancel()
	}
	h.mu.Lock()
	rec.done, rec.err = true, err
	if ack != nil {
		rec.duplicate = ack.Duplicate
	}
	h.mu.Unlock()
}

// missing returns the request ids without any result yet.
func (h *harness) missing() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []string
	for _, rs := range h.order {
		if len(h.results[rs.req.rid]) == 0 {
			out = append(out, rs.req.rid)
		}
	}
	return out
}

func TestCrashKillRestart(t *testing.T) {
	defKills := int64(20)
	if testing.Short() {
		defKills = 5
	}
	kills := int(knob(int64(*flagKills), "TELHA_CRASH_KILLS", defKills))
	seed := knob(*flagSeed, "TELHA_CRASH_SEED", time.Now().UnixNano()%1_000_000_000)
	perKill := int(knob(int64(*flagPerKill), "TELHA_CRASH_PER_KILL", 150))
	total := kills * perKill
	t.Logf("crashtest: seed %d, %d kills, %d publishes (replay the load with -seed %d)", seed, kills, total, seed)
	began := time.Now()

	tmp := t.TempDir()
	bin := buildWorker(t, tmp)
	logDir := t.TempDir()
	t.Logf("worker binary built in %s; logs in %s", time.Since(began).Round(time.Millisecond), logDir)

	ns := testnats.Start(t)
	nc := testnats.Connect(t, ns.ClientURL(), nats.MaxReconnects(-1))
	client, err := queue.NewClient(nc, queue.Config{})
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{
		t: t, client: client, js: client.JetStream(),
		reqs: map[string]*reqState{}, results: map[string][]resultObs{},
		sem: make(chan struct{}, 128), journalSig: make(chan struct{}, 1),
	}
	sub, err := nc.Subscribe("telha.res.*", h.onResult)
	if err != nil {
		t.Fatal(err)
	}
	_ = sub.SetPendingLimits(-1, -1)
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}

	runner := &workerRunner{
		t: t, bin: bin, dataDir: t.TempDir(), logDir: logDir, addr: testnats.FreeAddr(t),
	}
	runner.args = []string{
		"--data-dir", runner.dataDir, "--http-addr", runner.addr, "--nats-url", ns.ClientURL(),
		"--max-batch-ops", strconv.Itoa(maxBatchOps), "--reaper-schedule", "@every 1s", "--log-format", "json",
		"--ack-wait", "2s", "--max-deliver", "1000",
	}
	loseDisk := *flagLoseDisk || os.Getenv("TELHA_CRASH_LOSE_DISK") == "1"
	if loseDisk {
		runner.args = append(runner.args, "--changelog", "jetstream", "--checkpoint-schedule", "@every 2s", "--checkpoints-keep", "1")
	}
	var disksLost int
	t.Cleanup(runner.stopAll)
	defer func() {
		if t.Failed() {
			t.Logf("crashtest FAILED with seed %d (replay the load with -seed %d)", seed, seed)
			runner.dumpLogs(3, 40)
		}
	}()

	// The kill phase.
	killStart := time.Now()
	gen := newGenerator(seed)
	killRng := rand.New(rand.NewPCG(uint64(seed), 0x4b11))
	stop := make(chan struct{})
	stopPublisher := sync.OnceFunc(func() { close(stop) })
	defer stopPublisher()
	pubDone := make(chan struct{})
	var startupKills, journalKills, hubKills, readyKills int
	for k := 0; k < kills; k++ {
		p := runner.start()
		h.allowed.Store(int64(min(total, perKill*(k+1))))
		mode := killRng.IntN(100)
		if k > 0 && mode < 15 {
			// During startup: maybe in the middle of resuming journals.
			d := time.Duration(killRng.IntN(400)) * time.Millisecond
			select {
			case <-p.done:
				t.Fatalf("worker run %d exited on its own during startup: %v\n%s", p.n, p.err, p.tail(40))
			case <-time.After(d):
			}
			if !p.kill() {
				t.Fatalf("worker run %d exited on its own: %v\n%s", p.n, p.err, p.tail(40))
			}
			startupKills++
			continue
		}
		if err := runner.waitReady(p, 60*time.Second); err != nil {
			t.Fatalf("%v\n%s", err, p.tail(40))
		}
		if k == 0 {
			go func() {
				defer close(pubDone)
				h.publishAll(gen, total, 2*time.Millisecond, stop)
			}()
		}
		var delay time.Duration
		if mode < 55 {
			// Right after a hub's cascade (likely journaled) was published:
			// as soon as /v1/journals lists a journal (its chunks are being
			// applied), or a little later.
			select {
			case <-h.journalSig:
			default:
			}
			hunt := time.Now()
			switch {
			case runner.huntJournal(p, 700*time.Millisecond):
				if killRng.IntN(3) == 0 {
					delay = time.Duration(killRng.IntN(2000)) * time.Microsecond
				}
				journalKills++
			case time.Since(hunt) < 700*time.Millisecond:
				// the process exited; caught below
			default:
				select {
				case <-h.journalSig:
					delay = time.Duration(killRng.IntN(30)) * time.Millisecond
					hubKills++
				default:
					readyKills++
				}
			}
		} else {
			delay = time.Duration(100+killRng.IntN(700)) * time.Millisecond
			readyKills++
		}
		select {
		case <-p.done:
		case <-time.After(delay):
		}
		if !p.kill() {
			t.Fatalf("worker run %d exited on its own: %v\n%s", p.n, p.err, p.tail(40))
		}
		if loseDisk && k%3 == 2 {
			if err := os.RemoveAll(filepath.Join(runner.dataDir, "pebble")); err != nil {
				t.Fatal(err)
			}
			disksLost++
		}
	}
	if loseDisk {
		t.Logf("lose-disk: the Pebble directory was deleted after %d of the kills", disksLost)
	}
	t.Logf("kill phase: %d kills (%d during startup, %d while /v1/journals listed a journal, %d soon after a hub cascade was published, %d at random delays after ready) in %s; %d of %d published",
		kills, startupKills, journalKills, hubKills, readyKills, time.Since(killStart).Round(time.Millisecond), h.published.Load(), total)

	// The last run: it must finish everything.
	final := runner.start()
	h.allowed.Store(int64(total))
	if err := runner.waitReady(final, 60*time.Second); err != nil {
		t.Fatalf("%v\n%s", err, final.tail(40))
	}
	if kills == 0 {
		go func() {
			defer close(pubDone)
			h.publishAll(gen, total, 2*time.Millisecond, stop)
		}()
	}
	select {
	case <-pubDone:
	case <-time.After(5 * time.Minute):
		t.Fatal("publisher did not finish within 5 minutes")
	}
	h.pubWG.Wait()
	drainStart := time.Now()

	// Every request answered (no new result for 45s while some are missing
	// is a failure).
	lastN, lastProgress := -1, time.Now()
	for {
		miss := h.missing()
		if len(miss) == 0 {
			break
		}
		h.mu.Lock()
		n := h.nres
		h.mu.Unlock()
		if n != lastN {
			lastN, lastProgress = n, time.Now()
		}
		if final.exited() {
			t.Fatalf("the last worker run exited: %v\n%s", final.err, final.tail(40))
		}
		if time.Since(lastProgress) > 45*time.Second {
			h.describeMissing(t, miss)
			t.FailNow()
		}
		time.Sleep(50 * time.Millisecond)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if msg := waitDrained(ctx, h.js, runner); msg != "" {
		t.Fatal(msg)
	}
	t.Logf("drained %s after the last publish", time.Since(drainStart).Round(time.Millisecond))

	// A subscriber sees a result a moment before TELHA_RES has stored it:
	// poll (with a deadline) until every result the subscription saw is
	// stored, instead of sleeping.
	var stored map[string][]queue.Result
	storeDeadline := time.Now().Add(10 * time.Second)
	for {
		var err error
		if stored, err = readResults(ctx, h.js); err != nil {
			t.Fatalf("reading TELHA_RES: %v", err)
		}
		if h.allStored(stored) || time.Now().After(storeDeadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	dlq, err := readDeadLetters(ctx, h.js)
	if err != nil {
		t.Fatalf("reading TELHA_DLQ: %v", err)
	}
	if d, _ := sub.Dropped(); d > 0 {
		t.Errorf("the result subscription dropped %d messages", d)
	}

	// Results.
	h.mu.Lock()
	order := append([]*reqState(nil), h.order...)
	results := map[string][]resultObs{}
	for k, v := range h.results {
		results[k] = append([]resultObs(nil), v...)
	}
	bad := append([]string(nil), h.bad...)
	h.mu.Unlock()
	rep := &report{t: t}
	for _, b := range bad {
		rep.fail("%s", b)
	}
	effects, refusals := analyseResults(rep, order, results, stored)
	checkDeadLetters(rep, order, dlq)

	// The model.
	w, violations := replay(effects)
	for _, v := range violations {
		rep.fail("model: %s", v)
	}
	b := newBounds(effects)
	for _, rf := range refusals {
		var msg string
		if rf.status == queue.StatusCascadeInFlight {
			msg = w.checkInFlight(b, rf.rs, rf.at)
		} else {
			msg = w.checkRefusal(b, rf.rs, rf.status, rf.at)
		}
		if msg != "" {
			rep.fail("refusal: %s", msg)
		}
	}

	// The store through the read API.
	checkStart := time.Now()
	c := newChecker(runner.base(), w, seed)
	var journals struct {
		Journals []json.RawMessage `json:"journals"`
	}
	if code, err := c.get("/v1/journals", &journals); err != nil || code != http.StatusOK || journals.Journals == nil || len(journals.Journals) != 0 {
		rep.fail("GET /v1/journals: %d %v %v: want 200 with an empty list", code, err, journals.Journals)
	}
	tasks := c.buildTasks(order)
	c.run(4, tasks)
	for _, f := range c.failures {
		rep.fail("api: %s", f)
	}
	if c.nfail > len(c.failures) {
		rep.fail("api: ... and %d more read-API failures", c.nfail-len(c.failures))
	}
	checkEffects(rep, order, effects, c)
	t.Logf("read-API checks: %d GETs in %s", c.gets.Load(), time.Since(checkStart).Round(time.Millisecond))

	// SIGTERM drains and exits 0.
	if code := final.term(70 * time.Second); code != 0 {
		rep.fail("SIGTERM: the last worker run exited with code %d, want 0\n%s", code, final.tail(20))
	}

	// Summary.
	var nJournaled, nCascades int
	for _, e := range effects {
		if e.rs.req.op == "tombstone_node" {
			nCascades++
			if e.res.Journaled {
				nJournaled++
			}
		}
	}
	byStatus := map[string]int{}
	for _, rs := range order {
		byStatus[effectiveStatus(results[rs.req.rid])]++
	}
	resumed := len(runner.logLines(1<<20, `"msg":"resuming cascade journal"`))
	t.Logf("crashtest: seed %d: %d kills, %d worker runs, %d requests (%d publishes), results by status %v, %d node cascades (%d journaled, %d journal resumes after a kill), %d read-API GETs, %d failures; total %s",
		seed, kills, len(runner.runs), len(order), h.published.Load(), byStatus, nCascades, nJournaled, resumed, c.gets.Load(), rep.n, time.Since(began).Round(time.Millisecond))
	for _, f := range rep.notes {
		t.Log("note: " + f)
	}
	if msgs := logSummary(runner.logLines(1<<20, `"level":"WARN"`, `"level":"ERROR"`)); msgs != "" {
		t.Logf("worker WARN/ERROR log messages (all runs): %s", msgs)
	}
}

// report collects failures (printed, capped) and notes.
type report struct {
	t     *testing.T
	n     int
	notes []string
}

func (r *report) fail(format string, args ...any) {
	r.t.Helper()
	r.n++
	if r.n <= 80 {
		r.t.Errorf(format, args...)
	} else if r.n == 81 {
		r.t.Errorf("... more failures not shown")
	}
}

func (r *report) note(format string, args ...any) {
	if len(r.notes) < 20 {
		r.notes = append(r.notes, fmt.Sprintf(format, args...))
	}
}

func (h *harness) describeMissing(t *testing.T, miss []string) {
	t.Errorf("%d requests without a result after the last restart (no progress for 45s); first ones:", len(miss))
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, rid := range miss[:min(len(miss), 15)] {
		rs := h.reqs[rid]
		var pubs []string
		for _, p := range rs.pubs {
			pubs = append(pubs, fmt.Sprintf("%s msgid=%s err=%v dup=%v", p.kind, p.msgID, p.err, p.duplicate))
		}
		t.Errorf("  %s %s %s %s: published %v", rid, rs.req.tenant, rs.req.op, rs.req.id, pubs)
	}
}

// waitDrained waits until the request stream is empty, the consumer has
// nothing pending, and /v1/journals lists none.
func waitDrained(ctx context.Context, js jetstream.JetStream, runner *workerRunner) string {
	last := ""
	for ctx.Err() == nil {
		last = drainState(ctx, js, runner)
		if last == "" {
			return ""
		}
		time.Sleep(100 * time.Millisecond)
	}
	return "not drained within 2 minutes: " + last
}

func drainState(ctx context.Context, js jetstream.JetStream, runner *workerRunner) string {
	s, err := js.Stream(ctx, "TELHA_REQ")
	if err != nil {
		return err.Error()
	}
	si, err := s.Info(ctx)
	if err != nil {
		return err.Error()
	}
	if si.State.Msgs != 0 {
		return fmt.Sprintf("TELHA_REQ holds %d messages", si.State.Msgs)
	}
	cons, err := s.Consumer(ctx, "telha-worker-0")
	if err != nil {
		return err.Error()
	}
	ci, err := cons.Info(ctx)
	if err != nil {
		return err.Error()
	}
	if ci.NumAckPending != 0 || ci.NumPending != 0 {
		return fmt.Sprintf("consumer: %d pending, %d ack pending", ci.NumPending, ci.NumAckPending)
	}
	resp, err := http.Get(runner.base() + "/v1/journals")
	if err != nil {
		return err.Error()
	}
	defer resp.Body.Close()
	var j struct {
		Journals []json.RawMessage `json:"journals"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&j); err != nil {
		return err.Error()
	}
	if len(j.Journals) != 0 {
		return fmt.Sprintf("%d journals remain: %s", len(j.Journals), j.Journals[0])
	}
	return ""
}

// readResults reads every result TELHA_RES kept (after Nats-Msg-Id dedup):
// the first per request id.
// allStored reports whether every request id the result subscription saw
// has a result stored in TELHA_RES.
func (h *harness) allStored(stored map[string][]queue.Result) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	for id := range h.results {
		if len(stored[id]) == 0 {
			return false
		}
	}
	return true
}

func readResults(ctx context.Context, js jetstream.JetStream) (map[string][]queue.Result, error) {
	s, err := js.Stream(ctx, "TELHA_RES")
	if err != nil {
		return nil, err
	}
	si, err := s.Info(ctx)
	if err != nil {
		return nil, err
	}
	out := map[string][]queue.Result{}
	if si.State.Msgs == 0 {
		return out, nil
	}
	oc, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	if err != nil {
		return nil, err
	}
	got := uint64(0)
	for got < si.State.Msgs {
		batch, err := oc.Fetch(1000, jetstream.FetchMaxWait(2*time.Second))
		if err != nil {
			return nil, err
		}
		n := 0
		for m := range batch.Messages() {
			n++
			got++
			var r queue.Result
			if err := json.Unmarshal(m.Data(), &r); err != nil {
				return nil, fmt.Errorf("undecodable stored result %q", m.Data())
			}
			out[r.RequestID] = append(out[r.RequestID], r)
		}
		if n == 0 && ctx.Err() != nil {
			return nil, ctx.Err()
		}
	}
	return out, nil
}

// readDeadLetters returns the request ids of TELHA_DLQ's messages, with
// their Telha-Error headers.
func readDeadLetters(ctx context.Context, js jetstream.JetStream) (map[string][]string, error) {
	out := map[string][]string{}
	s, err := js.Stream(ctx, "TELHA_DLQ")
	if err != nil {
		return nil, err
	}
	si, err := s.Info(ctx)
	if err != nil {
		return nil, err
	}
	for seq := si.State.FirstSeq; si.State.Msgs > 0 && seq <= si.State.LastSeq; seq++ {
		m, err := s.GetMsg(ctx, seq)
		if err != nil {
			continue
		}
		var head struct {
			RequestID string `json:"request_id"`
		}
		_ = json.Unmarshal(m.Data, &head)
		out[head.RequestID] = append(out[head.RequestID], m.Header.Get("Telha-Error"))
	}
	return out, nil
}

// checkDeadLetters: exactly the requests that are invalid by construction
// are dead-lettered, once per copy the request stream stored (every copy:
// it keeps no duplicate window; redeliveries of a copy are deduplicated).
func checkDeadLetters(rep *report, order []*reqState, dlq map[string][]string) {
	byRid := map[string]*reqState{}
	for _, rs := range order {
		byRid[rs.req.rid] = rs
		if rs.req.invalid == "" {
			continue
		}
		copies := len(rs.pubs) // every copy is stored (no duplicate window)
		if n := len(dlq[rs.req.rid]); n != copies {
			rep.fail("request %s (%s): %d dead letters, want one per stored copy: %d", rs.req.rid, rs.req.invalid, n, copies)
		}
	}
	for rid, errs := range dlq {
		rs := byRid[rid]
		if rs != nil && rs.req.invalid == "" && appliedInvalid(errs) {
			continue // found invalid when applied (an edge's endpoints changed): dead-lettered too (CONTRACT §5)
		}
		if rs == nil || rs.req.invalid == "" {
			rep.fail("request %q dead-lettered, but it is not invalid: %v", rid, errs)
		}
	}
}

// appliedInvalid reports whether every dead letter of a request says it
// was found invalid when applied (the error of an invalid outcome, which
// starts with the sentinel's "invalid: ").
func appliedInvalid(errs []string) bool {
	for _, e := range errs {
		if !strings.HasPrefix(e, "invalid: ") {
			return false
		}
	}
	return len(errs) > 0
}

type refusal struct {
	rs     *reqState
	status string
	at     time.Time // first arrival of a result with this status
}

var finalStatuses = map[string]bool{
	queue.StatusOK: true, queue.StatusNotFound: true, queue.StatusAlreadyTombstoned: true,
	queue.StatusEndpointDead: true, queue.StatusInvalid: true, queue.StatusFailed: true,
}

func effectiveStatus(obs []resultObs) string {
	st := ""
	for _, o := range obs {
		if o.res.Status == queue.StatusOK {
			return queue.StatusOK
		}
		if finalStatuses[o.res.Status] || st == "" {
			st = o.res.Status
		}
	}
	if st == "" {
		return "none"
	}
	return st
}

// analyseResults checks every request's results and splits them into
// effects (ok) and refusals to check against the model.
func analyseResults(rep *report, order []*reqState, results map[string][]resultObs, stored map[string][]queue.Result) ([]*effect, []refusal) {
	var effects []*effect
	var refusals []refusal
	published := map[string]bool{}
	retriedInFlight := 0
	for _, rs := range order {
		r := rs.req
		published[r.rid] = true
		for _, p := range rs.pubs {
			if p.err != nil {
				rep.fail("request %s: publish %s (Nats-Msg-Id %s) failed: %v", r.rid, p.kind, p.msgID, p.err)
			}
		}
		// The request stream keeps no duplicate window (issue 20 item 1):
		// a second publish with the same Nats-Msg-Id is stored and answered
		// from the receipt, which the checks below cover.
		for _, p := range rs.pubs {
			if p.err == nil && p.duplicate {
				rep.fail("request %s: a publish with Nats-Msg-Id %s was dropped as a duplicate (the request stream keeps no window)", r.rid, p.msgID)
			}
		}
		obs := results[r.rid]
		if len(obs) == 0 {
			rep.fail("request %s (%s %s %s): no result", r.rid, r.tenant, r.op, r.id)
			continue
		}
		st := stored[r.rid]
		if len(st) == 0 {
			rep.fail("request %s (%s %s %s): no result in TELHA_RES", r.rid, r.tenant, r.op, r.id)
		} else {
			// One stored result per distinct answer (issue 20 item 8): the
			// same answer twice means the result id did not deduplicate.
			seen := map[string]bool{}
			for _, x := range st {
				if seen[queue.ResultMsgID(x)] {
					rep.fail("request %s: the same answer %s stored twice in TELHA_RES (its Nats-Msg-Id must deduplicate)", r.rid, x.Status)
				}
				seen[queue.ResultMsgID(x)] = true
			}
		}
		var okObs []resultObs
		finals := map[string]time.Time{}
		inFlight := time.Time{}
		for _, o := range obs {
			res := o.res
			if res.Tenant != r.tenant || res.Op != r.op || res.ID != r.id.String() {
				rep.fail("request %s: result names tenant %q op %q id %q, want %q %q %q", r.rid, res.Tenant, res.Op, res.ID, r.tenant, r.op, r.id)
			}
			if res.Status == queue.StatusOK {
				if _, err := parseTx(res.TxTime); err != nil {
					rep.fail("request %s: ok result: %v", r.rid, err)
					continue
				}
				if res.Error != "" {
					rep.fail("request %s: ok result with error %q", r.rid, res.Error)
				}
				okObs = append(okObs, o)
			} else if res.TxTime != "" {
				rep.fail("request %s: %s result with tx_time %q (want empty)", r.rid, res.Status, res.TxTime)
			}
			if (res.Status != queue.StatusOK || r.op != "tombstone_node") && (res.EdgesTombstoned != 0 || res.Journaled) {
				rep.fail("request %s: %s %s result with edges_tombstoned %d journaled %v", r.rid, r.op, res.Status, res.EdgesTombstoned, res.Journaled)
			}
			switch {
			case res.Status == queue.StatusCascadeInFlight:
				if inFlight.IsZero() {
					inFlight = o.at
				}
			case finalStatuses[res.Status]:
				if _, ok := finals[res.Status]; !ok {
					finals[res.Status] = o.at
				}
			default:
				rep.fail("request %s: unknown status %q", r.rid, res.Status)
			}
		}
		if len(finals) > 1 {
			var ss []string
			for s := range finals {
				ss = append(ss, s)
			}
			sort.Strings(ss)
			rep.fail("request %s (%s %s %s): conflicting results %v: a request id must have one outcome", r.rid, r.tenant, r.op, r.id, ss)
			continue
		}
		for _, o := range okObs[min(1, len(okObs)):] {
			a, b := okObs[0].res, o.res
			if a.TxTime != b.TxTime || a.EdgesTombstoned != b.EdgesTombstoned || a.Journaled != b.Journaled {
				rep.fail("request %s: two ok results differ: tx %s edges %d journaled %v vs tx %s edges %d journaled %v (a duplicate must return the stored receipt)",
					r.rid, a.TxTime, a.EdgesTombstoned, a.Journaled, b.TxTime, b.EdgesTombstoned, b.Journaled)
			}
		}
		if r.invalid != "" {
			if _, ok := finals[queue.StatusInvalid]; !ok || len(finals) != 1 {
				rep.fail("request %s (%s, %s): results %v, want invalid", r.rid, r.op, r.invalid, statuses(obs))
			}
			continue
		}
		if _, ok := finals[queue.StatusFailed]; ok {
			rep.fail("request %s (%s %s %s): status failed (dead-lettered after transient failures): %s", r.rid, r.tenant, r.op, r.id, obs[0].res.Error)
			continue
		}
		if len(okObs) > 0 {
			tx, _ := parseTx(okObs[0].res.TxTime)
			effects = append(effects, &effect{rs: rs, res: okObs[0].res, tx: tx, recv: okObs[0].at})
		}
		if !inFlight.IsZero() && len(finals) == 1 {
			// A cascade_in_flight answer is not a receipt: a later delivery of
			// the same request id (a duplicate publish, or a redelivery after a
			// kill between the result and the ack) decides again. TELHA_RES
			// keeps only the first result per request id.
			dupPublished := false
			for _, p := range rs.pubs {
				if p.kind == "dup-new-msgid" {
					dupPublished = true
				}
			}
			switch {
			case len(okObs) > 0 && firstStatus(st) != queue.StatusOK && !dupPublished:
				// Nobody retried: the only copy was answered "retryable, not
				// applied", then applied on a redelivery, and the results
				// stream keeps the answer that contradicts the store.
				rep.fail("request %s (%s %s %s): took effect (tx %s) on a redelivery after it was answered cascade_in_flight; results %v; TELHA_RES keeps %q (Nats-Msg-Id res-<request_id> drops the ok)",
					r.rid, r.tenant, r.op, r.id, okObs[0].res.TxTime, statuses(obs), firstStatus(st))
			case len(okObs) > 0 && firstStatus(st) != queue.StatusOK:
				rep.note("request %s (%s %s): answered cascade_in_flight, then ok for the test's second copy (same request_id, new Nats-Msg-Id); TELHA_RES keeps %q", r.rid, r.op, r.id, firstStatus(st))
			case !dupPublished:
				retriedInFlight++
				rep.note("request %s (%s %s): answered cascade_in_flight, then %s on a redelivery; TELHA_RES keeps %q", r.rid, r.op, r.id, statuses(obs), firstStatus(st))
			}
		}
		for s, at := range finals {
			if s != queue.StatusOK {
				refusals = append(refusals, refusal{rs: rs, status: s, at: at})
			}
		}
		if len(finals) == 0 {
			refusals = append(refusals, refusal{rs: rs, status: queue.StatusCascadeInFlight, at: inFlight})
		}
	}
	for rid := range results {
		if !published[rid] {
			rep.fail("a result for request id %q that the test never published: %+v", rid, results[rid][0].res)
		}
	}
	if retriedInFlight > 0 {
		rep.note("%d requests were answered cascade_in_flight and later decided again by a redelivery of the same message", retriedInFlight)
	}
	return effects, refusals
}

func statuses(obs []resultObs) []string {
	var out []string
	for _, o := range obs {
		out = append(out, o.res.Status)
	}
	return out
}

// firstStatus is the status of the latest answer TELHA_RES keeps (it keeps
// every distinct answer, in order: issue 20 item 8).
func firstStatus(rs []queue.Result) string {
	if len(rs) == 0 {
		return ""
	}
	return rs[len(rs)-1].Status
}

// checkEffects is "exactly one effect": per request id, the versions that
// carry it (seen in the histories the checker read) against the result.
func checkEffects(rep *report, order []*reqState, effects []*effect, c *checker) {
	byRid := map[string]*effect{}
	for _, e := range effects {
		byRid[e.rs.req.rid] = e
	}
	known := map[string]bool{}
	for _, rs := range order {
		rid := rs.req.rid
		known[rid] = true
		want := 0
		e := byRid[rid]
		if e != nil {
			want = 1
			if rs.req.op == "tombstone_node" {
				want += int(e.res.EdgesTombstoned)
			}
		}
		c.mu.Lock()
		got := c.ridVersions[rid]
		txs := c.ridTx[rid]
		c.mu.Unlock()
		if got != want {
			rep.fail("request %s (%s %s %s, status %s): %d versions carry its request id, want %d", rid, rs.req.tenant, rs.req.op, rs.req.id, statusOf(e), got, want)
		}
		if e != nil && got > 0 && (len(txs) != 1 || !txs[e.res.TxTime]) {
			var ts []string
			for k := range txs {
				ts = append(ts, k)
			}
			rep.fail("request %s: its versions have tx_from %v, want exactly its tx_time %s", rid, ts, e.res.TxTime)
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for rid, n := range c.ridVersions {
		if !known[rid] {
			rep.fail("%d versions carry request id %q, which the test never published", n, rid)
		}
	}
}

// logSummary counts log lines by level and message.
func logSummary(lines []string) string {
	counts := map[string]int{}
	for _, l := range lines {
		if i := strings.Index(l, "{"); i >= 0 {
			var rec struct {
				Level string `json:"level"`
				Msg   string `json:"msg"`
			}
			if json.Unmarshal([]byte(l[i:]), &rec) == nil {
				counts[rec.Level+" "+rec.Msg]++
				continue
			}
		}
		counts["unparsed"]++
	}
	var keys []string
	for k := range counts {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var out []string
	for _, k := range keys {
		out = append(out, fmt.Sprintf("%q x%d", k, counts[k]))
	}
	return strings.Join(out, ", ")
}

func statusOf(e *effect) string {
	if e == nil {
		return "not ok"
	}
	return "ok"
}
