package crashtest

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"sort"
	"time"

	"github.com/google/uuid"
)

// The load: a deterministic (seeded) stream of publish items over a few
// tenants. Outcomes are not deterministic (the worker assigns tx times and
// the kills land where they land), so the generator never looks at results:
// it only remembers which ids it asked to create.

// tval is an optional request time: its µs value and the text sent.
type tval struct {
	us   int64
	text string
}

// request is one request as the test sent it.
type request struct {
	idx     int
	rid     string
	tenant  string
	op      string
	id      uuid.UUID
	src     uuid.UUID
	dst     uuid.UUID
	label   string
	vf, vt  *tval // put_*; nil = omitted
	ve      *tval // tombstone_*; nil = omitted
	props   string
	actor   string
	reason  string
	source  string
	decided *tval

	// invalid is set for requests the worker must refuse as invalid
	// whatever the store holds (malformed on purpose).
	invalid string
	// hubCascade marks the tombstone_node of a hub (likely journaled).
	hubCascade bool

	body []byte
}

// item is one publish: a request under a Nats-Msg-Id.
type item struct {
	req   *request
	msgID string
	kind  string // "orig", "dup-same-msgid", "dup-new-msgid"
}

type genEdge struct {
	id, src, dst uuid.UUID
}

type genTenant struct {
	name  string
	nodes []uuid.UUID
	edges []genEdge
}

type scheduled struct {
	due int
	seq int
	fn  func() *item
}

// generator produces the publish items.
type generator struct {
	seed    int64
	rng     *rand.Rand
	tenants []*genTenant
	weights []int
	n       int // items emitted
	reqs    int // requests created
	seq     int
	sched   []scheduled
	all     []*request
	labels  []string
}

// Tenants: "a" and "ab" are prefixes of each other (keys are length
// prefixed; nothing may leak between them), and node ids are sometimes
// reused across tenants.
// year2026 separates the past and future valid_ends the generator makes.
var year2026 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixMicro()

var tenantNames = []string{"a", "ab", "z9-x_y"}

func newGenerator(seed int64) *generator {
	g := &generator{
		seed:    seed,
		rng:     rand.New(rand.NewPCG(uint64(seed), 0x7e1a)),
		weights: []int{40, 35, 25},
		labels:  []string{"knows", "likes", "owns", "", "réseau"},
	}
	for _, n := range tenantNames {
		g.tenants = append(g.tenants, &genTenant{name: n})
	}
	return g
}

func (g *generator) uuid() uuid.UUID {
	var u uuid.UUID
	for i := 0; i < 16; i += 8 {
		x := g.rng.Uint64()
		for j := 0; j < 8; j++ {
			u[i+j] = byte(x >> (8 * j))
		}
	}
	u[6] = (u[6] & 0x0f) | 0x40
	u[8] = (u[8] & 0x3f) | 0x80
	return u
}

func (g *generator) intn(n int) int { return g.rng.IntN(n) }

func (g *generator) pct(p int) bool { return g.rng.IntN(100) < p }

// timeBetween returns a random time between two years (UTC), as sent: mostly
// RFC 3339 UTC with 6 fractional digits, sometimes without fraction or with
// a zone offset.
func (g *generator) timeBetween(fromYear, toYear int) *tval {
	lo := time.Date(fromYear, 1, 1, 0, 0, 0, 0, time.UTC).UnixMicro()
	hi := time.Date(toYear, 1, 1, 0, 0, 0, 0, time.UTC).UnixMicro()
	return g.timeAt(lo + g.rng.Int64N(hi-lo))
}

func (g *generator) timeAt(us int64) *tval {
	t := time.UnixMicro(us).UTC()
	var s string
	switch r := g.intn(10); {
	case r < 8:
		s = t.Format("2006-01-02T15:04:05.000000Z07:00")
	case r < 9:
		s = t.Format(time.RFC3339) // seconds only
	default:
		zones := []*time.Location{time.FixedZone("", 5*3600+1800), time.FixedZone("", -3*3600)}
		s = t.In(zones[g.intn(2)]).Format(time.RFC3339Nano)
	}
	p, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		panic(err)
	}
	return &tval{us: p.UnixMicro(), text: s}
}

// validInterval returns optional valid_from / valid_to of a put.
func (g *generator) validInterval() (vf, vt *tval) {
	switch r := g.intn(10); {
	case r < 5: // defaults: [tx, open)
		return nil, nil
	case r < 6: // [tx, far future)
		return nil, g.timeBetween(2060, 2190)
	default:
		if g.pct(25) {
			vf = g.timeBetween(1890, 1970)
		} else {
			vf = g.timeBetween(1970, 2100)
		}
		if g.pct(50) {
			span := int64(time.Hour/time.Microsecond) * (1 + g.rng.Int64N(24*365*80))
			vt = g.timeAt(vf.us + span)
		}
		return vf, vt
	}
}

// validEnd returns the optional valid_end of a tombstone: omitted (the
// request's tx), past, or future.
func (g *generator) validEnd(futurePct int) *tval {
	switch r := g.intn(100); {
	case r < 35:
		return nil
	case r < 100-futurePct:
		if g.pct(30) {
			return g.timeBetween(1895, 1970)
		}
		return g.timeBetween(1970, 2025)
	default:
		return g.timeBetween(2030, 2150)
	}
}

func (g *generator) pickTenant() *genTenant {
	r := g.intn(100)
	for i, w := range g.weights {
		if r < w {
			return g.tenants[i]
		}
		r -= w
	}
	return g.tenants[len(g.tenants)-1]
}

// pickNode picks a node id the tenant asked to create, mostly recent ones.
func (g *generator) pickNode(t *genTenant) uuid.UUID {
	if g.pct(70) && len(t.nodes) > 60 {
		return t.nodes[len(t.nodes)-1-g.intn(60)]
	}
	return t.nodes[g.intn(len(t.nodes))]
}

func (g *generator) pickEdge(t *genTenant) genEdge {
	if g.pct(60) && len(t.edges) > 80 {
		return t.edges[len(t.edges)-1-g.intn(80)]
	}
	return t.edges[g.intn(len(t.edges))]
}

func (g *generator) newReq(t *genTenant, op string, id uuid.UUID) *request {
	g.reqs++
	r := &request{idx: g.reqs, rid: fmt.Sprintf("crash-%d-%06d", g.seed, g.reqs), tenant: t.name, op: op, id: id}
	r.actor = "crashtest"
	r.reason = []string{"", "gdpr", "cleanup", "test reason ✓"}[g.intn(4)]
	if g.pct(30) {
		r.source = "src-" + fmt.Sprint(g.intn(5))
	}
	if g.pct(25) {
		r.decided = g.timeBetween(2000, 2030)
	}
	g.all = append(g.all, r)
	return r
}

func (g *generator) props() string {
	if g.pct(20) {
		return ""
	}
	return fmt.Sprintf(`{"n":%d,"s":"v%d","nested":{"k":[1,2,%d]}}`, g.intn(1000), g.intn(50), g.intn(9))
}

func (g *generator) putNode(t *genTenant, id uuid.UUID) *request {
	r := g.newReq(t, "put_node", id)
	r.vf, r.vt = g.validInterval()
	r.props = g.props()
	return r
}

func (g *generator) newNodeID(t *genTenant) uuid.UUID {
	if g.pct(15) {
		// Reuse an id of another tenant: tenants must stay isolated.
		o := g.tenants[g.intn(len(g.tenants))]
		if o != t && len(o.nodes) > 0 {
			id := o.nodes[g.intn(len(o.nodes))]
			for _, x := range t.nodes {
				if x == id {
					return g.uuid()
				}
			}
			return id
		}
	}
	return g.uuid()
}

func (g *generator) addNode(t *genTenant) *request {
	id := g.newNodeID(t)
	t.nodes = append(t.nodes, id)
	return g.putNode(t, id)
}

func (g *generator) putEdge(t *genTenant, id, src, dst uuid.UUID) *request {
	r := g.newReq(t, "put_edge", id)
	r.src, r.dst = src, dst
	r.label = g.labels[g.intn(len(g.labels))]
	r.vf, r.vt = g.validInterval()
	r.props = g.props()
	return r
}

func (g *generator) addEdge(t *genTenant, src, dst uuid.UUID) *request {
	e := genEdge{id: g.uuid(), src: src, dst: dst}
	t.edges = append(t.edges, e)
	return g.putEdge(t, e.id, src, dst)
}

func (g *generator) tombNode(t *genTenant, id uuid.UUID, ve *tval) *request {
	r := g.newReq(t, "tombstone_node", id)
	r.ve = ve
	return r
}

func (g *generator) tombEdge(t *genTenant, id uuid.UUID, ve *tval) *request {
	r := g.newReq(t, "tombstone_edge", id)
	r.ve = ve
	return r
}

func (g *generator) schedule(due int, fn func() *item) {
	g.seq++
	g.sched = append(g.sched, scheduled{due: due, seq: g.seq, fn: fn})
	sort.SliceStable(g.sched, func(i, j int) bool {
		if g.sched[i].due != g.sched[j].due {
			return g.sched[i].due < g.sched[j].due
		}
		return g.sched[i].seq < g.sched[j].seq
	})
}

func orig(r *request) *item { return &item{req: r, msgID: r.rid, kind: "orig"} }

func (g *generator) scheduleReq(due int, fn func() *request) {
	g.schedule(due, func() *item {
		r := fn()
		if r == nil {
			return nil
		}
		return orig(r)
	})
}

// next returns the next publish item.
func (g *generator) next() *item {
	for {
		it := g.next1()
		if it == nil {
			continue
		}
		g.n++
		if it.kind == "orig" {
			r := it.req
			r.body = encodeRequest(r)
			// Duplicates: the same Nats-Msg-Id (the stream drops it), and a
			// new Nats-Msg-Id with the same request_id (the worker's own
			// exactly-once path).
			if g.pct(4) {
				g.schedule(g.n+1+g.intn(30), func() *item { return &item{req: r, msgID: r.rid, kind: "dup-same-msgid"} })
			}
			if g.pct(5) || (r.hubCascade && g.pct(30)) {
				g.schedule(g.n+1+g.intn(60), func() *item { return &item{req: r, msgID: r.rid + "#dup", kind: "dup-new-msgid"} })
			}
		}
		return it
	}
}

func (g *generator) next1() *item {
	if len(g.sched) > 0 && g.sched[0].due <= g.n {
		s := g.sched[0]
		g.sched = g.sched[1:]
		return s.fn()
	}
	t := g.pickTenant()
	if len(t.nodes) < 6 {
		return orig(g.addNode(t))
	}
	switch r := g.intn(100); {
	case r < 22:
		return orig(g.addNode(t))
	case r < 26: // a new version of an existing node
		return orig(g.putNode(t, g.pickNode(t)))
	case r < 50:
		src, dst := g.pickNode(t), g.pickNode(t)
		switch x := g.intn(100); {
		case x < 8:
			dst = src // self-loop
		case x < 10:
			dst = g.uuid() // an endpoint that never existed
		}
		return orig(g.addEdge(t, src, dst))
	case r < 55: // a new version of an existing edge
		if len(t.edges) == 0 {
			return orig(g.addNode(t))
		}
		e := g.pickEdge(t)
		if g.pct(10) {
			// Other endpoints for an existing edge id: invalid if it exists.
			return orig(g.putEdge(t, e.id, e.dst, g.pickNode(t)))
		}
		return orig(g.putEdge(t, e.id, e.src, e.dst))
	case r < 64:
		if len(t.edges) == 0 {
			return orig(g.addNode(t))
		}
		e := g.pickEdge(t)
		req := g.tombEdge(t, e.id, g.validEnd(40))
		if req.ve != nil && req.ve.us > year2026 && g.pct(40) {
			// A later cascade of an endpoint with an earlier valid_end
			// narrows the edge's tombstone (CONTRACT §3).
			n := e.src
			if g.pct(50) {
				n = e.dst
			}
			ve := g.validEnd(0)
			g.scheduleReq(g.n+2+g.intn(40), func() *request { return g.tombNode(t, n, ve) })
		}
		return orig(req)
	case r < 74:
		return orig(g.tombNode(t, g.pickNode(t), g.validEnd(30)))
	case r < 76: // ids that never existed
		if g.pct(50) {
			return orig(g.tombNode(t, g.uuid(), g.validEnd(30)))
		}
		return orig(g.tombEdge(t, g.uuid(), g.validEnd(30)))
	case r < 77:
		return orig(g.invalidReq(t))
	case r < 79:
		return g.hub(t)
	default:
		if g.pct(50) {
			return orig(g.addNode(t))
		}
		return orig(g.addEdge(t, g.pickNode(t), g.pickNode(t)))
	}
}

// invalidReq builds a request the worker must answer invalid.
func (g *generator) invalidReq(t *genTenant) *request {
	if g.pct(50) {
		r := g.putNode(t, g.uuid())
		r.vf = g.timeBetween(2000, 2010)
		r.vt = g.timeBetween(1950, 1990)
		r.invalid = "valid_from after valid_to"
		return r
	}
	r := g.tombNode(t, g.pickNode(t), nil)
	r.props = `{"x":1}`
	r.invalid = "props on a tombstone"
	return r
}

// hub emits a hub node and schedules 10-60 edges to and from it, its
// cascade (journaled at --max-batch-ops 40 when more than 7 edges are live)
// and requests that race the cascade.
func (g *generator) hub(t *genTenant) *item {
	h := g.addNode(t)
	hid := h.id
	k := 10 + g.intn(51)
	due := g.n + 1
	var hubEdges []uuid.UUID
	neighbour := map[uuid.UUID]uuid.UUID{}
	for i := 0; i < k; i++ {
		var other uuid.UUID
		var leaf *request
		switch x := g.intn(100); {
		case x < 5:
			other = hid
		case x < 35:
			leaf = g.addNode(t)
			other = leaf.id
		default:
			other = g.pickNode(t)
		}
		if leaf != nil {
			l := leaf
			g.scheduleReq(due, func() *request { return l })
			due++
		}
		src, dst := hid, other
		if g.pct(50) {
			src, dst = other, hid
		}
		e := g.addEdge(t, src, dst)
		hubEdges = append(hubEdges, e.id)
		neighbour[e.id] = other
		g.scheduleReq(due, func() *request { return e })
		due++
	}
	// The cascade a little later, then requests that race it.
	due += g.intn(40)
	ve := g.validEnd(30)
	g.scheduleReq(due, func() *request {
		r := g.tombNode(t, hid, ve)
		r.hubCascade = true
		return r
	})
	for i := 0; i < 1+g.intn(3); i++ {
		d := due + 1 + g.intn(4)
		switch g.intn(4) {
		case 0:
			g.scheduleReq(d, func() *request { return g.addEdge(t, hid, g.pickNode(t)) })
		case 1: // a neighbour's cascade: refused while the hub's journal is in flight
			e := hubEdges[g.intn(len(hubEdges))]
			g.scheduleReq(d, func() *request { return g.tombNode(t, neighbour[e], g.validEnd(30)) })
		case 2:
			id := hubEdges[g.intn(len(hubEdges))]
			g.scheduleReq(d, func() *request { return g.tombEdge(t, id, g.validEnd(30)) })
		default:
			g.scheduleReq(d, func() *request { return g.putNode(t, hid) })
		}
	}
	return orig(h)
}

func encodeRequest(r *request) []byte {
	m := map[string]any{"request_id": r.rid, "op": r.op, "tenant": r.tenant, "id": r.id.String()}
	if r.op == "put_edge" {
		m["src"], m["dst"], m["label"] = r.src.String(), r.dst.String(), r.label
	}
	if r.vf != nil {
		m["valid_from"] = r.vf.text
	}
	if r.vt != nil {
		m["valid_to"] = r.vt.text
	}
	if r.ve != nil {
		m["valid_end"] = r.ve.text
	}
	if r.props != "" {
		m["props"] = json.RawMessage(r.props)
	}
	prov := map[string]any{"actor": r.actor, "reason": r.reason}
	if r.source != "" {
		prov["source"] = r.source
	}
	if r.decided != nil {
		prov["decided_at"] = r.decided.text
	}
	m["provenance"] = prov
	b, err := json.Marshal(m)
	if err != nil {
		panic(err)
	}
	return b
}
