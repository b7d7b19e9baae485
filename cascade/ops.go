package cascade

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/google/uuid"
	"github.com/telha/telha-cascade/storage"
)

// Errors, re-exported from storage so callers need one import. Test with
// errors.Is.
var (
	ErrNotFound          = storage.ErrNotFound
	ErrAlreadyTombstoned = storage.ErrAlreadyTombstoned
	ErrEndpointDead      = storage.ErrEndpointDead
	ErrCascadeInFlight   = storage.ErrCascadeInFlight
	ErrInvalid           = storage.ErrInvalid
	ErrConflict          = storage.ErrConflict
	ErrDecode            = storage.ErrDecode
	ErrStorage           = storage.ErrStorage
)

// DefaultMaxBatchOps is the inline-versus-journaled threshold and the chunk
// size when none is configured.
const DefaultMaxBatchOps = 100_000

// DefaultChunkOps is the largest chunk of a journaled cascade when none is
// configured (and never more than max_batch_ops). A chunk's commit is what
// a small request may wait for behind a super-node cascade; cmd/bench's
// mixed phase chose it (docs/BENCHMARKS.md, docs/DECISIONS.md).
const DefaultChunkOps = 5_000

// MinMaxBatchOps is the floor of max_batch_ops: a batch must hold the
// largest single request (an edge version, 5 puts, plus its receipt and a
// new tenant's registry row), so a chunk boundary never splits a version
// and every request fits a group on its own.
const MinMaxBatchOps = 7

// Path is how a cascade was applied.
type Path string

const (
	PathInline    Path = "inline"
	PathJournaled Path = "journaled"
)

// Hooks let the metrics layer observe the engine. Every field is optional;
// hooks must not block for long (some run on the writer).
type Hooks struct {
	// CascadeFinished fires when a cascade's node tombstone is durable: on
	// the commit of an inline cascade's group, on a journal's removal.
	CascadeFinished func(path Path, edges uint64, took time.Duration)
	// ChunkApplied fires after each durable chunk of a journaled cascade.
	ChunkApplied func(ops int)
	// JournalStep, a test signal, fires before an applier queues durable
	// step n of journal e (1, 2, ...: its chunks, then its removal) with
	// every earlier step durable and nothing of it queued. It may block:
	// interleaving tests hold a journal between two steps with it.
	JournalStep func(e *storage.JournalEntry, n int)
	// JournalScanned, a test signal, fires every few hundred adjacency
	// rows of an applier's scan of journal e's neighbourhood (rows read so
	// far in this scan). It may block.
	JournalScanned func(e *storage.JournalEntry, rows int)
	// EraseScrubbed fires when an erase has scrubbed the disk and the
	// copies (FinishErase; an erase whose copies an earlier erase of its
	// round scrubbed reports Copies with a CopiesTook near zero).
	EraseScrubbed func(st storage.ScrubStats)
	// EraseChecked, a test signal, fires when an erase has found no
	// journal in flight that may still write a version it must rewrite,
	// before it reads those versions. It may block: interleaving tests
	// commit other requests there.
	EraseChecked func(e *storage.EraseEntry)
}

// JournalSink takes journaled cascades once their head (the commit point)
// is durable, to apply them (package reaper owns their life). Begin runs on
// the writer right after the commit and must not block.
type JournalSink interface {
	Begin(e *storage.JournalEntry)
}

// Options configure New.
type Options struct {
	// MaxBatchOps: a request whose writes (receipt included) are at most
	// MaxBatchOps commits inline; a larger cascade is journaled. No durable
	// batch of a group holds more. Default DefaultMaxBatchOps; floored at
	// MinMaxBatchOps.
	MaxBatchOps int
	// ChunkOps is the largest chunk of a journaled cascade, in puts.
	// Default DefaultChunkOps; never more than MaxBatchOps.
	ChunkOps int
	// Journals receives every journal committed. Nil: TombstoneNode applies
	// a journal in the caller's goroutine, and other journals wait for
	// ResumeJournals (tests, tools).
	Journals JournalSink
	// Erases receives every erase committed. Nil: erases wait for
	// ResumeErases (tests, tools).
	Erases EraseSink
	Hooks  Hooks
	Logger *slog.Logger
}

// Ops is the cascade engine over one store.
type Ops struct {
	store       *storage.Store
	maxBatchOps int
	sink        JournalSink
	eraseSink   EraseSink
	hooks       Hooks
	log         *slog.Logger
	applier     *Applier
}

// New returns the engine.
func New(store *storage.Store, opts Options) *Ops {
	opts = opts.withDefaults()
	return &Ops{store: store, maxBatchOps: opts.MaxBatchOps, sink: opts.Journals, eraseSink: opts.Erases, hooks: opts.Hooks, log: opts.Logger,
		applier: NewApplier(store, opts)}
}

func (opts Options) withDefaults() Options {
	if opts.MaxBatchOps == 0 {
		opts.MaxBatchOps = DefaultMaxBatchOps
	}
	if opts.MaxBatchOps < MinMaxBatchOps {
		opts.MaxBatchOps = MinMaxBatchOps
	}
	if opts.ChunkOps <= 0 {
		opts.ChunkOps = DefaultChunkOps
	}
	if opts.ChunkOps > opts.MaxBatchOps {
		opts.ChunkOps = opts.MaxBatchOps
	}
	if opts.ChunkOps < MinMaxBatchOps {
		opts.ChunkOps = MinMaxBatchOps
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	return opts
}

// MaxBatchOps returns the effective threshold.
func (o *Ops) MaxBatchOps() int { return o.maxBatchOps }

// ChunkOps returns the effective chunk size of journaled cascades.
func (o *Ops) ChunkOps() int { return o.applier.chunkOps }

// ApplyJournal applies journal e (see Applier.ApplyJournal).
func (o *Ops) ApplyJournal(ctx context.Context, e *storage.JournalEntry, obs JournalObserver) (storage.Receipt, error) {
	return o.applier.ApplyJournal(ctx, e, obs)
}

// ResumeJournals applies every journal of a tenant (see
// Applier.ResumeJournals).
func (o *Ops) ResumeJournals(ctx context.Context, sc storage.Scope) (int, error) {
	return o.applier.ResumeJournals(ctx, sc)
}

// Store returns the underlying store.
func (o *Ops) Store() *storage.Store { return o.store }

// CascadeReceipt is the outcome of a node cascade.
type CascadeReceipt struct {
	NodeID          uuid.UUID
	EdgesTombstoned uint64
	TxTime          storage.Ts
	Journaled       bool
}

// TombstoneReceipt is the outcome of a standalone edge tombstone.
type TombstoneReceipt struct {
	EdgeID uuid.UUID
	TxTime storage.Ts
}

// Request is one op to apply. Times of storage.NoTs take their defaults:
// ValidFrom and ValidEnd the request's own tx, ValidTo open.
type Request struct {
	Scope     storage.Scope
	Op        storage.Op
	RequestID string // "" stores no receipt
	ID        uuid.UUID
	Src, Dst  uuid.UUID
	Label     string
	ValidFrom storage.Ts
	ValidTo   storage.Ts
	ValidEnd  storage.Ts
	Props     []byte
	Prov      storage.Provenance
	// Traceparent is the request's W3C trace context (tracing only: not
	// part of the fingerprint, not stored), handed to its journal.
	Traceparent string
}

// Fingerprint identifies the request's content: its op and every field
// but the request id (tenant, id, endpoints, label, times as given, props,
// provenance), canonically encoded and hashed. A request id seen again with
// the same fingerprint is a retry (it gets the stored answer); with
// another, a conflict.
func (r *Request) Fingerprint() storage.Fingerprint {
	h := sha256.New()
	var b []byte
	str := func(s string) {
		b = binary.AppendUvarint(b, uint64(len(s)))
		b = append(b, s...)
	}
	ts := func(t storage.Ts) { b = binary.BigEndian.AppendUint64(b, uint64(t)) }
	b = append(b, 1, byte(r.Op)) // 1: the encoding's version
	str(r.Scope.Tenant())
	b = append(b, r.ID[:]...)
	b = append(b, r.Src[:]...)
	b = append(b, r.Dst[:]...)
	str(r.Label)
	ts(r.ValidFrom)
	ts(r.ValidTo)
	ts(r.ValidEnd)
	props := r.Props
	if len(props) == 0 {
		props = []byte("{}") // what an omitted props stores
	}
	str(string(props))
	str(r.Prov.Actor)
	str(r.Prov.Reason)
	str(r.Prov.Source)
	ts(r.Prov.DecidedAt)
	h.Write(b)
	var fp storage.Fingerprint
	copy(fp[:], h.Sum(nil))
	return fp
}

// Kind says what an Outcome is.
type Kind uint8

const (
	// Answered: Receipt is the request's answer (Receipt.Status), fresh or
	// stored before; a fresh one is stored under the request id in the same
	// batch as the effect. Err wraps the refusal's sentinel (nil for ok).
	Answered Kind = 1 + iota
	// Invalid: the request can never apply (Err wraps ErrInvalid). Nothing
	// is stored.
	Invalid
	// Journaled: the cascade's journal (its commit point) committed with
	// the group, or, when Duplicate, was already in flight for this request
	// id. The answer is written to the result outbox when the journal
	// finishes.
	Journaled
	// Conflict: the request id was used before in its tenant for a
	// different request (another fingerprint). Nothing is applied or
	// stored; Receipt is the first request's, when it has one (Err says
	// which request it was).
	Conflict
	// Erasing: the erase's head (its commit point) committed with the
	// group (with the tombstone, when the entity was live), or, when
	// Duplicate, was already in flight. The answer is written to the
	// result outbox when the erase finishes (erase.go).
	Erasing
)

// Outcome is what applying one Request came to.
type Outcome struct {
	Kind      Kind
	Receipt   storage.Receipt // Answered
	Err       error           // Answered refusals and Invalid
	Duplicate bool            // the request id was seen before
	Journal   *storage.JournalEntry
	Erase     *storage.EraseEntry
}

// Status is the outcome's status (StatusOK for a journaled cascade: its
// commit point is durable, it will complete).
func (oc Outcome) Status() storage.Status {
	switch oc.Kind {
	case Answered:
		return oc.Receipt.Status
	case Journaled, Erasing:
		return storage.StatusOK
	case Conflict:
		return storage.StatusConflict
	}
	return storage.StatusInvalid
}

func answered(rc storage.Receipt, err error) Outcome {
	return Outcome{Kind: Answered, Receipt: rc, Err: err}
}

// Apply applies reqs in order with group commit: as many as fit in
// MaxBatchOps puts share one durable batch (receipts and tenant rows
// included; never more). Each request sees the effects of the ones before
// it exactly as serial application would. A storage error fails the
// requests of the failing batch (their outcomes are left zero) and is
// returned with the number of requests committed before it.
func (o *Ops) Apply(ctx context.Context, reqs []Request) ([]Outcome, int, error) {
	out := make([]Outcome, len(reqs))
	done := 0
	for done < len(reqs) {
		next := done
		err := o.store.Update(ctx, func(t *storage.Txn) error {
			for next = done; next < len(reqs); next++ {
				oc, fits, err := o.applyOne(t, &reqs[next], next == done)
				if err != nil {
					return err
				}
				if !fits {
					break
				}
				out[next] = oc
			}
			return nil
		})
		if err != nil {
			for i := done; i < len(reqs); i++ {
				out[i] = Outcome{}
			}
			return out, done, err
		}
		done = next
	}
	return out, done, nil
}

// budget is what a request may add to its group's batch.
type budget struct {
	t     *storage.Txn
	max   int
	first bool // the group's first request: it always fits on its own
}

// fits reports whether ops more writes (plus the request's receipt and its
// tenant's registry row, when they would be new) stay within max_batch_ops.
func (b budget) fits(r *Request, ops int) bool {
	return b.first || b.t.Ops()+ops+b.overhead(r) <= b.max
}

// fitsJournal reports whether a journal head (one put, and its tenant's
// registry row when new) fits. Its receipt is stored when it finishes.
func (b budget) fitsJournal(r *Request) bool {
	n := 1
	if b.t.NewTenant(r.Scope) {
		n++
	}
	return b.first || b.t.Ops()+n <= b.max
}

func (b budget) overhead(r *Request) int {
	n := 0
	if r.RequestID != "" {
		n++
	}
	if b.t.NewTenant(r.Scope) {
		n++
	}
	return n
}

// applyOne decides and writes one request inside t. fits is false, with
// nothing written, when the request's writes would take the group's batch
// over max_batch_ops: it starts the next group. A returned error is a
// storage failure that aborts the whole transaction; refusals are outcomes.
func (o *Ops) applyOne(t *storage.Txn, req *Request, first bool) (Outcome, bool, error) {
	r := *req
	r.Prov.RequestID = r.RequestID // every version records the request that wrote it
	b := budget{t: t, max: o.maxBatchOps, first: first}
	if r.Scope.IsZero() {
		return Outcome{Kind: Invalid, Err: fmt.Errorf("%w: no tenant", ErrInvalid)}, true, nil
	}
	fp := r.Fingerprint()
	if r.RequestID != "" {
		rc, ok, err := t.Receipt(r.Scope, r.RequestID)
		if err != nil {
			return Outcome{}, false, err
		}
		if ok {
			if !rc.Fingerprint.IsZero() && rc.Fingerprint != fp {
				return Outcome{Kind: Conflict, Receipt: rc, Duplicate: true, Err: fmt.Errorf("%w: request id %q was used for %s of %s (status %s); this request differs",
					ErrConflict, r.RequestID, rc.Op, rc.ID, rc.Status)}, true, nil
			}
			return Outcome{Kind: Answered, Receipt: rc, Err: rc.Status.Err(), Duplicate: true}, true, nil
		}
		if e := t.Store().Erases().ByRequest(r.Scope, r.RequestID); e != nil {
			if e.Job.Fingerprint != fp {
				return Outcome{Kind: Conflict, Duplicate: true, Err: fmt.Errorf("%w: request id %q is the %s of %s, in flight; this request differs",
					ErrConflict, r.RequestID, e.Job.Op, e.Job.ID)}, true, nil
			}
			return Outcome{Kind: Erasing, Erase: e, Duplicate: true}, true, nil
		}
		if e := t.Store().Journals().ByRequest(r.Scope, r.RequestID); e != nil {
			if !e.J.Fingerprint.IsZero() && e.J.Fingerprint != fp {
				return Outcome{Kind: Conflict, Duplicate: true, Err: fmt.Errorf("%w: request id %q is the tombstone_node of %s, in flight; this request differs",
					ErrConflict, r.RequestID, e.J.NodeID)}, true, nil
			}
			return Outcome{Kind: Journaled, Journal: e, Duplicate: true}, true, nil
		}
	}
	var (
		tx    storage.Ts
		edges uint64
		err2  error
	)
	switch r.Op {
	case storage.OpPutNode:
		if !b.fits(&r, storage.OpsPerNodeVersion) {
			return Outcome{}, false, nil
		}
		var v storage.Version
		v, err2 = t.PutNode(r.Scope, storage.NodeWrite{ID: r.ID, ValidFrom: r.ValidFrom, ValidTo: r.ValidTo, Props: r.Props, Prov: r.Prov})
		tx = v.Tx.Start
	case storage.OpPutEdge:
		if !b.fits(&r, storage.OpsPerEdgeVersion) {
			return Outcome{}, false, nil
		}
		var v storage.Version
		v, err2 = t.PutEdge(r.Scope, storage.EdgeWrite{ID: r.ID, Src: r.Src, Dst: r.Dst, Label: r.Label, ValidFrom: r.ValidFrom, ValidTo: r.ValidTo, Props: r.Props, Prov: r.Prov})
		tx = v.Tx.Start
	case storage.OpTombstoneEdge:
		if !b.fits(&r, storage.OpsPerEdgeVersion) {
			return Outcome{}, false, nil
		}
		tx, err2 = o.tombstoneEdge(t, &r)
	case storage.OpEraseNode, storage.OpEraseEdge:
		var e *storage.EraseEntry
		e, tx, err2 = o.beginErase(t, &r, b, fp)
		if e != nil {
			return Outcome{Kind: Erasing, Erase: e}, true, nil
		}
		if err2 == nil && tx == 0 {
			return Outcome{}, false, nil // does not fit this group
		}
	case storage.OpTombstoneNode:
		var d nodeDecision
		d, err2 = o.decideNode(t, &r, b)
		d.fingerprint = fp
		if err2 == nil && !d.fits {
			return Outcome{}, false, nil
		}
		if err2 == nil {
			if e := o.writeNode(t, &r, d); e != nil {
				return Outcome{Kind: Journaled, Journal: e}, true, nil
			}
			tx, edges = d.tx, uint64(len(d.edges))
		}
	default:
		return Outcome{Kind: Invalid, Err: fmt.Errorf("%w: unknown op %v", ErrInvalid, r.Op)}, true, nil
	}
	if err2 != nil && errors.Is(err2, ErrDecode) {
		// A record that fails to decode is not the request's fault; fail the
		// group like any storage failure (it is retried, then dead-lettered).
		return Outcome{}, false, fmt.Errorf("%w: %w", ErrStorage, err2)
	}
	st, ok := storage.StatusOf(err2)
	if !ok {
		return Outcome{}, false, err2
	}
	if st == storage.StatusInvalid {
		return Outcome{Kind: Invalid, Err: err2}, true, nil
	}
	rc := storage.Receipt{Op: r.Op, ID: r.ID, Status: st, Fingerprint: fp}
	if st == storage.StatusOK {
		rc.Tx, rc.EdgesTombstoned = tx, edges
	}
	if r.RequestID != "" {
		// A refusal is final for its request id too (docs/DECISIONS.md 4):
		// a redelivery must not turn an answered cascade_in_flight into
		// another outcome the results stream would drop as a duplicate.
		t.PutReceipt(r.Scope, r.RequestID, &rc)
	}
	return answered(rc, err2), true, nil
}

// tombstoneEdge writes a standalone edge tombstone [valid_end, open).
func (o *Ops) tombstoneEdge(t *storage.Txn, r *Request) (storage.Ts, error) {
	latest, ok, err := t.Latest(r.Scope, storage.KindEdge, r.ID)
	if err != nil {
		return 0, err
	}
	if !ok {
		return 0, fmt.Errorf("%w: edge %s", ErrNotFound, r.ID)
	}
	// The endpoints are immutable, so the fence check can follow the read
	// that names them (nothing commits in between: one writer), and it
	// comes before already_tombstoned: the edge's tombstone may be what
	// the journal has just written.
	for _, n := range []uuid.UUID{latest.Src, latest.Dst} {
		if e := t.Fenced(r.Scope, n); e != nil {
			return 0, fmt.Errorf("%w: endpoint node %s of edge %s is being tombstoned (journal tx %s)", ErrCascadeInFlight, n, r.ID, e.J.Tx)
		}
	}
	if latest.Tombstone {
		return 0, fmt.Errorf("%w: edge %s was tombstoned at tx %s", ErrAlreadyTombstoned, r.ID, latest.Tx.Start)
	}
	tx := t.NextTx()
	validEnd := r.ValidEnd
	if validEnd == storage.NoTs {
		validEnd = tx
	}
	v := edgeTombstone(latest.ID, latest.Src, latest.Dst, latest.Label, validEnd, tx, r.Prov)
	t.WriteVersion(r.Scope, &v)
	return tx, nil
}

// edgeTombstone is the one constructor of edge tombstone versions: inline,
// journaled and resumed cascades must build byte-identical records.
func edgeTombstone(id, src, dst uuid.UUID, label string, validEnd, tx storage.Ts, prov storage.Provenance) storage.Version {
	return storage.Version{Kind: storage.KindEdge, ID: id, Src: src, Dst: dst, Label: label,
		Valid: storage.Open(validEnd), Tx: storage.Open(tx), Tombstone: true, Props: []byte("{}"), Prov: prov}
}

func nodeTombstone(id uuid.UUID, validEnd, tx storage.Ts, prov storage.Provenance) storage.Version {
	return storage.Version{Kind: storage.KindNode, ID: id,
		Valid: storage.Open(validEnd), Tx: storage.Open(tx), Tombstone: true, Props: []byte("{}"), Prov: prov}
}

// TombstoneNode tombstones a node and every edge CONTRACT §3 collects, and
// waits until the node tombstone is durable. validEnd of storage.NoTs means
// the cascade's tx. A journaled cascade is applied in the caller's
// goroutine when the engine has no JournalSink; otherwise the sink applies
// it and TombstoneNode waits for the journal's removal.
func (o *Ops) TombstoneNode(ctx context.Context, sc storage.Scope, node uuid.UUID, validEnd storage.Ts, prov storage.Provenance) (CascadeReceipt, error) {
	out, _, err := o.Apply(ctx, []Request{{Scope: sc, Op: storage.OpTombstoneNode, ID: node, ValidEnd: validEnd, Prov: prov}})
	if err != nil {
		return CascadeReceipt{}, err
	}
	oc := out[0]
	switch oc.Kind {
	case Journaled:
		e := oc.Journal
		if o.sink == nil {
			rc, err := o.ApplyJournal(ctx, e, JournalObserver{})
			if err != nil {
				return CascadeReceipt{}, err
			}
			return CascadeReceipt{NodeID: node, EdgesTombstoned: rc.EdgesTombstoned, TxTime: rc.Tx, Journaled: true}, nil
		}
		select {
		case <-e.Removed():
		case <-ctx.Done():
			return CascadeReceipt{}, ctx.Err()
		}
		n, err := o.landedEdges(e)
		if err != nil {
			return CascadeReceipt{}, err
		}
		return CascadeReceipt{NodeID: node, EdgesTombstoned: n, TxTime: e.J.Tx, Journaled: true}, nil
	case Answered:
		if oc.Err != nil {
			return CascadeReceipt{}, oc.Err
		}
		return CascadeReceipt{NodeID: node, EdgesTombstoned: oc.Receipt.EdgesTombstoned, TxTime: oc.Receipt.Tx}, nil
	}
	return CascadeReceipt{}, oc.Err
}

// TombstoneEdge tombstones one edge from validEnd on; both endpoints stay.
func (o *Ops) TombstoneEdge(ctx context.Context, sc storage.Scope, edge uuid.UUID, validEnd storage.Ts, prov storage.Provenance) (TombstoneReceipt, error) {
	out, _, err := o.Apply(ctx, []Request{{Scope: sc, Op: storage.OpTombstoneEdge, ID: edge, ValidEnd: validEnd, Prov: prov}})
	if err != nil {
		return TombstoneReceipt{}, err
	}
	if out[0].Err != nil {
		return TombstoneReceipt{}, out[0].Err
	}
	return TombstoneReceipt{EdgeID: edge, TxTime: out[0].Receipt.Tx}, nil
}

// PutNode applies one put_node.
func (o *Ops) PutNode(ctx context.Context, sc storage.Scope, w storage.NodeWrite) (storage.Ts, error) {
	out, _, err := o.Apply(ctx, []Request{{Scope: sc, Op: storage.OpPutNode, ID: w.ID, ValidFrom: w.ValidFrom, ValidTo: w.ValidTo, Props: w.Props, Prov: w.Prov}})
	if err != nil {
		return 0, err
	}
	return out[0].Receipt.Tx, out[0].Err
}

// PutEdge applies one put_edge.
func (o *Ops) PutEdge(ctx context.Context, sc storage.Scope, w storage.EdgeWrite) (storage.Ts, error) {
	out, _, err := o.Apply(ctx, []Request{{Scope: sc, Op: storage.OpPutEdge, ID: w.ID, Src: w.Src, Dst: w.Dst, Label: w.Label, ValidFrom: w.ValidFrom, ValidTo: w.ValidTo, Props: w.Props, Prov: w.Prov}})
	if err != nil {
		return 0, err
	}
	return out[0].Receipt.Tx, out[0].Err
}
