package crashtest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"sort"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/telha/telha-cascade/queue"
)

// The reference model: every request with an ok result, replayed in
// tx_time order with the rules of CONTRACT §2-§4. Its reads use the one
// liveness rule (latest-tx-wins).

const (
	openEnd = int64(math.MaxInt64)
	noTs    = int64(math.MinInt64)
)

const txLayout = "2006-01-02T15:04:05.000000Z07:00"

// mver is one version record.
type mver struct {
	edge     bool
	id       uuid.UUID
	src, dst uuid.UUID
	label    string
	vf, vt   int64
	tx       int64
	tomb     bool
	props    string // compact JSON
	actor    string
	reason   string
	source   string
	rid      string
	decided  int64
}

func (v *mver) String() string {
	kind := "node"
	if v.edge {
		kind = "edge " + v.src.String()[:8] + "->" + v.dst.String()[:8] + " " + fmt.Sprintf("%q", v.label)
	}
	tomb := ""
	if v.tomb {
		tomb = " TOMBSTONE"
	}
	return fmt.Sprintf("%s valid [%s, %s) tx %s%s props %s rid %s", kind, fmtTs(v.vf), fmtTs(v.vt), fmtTs(v.tx), tomb, v.props, v.rid)
}

func fmtTs(us int64) string {
	switch us {
	case openEnd:
		return "open"
	case noTs:
		return "none"
	}
	return time.UnixMicro(us).UTC().Format(txLayout)
}

type mentity struct {
	edge bool
	id   uuid.UUID
	vers []*mver // ascending tx
}

// latestBefore returns the latest-recorded version with tx < tau.
func (e *mentity) latestBefore(tau int64) *mver {
	if e == nil {
		return nil
	}
	i := sort.Search(len(e.vers), func(i int) bool { return e.vers[i].tx >= tau })
	if i == 0 {
		return nil
	}
	return e.vers[i-1]
}

func (e *mentity) latest() *mver { return e.latestBefore(openEnd) }

// asOf is latest-tx-wins at (v, t): among the versions whose valid interval
// contains v and whose tx_from <= t, the highest tx_from wins; a winning
// tombstone (or no winner) reads absent.
func (e *mentity) asOf(v, t int64) *mver {
	if e == nil {
		return nil
	}
	for i := len(e.vers) - 1; i >= 0; i-- {
		x := e.vers[i]
		if x.tx > t || v < x.vf || v >= x.vt {
			continue
		}
		if x.tomb {
			return nil
		}
		return x
	}
	return nil
}

// tmodel is one tenant's graph.
type tmodel struct {
	name  string
	nodes map[uuid.UUID]*mentity
	edges map[uuid.UUID]*mentity
	adj   map[uuid.UUID][]uuid.UUID // node -> edges touching it, each once
}

func newTModel(name string) *tmodel {
	return &tmodel{name: name, nodes: map[uuid.UUID]*mentity{}, edges: map[uuid.UUID]*mentity{}, adj: map[uuid.UUID][]uuid.UUID{}}
}

func (m *tmodel) ent(edge bool, id uuid.UUID) *mentity {
	mp := m.nodes
	if edge {
		mp = m.edges
	}
	e := mp[id]
	if e == nil {
		e = &mentity{edge: edge, id: id}
		mp[id] = e
	}
	return e
}

// edgesOf lists the edges of node live at (v, t) in a direction.
func (m *tmodel) edgesOf(node uuid.UUID, dir string, v, t int64) map[uuid.UUID]*mver {
	out := map[uuid.UUID]*mver{}
	for _, id := range m.adj[node] {
		e := m.edges[id]
		first := e.vers[0]
		if !((dir != "in" && first.src == node) || (dir != "out" && first.dst == node)) {
			continue
		}
		if x := e.asOf(v, t); x != nil {
			out[id] = x
		}
	}
	return out
}

// effect is a request that took effect (an ok result).
type effect struct {
	rs   *reqState
	res  queue.Result
	tx   int64
	recv time.Time // first arrival of an ok result
}

// cascadeRec is an ok tombstone_node, for the I1 checks.
type cascadeRec struct {
	tenant  string
	node    uuid.UUID
	ve, tx  int64
	touched []uuid.UUID // every edge that ever touched the node
	rid     string
}

// world is the replayed model of every tenant.
type world struct {
	tenants  map[string]*tmodel
	effects  []*effect // ascending tx
	cascades []cascadeRec
	txs      []int64 // every ok tx, ascending
}

func parseTx(s string) (int64, error) {
	t, err := time.Parse(txLayout, s)
	if err != nil {
		return 0, err
	}
	if t.Format(txLayout) != s || !strings.HasSuffix(s, "Z") {
		return 0, fmt.Errorf("tx_time %q is not RFC 3339 UTC with 6 fractional digits", s)
	}
	return t.UnixMicro(), nil
}

func compactJSON(s string) string {
	if s == "" {
		return "{}"
	}
	var b bytes.Buffer
	if err := json.Compact(&b, []byte(s)); err != nil {
		return s
	}
	return b.String()
}

func provOf(r *request, v *mver) {
	v.actor, v.reason, v.source, v.rid = r.actor, r.reason, r.source, r.rid
	v.decided = noTs
	if r.decided != nil {
		v.decided = r.decided.us
	}
}

func opt(t *tval, def int64) int64 {
	if t == nil {
		return def
	}
	return t.us
}

// replay applies the effects in tx order. Every effect must be one the
// model allows at its tx (an ok the model would refuse is a violation: a
// ghost through a race, a resurrection, a double tombstone).
func replay(effects []*effect) (*world, []string) {
	w := &world{tenants: map[string]*tmodel{}}
	for _, n := range tenantNames {
		w.tenants[n] = newTModel(n)
	}
	sort.Slice(effects, func(i, j int) bool { return effects[i].tx < effects[j].tx })
	w.effects = effects
	var bad []string
	fail := func(e *effect, format string, args ...any) {
		r := e.rs.req
		bad = append(bad, fmt.Sprintf("request %s (%s %s %s, tx %s): ", r.rid, r.tenant, r.op, r.id, e.res.TxTime)+fmt.Sprintf(format, args...))
	}
	for i, e := range effects {
		if i > 0 && effects[i-1].tx == e.tx {
			fail(e, "same tx_time as request %s: tx times must be strictly increasing", effects[i-1].rs.req.rid)
		}
		w.txs = append(w.txs, e.tx)
		r := e.rs.req
		m := w.tenants[r.tenant]
		tx := e.tx
		switch r.op {
		case "put_node":
			n := m.ent(false, r.id)
			if l := n.latest(); l != nil && l.tomb {
				fail(e, "ok, but the node was tombstoned at tx %s (resurrection)", fmtTs(l.tx))
			}
			v := &mver{id: r.id, vf: opt(r.vf, tx), vt: opt(r.vt, openEnd), tx: tx, props: compactJSON(r.props)}
			if v.vf >= v.vt {
				fail(e, "ok, but its valid interval [%s, %s) is empty", fmtTs(v.vf), fmtTs(v.vt))
			}
			provOf(r, v)
			n.vers = append(n.vers, v)
		case "put_edge":
			ed := m.ent(true, r.id)
			if l := ed.latest(); l != nil {
				if l.src != r.src || l.dst != r.dst {
					fail(e, "ok, but the edge exists as %s->%s (src and dst are immutable)", l.src, l.dst)
				}
				if l.tomb {
					fail(e, "ok, but the edge was tombstoned at tx %s (resurrection)", fmtTs(l.tx))
				}
			}
			for _, end := range []uuid.UUID{r.src, r.dst} {
				l := m.nodes[end].latest()
				switch {
				case l == nil:
					fail(e, "ok, but endpoint %s never existed", end)
				case l.tomb:
					fail(e, "ok, but endpoint %s was tombstoned at tx %s (an edge on a dead node: ghost)", end, fmtTs(l.tx))
				}
			}
			v := &mver{edge: true, id: r.id, src: r.src, dst: r.dst, label: r.label, vf: opt(r.vf, tx), vt: opt(r.vt, openEnd), tx: tx, props: compactJSON(r.props)}
			provOf(r, v)
			if len(ed.vers) == 0 {
				m.adj[r.src] = append(m.adj[r.src], r.id)
				if r.dst != r.src {
					m.adj[r.dst] = append(m.adj[r.dst], r.id)
				}
			}
			ed.vers = append(ed.vers, v)
		case "tombstone_edge":
			ed := m.edges[r.id]
			l := ed.latest()
			if l == nil {
				fail(e, "ok, but the edge never existed")
				continue
			}
			if l.tomb {
				fail(e, "ok, but the edge was already tombstoned at tx %s (double tombstone)", fmtTs(l.tx))
			}
			v := &mver{edge: true, id: r.id, src: l.src, dst: l.dst, label: l.label, vf: opt(r.ve, tx), vt: openEnd, tx: tx, tomb: true, props: "{}"}
			provOf(r, v)
			ed.vers = append(ed.vers, v)
		case "tombstone_node":
			n := m.nodes[r.id]
			l := n.latest()
			if l == nil {
				fail(e, "ok, but the node never existed")
				continue
			}
			if l.tomb {
				fail(e, "ok, but the node was already tombstoned at tx %s (double tombstone)", fmtTs(l.tx))
			}
			ve := opt(r.ve, tx)
			collected := 0
			for _, id := range m.adj[r.id] {
				ed := m.edges[id]
				le := ed.latest()
				if le.tomb && le.vf <= ve {
					continue
				}
				v := &mver{edge: true, id: id, src: le.src, dst: le.dst, label: le.label, vf: ve, vt: openEnd, tx: tx, tomb: true, props: "{}"}
				provOf(r, v)
				ed.vers = append(ed.vers, v)
				collected++
			}
			if uint64(collected) != e.res.EdgesTombstoned {
				fail(e, "edges_tombstoned %d, the model collects %d of the %d edges touching the node", e.res.EdgesTombstoned, collected, len(m.adj[r.id]))
			}
			// Inline when edges*5 + 3 <= --max-batch-ops (40): up to 7 edges.
			if want := e.res.EdgesTombstoned > 7; e.res.Journaled != want {
				fail(e, "journaled=%v with %d edges at --max-batch-ops %d", e.res.Journaled, e.res.EdgesTombstoned, maxBatchOps)
			}
			v := &mver{id: r.id, vf: ve, vt: openEnd, tx: tx, tomb: true, props: "{}"}
			provOf(r, v)
			n.vers = append(n.vers, v)
			w.cascades = append(w.cascades, cascadeRec{tenant: r.tenant, node: r.id, ve: ve, tx: tx, touched: append([]uuid.UUID(nil), m.adj[r.id]...), rid: r.rid})
		default:
			fail(e, "ok for an unknown op")
		}
	}
	return w, bad
}

// bounds places a decision without a tx among the effects, by causality
// only (no clock assumption): an effect whose ok result arrived before the
// request was first published was decided before it; an effect first
// published after the request's result arrived was decided after it.
type bounds struct {
	byRecv  []*effect
	prefMax []int64
	byPub   []*effect
	sufMin  []int64
}

func newBounds(effects []*effect) *bounds {
	b := &bounds{byRecv: append([]*effect(nil), effects...), byPub: append([]*effect(nil), effects...)}
	sort.Slice(b.byRecv, func(i, j int) bool { return b.byRecv[i].recv.Before(b.byRecv[j].recv) })
	sort.Slice(b.byPub, func(i, j int) bool { return b.byPub[i].rs.firstPub.Before(b.byPub[j].rs.firstPub) })
	b.prefMax = make([]int64, len(effects))
	run := noTs
	for i, e := range b.byRecv {
		run = max(run, e.tx)
		b.prefMax[i] = run
	}
	b.sufMin = make([]int64, len(effects))
	run = openEnd
	for i := len(b.byPub) - 1; i >= 0; i-- {
		run = min(run, b.byPub[i].tx)
		b.sufMin[i] = run
	}
	return b
}

// window returns (lo, hi): the decision saw every effect with tx <= lo and
// none with tx >= hi.
func (b *bounds) window(published, answered time.Time) (lo, hi int64) {
	lo, hi = noTs, openEnd
	i := sort.Search(len(b.byRecv), func(i int) bool { return !b.byRecv[i].recv.Before(published) })
	if i > 0 {
		lo = b.prefMax[i-1]
	}
	j := sort.Search(len(b.byPub), func(j int) bool { return b.byPub[j].rs.firstPub.After(answered) })
	if j < len(b.byPub) {
		hi = b.sufMin[j]
	}
	return lo, hi
}

// refusalHolds says whether a refusal status is what the rules give for r
// against the state made of the effects with tx < tau.
func (m *tmodel) refusalHolds(r *request, status string, tau int64) bool {
	lat := func(edge bool, id uuid.UUID) *mver {
		if edge {
			return m.edges[id].latestBefore(tau)
		}
		return m.nodes[id].latestBefore(tau)
	}
	switch r.op {
	case "tombstone_node", "tombstone_edge":
		l := lat(r.op == "tombstone_edge", r.id)
		switch status {
		case queue.StatusNotFound:
			return l == nil
		case queue.StatusAlreadyTombstoned:
			return l != nil && l.tomb
		}
	case "put_node":
		l := lat(false, r.id)
		return status == queue.StatusAlreadyTombstoned && l != nil && l.tomb
	case "put_edge":
		e := lat(true, r.id)
		mismatch := e != nil && (e.src != r.src || e.dst != r.dst)
		if status == queue.StatusInvalid || mismatch {
			return status == queue.StatusInvalid && mismatch
		}
		if e != nil && e.tomb {
			return status == queue.StatusAlreadyTombstoned
		}
		missing, dead := false, false
		for _, n := range []uuid.UUID{r.src, r.dst} {
			l := lat(false, n)
			if l == nil {
				missing = true
			} else if l.tomb {
				dead = true
			}
		}
		switch status {
		case queue.StatusNotFound:
			return missing
		case queue.StatusEndpointDead:
			return !missing && dead
		}
	}
	return false
}

// relevant lists the entities whose versions can change r's refusal.
func (m *tmodel) relevant(r *request) []*mentity {
	var out []*mentity
	add := func(e *mentity) {
		if e != nil {
			out = append(out, e)
		}
	}
	switch r.op {
	case "tombstone_edge":
		add(m.edges[r.id])
	case "put_edge":
		add(m.edges[r.id])
		add(m.nodes[r.src])
		add(m.nodes[r.dst])
	default:
		add(m.nodes[r.id])
	}
	return out
}

// checkRefusal checks a final refusal (no tx): some point of the serial
// order inside the causal window must give exactly this status.
func (w *world) checkRefusal(b *bounds, rs *reqState, status string, answered time.Time) string {
	r := rs.req
	m := w.tenants[r.tenant]
	lo, hi := b.window(rs.firstPub, answered)
	taus := []int64{lo + 1}
	if lo == noTs {
		taus[0] = noTs + 1
	}
	for _, e := range m.relevant(r) {
		for _, v := range e.vers {
			if v.tx > lo && v.tx < hi {
				taus = append(taus, v.tx+1)
			}
		}
	}
	for _, tau := range taus {
		if m.refusalHolds(r, status, tau) {
			return ""
		}
	}
	var sb strings.Builder
	fmt.Fprintf(&sb, "request %s (%s %s %s): status %s, but no point of the serial order between tx %s and %s gives it; the model's versions:",
		r.rid, r.tenant, r.op, r.id, status, fmtTs(lo), fmtTs(hi))
	for _, e := range m.relevant(r) {
		for _, v := range e.vers {
			fmt.Fprintf(&sb, "\n      %s %s", e.id.String()[:8], v)
		}
	}
	return sb.String()
}

// checkInFlight checks a cascade_in_flight answer, weakly: a journaled
// cascade of a node the request touches must have committed before the
// answer and finished (its result arrived) after the request was published.
func (w *world) checkInFlight(b *bounds, rs *reqState, answered time.Time) string {
	r := rs.req
	m := w.tenants[r.tenant]
	_, hi := b.window(rs.firstPub, answered)
	var nodes []uuid.UUID
	switch r.op {
	case "put_node":
		nodes = []uuid.UUID{r.id}
	case "put_edge":
		nodes = []uuid.UUID{r.src, r.dst}
	case "tombstone_edge":
		if e := m.edges[r.id]; e != nil {
			nodes = []uuid.UUID{e.vers[0].src, e.vers[0].dst}
		}
	case "tombstone_node":
		nodes = []uuid.UUID{r.id}
		for _, id := range m.adj[r.id] {
			f := m.edges[id].vers[0]
			nodes = append(nodes, f.src, f.dst)
		}
	}
	for _, e := range w.effects {
		er := e.rs.req
		if er.op != "tombstone_node" || !e.res.Journaled || er.tenant != r.tenant || e.tx >= hi || !e.recv.After(rs.firstPub) {
			continue
		}
		for _, n := range nodes {
			if n == er.id {
				return ""
			}
		}
	}
	return fmt.Sprintf("request %s (%s %s %s): cascade_in_flight, but no journaled cascade of a node it touches (%d nodes) was in flight between its publish and its answer (before tx %s)",
		r.rid, r.tenant, r.op, r.id, len(nodes), fmtTs(hi))
}
