package main

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/telha/telha-cascade/queue"
	"github.com/telha/telha-cascade/storage"
)

// writeSet appends to b the versions the cascade of sp writes, with fresh
// ids (same kinds, label, provenance, hence the same key and value sizes)
// and the request's receipt: 5+1 puts for a tombstone_edge, 5k+3+1 for a
// tombstone_node of k edges.
func writeSet(b *pebble.Batch, sc storage.Scope, sp *spec, requestID string, tx storage.Ts, rng *rand.Rand) storage.Receipt {
	prov := storage.Provenance{Actor: benchActor, Reason: benchReason, Source: benchSource, RequestID: requestID, DecidedAt: storage.NoTs}
	id := randUUID(rng)
	edge := func(eid, src, dst uuid.UUID) {
		v := storage.Version{Kind: storage.KindEdge, ID: eid, Src: src, Dst: dst, Label: benchLabel,
			Valid: storage.Open(tx), Tx: storage.Open(tx), Tombstone: true, Props: []byte("{}"), Prov: prov}
		storage.AppendVersion(b, sc, &v)
	}
	rc := storage.Receipt{Status: storage.StatusOK, ID: id, Tx: tx}
	if sp.edges < 0 {
		edge(id, randUUID(rng), randUUID(rng))
		rc.Op = storage.OpTombstoneEdge
	} else {
		for k := range sp.edges {
			src, dst := id, randUUID(rng)
			if k%2 == 1 {
				src, dst = dst, id
			}
			edge(randUUID(rng), src, dst)
		}
		v := storage.Version{Kind: storage.KindNode, ID: id, Valid: storage.Open(tx), Tx: storage.Open(tx), Tombstone: true, Props: []byte("{}"), Prov: prov}
		storage.AppendVersion(b, sc, &v)
		rc.Op, rc.EdgesTombstoned = storage.OpTombstoneNode, uint64(sp.edges)
	}
	_ = b.Set(storage.ReceiptKey(sc, requestID), storage.EncodeReceipt(&rc), nil)
	return rc
}

func randUUID(rng *rand.Rand) uuid.UUID {
	var u uuid.UUID
	binary.LittleEndian.PutUint64(u[:8], rng.Uint64())
	binary.LittleEndian.PutUint64(u[8:], rng.Uint64())
	u[6] = (u[6] & 0x0f) | 0x40
	u[8] = (u[8] & 0x3f) | 0x80
	return u
}

// minimal is the pipeline or naive consumer: it reads the request id from
// Nats-Msg-Id (its shape and tenant come from the spec table, no body
// decoding), writes the request's write-set and publishes its result.
type minimal struct {
	st      *storage.Store
	db      storage.Engine
	js      jetstream.JetStream
	cfg     queue.Config
	specs   []spec
	scopes  map[string]storage.Scope
	counter *commitCounter
	rng     *rand.Rand
	clock   *storage.TxClock
}

// lookup finds the spec of a message from its request id "<tag>-<run>-<i>".
// The publisher's Nats-Msg-Id is "<tenant>.<request_id>" (CONTRACT §5), and
// the stored subject ends in the tenant, so the request id is the message id
// less that prefix. It is checked against the spec it names, so a change of
// the message-id shape fails loudly here instead of leaving every result
// unmatched.
func (m *minimal) lookup(msg jetstream.Msg) (*spec, string, error) {
	subj := msg.Subject()
	tenant := subj[strings.LastIndexByte(subj, '.')+1:]
	rid, ok := strings.CutPrefix(msg.Headers().Get(jetstream.MsgIDHeader), tenant+".")
	if !ok {
		return nil, "", fmt.Errorf("message id %q on %s is not <tenant>.<request_id>", msg.Headers().Get(jetstream.MsgIDHeader), subj)
	}
	i, err := strconv.Atoi(rid[strings.LastIndexByte(rid, '-')+1:])
	if err != nil || i < 0 || i >= len(m.specs) {
		return nil, "", fmt.Errorf("bad request id %q", rid)
	}
	if m.specs[i].tenant != tenant {
		return nil, "", fmt.Errorf("request id %q names a spec of tenant %s, not %s", rid, m.specs[i].tenant, tenant)
	}
	return &m.specs[i], rid, nil
}

func (m *minimal) scope(t string) storage.Scope {
	sc, ok := m.scopes[t]
	if !ok {
		sc = storage.MustScope(t)
		m.scopes[t] = sc
	}
	return sc
}

func (m *minimal) resultMsg(sp *spec, rid string, rc storage.Receipt) *nats.Msg {
	res := queue.ResultOfReceipt(sp.tenant, rid, rc, nil)
	res.ID = sp.id.String()
	body, _ := json.Marshal(res)
	msg := nats.NewMsg(m.cfg.Prefix + ".res." + sp.tenant)
	msg.Data = body
	msg.Header.Set(jetstream.MsgIDHeader, "res-"+rid)
	return msg
}

func (m *minimal) commit(b *pebble.Batch) error {
	m.counter.add(b)
	t0 := time.Now()
	err := m.db.Commit(b) // the worker's durable call: pebble.Sync
	m.counter.took(time.Since(t0))
	return err
}

// setupMinimal provisions streams and the consumer under prefix (the
// worker's configuration) and opens a fresh store.
func setupMinimal(ctx context.Context, ns *natsServer, dir, prefix string, specs []spec) (*minimal, *nats.Conn, jetstream.Consumer, error) {
	cfg := queue.Config{Prefix: prefix, ReqStream: strings.ToUpper(prefix) + "_REQ", ResStream: strings.ToUpper(prefix) + "_RES", DLQStream: strings.ToUpper(prefix) + "_DLQ"}.Defaults()
	nc, err := nats.Connect(ns.url, nats.Name("bench-"+prefix))
	if err != nil {
		return nil, nil, nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, nil, err
	}
	pctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	cons, err := queue.Provision(pctx, js, cfg)
	if err != nil {
		nc.Close()
		return nil, nil, nil, err
	}
	// A store opened like the worker's (same Pebble options); only its
	// engine is used.
	st, err := storage.OpenStore(dir, storage.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		nc.Close()
		return nil, nil, nil, err
	}
	m := &minimal{st: st, db: st.Engine(), js: js, cfg: cfg, specs: specs, scopes: map[string]storage.Scope{}, counter: &commitCounter{},
		rng: rand.New(rand.NewPCG(1, 2)), clock: storage.NewTxClock(nil, storage.NoTs)}
	return m, nc, cons, nil
}

// consumeInto starts consuming with the worker's buffer size and returns
// the channel messages arrive on and a stop function.
func consumeInto(cons jetstream.Consumer, buffer int) (<-chan jetstream.Msg, func(), error) {
	in := make(chan jetstream.Msg, buffer)
	quit := make(chan struct{})
	cc, err := cons.Consume(func(m jetstream.Msg) {
		select {
		case in <- m:
		case <-quit:
		}
	}, jetstream.PullMaxMessages(buffer))
	if err != nil {
		return nil, nil, err
	}
	var once sync.Once
	return in, func() { once.Do(func() { close(quit); cc.Stop() }) }, nil
}

// runPipeline measures the raw limit: group commit without cascade logic.
func runPipeline(ctx context.Context, o *options, pg progress, ns *natsServer, dir string, specs *specSet, rep *Report) error {
	// The same specs as the small run (warm-up and saturation), so the same
	// message count, bodies and write-set sizes.
	m, nc, cons, err := setupMinimal(ctx, ns, dir, "benchp", nil)
	if err != nil {
		return err
	}
	defer nc.Close()
	defer m.st.Close()
	cfg := m.cfg
	groupMax := cfg.GroupMax

	d, err := newDriver(ns.url, "benchp")
	if err != nil {
		return err
	}
	defer d.close()

	var specsMu sync.RWMutex
	setSpecs := func(s []spec) { specsMu.Lock(); m.specs = s; specsMu.Unlock() }

	in, stopConsume, err := consumeInto(cons, cfg.Buffer)
	if err != nil {
		return err
	}
	quit := make(chan struct{})
	loopDone := make(chan error, 1)
	go pprof.Do(ctx, pprof.Labels("side", "pipeline"), func(context.Context) {
		loopDone <- m.pipelineLoop(in, quit, groupMax, &specsMu)
	})
	defer func() {
		close(quit)
		stopConsume()
		if err := <-loopDone; err != nil {
			pg.printf("pipeline loop: %v", err)
		}
	}()
	closed := load{publishers: o.publishers, window: o.window}
	setSpecs(specs.warm)
	if _, err := d.run(ctx, "warm", specs.warm, closed, 60*time.Second); err != nil {
		return fmt.Errorf("warm-up: %w", err)
	}
	runtime.GC()
	waitIdle(o.waitIdle, runtime.NumCPU(), pg)
	setSpecs(specs.sat)
	m.counter.reset()
	prof, err := startProfile(o.profileDir, "pipeline")
	if err != nil {
		return err
	}
	pm0, sm0 := m.db.Metrics(), markStalls(m.st)
	st, err := d.run(ctx, "pipe", specs.sat, closed, 60*time.Second)
	pm1 := m.db.Metrics()
	if perr := prof.stop(); perr != nil && err == nil {
		err = perr
	}
	if err != nil {
		return err
	}
	rep.Pipeline.fromRun(st)
	rep.Pipeline.Writes = m.counter.stats(st.Requests, st.Seconds)
	rep.Pipeline.Pebble = pebbleDelta(pm0, pm1).withStalls(m.st, sm0)
	pg.printf("pipeline: %d requests, %.0f/s, p50 %.1f ms, p99 %.1f ms, %.1f msgs/commit, %.1f puts/msg",
		st.Requests, st.PerSec, st.P50ms, st.P99ms, rep.Pipeline.Writes.MsgsPerCommit, rep.Pipeline.Writes.PutsPerMsg)
	return nil
}

type pipeItem struct {
	msg jetstream.Msg
	res *nats.Msg
}

// pipelineLoop is the worker's structure without the cascade: take what has
// arrived (up to groupMax), one synced batch, then (overlapped with the next
// group) publish results async, await their acks, ack the messages.
func (m *minimal) pipelineLoop(in <-chan jetstream.Msg, quit <-chan struct{}, groupMax int, specsMu *sync.RWMutex) error {
	groups := make(chan []pipeItem, 2)
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		for g := range groups {
			futs := make([]jetstream.PubAckFuture, len(g))
			for i, it := range g {
				f, err := m.js.PublishMsgAsync(it.res)
				if err != nil {
					_ = it.msg.NakWithDelay(time.Second)
					continue
				}
				futs[i] = f
			}
			for i, f := range futs {
				if f == nil {
					continue
				}
				select {
				case <-f.Ok():
					_ = g[i].msg.Ack()
				case <-f.Err():
					_ = g[i].msg.NakWithDelay(time.Second)
				}
			}
		}
	}()
	defer func() { close(groups); <-finished }()
	var batch []jetstream.Msg
	for {
		var first jetstream.Msg
		select {
		case first = <-in:
		case <-quit:
			return nil
		}
		batch = append(batch[:0], first)
	fill:
		for len(batch) < groupMax {
			select {
			case x := <-in:
				batch = append(batch, x)
			default:
				break fill
			}
		}
		b := m.db.NewBatch()
		items := make([]pipeItem, 0, len(batch))
		specsMu.RLock()
		for _, msg := range batch {
			sp, rid, err := m.lookup(msg)
			if err != nil {
				specsMu.RUnlock()
				return err
			}
			rc := writeSet(b, m.scope(sp.tenant), sp, rid, m.clock.Next(), m.rng)
			items = append(items, pipeItem{msg: msg, res: m.resultMsg(sp, rid, rc)})
		}
		specsMu.RUnlock()
		err := m.commit(b)
		b.Close()
		if err != nil {
			return err
		}
		groups <- items
	}
}

// runNaive: one message at a time, one synced commit each.
func runNaive(ctx context.Context, o *options, pg progress, ns *natsServer, dir string, specs *specSet, rep *Report) error {
	n := min(o.naiveRequests, len(specs.sat))
	m, nc, cons, err := setupMinimal(ctx, ns, dir, "benchn", nil)
	if err != nil {
		return err
	}
	defer nc.Close()
	defer m.st.Close()
	d, err := newDriver(ns.url, "benchn")
	if err != nil {
		return err
	}
	defer d.close()
	var specsMu sync.RWMutex
	setSpecs := func(s []spec) { specsMu.Lock(); m.specs = s; specsMu.Unlock() }
	in, stopConsume, err := consumeInto(cons, m.cfg.Buffer)
	if err != nil {
		return err
	}
	quit := make(chan struct{})
	loopDone := make(chan error, 1)
	go pprof.Do(ctx, pprof.Labels("side", "naive"), func(context.Context) {
		loopDone <- func() error {
			for {
				var msg jetstream.Msg
				select {
				case msg = <-in:
				case <-quit:
					return nil
				}
				specsMu.RLock()
				sp, rid, err := m.lookup(msg)
				specsMu.RUnlock()
				if err != nil {
					return err
				}
				b := m.db.NewBatch()
				rc := writeSet(b, m.scope(sp.tenant), sp, rid, m.clock.Next(), m.rng)
				err = m.commit(b)
				b.Close()
				if err != nil {
					return err
				}
				if _, err := m.js.PublishMsgAsync(m.resultMsg(sp, rid, rc)); err != nil {
					return err
				}
				_ = msg.Ack()
			}
		}()
	})
	defer func() {
		close(quit)
		stopConsume()
		if err := <-loopDone; err != nil && !errors.Is(err, context.Canceled) {
			pg.printf("naive loop: %v", err)
		}
	}()
	closed := load{publishers: o.publishers, window: o.window}
	warm := specs.warm[:min(len(specs.warm), 200)]
	setSpecs(warm)
	if _, err := d.run(ctx, "warm", warm, closed, 60*time.Second); err != nil {
		return fmt.Errorf("warm-up: %w", err)
	}
	runtime.GC()
	waitIdle(o.waitIdle, runtime.NumCPU(), pg)
	setSpecs(specs.sat[:n])
	m.counter.reset()
	pm0, sm0 := m.db.Metrics(), markStalls(m.st)
	st, err := d.run(ctx, "naive", specs.sat[:n], closed, 60*time.Second)
	pm1 := m.db.Metrics()
	if err != nil {
		return err
	}
	rep.Naive.fromRun(st)
	rep.Naive.Writes = m.counter.stats(st.Requests, st.Seconds)
	rep.Naive.Pebble = pebbleDelta(pm0, pm1).withStalls(m.st, sm0)
	pg.printf("naive: %d requests, %.0f/s, p50 %.1f ms, p99 %.1f ms, %.1f puts/msg",
		st.Requests, st.PerSec, st.P50ms, st.P99ms, rep.Naive.Writes.PutsPerMsg)
	return nil
}
