package storage

import (
	"context"
	"crypto/sha1"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"sort"

	"github.com/cockroachdb/pebble/v2"
	"github.com/google/uuid"
)

// Txn is a serialised read-write transaction (see Store.Update). Reads see
// committed state plus the transaction's own pending writes, so requests
// applied in order within one Txn behave exactly as if each had been
// committed on its own.
type Txn struct {
	s           *Store
	b           *pebble.Batch
	r           txnReader
	it          *pebble.Iterator // lent out by txnReader, reused across reads
	itOpts      pebble.IterOptions
	itBusy      bool
	w           VersionWriter
	newTenants  map[string]bool
	touched     map[string]bool // tenants written (their feed generation moves: FeedGen)
	rollbacks   []func()
	afterCommit []func()
	// written is the highest tx this transaction writes under (versions,
	// journal and erase heads): once it commits, the committed tx reaches
	// it (safetime.go). Txs taken and not written do not count.
	written Ts
}

// Reader reads committed state plus this transaction's pending writes.
func (t *Txn) Reader() pebble.Reader { return t.r }

// txnReader is the transaction's reader: the indexed batch, lending out
// one iterator that it repositions for each read. SetOptions refreshes the
// iterator's view of the batch, so every read sees the transaction's
// writes so far. The iterator keeps the view of committed state it had at
// the transaction's first read; that view is still the committed state
// when the transaction commits, because the transaction runs on the one
// writer (writer.go: nothing commits between a decision's reads and its
// batch).
type txnReader struct {
	*pebble.Batch
	t *Txn
}

// Get reads one key (through the test signal, like every read).
func (r txnReader) Get(key []byte) ([]byte, io.Closer, error) {
	if r.t.s.onTxnRead != nil {
		r.t.s.onTxnRead()
	}
	return r.Batch.Get(key)
}

func (r txnReader) acquire(lo, hi []byte) (*pebble.Iterator, func() error, error) {
	t := r.t
	if t.s.onTxnRead != nil {
		t.s.onTxnRead()
	}
	if t.itBusy { // a read nested in another read's scan: a fresh iterator
		it, err := t.b.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: hi})
		if err != nil {
			return nil, nil, fmt.Errorf("%w: iterator: %w", ErrStorage, err)
		}
		return it, it.Close, nil
	}
	t.itOpts = pebble.IterOptions{LowerBound: lo, UpperBound: hi} // reused: no allocation per read
	if t.it == nil {
		it, err := t.b.NewIter(&t.itOpts)
		if err != nil {
			return nil, nil, fmt.Errorf("%w: iterator: %w", ErrStorage, err)
		}
		t.it = it
	} else {
		t.it.SetOptions(&t.itOpts)
	}
	t.itBusy = true
	return t.it, func() error { t.itBusy = false; return t.it.Error() }, nil
}

func (t *Txn) closeIter() {
	if t.it != nil {
		_ = t.it.Close()
		t.it = nil
	}
}

// Store returns the store the transaction belongs to.
func (t *Txn) Store() *Store { return t.s }

// NextTx allocates the next transaction time.
func (t *Txn) NextTx() Ts {
	return t.s.clock.Next()
}

// Ops returns the number of writes the transaction's batch will hold if it
// commits now (tenant registry rows included): what max_batch_ops bounds.
func (t *Txn) Ops() int { return int(t.b.Count()) + len(t.newTenants) }

// NewTenant reports whether writing in sc would add the tenant's registry
// row to the batch (one more op).
func (t *Txn) NewTenant(sc Scope) bool {
	return !t.s.knownTenant(sc.tenant) && !t.newTenants[sc.tenant]
}

// Fenced returns the journal fencing node, or nil. Decisions check fences
// before the reads they guard.
func (t *Txn) Fenced(sc Scope, node uuid.UUID) *JournalEntry { return t.s.journals.Fenced(sc, node) }

// OnRollback registers an action to undo in-memory effects if the
// transaction does not commit.
func (t *Txn) OnRollback(fn func()) { t.rollbacks = append(t.rollbacks, fn) }

// AfterCommit registers an action to run after the durable commit, while
// Updates are still serialised.
func (t *Txn) AfterCommit(fn func()) { t.afterCommit = append(t.afterCommit, fn) }

func (t *Txn) rollback() {
	for i := len(t.rollbacks) - 1; i >= 0; i-- {
		t.rollbacks[i]()
	}
	t.rollbacks = nil
}

func (t *Txn) runAfterCommit() {
	for _, fn := range t.afterCommit {
		fn()
	}
}

func (t *Txn) touch(sc Scope) {
	if !t.s.knownTenant(sc.tenant) {
		t.newTenants[sc.tenant] = true
	}
	if t.touched == nil {
		t.touched = map[string]bool{}
	}
	t.touched[sc.tenant] = true
}

// Latest returns the latest-recorded version (highest tx.start) of an entity.
func (t *Txn) Latest(sc Scope, k Kind, id uuid.UUID) (Version, bool, error) {
	return Latest(t.r, sc, k, id)
}

// WriteVersion appends a version's puts (3 for a node, 5 for an edge).
func (t *Txn) WriteVersion(sc Scope, v *Version) {
	t.touch(sc)
	t.written = max(t.written, v.Tx.Start)
	t.w.Append(t.b, sc, v)
}

// AppendVersion writes the puts of one version into b: the version record,
// for edges both adjacency rows, and both index entries. Keys are a pure
// function of (id, tx, valid), so writing the same version twice writes the
// same bytes.
func AppendVersion(b *pebble.Batch, sc Scope, v *Version) {
	var w VersionWriter
	w.Append(b, sc, v)
}

// VersionWriter writes versions' puts into batches through two scratch
// buffers it reuses (Set copies into the batch), so a chunk of a
// super-node cascade costs no allocation per key or value.
type VersionWriter struct{ k, v []byte }

// Append writes the puts of one version into b (see AppendVersion).
func (w *VersionWriter) Append(b *pebble.Batch, sc Scope, v *Version) {
	w.k = appendVersionKey(w.k[:0], versionSpace(v.Kind), sc, v.ID, v.Tx.Start, v.Valid.Start)
	w.v = appendVersion(w.v[:0], v)
	_ = b.Set(w.k, w.v, nil)
	if v.Kind == KindEdge {
		row := AdjRow{Other: v.Dst, Label: v.Label, Valid: v.Valid, Tx: v.Tx, Tombstone: v.Tombstone}
		w.k = appendAdjKey(w.k[:0], sc, true, v.Src, v.ID, v.Tx.Start, v.Valid.Start)
		w.v = appendAdj(w.v[:0], &row)
		_ = b.Set(w.k, w.v, nil)
		row.Other = v.Src
		w.k = appendAdjKey(w.k[:0], sc, false, v.Dst, v.ID, v.Tx.Start, v.Valid.Start)
		w.v = appendAdj(w.v[:0], &row)
		_ = b.Set(w.k, w.v, nil)
	}
	w.k = appendIdxKey(w.k[:0], ksValidIdx, sc, v.Valid.Start, v.Kind, v.ID, v.Tx.Start)
	_ = b.Set(w.k, nil, nil)
	w.k = appendIdxKey(w.k[:0], ksTxIdx, sc, v.Tx.Start, v.Kind, v.ID, v.Valid.Start)
	_ = b.Set(w.k, nil, nil)
}

// NodeWrite is a put_node request. ValidFrom/ValidTo of NoTs mean "the
// request's own tx" and "open".
type NodeWrite struct {
	ID        uuid.UUID
	ValidFrom Ts
	ValidTo   Ts
	Props     []byte
	Prov      Provenance
}

// EdgeWrite is a put_edge request.
type EdgeWrite struct {
	ID, Src, Dst uuid.UUID
	Label        string
	ValidFrom    Ts
	ValidTo      Ts
	Props        []byte
	Prov         Provenance
}

func interval(from, to, tx Ts) (Interval, error) {
	if from == NoTs {
		from = tx
	}
	if to == NoTs {
		to = OpenEnd
	}
	iv := Interval{Start: from, End: to}
	if !iv.Valid() {
		return iv, fmt.Errorf("%w: valid interval %s is empty", ErrInvalid, iv)
	}
	return iv, nil
}

func props(p []byte) []byte {
	if len(p) == 0 {
		return []byte("{}")
	}
	return p
}

// PutNode appends a new node version at a new tx.
//
// Refused: Invalid for an empty valid interval; CascadeInFlight while the
// node's cascade journal is in flight (before the next check: the
// tombstone may be the journal's own); AlreadyTombstoned when the node's
// latest version is a tombstone (resurrection is forbidden).
func (t *Txn) PutNode(sc Scope, w NodeWrite) (Version, error) {
	if sc.IsZero() {
		return Version{}, fmt.Errorf("%w: no tenant", ErrInvalid)
	}
	if w.ValidFrom != NoTs && w.ValidTo != NoTs && w.ValidFrom >= w.ValidTo {
		return Version{}, fmt.Errorf("%w: valid_from %s is not before valid_to %s", ErrInvalid, w.ValidFrom, w.ValidTo)
	}
	if e := t.Fenced(sc, w.ID); e != nil {
		return Version{}, fmt.Errorf("%w: node %s is being tombstoned (journal tx %s)", ErrCascadeInFlight, w.ID, e.J.Tx)
	}
	latest, ok, err := t.Latest(sc, KindNode, w.ID)
	if err != nil {
		return Version{}, err
	}
	if ok && latest.Tombstone {
		return Version{}, fmt.Errorf("%w: node %s was tombstoned at tx %s", ErrAlreadyTombstoned, w.ID, latest.Tx.Start)
	}
	tx := t.NextTx()
	valid, err := interval(w.ValidFrom, w.ValidTo, tx)
	if err != nil {
		return Version{}, err
	}
	v := Version{Kind: KindNode, ID: w.ID, Valid: valid, Tx: Open(tx), Props: props(w.Props), Prov: w.Prov}
	t.WriteVersion(sc, &v)
	return v, nil
}

// PutEdge appends a new edge version at a new tx.
//
// Checked in this order: Invalid (empty interval, or an existing edge with
// other endpoints: src and dst are immutable); NotFound (an endpoint never
// existed); CascadeInFlight (an endpoint's cascade journal is in flight);
// AlreadyTombstoned (the edge's latest version is a tombstone);
// EndpointDead (an endpoint's latest version is a tombstone). The fence
// comes before the two states an in-flight journal writes (the edge's
// tombstone, the node's), so no answer reveals half a cascade; existence
// and endpoints are never changed by one. Endpoints are checked by their
// latest versions only, not over the edge's whole valid interval.
func (t *Txn) PutEdge(sc Scope, w EdgeWrite) (Version, error) {
	if sc.IsZero() {
		return Version{}, fmt.Errorf("%w: no tenant", ErrInvalid)
	}
	if w.ValidFrom != NoTs && w.ValidTo != NoTs && w.ValidFrom >= w.ValidTo {
		return Version{}, fmt.Errorf("%w: valid_from %s is not before valid_to %s", ErrInvalid, w.ValidFrom, w.ValidTo)
	}
	ends := []uuid.UUID{w.Src, w.Dst}
	if w.Src == w.Dst {
		ends = ends[:1]
	}
	var fences [2]*JournalEntry
	for i, n := range ends {
		fences[i] = t.Fenced(sc, n) // before the reads they guard
	}
	latest, ok, err := t.Latest(sc, KindEdge, w.ID)
	if err != nil {
		return Version{}, err
	}
	if ok && (latest.Src != w.Src || latest.Dst != w.Dst) {
		return Version{}, fmt.Errorf("%w: edge %s connects %s->%s; src and dst are immutable", ErrInvalid, w.ID, latest.Src, latest.Dst)
	}
	var state [2]Version
	for i, n := range ends {
		v, found, err := t.Latest(sc, KindNode, n)
		if err != nil {
			return Version{}, err
		}
		if !found {
			return Version{}, fmt.Errorf("%w: endpoint node %s", ErrNotFound, n)
		}
		state[i] = v
	}
	for i, n := range ends {
		if fences[i] != nil {
			return Version{}, fmt.Errorf("%w: endpoint node %s is being tombstoned (journal tx %s)", ErrCascadeInFlight, n, fences[i].J.Tx)
		}
	}
	if ok && latest.Tombstone {
		return Version{}, fmt.Errorf("%w: edge %s was tombstoned at tx %s", ErrAlreadyTombstoned, w.ID, latest.Tx.Start)
	}
	for i, n := range ends {
		if state[i].Tombstone {
			return Version{}, fmt.Errorf("%w: endpoint node %s was tombstoned at tx %s", ErrEndpointDead, n, state[i].Tx.Start)
		}
	}
	tx := t.NextTx()
	valid, err := interval(w.ValidFrom, w.ValidTo, tx)
	if err != nil {
		return Version{}, err
	}
	v := Version{Kind: KindEdge, ID: w.ID, Src: w.Src, Dst: w.Dst, Label: w.Label, Valid: valid, Tx: Open(tx), Props: props(w.Props), Prov: w.Prov}
	t.WriteVersion(sc, &v)
	return v, nil
}

// Receipt returns the stored receipt of a request id.
func (t *Txn) Receipt(sc Scope, requestID string) (Receipt, bool, error) {
	return GetReceipt(t.r, sc, requestID)
}

// PutReceipt stores a request's receipt in the transaction.
func (t *Txn) PutReceipt(sc Scope, requestID string, r *Receipt) {
	t.touch(sc)
	_ = t.b.Set(ReceiptKey(sc, requestID), EncodeReceipt(r), nil)
}

// GetReceipt reads a request's receipt from r.
func GetReceipt(r pebble.Reader, sc Scope, requestID string) (Receipt, bool, error) {
	v, ok, err := getValue(r, ReceiptKey(sc, requestID))
	if err != nil || !ok {
		return Receipt{}, false, err
	}
	rc, err := DecodeReceipt(v)
	if err != nil {
		return Receipt{}, false, fmt.Errorf("receipt of %q: %w", requestID, err)
	}
	return rc, true, nil
}

// JournalJobID derives a journal's job id from its node and tx, so that
// replaying the same history produces the same keys.
func JournalJobID(node uuid.UUID, tx Ts) uuid.UUID {
	var b [24]byte
	copy(b[:], node[:])
	binary.BigEndian.PutUint64(b[16:], uint64(tx))
	return uuid.NewHash(sha1.New(), uuid.NameSpaceOID, b[:], 5)
}

// BeginJournal writes a journal head for node at tx (one put: the
// cascade's commit point once the transaction commits) and registers it,
// fencing the node for the rest of the transaction and, once committed,
// until RemoveJournal. The head records what the cascade needs to be
// re-derived at any time (node, tx, valid_end, provenance); the edges are
// the node's, frozen by the fence (see JournalEntry).
func (t *Txn) BeginJournal(sc Scope, node uuid.UUID, validEnd, tx Ts, prov Provenance, fp Fingerprint) *JournalEntry {
	return t.beginJournal(sc, Journal{NodeID: node, ValidEnd: validEnd, Tx: tx, Prov: prov, Fingerprint: fp})
}

// BeginQuietJournal is BeginJournal for the cascade of an erase_node: its
// removal stores no receipt and no result (the erase answers its request).
func (t *Txn) BeginQuietJournal(sc Scope, node uuid.UUID, validEnd, tx Ts, prov Provenance, fp Fingerprint) *JournalEntry {
	return t.beginJournal(sc, Journal{NodeID: node, ValidEnd: validEnd, Tx: tx, Prov: prov, Fingerprint: fp, Quiet: true})
}

func (t *Txn) beginJournal(sc Scope, j Journal) *JournalEntry {
	t.touch(sc)
	t.written = max(t.written, j.Tx)
	node, tx := j.NodeID, j.Tx
	j.CreatedAt = TsFromTime(t.s.clock.Wall().Now())
	key := JobKey(sc, CascadeJournalState, 0, tx, JournalJobID(node, tx))
	_ = t.b.Set(key, EncodeJournal(&j), nil)
	e := newJournalEntry(sc, key, j)
	t.s.journals.add(e)
	t.AfterCommit(func() { e.committed.Store(true) })
	t.OnRollback(func() {
		t.s.journals.remove(e)
		close(e.removed) // its fence is down: whoever found it stops waiting
	})
	return e
}

// ErrJournalGone: the journal is no longer registered (it was removed).
var ErrJournalGone = errors.New("journal no longer registered")

// RemoveJournal deletes a finished journal: its head, and the edge-id
// pages an older build wrote beside it (one range delete). When the journal
// answers a request, rc (the request's receipt) and a result-outbox row
// join the same batch. The fence drops when the batch commits. These
// deletes, the outbox's and the page range are the only deletes the store
// issues; all live in the jobs keyspace.
func (t *Txn) RemoveJournal(e *JournalEntry, rc *Receipt) error {
	if !t.s.journals.Registered(e) {
		return fmt.Errorf("%w: %x", ErrJournalGone, e.HeadKey)
	}
	key, err := DecodeKey(e.HeadKey)
	if err != nil {
		return err
	}
	_ = t.b.Delete(e.HeadKey, nil)
	if e.J.PageCount > 0 {
		lo, hi := JournalPagesRange(e.Scope, key.Priority, key.CreatedAt, key.JobID)
		_ = t.b.DeleteRange(lo, hi, nil)
	}
	if req := e.J.Prov.RequestID; req != "" && rc != nil && !e.J.Quiet {
		_ = t.b.Set(ReceiptKey(e.Scope, req), EncodeReceipt(rc), nil)
		o := Outbox{RequestID: req, Receipt: *rc}
		_ = t.b.Set(JobKey(e.Scope, ResultOutboxState, key.Priority, key.CreatedAt, key.JobID), EncodeOutbox(&o), nil)
	}
	t.AfterCommit(func() {
		t.s.journals.remove(e)
		close(e.removed)
	})
	return nil
}

// MarkDelivery records that the delivery of a redelivered request message
// is being handled, with the deaths counted so far (the crash-loop guard of
// package queue). ClearDelivery removes it when the delivery ends.
func (t *Txn) MarkDelivery(stream string, seq uint64, deaths int) {
	_ = t.b.Set(DeliveryKey(stream, seq), []byte{FormatVersion, byte(min(deaths, 255))}, nil)
}

// ClearDelivery deletes a delivery marker.
func (t *Txn) ClearDelivery(stream string, seq uint64) { _ = t.b.Delete(DeliveryKey(stream, seq), nil) }

// Delivery reads a delivery marker: found, and the deaths it counted.
func (t *Txn) Delivery(stream string, seq uint64) (deaths int, found bool, err error) {
	v, ok, err := getValue(t.r, DeliveryKey(stream, seq))
	if err != nil || !ok {
		return 0, false, err
	}
	if len(v) != 2 || v[0] != FormatVersion {
		return 0, true, fmt.Errorf("%w: delivery marker of %s/%d: %x", ErrDecode, stream, seq, v)
	}
	return int(v[1]), true, nil
}

// DeleteOutbox deletes a published result-outbox row.
func (t *Txn) DeleteOutbox(key []byte) { _ = t.b.Delete(key, nil) }

func sortScopes(s []Scope) { sort.Slice(s, func(i, j int) bool { return s[i].tenant < s[j].tenant }) }

// PutNode commits one node version on its own (see Txn.PutNode).
func (s *Store) PutNode(ctx context.Context, sc Scope, w NodeWrite) (Version, error) {
	var v Version
	err := s.Update(ctx, func(t *Txn) error {
		var err error
		v, err = t.PutNode(sc, w)
		return err
	})
	return v, err
}

// PutEdge commits one edge version on its own (see Txn.PutEdge).
func (s *Store) PutEdge(ctx context.Context, sc Scope, w EdgeWrite) (Version, error) {
	var v Version
	err := s.Update(ctx, func(t *Txn) error {
		var err error
		v, err = t.PutEdge(sc, w)
		return err
	})
	return v, err
}
