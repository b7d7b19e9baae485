package cascade

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
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
	ErrDecode            = storage.ErrDecode
	ErrStorage           = storage.ErrStorage
)

// DefaultMaxBatchOps is the inline-versus-journaled threshold and the chunk
// size when none is configured.
const DefaultMaxBatchOps = 100_000

// MinMaxBatchOps is the floor of max_batch_ops: a chunk must hold the
// largest version group (an edge, 5 puts) with room to spare, so a chunk
// boundary never splits a version.
const MinMaxBatchOps = 7

// Path is how a cascade was applied.
type Path string

const (
	PathInline    Path = "inline"
	PathJournaled Path = "journaled"
)

// Hooks let the metrics and queue layers observe the engine. Every field is
// optional; hooks must not block for long.
type Hooks struct {
	// CascadeStarted fires when a tombstone_node decides its path.
	CascadeStarted func(path Path)
	// CascadeFinished fires when a cascade's node tombstone is durable.
	CascadeFinished func(path Path, edges uint64, took time.Duration)
	// ChunkApplied fires after each durable chunk of a journaled cascade.
	ChunkApplied func(ops int)
	// JournalResumed fires when an orphaned journal is taken up again.
	JournalResumed func(e *storage.JournalEntry)
	// JournalDone fires after a journal is removed; r is its request's
	// receipt (the result to publish when e.J.Prov.RequestID is set).
	JournalDone func(e *storage.JournalEntry, r storage.Receipt)
	// JournalFailed fires when applying a journal fails; it stays for the
	// reaper.
	JournalFailed func(e *storage.JournalEntry, err error)
}

// Options configure New.
type Options struct {
	// MaxBatchOps: write-sets at or under it commit inline in one durable
	// batch; larger ones are journaled and applied in chunks of at most
	// MaxBatchOps. Default DefaultMaxBatchOps; floored at MinMaxBatchOps.
	MaxBatchOps int
	// LeaseTTL: a journal whose applier has not heartbeaten for this long is
	// an orphan the reaper may take over. Default 1 minute (a chunk of 100k
	// puts takes well under a second).
	LeaseTTL time.Duration
	Hooks    Hooks
	Logger   *slog.Logger
}

// Ops is the cascade engine over one store.
type Ops struct {
	store       *storage.Store
	maxBatchOps int
	leaseTTL    time.Duration
	hooks       Hooks
	log         *slog.Logger

	ctx    context.Context // cancelled by Close: stops appliers between chunks
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// New returns the engine. Close it before closing the store.
func New(store *storage.Store, opts Options) *Ops {
	if opts.MaxBatchOps == 0 {
		opts.MaxBatchOps = DefaultMaxBatchOps
	}
	if opts.MaxBatchOps < MinMaxBatchOps {
		opts.MaxBatchOps = MinMaxBatchOps
	}
	if opts.LeaseTTL <= 0 {
		opts.LeaseTTL = time.Minute
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Ops{store: store, maxBatchOps: opts.MaxBatchOps, leaseTTL: opts.LeaseTTL, hooks: opts.Hooks, log: opts.Logger, ctx: ctx, cancel: cancel}
}

// MaxBatchOps returns the effective threshold.
func (o *Ops) MaxBatchOps() int { return o.maxBatchOps }

// LeaseTTL returns the journal lease TTL.
func (o *Ops) LeaseTTL() time.Duration { return o.leaseTTL }

// Store returns the underlying store.
func (o *Ops) Store() *storage.Store { return o.store }

// Close stops journal appliers between chunks and waits for them. Their
// journals stay durable and are resumed by the next process.
func (o *Ops) Close() {
	o.cancel()
	o.wg.Wait()
}

// Wait blocks until every journal applier started so far has finished.
func (o *Ops) Wait() { o.wg.Wait() }

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
}

// Outcome is what applying a Request came to.
//
//   - Final outcomes carry Receipt (stored under RequestID in the same batch
//     as the effect). Err is nil for StatusOK and wraps the refusal's sentinel
//     otherwise.
//   - Err without a receipt: ErrInvalid (the request can never apply).
//     ErrCascadeInFlight is retryable for the caller (with a new request
//     id) but final for this request id, so it carries a receipt.
//   - Journal is set when the request's cascade was journaled (or a journal
//     for its request id is already in flight): the commit point is durable
//     and the result comes when the journal finishes (Hooks.JournalDone).
//     Done, when set, yields the applier's final error (nil on success).
type Outcome struct {
	Receipt   storage.Receipt
	Final     bool
	Err       error
	Duplicate bool
	Journal   *storage.JournalEntry
	Done      <-chan error
}

// Apply applies reqs in order with group commit: as many as fit in one
// transaction of about MaxBatchOps puts share one durable batch (receipts
// included). Each request sees the effects of the ones before it exactly as
// serial application would. A storage error fails the requests of the
// failing transaction (their outcomes are left zero) and is returned with
// the number of requests that were committed before it.
func (o *Ops) Apply(ctx context.Context, reqs []Request) ([]Outcome, int, error) {
	out := make([]Outcome, len(reqs))
	done := 0
	for done < len(reqs) {
		next := done
		err := o.store.Update(ctx, func(t *storage.Txn) error {
			for next = done; next < len(reqs); next++ {
				if next > done && t.Ops() >= o.maxBatchOps {
					break
				}
				oc, err := o.applyOne(t, &reqs[next])
				if err != nil {
					return err
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

// applyOne decides and writes one request inside t. A returned error is a
// storage failure that aborts the whole transaction; refusals are outcomes.
func (o *Ops) applyOne(t *storage.Txn, req *Request) (Outcome, error) {
	r := *req
	r.Prov.RequestID = r.RequestID // every version records the request that wrote it
	if r.Scope.IsZero() {
		return Outcome{Err: fmt.Errorf("%w: no tenant", ErrInvalid)}, nil
	}
	if r.RequestID != "" {
		rc, ok, err := t.Receipt(r.Scope, r.RequestID)
		if err != nil {
			return Outcome{}, err
		}
		if ok {
			return Outcome{Receipt: rc, Final: true, Err: statusErr(rc.Status), Duplicate: true}, nil
		}
		if e := o.store.Journals().ByRequest(r.Scope, r.RequestID); e != nil {
			return Outcome{Journal: e, Duplicate: true}, nil
		}
	}
	var (
		oc  Outcome
		err error
	)
	switch r.Op {
	case storage.OpPutNode:
		var v storage.Version
		v, err = t.PutNode(r.Scope, storage.NodeWrite{ID: r.ID, ValidFrom: r.ValidFrom, ValidTo: r.ValidTo, Props: r.Props, Prov: r.Prov})
		oc = outcomeOf(&r, v.Tx.Start, 0, err)
	case storage.OpPutEdge:
		var v storage.Version
		v, err = t.PutEdge(r.Scope, storage.EdgeWrite{ID: r.ID, Src: r.Src, Dst: r.Dst, Label: r.Label, ValidFrom: r.ValidFrom, ValidTo: r.ValidTo, Props: r.Props, Prov: r.Prov})
		oc = outcomeOf(&r, v.Tx.Start, 0, err)
	case storage.OpTombstoneEdge:
		var tx storage.Ts
		tx, err = o.tombstoneEdge(t, &r)
		oc = outcomeOf(&r, tx, 0, err)
	case storage.OpTombstoneNode:
		oc, err = o.tombstoneNode(t, &r)
		if err == nil && oc.Journal == nil {
			oc = outcomeOf(&r, oc.Receipt.Tx, oc.Receipt.EdgesTombstoned, nil)
		} else if err != nil {
			oc = outcomeOf(&r, 0, 0, err)
		}
	default:
		return Outcome{Err: fmt.Errorf("%w: unknown op %v", ErrInvalid, r.Op)}, nil
	}
	if err != nil && errors.Is(err, ErrStorage) {
		return Outcome{}, err
	}
	if errors.Is(err, ErrDecode) {
		// A record that fails to decode is not the request's fault; fail the
		// group like any storage failure (it is retried, then dead-lettered).
		return Outcome{}, fmt.Errorf("%w: %w", ErrStorage, err)
	}
	if oc.Final && r.RequestID != "" {
		t.PutReceipt(r.Scope, r.RequestID, &oc.Receipt)
	}
	return oc, nil
}

func outcomeOf(r *Request, tx storage.Ts, edges uint64, err error) Outcome {
	rc := storage.Receipt{Op: r.Op, ID: r.ID}
	switch {
	case err == nil:
		rc.Status, rc.Tx, rc.EdgesTombstoned = storage.StatusOK, tx, edges
	case errors.Is(err, ErrNotFound):
		rc.Status = storage.StatusNotFound
	case errors.Is(err, ErrAlreadyTombstoned):
		rc.Status = storage.StatusAlreadyTombstoned
	case errors.Is(err, ErrEndpointDead):
		rc.Status = storage.StatusEndpointDead
	case errors.Is(err, ErrCascadeInFlight):
		// Final for this request id (see docs/DECISIONS.md 4): a redelivery
		// must not turn an answered cascade_in_flight into another outcome
		// the results stream would drop as a duplicate.
		rc.Status = storage.StatusCascadeInFlight
	default:
		return Outcome{Err: err}
	}
	return Outcome{Receipt: rc, Final: true, Err: err}
}

// statusErr maps a stored status back to its sentinel.
func statusErr(s storage.Status) error {
	switch s {
	case storage.StatusNotFound:
		return ErrNotFound
	case storage.StatusAlreadyTombstoned:
		return ErrAlreadyTombstoned
	case storage.StatusEndpointDead:
		return ErrEndpointDead
	case storage.StatusCascadeInFlight:
		return ErrCascadeInFlight
	}
	return nil
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
	if latest.Tombstone {
		return 0, fmt.Errorf("%w: edge %s was tombstoned at tx %s", ErrAlreadyTombstoned, r.ID, latest.Tx.Start)
	}
	for _, n := range []uuid.UUID{latest.Src, latest.Dst} {
		if o.store.Journals().Fenced(r.Scope, n) != nil {
			return 0, fmt.Errorf("%w: endpoint node %s is being tombstoned", ErrCascadeInFlight, n)
		}
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
// first-pass and resumed cascades must build byte-identical records.
func edgeTombstone(id, src, dst uuid.UUID, label string, validEnd, tx storage.Ts, prov storage.Provenance) storage.Version {
	return storage.Version{Kind: storage.KindEdge, ID: id, Src: src, Dst: dst, Label: label,
		Valid: storage.Open(validEnd), Tx: storage.Open(tx), Tombstone: true, Props: []byte("{}"), Prov: prov}
}

func nodeTombstone(id uuid.UUID, validEnd, tx storage.Ts, prov storage.Provenance) storage.Version {
	return storage.Version{Kind: storage.KindNode, ID: id,
		Valid: storage.Open(validEnd), Tx: storage.Open(tx), Tombstone: true, Props: []byte("{}"), Prov: prov}
}

// TombstoneNode tombstones a node and every edge DESIGN §3 collects, and
// waits until the node tombstone is durable (for a journaled cascade, until
// the journal is removed). validEnd of storage.NoTs means the cascade's tx.
func (o *Ops) TombstoneNode(ctx context.Context, sc storage.Scope, node uuid.UUID, validEnd storage.Ts, prov storage.Provenance) (CascadeReceipt, error) {
	out, _, err := o.Apply(ctx, []Request{{Scope: sc, Op: storage.OpTombstoneNode, ID: node, ValidEnd: validEnd, Prov: prov, RequestID: ""}})
	if err != nil {
		return CascadeReceipt{}, err
	}
	oc := out[0]
	if oc.Journal != nil {
		if oc.Done == nil {
			return CascadeReceipt{}, fmt.Errorf("%w: node %s is being tombstoned", ErrCascadeInFlight, node)
		}
		select {
		case err := <-oc.Done:
			if err != nil {
				return CascadeReceipt{}, err
			}
		case <-ctx.Done():
			return CascadeReceipt{}, ctx.Err()
		}
		return CascadeReceipt{NodeID: node, EdgesTombstoned: oc.Journal.J.Edges, TxTime: oc.Journal.J.Tx, Journaled: true}, nil
	}
	if oc.Err != nil {
		return CascadeReceipt{}, oc.Err
	}
	return CascadeReceipt{NodeID: node, EdgesTombstoned: oc.Receipt.EdgesTombstoned, TxTime: oc.Receipt.Tx}, nil
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
