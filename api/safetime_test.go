package api_test

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/telha/telha-cascade/api"
	"github.com/telha/telha-cascade/cascade"
	"github.com/telha/telha-cascade/storage"
)

// Safe time (CONTRACT §6): every read is answered at a coordinate nothing
// can change any more, and says which (as_of_valid, as_of_tx). These tests
// race readers against a journaled cascade applied chunk by chunk (and
// crashed in the middle), and against a group commit paused between
// taking its tx and committing.

// safeWorld is a reopenable store (a process restart) with a fault
// engine, a cascade engine that leaves journals to the test, and the read
// API over them.
type safeWorld struct {
	t     testing.TB
	dir   string
	clock *storage.ManualClock
	fault *storage.FaultEngine
	store *storage.Store
	ops   *cascade.Ops
	h     atomic.Pointer[http.Handler]
}

func newSafeWorld(t testing.TB) *safeWorld {
	w := &safeWorld{t: t, dir: t.TempDir(), clock: storage.NewManualClock(t0)}
	w.open()
	t.Cleanup(w.close)
	return w
}

func (w *safeWorld) open() {
	st, err := storage.OpenStore(w.dir, storage.Options{Clock: w.clock, Logger: quiet, WrapEngine: func(inner storage.Engine) storage.Engine {
		w.fault = storage.NewFaultEngine(inner)
		return w.fault
	}})
	if err != nil {
		w.t.Fatal(err)
	}
	w.store = st
	w.ops = cascade.New(st, cascade.Options{ChunkOps: 2_000, Logger: quiet})
	h := api.Handler(st, api.Options{ReadAPI: true, Now: w.clock.Now, Logger: quiet})
	w.h.Store(&h)
}

func (w *safeWorld) close() {
	if w.store != nil {
		_ = w.store.Close() // after an injected crash the store reports it
		w.store = nil
	}
}

func (w *safeWorld) get(path string) response {
	rec := httptest.NewRecorder()
	(*w.h.Load()).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
	return response{rec.Code, rec.Header().Get("Content-Type"), rec.Body.Bytes(), rec.Header()}
}

// hub writes a node with n edges to fresh neighbours (out and in
// alternately), 10,000 edges per transaction, and returns it and its edges.
func (w *safeWorld) hub(sc storage.Scope, n int) (uuid.UUID, []uuid.UUID) {
	w.t.Helper()
	hub := uuid.New()
	edges := make([]uuid.UUID, 0, n)
	open := func(v storage.NodeWrite) storage.NodeWrite {
		v.ValidFrom, v.ValidTo = storage.NoTs, storage.NoTs
		return v
	}
	if _, err := w.ops.PutNode(context.Background(), sc, open(storage.NodeWrite{ID: hub})); err != nil {
		w.t.Fatal(err)
	}
	for len(edges) < n {
		step := min(10_000, n-len(edges))
		err := w.store.Update(context.Background(), func(t *storage.Txn) error {
			for i := 0; i < step; i++ {
				m, id := uuid.New(), uuid.New()
				if _, err := t.PutNode(sc, open(storage.NodeWrite{ID: m})); err != nil {
					return err
				}
				src, dst := hub, m
				if i%2 == 1 {
					src, dst = m, hub
				}
				if _, err := t.PutEdge(sc, storage.EdgeWrite{ID: id, Src: src, Dst: dst, Label: "rel", ValidFrom: storage.NoTs, ValidTo: storage.NoTs}); err != nil {
					return err
				}
				edges = append(edges, id)
			}
			return nil
		})
		if err != nil {
			w.t.Fatal(err)
		}
	}
	return hub, edges
}

// answer is one read: what was asked, the coordinate it was answered at,
// and the data (the body without the coordinate fields; for a walk, the
// edge count and a digest of the sorted edge ids).
type answer struct {
	path      string // without valid, tx or cursor
	walk      bool
	code      int
	data      string
	asOfValid string
	asOfTx    string
	inFlight  bool
	edges     int // a walk's edge count
}

func (a answer) tx(t testing.TB) storage.Ts {
	tm, err := time.Parse(time.RFC3339Nano, a.asOfTx)
	if err != nil {
		t.Fatalf("%s: as_of_tx %q: %v", a.path, a.asOfTx, err)
	}
	return storage.TsFromTime(tm)
}

func withQuery(path string, kv ...string) string {
	q := url.Values{}
	for i := 0; i < len(kv); i += 2 {
		if kv[i+1] != "" {
			q.Set(kv[i], kv[i+1])
		}
	}
	if len(q) == 0 {
		return path
	}
	sep := "?"
	if slices.Contains([]byte(path), '?') {
		sep = "&"
	}
	return path + sep + q.Encode()
}

// read reads an entity at (valid, tx) ("" for the default) and records it.
func (w *safeWorld) read(path, valid, tx, wait string) (answer, error) {
	r := w.get(withQuery(path, "valid", valid, "tx", tx, "wait", wait))
	var body map[string]json.RawMessage
	if err := json.Unmarshal(r.body, &body); err != nil {
		return answer{}, fmt.Errorf("GET %s: %d %s: %w", path, r.code, r.body, err)
	}
	if r.code != http.StatusOK && r.code != http.StatusNotFound {
		return answer{}, fmt.Errorf("GET %s: %d %s", path, r.code, r.body)
	}
	a := answer{path: path, code: r.code, inFlight: body["cascade_in_flight"] != nil}
	_ = json.Unmarshal(body["as_of_valid"], &a.asOfValid)
	_ = json.Unmarshal(body["as_of_tx"], &a.asOfTx)
	for _, k := range []string{"as_of_valid", "as_of_tx", "cascade_in_flight", "error"} {
		delete(body, k)
	}
	data, _ := json.Marshal(body)
	a.data = string(data)
	return a, nil
}

// walk reads every page of a node's edges, the first at (valid, tx), and
// fails unless every page answers at the first page's coordinate.
func (w *safeWorld) walk(node uuid.UUID, valid, tx string) (answer, error) {
	path := "/v1/tenants/acme/nodes/" + node.String() + "/edges"
	a := answer{path: path, walk: true, code: http.StatusOK}
	var ids []string
	var cursor string
	for page := 0; ; page++ {
		p := withQuery(path, "limit", "10000", "cursor", cursor)
		if page == 0 {
			p = withQuery(p, "valid", valid, "tx", tx)
		}
		r := w.get(p)
		if r.code != http.StatusOK {
			return a, fmt.Errorf("GET %s: %d %s", p, r.code, r.body)
		}
		var pg struct {
			edgePage
			InFlight any `json:"cascade_in_flight"`
		}
		if err := json.Unmarshal(r.body, &pg); err != nil {
			return a, err
		}
		if page == 0 {
			a.asOfValid, a.asOfTx, a.inFlight = pg.AsOfValid, pg.AsOfTx, pg.InFlight != nil
		} else if pg.AsOfValid != a.asOfValid || pg.AsOfTx != a.asOfTx {
			return a, fmt.Errorf("page %d answered at (%s, %s), the walk at (%s, %s)", page, pg.AsOfValid, pg.AsOfTx, a.asOfValid, a.asOfTx)
		}
		for _, v := range pg.Edges {
			ids = append(ids, v.ID)
		}
		if pg.Next == nil {
			break
		}
		cursor = *pg.Next
	}
	slices.Sort(ids)
	a.edges = len(ids)
	a.data = fmt.Sprintf("%d %x", len(ids), sha256.Sum256([]byte(fmt.Sprint(ids))))
	return a, nil
}

// again reads an answer's coordinate again, explicitly.
func (w *safeWorld) again(a answer) (answer, error) {
	if a.walk {
		return w.walk(uuid.MustParse(a.path[len("/v1/tenants/acme/nodes/"):len("/v1/tenants/acme/nodes/")+36]), a.asOfValid, a.asOfTx)
	}
	return w.read(a.path, a.asOfValid, a.asOfTx, "")
}

// cascadeRun is a journaled cascade of a hub raced by readers.
type cascadeRun struct {
	w     *safeWorld
	sc    storage.Scope
	hub   uuid.UUID
	edges []uuid.UUID
	j     storage.Ts // the journal's tx

	mu      sync.Mutex
	answers []answer
	reads   atomic.Int64
	readSig chan struct{}
	// walks is how many more whole walks of the hub's edges the readers
	// may do (a walk of a 200k-edge hub reads 200k edges; the other reads
	// are point reads).
	walks atomic.Int64
	// The readers read at most perChunk*2 times per chunk applied (so the
	// answers, all read again at the end, stay in proportion to the
	// cascade, not to how fast the readers spin).
	perChunk int64
	chunkMu  sync.Mutex
	chunks   int64
	chunkSig chan struct{} // closed and replaced when a chunk is applied
	// gone is closed when a reader failed: the gate stops holding.
	gone     chan struct{}
	goneOnce sync.Once
}

// check fails unless a shows the hub and its edges all before the cascade
// (answered below its tx) or all after (at or above it).
func (c *cascadeRun) check(a answer) error {
	before := a.tx(c.w.t) < c.j
	switch {
	case a.walk && before && a.edges != len(c.edges):
		return fmt.Errorf("walk at tx %s (before the cascade at %s) saw %d of %d edges", a.asOfTx, fmtTs(c.j), a.edges, len(c.edges))
	case a.walk && !before && a.edges != 0:
		return fmt.Errorf("walk at tx %s (after the cascade at %s) saw %d live edges", a.asOfTx, fmtTs(c.j), a.edges)
	case !a.walk && before && a.code != http.StatusOK:
		return fmt.Errorf("%s at tx %s (before the cascade at %s): %d %s", a.path, a.asOfTx, fmtTs(c.j), a.code, a.data)
	case !a.walk && !before && a.code != http.StatusNotFound:
		return fmt.Errorf("%s at tx %s (after the cascade at %s): %d %s", a.path, a.asOfTx, fmtTs(c.j), a.code, a.data)
	}
	return nil
}

// readOnce does one random read: the hub, a journaled edge or a walk of
// the hub's edges, at the default coordinate or at an explicit tx around
// the journal's (below, at, above, far above the last tx handed out).
func (c *cascadeRun) readOnce(rng *rand.Rand) error {
	var tx string
	switch rng.IntN(6) {
	case 0:
		tx = fmtTs(c.j - 1)
	case 1:
		tx = fmtTs(c.j)
	case 2:
		tx = fmtTs(c.j + 1)
	case 3:
		tx = fmtTs(c.w.store.Clock().Last() + 1_000_000)
	}
	var a answer
	var err error
	switch k := rng.IntN(10); {
	case k < 4:
		a, err = c.w.read("/v1/tenants/acme/nodes/"+c.hub.String(), "", tx, "")
	case k < 9:
		a, err = c.w.read("/v1/tenants/acme/edges/"+c.edges[rng.IntN(len(c.edges))].String(), "", tx, "")
	case c.takeWalk():
		a, err = c.w.walk(c.hub, "", tx)
	default:
		a, err = c.w.read("/v1/tenants/acme/nodes/"+c.hub.String(), "", tx, "")
	}
	if err != nil {
		return err
	}
	if err := c.check(a); err != nil {
		return err
	}
	c.mu.Lock()
	c.answers = append(c.answers, a)
	c.mu.Unlock()
	c.reads.Add(1)
	select {
	case c.readSig <- struct{}{}:
	default:
	}
	return nil
}

// takeWalk takes one walk from the budget, if any is left.
func (c *cascadeRun) takeWalk() bool {
	for {
		n := c.walks.Load()
		if n <= 0 {
			return false
		}
		if c.walks.CompareAndSwap(n, n-1) {
			return true
		}
	}
}

// readers runs n readers until stop is closed, then each reads after more
// times; it returns the first error.
func (c *cascadeRun) readers(n, after int, stop <-chan struct{}) error {
	errs := make(chan error, n)
	for i := 0; i < n; i++ {
		go func(seed uint64) {
			rng := rand.New(rand.NewPCG(seed, 7))
			for {
				select {
				case <-stop:
					for k := 0; k < after; k++ {
						if err := c.readOnce(rng); err != nil {
							c.goneOnce.Do(func() { close(c.gone) })
							errs <- err
							return
						}
					}
					errs <- nil
					return
				case <-c.paced():
				}
				if err := c.readOnce(rng); err != nil {
					c.goneOnce.Do(func() { close(c.gone) })
					errs <- err
					return
				}
			}
		}(uint64(i))
	}
	var first error
	for i := 0; i < n; i++ {
		if err := <-errs; err != nil && first == nil {
			first = err
		}
	}
	return first
}

// paced returns a channel that is ready when the readers may read again:
// at once while they are under their allowance, else at the next chunk.
func (c *cascadeRun) paced() <-chan struct{} {
	c.chunkMu.Lock()
	defer c.chunkMu.Unlock()
	if c.reads.Load() < (c.chunks+1)*c.perChunk*2 {
		return closedChan
	}
	return c.chunkSig
}

var closedChan = func() chan struct{} { ch := make(chan struct{}); close(ch); return ch }()

// gate is a JournalObserver.Applied that holds the applier after each
// chunk until the readers have read k more times, so reads interleave with
// every chunk.
//
// The target is counted before the readers are let go: counted after, a
// gate descheduled between the two could find them past their new
// allowance already (k*2 more reads), and wait for k reads they would
// never make (a CI run hung so for 18 minutes).
func (c *cascadeRun) gate(k int64) func(int64) {
	c.perChunk = k
	return func(int64) {
		c.chunkMu.Lock()
		target := c.reads.Load() + k
		c.chunks++
		close(c.chunkSig)
		c.chunkSig = make(chan struct{})
		c.chunkMu.Unlock()
		for c.reads.Load() < target {
			select {
			case <-c.readSig:
			case <-c.gone:
				return // a reader failed; the test reports why
			}
		}
	}
}

// rereadAll reads every recorded answer's coordinate again and fails
// unless the data is identical.
func (c *cascadeRun) rereadAll() {
	c.w.t.Helper()
	c.mu.Lock()
	answers := slices.Clone(c.answers)
	c.mu.Unlock()
	changed := 0
	for _, a := range answers {
		b, err := c.w.again(a)
		if err != nil {
			c.w.t.Fatal(err)
		}
		if b.code != a.code || b.data != a.data || b.asOfTx != a.asOfTx || b.asOfValid != a.asOfValid {
			if changed++; changed <= 5 {
				c.w.t.Errorf("%s at (%s, %s): %d %s, read again: %d %s at (%s, %s)", a.path, a.asOfValid, a.asOfTx, a.code, a.data, b.code, b.data, b.asOfValid, b.asOfTx)
			}
		}
	}
	if changed > 0 {
		c.w.t.Fatalf("%d of %d answers changed when read again", changed, len(answers))
	}
}

// stats counts the answers below and at or above the journal's tx, and
// those that said a cascade was in flight.
func (c *cascadeRun) stats() (before, after, inFlight int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, a := range c.answers {
		if a.tx(c.w.t) < c.j {
			before++
		} else {
			after++
		}
		if a.inFlight {
			inFlight++
		}
	}
	return
}

// hubEdges is the size of the hub the cascade tests delete: 200k, or 20k
// with -short or -race (race_on_test.go).
func hubEdges(t testing.TB) int {
	if testing.Short() || raceOn {
		return 20_000
	}
	return 200_000
}

// startCascade builds the hub, commits the journal of its tombstone and
// returns the run (the cascade not applied yet).
func startCascade(t testing.TB, w *safeWorld) (*cascadeRun, *storage.JournalEntry) {
	c := &cascadeRun{w: w, sc: storage.MustScope("acme"), readSig: make(chan struct{}, 1), chunkSig: make(chan struct{}), gone: make(chan struct{})}
	c.hub, c.edges = w.hub(c.sc, hubEdges(t))
	out, _, err := w.ops.Apply(context.Background(), []cascade.Request{{Scope: c.sc, Op: storage.OpTombstoneNode, ID: c.hub, RequestID: "del-hub",
		ValidFrom: storage.NoTs, ValidTo: storage.NoTs, ValidEnd: storage.NoTs, Prov: storage.Provenance{DecidedAt: storage.NoTs}}})
	if err != nil || out[0].Kind != cascade.Journaled {
		t.Fatalf("tombstone_node: %+v %v, want journaled", out[0], err)
	}
	c.j = out[0].Journal.J.Tx
	return c, out[0].Journal
}

// churn commits unrelated puts until stop closes, so the committed tx
// runs ahead of the journal's (as it does on a busy worker).
func churn(w *safeWorld, sc storage.Scope, stop <-chan struct{}) <-chan error {
	done := make(chan error, 1)
	go func() {
		for {
			select {
			case <-stop:
				done <- nil
				return
			default:
			}
			if _, err := w.ops.PutNode(context.Background(), sc, storage.NodeWrite{ID: uuid.New(), ValidFrom: storage.NoTs, ValidTo: storage.NoTs}); err != nil {
				done <- err
				return
			}
		}
	}()
	return done
}

// TestReadsNeverSeeHalfACascade: readers read the hub, random journaled
// edges and whole walks of the hub's edges while its 200k-edge cascade
// lands chunk by chunk (and unrelated writes move the committed tx on);
// every answer is all before or all after the cascade, and every answer
// read again afterwards at its coordinate is identical.
func TestReadsNeverSeeHalfACascade(t *testing.T) {
	w := newSafeWorld(t)
	c, j := startCascade(t, w)

	stop, stopChurn := make(chan struct{}), make(chan struct{})
	churned := churn(w, storage.MustScope("other"), stopChurn)
	read := make(chan error, 1)
	c.walks.Store(12)
	gate := c.gate(8)
	go func() { read <- c.readers(4, 50, stop) }()
	_, err := w.ops.ApplyJournal(context.Background(), j, cascade.JournalObserver{Applied: gate})
	c.walks.Add(6) // and some after
	close(stop)
	if rerr := <-read; rerr != nil {
		t.Fatal(rerr)
	}
	close(stopChurn)
	if cerr := <-churned; cerr != nil {
		t.Fatal(cerr)
	}
	if err != nil {
		t.Fatal(err)
	}
	before, after, inFlight := c.stats()
	t.Logf("%d answers: %d before the cascade, %d after, %d said a cascade was in flight", before+after, before, after, inFlight)
	if before == 0 || after == 0 || inFlight == 0 {
		t.Fatalf("the readers did not meet the cascade: %d before, %d after, %d in flight", before, after, inFlight)
	}
	c.rereadAll()
}

// TestReadsBeforeACrashHoldAfterRestart: the same, with the process
// crashing in the middle of the cascade; after the restart (the journal
// pending, then resumed and finished) no answer given before the crash
// has changed.
func TestReadsBeforeACrashHoldAfterRestart(t *testing.T) {
	w := newSafeWorld(t)
	c, j := startCascade(t, w)
	half := int64(len(c.edges) / 2)
	gate := c.gate(8)
	c.walks.Store(12)

	stop := make(chan struct{})
	read := make(chan error, 1)
	go func() { read <- c.readers(4, 0, stop) }()
	_, err := w.ops.ApplyJournal(context.Background(), j, cascade.JournalObserver{Applied: func(done int64) {
		gate(done)
		if done >= half {
			w.fault.CrashAfter(w.fault.Calls()) // the next chunk never lands
		}
	}})
	close(stop)
	if rerr := <-read; rerr != nil {
		t.Fatal(rerr)
	}
	if !errors.Is(err, storage.ErrInjected) {
		t.Fatalf("cascade: %v, want the injected crash", err)
	}
	before, _, _ := c.stats()
	t.Logf("%d answers before the crash", before)

	w.close()
	w.open()
	if n := len(w.store.Journals().List()); n != 1 {
		t.Fatalf("%d journals after the restart, want the crashed one", n)
	}
	// The journal is pending: answers are still all before it.
	rng := rand.New(rand.NewPCG(1, 2))
	c.walks.Store(4)
	for i := 0; i < 100; i++ {
		if err := c.readOnce(rng); err != nil {
			t.Fatal(err)
		}
	}
	c.rereadAll()
	c.walks.Store(4)
	if _, err := w.ops.ResumeJournals(context.Background(), c.sc); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 100; i++ {
		if err := c.readOnce(rng); err != nil {
			t.Fatal(err)
		}
	}
	_, after, _ := c.stats()
	if after == 0 {
		t.Fatal("no answer after the resumed cascade")
	}
	c.rereadAll()
}

// TestReadAboveAPausedGroupCommit: a group holds a tx it has not committed
// yet. A read at that tx is answered at the committed tx below it (and
// says so), with or without a short wait; a read that waits long enough
// gets the group's write; the first answers read again are unchanged.
func TestReadAboveAPausedGroupCommit(t *testing.T) {
	w := newSafeWorld(t)
	sc := storage.MustScope("acme")
	if _, err := w.ops.PutNode(context.Background(), sc, storage.NodeWrite{ID: uuid.New(), ValidFrom: storage.NoTs, ValidTo: storage.NoTs}); err != nil {
		t.Fatal(err)
	}
	n := uuid.New()
	allocated, release := make(chan storage.Ts), make(chan struct{})
	var releaseOnce sync.Once
	unpause := func() { releaseOnce.Do(func() { close(release) }) }
	t.Cleanup(unpause) // before the store closes, even when the test fails
	committed := make(chan error, 1)
	go func() {
		committed <- w.store.Update(context.Background(), func(t *storage.Txn) error {
			v, err := t.PutNode(sc, storage.NodeWrite{ID: n, ValidFrom: storage.NoTs, ValidTo: storage.NoTs})
			if err != nil {
				return err
			}
			allocated <- v.Tx.Start
			<-release
			return nil
		})
	}()
	tx := <-allocated
	path := "/v1/tenants/acme/nodes/" + n.String()
	var first []answer
	for _, wait := range []string{"", "0", "20ms"} {
		a, err := w.read(path, "", fmtTs(tx), wait)
		if err != nil {
			t.Fatal(err)
		}
		if a.code != http.StatusNotFound || a.tx(t) >= tx {
			t.Fatalf("read at the paused group's tx %s (wait %q): %d at tx %s, want 404 below it", fmtTs(tx), wait, a.code, a.asOfTx)
		}
		first = append(first, a)
	}
	waited := make(chan answer, 1)
	go func() {
		a, err := w.read(path, "", fmtTs(tx), "20s")
		if err != nil {
			t.Error(err)
		}
		waited <- a
	}()
	unpause()
	if err := <-committed; err != nil {
		t.Fatal(err)
	}
	if a := <-waited; a.code != http.StatusOK || a.asOfTx != fmtTs(tx) {
		t.Fatalf("a read waiting for tx %s: %d at %s, want 200 at it", fmtTs(tx), a.code, a.asOfTx)
	}
	for _, a := range first {
		b, err := w.again(a)
		if err != nil {
			t.Fatal(err)
		}
		if b.code != a.code || b.data != a.data {
			t.Fatalf("answer at %s changed: %d then %d", a.asOfTx, a.code, b.code)
		}
	}
	// A wait is bounded and checked.
	for _, bad := range []string{"forever", "-1s", "31s", "NaN"} {
		if r := w.get(path + "?wait=" + url.QueryEscape(bad)); r.code != http.StatusBadRequest {
			t.Errorf("wait=%s: %d %s, want 400", bad, r.code, r.body)
		}
	}
}
