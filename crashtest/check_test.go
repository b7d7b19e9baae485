package crashtest

import (
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"reflect"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
)

// The store as the HTTP read API shows it, compared with the model.

type apiVersion struct {
	ID         string          `json:"id"`
	Src        *string         `json:"src"`
	Dst        *string         `json:"dst"`
	Label      *string         `json:"label"`
	ValidFrom  *string         `json:"valid_from"`
	ValidTo    *string         `json:"valid_to"`
	TxFrom     *string         `json:"tx_from"`
	TxTo       *string         `json:"tx_to"`
	Tombstone  bool            `json:"tombstone"`
	Props      json.RawMessage `json:"props"`
	Provenance struct {
		Actor     string  `json:"actor"`
		Reason    string  `json:"reason"`
		Source    string  `json:"source"`
		RequestID string  `json:"request_id"`
		DecidedAt *string `json:"decided_at"`
	} `json:"provenance"`
}

func strp(p *string) string {
	if p == nil {
		return "null"
	}
	return *p
}

func tsJSON(us int64) string {
	if us == openEnd || us == noTs {
		return "null"
	}
	return time.UnixMicro(us).UTC().Format(txLayout)
}

func jsonEqual(a, b string) bool {
	var x, y any
	if json.Unmarshal([]byte(a), &x) != nil || json.Unmarshal([]byte(b), &y) != nil {
		return a == b
	}
	return reflect.DeepEqual(x, y)
}

// diffVersion compares an API version with a model version field by field
// (times as exact strings: RFC 3339 UTC, six fractional digits, null ends).
func diffVersion(a *apiVersion, m *mver) string {
	var d []string
	chk := func(name, got, want string) {
		if got != want {
			d = append(d, fmt.Sprintf("%s=%s want %s", name, got, want))
		}
	}
	chk("id", a.ID, m.id.String())
	chk("valid_from", strp(a.ValidFrom), tsJSON(m.vf))
	chk("valid_to", strp(a.ValidTo), tsJSON(m.vt))
	chk("tx_from", strp(a.TxFrom), tsJSON(m.tx))
	chk("tx_to", strp(a.TxTo), "null")
	chk("tombstone", fmt.Sprint(a.Tombstone), fmt.Sprint(m.tomb))
	if !jsonEqual(string(a.Props), m.props) {
		d = append(d, fmt.Sprintf("props=%s want %s", a.Props, m.props))
	}
	if m.edge {
		chk("src", strp(a.Src), m.src.String())
		chk("dst", strp(a.Dst), m.dst.String())
		chk("label", strp(a.Label), m.label)
	} else {
		chk("src", strp(a.Src), "null")
		chk("dst", strp(a.Dst), "null")
		chk("label", strp(a.Label), "null")
	}
	p := a.Provenance
	chk("provenance.actor", p.Actor, m.actor)
	chk("provenance.reason", p.Reason, m.reason)
	chk("provenance.source", p.Source, m.source)
	chk("provenance.request_id", p.RequestID, m.rid)
	chk("provenance.decided_at", strp(p.DecidedAt), tsJSON(m.decided))
	return strings.Join(d, "; ")
}

// checker runs the read-API checks with a few concurrent clients.
type checker struct {
	base   string
	client *http.Client
	w      *world
	rng    *rand.Rand

	mu       sync.Mutex
	failures []string
	nfail    int
	gets     atomic.Int64

	// Filled by the history checks (independent of the model).
	ridVersions map[string]int
	ridTx       map[string]map[string]bool
}

func newChecker(base string, w *world, seed int64) *checker {
	return &checker{
		base:        base,
		client:      &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 16}},
		w:           w,
		rng:         rand.New(rand.NewPCG(uint64(seed), 0xc4ec)),
		ridVersions: map[string]int{},
		ridTx:       map[string]map[string]bool{},
	}
}

func (c *checker) fail(format string, args ...any) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.nfail++
	if len(c.failures) < 60 {
		c.failures = append(c.failures, fmt.Sprintf(format, args...))
	}
}

// coordQuery renders (v, t); noTs leaves the parameter out (server default).
func coordQuery(v, t int64) string {
	q := url.Values{}
	if v != noTs {
		q.Set("valid", time.UnixMicro(v).UTC().Format(time.RFC3339Nano))
	}
	if t != noTs {
		q.Set("tx", time.UnixMicro(t).UTC().Format(time.RFC3339Nano))
	}
	if len(q) == 0 {
		return ""
	}
	return "?" + q.Encode()
}

// get fetches a path and decodes a 200 body into out; it returns the status.
func (c *checker) get(path string, out any) (int, error) {
	c.gets.Add(1)
	var lastErr error
	for attempt := 0; attempt < 3; attempt++ {
		resp, err := c.client.Get(c.base + path)
		if err != nil {
			lastErr = err
			time.Sleep(100 * time.Millisecond)
			continue
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			lastErr = err
			continue
		}
		if resp.StatusCode == http.StatusOK && out != nil {
			if err := json.Unmarshal(body, out); err != nil {
				return resp.StatusCode, fmt.Errorf("GET %s: undecodable body %q: %v", path, body, err)
			}
		}
		if resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusNotFound {
			return resp.StatusCode, fmt.Errorf("GET %s: status %d: %s", path, resp.StatusCode, body)
		}
		return resp.StatusCode, nil
	}
	return 0, fmt.Errorf("GET %s: %v", path, lastErr)
}

func kindPath(edge bool) string {
	if edge {
		return "edges"
	}
	return "nodes"
}

// point checks a point read at (v, t) against the model.
func (c *checker) point(tenant string, edge bool, id uuid.UUID, v, t int64) {
	m := c.w.tenants[tenant]
	var e *mentity
	if edge {
		e = m.edges[id]
	} else {
		e = m.nodes[id]
	}
	mv, mt := v, t
	if mt == noTs {
		mt = openEnd
	}
	if mv == noTs {
		mv = time.Now().UnixMicro() // the server's default valid time
	}
	want := e.asOf(mv, mt)
	path := fmt.Sprintf("/v1/tenants/%s/%s/%s%s", tenant, kindPath(edge), id, coordQuery(v, t))
	var got apiVersion
	code, err := c.get(path, &got)
	if err != nil {
		c.fail("%v", err)
		return
	}
	switch {
	case want == nil && code == http.StatusOK:
		c.fail("GET %s: 200 %s %s (rid %s), the model reads absent", path, got.ID, strp(got.TxFrom), got.Provenance.RequestID)
	case want != nil && code == http.StatusNotFound:
		c.fail("GET %s: 404, the model reads %s", path, want)
	case want != nil:
		if d := diffVersion(&got, want); d != "" {
			c.fail("GET %s: %s (model: %s)", path, d, want)
		}
	}
}

// edgesOf checks a node's edge list at (v, t) in one direction.
func (c *checker) edgesOf(tenant string, node uuid.UUID, dir string, v, t int64) {
	m := c.w.tenants[tenant]
	mt := t
	if mt == noTs {
		mt = openEnd
	}
	want := m.edgesOf(node, dir, v, mt)
	q := coordQuery(v, t)
	if q == "" {
		q = "?dir=" + dir
	} else {
		q += "&dir=" + dir
	}
	path := fmt.Sprintf("/v1/tenants/%s/nodes/%s/edges%s", tenant, node, q)
	var got struct {
		Edges []apiVersion `json:"edges"`
	}
	code, err := c.get(path, &got)
	if err != nil {
		c.fail("%v", err)
		return
	}
	if code != http.StatusOK || got.Edges == nil {
		c.fail("GET %s: status %d, edges %v: want 200 with a list", path, code, got.Edges)
		return
	}
	seen := map[string]bool{}
	for i := range got.Edges {
		a := &got.Edges[i]
		if seen[a.ID] {
			c.fail("GET %s: edge %s listed twice", path, a.ID)
		}
		seen[a.ID] = true
		id, _ := uuid.Parse(a.ID)
		w, ok := want[id]
		if !ok {
			c.fail("GET %s: lists edge %s (tx %s, rid %s), the model reads it absent there", path, a.ID, strp(a.TxFrom), a.Provenance.RequestID)
			continue
		}
		if d := diffVersion(a, w); d != "" {
			c.fail("GET %s: edge %s: %s", path, a.ID, d)
		}
	}
	for id, w := range want {
		if !seen[id.String()] {
			c.fail("GET %s: misses edge %s, the model reads %s", path, id, w)
		}
	}
}

// history checks an entity's whole history against the model, and on its
// own: ascending tx, no write after a node's tombstone, at most one node
// tombstone, and a second edge tombstone only as a strict narrowing.
func (c *checker) history(tenant string, edge bool, id uuid.UUID) {
	m := c.w.tenants[tenant]
	var e *mentity
	if edge {
		e = m.edges[id]
	} else {
		e = m.nodes[id]
	}
	var want []*mver
	if e != nil {
		want = e.vers
	}
	path := fmt.Sprintf("/v1/tenants/%s/%s/%s/history", tenant, kindPath(edge), id)
	var got struct {
		Versions []apiVersion `json:"versions"`
	}
	code, err := c.get(path, &got)
	if err != nil {
		c.fail("%v", err)
		return
	}
	if code == http.StatusNotFound && len(want) == 0 {
		return // an id that never existed: 404, like its GET (CONTRACT §6)
	}
	if code != http.StatusOK || got.Versions == nil {
		c.fail("GET %s: status %d, versions %v: want 200 with a list", path, code, got.Versions)
		return
	}
	vs := got.Versions
	c.mu.Lock()
	for i := range vs {
		rid := vs[i].Provenance.RequestID
		c.ridVersions[rid]++
		if c.ridTx[rid] == nil {
			c.ridTx[rid] = map[string]bool{}
		}
		c.ridTx[rid][strp(vs[i].TxFrom)] = true
	}
	c.mu.Unlock()
	// Model-independent checks.
	var lastTomb *apiVersion
	for i := range vs {
		if i > 0 && strp(vs[i].TxFrom) <= strp(vs[i-1].TxFrom) {
			c.fail("GET %s: versions not in ascending tx order at %d (%s after %s)", path, i, strp(vs[i].TxFrom), strp(vs[i-1].TxFrom))
		}
		if lastTomb != nil {
			switch {
			case !vs[i].Tombstone:
				c.fail("GET %s: a live version (tx %s, rid %s) after the tombstone of tx %s: resurrection", path, strp(vs[i].TxFrom), vs[i].Provenance.RequestID, strp(lastTomb.TxFrom))
			case !edge:
				c.fail("GET %s: two node tombstones: tx %s (rid %s) and tx %s (rid %s)", path, strp(lastTomb.TxFrom), lastTomb.Provenance.RequestID, strp(vs[i].TxFrom), vs[i].Provenance.RequestID)
			case !(vfTime(vs[i].ValidFrom) < vfTime(lastTomb.ValidFrom)):
				c.fail("GET %s: double edge tombstone that does not narrow: valid_from %s (tx %s, rid %s) after valid_from %s (tx %s, rid %s)", path,
					strp(vs[i].ValidFrom), strp(vs[i].TxFrom), vs[i].Provenance.RequestID, strp(lastTomb.ValidFrom), strp(lastTomb.TxFrom), lastTomb.Provenance.RequestID)
			}
		}
		if vs[i].Tombstone {
			lastTomb = &vs[i]
		}
	}
	if len(vs) != len(want) {
		var sb strings.Builder
		for _, v := range vs {
			fmt.Fprintf(&sb, "\n      api:   tx %s valid [%s, %s) tomb %v rid %s", strp(v.TxFrom), strp(v.ValidFrom), strp(v.ValidTo), v.Tombstone, v.Provenance.RequestID)
		}
		for _, v := range want {
			fmt.Fprintf(&sb, "\n      model: %s", v)
		}
		c.fail("GET %s: %d versions, the model has %d:%s", path, len(vs), len(want), sb.String())
		return
	}
	for i := range vs {
		if d := diffVersion(&vs[i], want[i]); d != "" {
			c.fail("GET %s: version %d: %s (model: %s)", path, i, d, want[i])
		}
	}
}

// vfTime parses a version's valid_from (noTs when null or unreadable).
func vfTime(p *string) int64 {
	if p == nil {
		return noTs
	}
	t, err := time.Parse(time.RFC3339Nano, *p)
	if err != nil {
		return noTs
	}
	return t.UnixMicro()
}

// absentEverywhere is I1 at one coordinate for one cascade: the node and
// every edge that touched it read absent through every read path.
func (c *checker) absentEverywhere(cr cascadeRec, v, t int64, rng *rand.Rand) {
	q := coordQuery(v, t)
	path := fmt.Sprintf("/v1/tenants/%s/nodes/%s%s", cr.tenant, cr.node, q)
	code, err := c.get(path, &apiVersion{})
	if err != nil {
		c.fail("%v", err)
	} else if code != http.StatusNotFound {
		c.fail("I1: cascade %s of node %s (valid_end %s, tx %s): GET %s = %d, want 404", cr.rid, cr.node, fmtTs(cr.ve), fmtTs(cr.tx), path, code)
	}
	touched := map[string]bool{}
	for _, id := range cr.touched {
		touched[id.String()] = true
	}
	lists := []uuid.UUID{cr.node}
	m := c.w.tenants[cr.tenant]
	for _, id := range cr.touched {
		f := m.edges[id].vers[0]
		other := f.src
		if other == cr.node {
			other = f.dst
		}
		if other != cr.node && len(lists) < 4 && rng.IntN(3) == 0 {
			lists = append(lists, other)
		}
	}
	for _, n := range lists {
		for _, dir := range []string{"both", "out", "in"} {
			if n != cr.node && dir != "both" {
				continue
			}
			var got struct {
				Edges []apiVersion `json:"edges"`
			}
			p := fmt.Sprintf("/v1/tenants/%s/nodes/%s/edges%s", cr.tenant, n, q)
			if q == "" {
				p += "?dir=" + dir
			} else {
				p += "&dir=" + dir
			}
			if _, err := c.get(p, &got); err != nil {
				c.fail("%v", err)
				continue
			}
			for _, e := range got.Edges {
				if touched[e.ID] {
					c.fail("I1: cascade %s of node %s (valid_end %s, tx %s): GET %s lists edge %s (tx %s, rid %s): a ghost", cr.rid, cr.node, fmtTs(cr.ve), fmtTs(cr.tx), p, e.ID, strp(e.TxFrom), e.Provenance.RequestID)
				}
			}
		}
	}
	ids := append([]uuid.UUID(nil), cr.touched...)
	rng.Shuffle(len(ids), func(i, j int) { ids[i], ids[j] = ids[j], ids[i] })
	for _, id := range ids[:min(len(ids), 8)] {
		p := fmt.Sprintf("/v1/tenants/%s/edges/%s%s", cr.tenant, id, q)
		code, err := c.get(p, &apiVersion{})
		if err != nil {
			c.fail("%v", err)
		} else if code != http.StatusNotFound {
			c.fail("I1: cascade %s of node %s (valid_end %s, tx %s): GET %s = %d, want 404: a ghost edge", cr.rid, cr.node, fmtTs(cr.ve), fmtTs(cr.tx), p, code)
		}
	}
}

// coordinate pools for sampling.
type pools struct {
	txs        []int64 // every ok tx (all tenants)
	minTx      int64
	maxTx      int64
	boundaries []int64 // valid-time boundaries of a tenant
}

func (c *checker) sampleV(rng *rand.Rand, p *pools, e *mentity) int64 {
	switch r := rng.IntN(10); {
	case r < 5 && e != nil && len(e.vers) > 0:
		x := e.vers[rng.IntN(len(e.vers))]
		b := []int64{x.vf, x.vf - 1, x.vt - 1, x.vt}[rng.IntN(4)]
		if b == openEnd || b == openEnd-1 {
			b = x.vf
		}
		return b
	case r < 7 && len(p.boundaries) > 0:
		return p.boundaries[rng.IntN(len(p.boundaries))] - int64(rng.IntN(2))
	default:
		lo := time.Date(1880, 1, 1, 0, 0, 0, 0, time.UTC).UnixMicro()
		hi := time.Date(2200, 1, 1, 0, 0, 0, 0, time.UTC).UnixMicro()
		return lo + rng.Int64N(hi-lo)
	}
}

func (c *checker) sampleT(rng *rand.Rand, p *pools, e *mentity) int64 {
	switch r := rng.IntN(10); {
	case r < 5 && e != nil && len(e.vers) > 0:
		return e.vers[rng.IntN(len(e.vers))].tx - int64(rng.IntN(2))
	case r < 8 && len(p.txs) > 0:
		return p.txs[rng.IntN(len(p.txs))] - int64(rng.IntN(2))
	case r < 9 && p.maxTx > 0:
		return p.minTx - 2_000_000 + rng.Int64N(p.maxTx-p.minTx+4_000_000)
	default:
		return []int64{p.minTx - 1, p.maxTx, p.maxTx + 3_600_000_000, noTs}[rng.IntN(4)]
	}
}

// run executes the tasks with n concurrent workers.
func (c *checker) run(n int, tasks []func()) {
	ch := make(chan func())
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for f := range ch {
				f()
			}
		}()
	}
	for _, f := range tasks {
		ch <- f
	}
	close(ch)
	wg.Wait()
}

// idSets lists the node and edge ids the requests of a tenant mention.
func idSets(reqs []*reqState, tenant string) (nodes, edges []uuid.UUID) {
	ns, es := map[uuid.UUID]bool{}, map[uuid.UUID]bool{}
	for _, rs := range reqs {
		r := rs.req
		if r.tenant != tenant {
			continue
		}
		switch r.op {
		case "put_node", "tombstone_node":
			ns[r.id] = true
		case "put_edge":
			es[r.id] = true
			ns[r.src], ns[r.dst] = true, true
		case "tombstone_edge":
			es[r.id] = true
		}
	}
	for id := range ns {
		nodes = append(nodes, id)
	}
	for id := range es {
		edges = append(edges, id)
	}
	sortIDs(nodes)
	sortIDs(edges)
	return nodes, edges
}

func sortIDs(ids []uuid.UUID) {
	sort.Slice(ids, func(i, j int) bool { return ids[i].String() < ids[j].String() })
}

// buildTasks plans every read-API check; the rng makes the plan a function
// of the seed and the model.
func (c *checker) buildTasks(reqs []*reqState) []func() {
	var tasks []func()
	rng := c.rng
	p := &pools{txs: c.w.txs}
	if len(p.txs) > 0 {
		p.minTx, p.maxTx = p.txs[0], p.txs[len(p.txs)-1]
	}
	allNodes := map[string][]uuid.UUID{}
	for _, tn := range tenantNames {
		nodes, _ := idSets(reqs, tn)
		allNodes[tn] = nodes
	}
	for _, tn := range tenantNames {
		m := c.w.tenants[tn]
		tp := &pools{txs: p.txs, minTx: p.minTx, maxTx: p.maxTx}
		for _, mp := range []map[uuid.UUID]*mentity{m.nodes, m.edges} {
			for _, e := range mp {
				for _, v := range e.vers {
					tp.boundaries = append(tp.boundaries, v.vf)
					if v.vt != openEnd {
						tp.boundaries = append(tp.boundaries, v.vt)
					}
				}
			}
		}
		sort.Slice(tp.boundaries, func(i, j int) bool { return tp.boundaries[i] < tp.boundaries[j] })
		nodes, edges := idSets(reqs, tn)
		// Ids of the other tenants: isolation (a and ab are prefixes).
		own := map[uuid.UUID]bool{}
		for _, id := range nodes {
			own[id] = true
		}
		var foreign []uuid.UUID
		for _, on := range tenantNames {
			if on == tn {
				continue
			}
			for _, id := range allNodes[on] {
				if !own[id] && rng.IntN(8) == 0 {
					foreign = append(foreign, id)
				}
			}
		}
		for _, id := range append(nodes, foreign...) {
			e := m.nodes[id]
			tasks = append(tasks, func() { c.history(tn, false, id) })
			for k := 0; k < 3; k++ {
				v, t := c.sampleV(rng, tp, e), c.sampleT(rng, tp, e)
				tasks = append(tasks, func() { c.point(tn, false, id, v, t) })
			}
			for _, dir := range []string{"out", "in", "both", "both"} {
				v, t := c.sampleV(rng, tp, e), c.sampleT(rng, tp, e)
				tasks = append(tasks, func() { c.edgesOf(tn, id, dir, v, t) })
			}
		}
		for _, id := range edges {
			e := m.edges[id]
			tasks = append(tasks, func() { c.history(tn, true, id) })
			for k := 0; k < 3; k++ {
				v, t := c.sampleV(rng, tp, e), c.sampleT(rng, tp, e)
				tasks = append(tasks, func() { c.point(tn, true, id, v, t) })
			}
		}
	}
	// Reads at the server's default coordinate (valid now, the latest tx).
	for k := 0; k < 40; k++ {
		tn := tenantNames[rng.IntN(len(tenantNames))]
		nodes, edges := idSets(reqs, tn)
		if rng.IntN(2) == 0 && len(nodes) > 0 {
			id := nodes[rng.IntN(len(nodes))]
			tasks = append(tasks, func() { c.point(tn, false, id, noTs, noTs) })
		} else if len(edges) > 0 {
			id := edges[rng.IntN(len(edges))]
			tasks = append(tasks, func() { c.point(tn, true, id, noTs, noTs) })
		}
	}
	// I1 at sampled v >= valid_end, t >= tx of every cascade.
	for _, cr := range c.w.cascades {
		for k := 0; k < 2; k++ {
			v := cr.ve
			switch rng.IntN(3) {
			case 1:
				v += rng.Int64N(1_000_000)
			case 2:
				v += rng.Int64N(100 * 365 * 24 * 3600 * 1_000_000)
			}
			t := cr.tx
			switch rng.IntN(4) {
			case 1:
				t += rng.Int64N(max(1, p.maxTx-cr.tx+1))
			case 2:
				t = p.maxTx + 1_000_000
			case 3:
				t = noTs // the server's default: the latest state
			}
			seed := rng.Uint64()
			tasks = append(tasks, func() { c.absentEverywhere(cr, v, t, rand.New(rand.NewPCG(seed, 1))) })
		}
	}
	rng.Shuffle(len(tasks), func(i, j int) { tasks[i], tasks[j] = tasks[j], tasks[i] })
	return tasks
}
