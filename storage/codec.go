package storage

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/google/uuid"
)

// Record encodings. Every value starts with FormatVersion; decoders check it,
// bound every length, reject trailing bytes, and return ErrDecode (never
// panic) on anything malformed.

const (
	flagTombstone byte = 1 << 0
	flagDecidedAt byte = 1 << 1
	flagJournaled byte = 1 << 2
	// flagFingerprint: a receipt or journal head carries its request's
	// fingerprint (16 bytes at the end). Records of earlier builds have none.
	flagFingerprint byte = 1 << 3

	// maxFieldLen bounds any length-prefixed field a decoder will accept.
	maxFieldLen = 1 << 24
)

type enc struct{ b []byte }

func (e *enc) byte(c byte)   { e.b = append(e.b, c) }
func (e *enc) i64(v int64)   { e.b = binary.BigEndian.AppendUint64(e.b, uint64(v)) }
func (e *enc) uvar(v uint64) { e.b = binary.AppendUvarint(e.b, v) }
func (e *enc) bytes(p []byte) {
	e.uvar(uint64(len(p)))
	e.b = append(e.b, p...)
}
func (e *enc) str(s string)        { e.uvar(uint64(len(s))); e.b = append(e.b, s...) }
func (e *enc) uuid(u uuid.UUID)    { e.b = append(e.b, u[:]...) }
func (e *enc) interval(i Interval) { e.i64(int64(i.Start)); e.i64(int64(i.End)) }

type dec struct {
	b   []byte
	err error
}

func (d *dec) fail(format string, args ...any) {
	if d.err == nil {
		d.err = fmt.Errorf(format, args...)
	}
}

func (d *dec) take(n int) []byte {
	if d.err != nil {
		return nil
	}
	if n < 0 || len(d.b) < n {
		d.fail("short record: want %d bytes, have %d", n, len(d.b))
		return nil
	}
	p := d.b[:n]
	d.b = d.b[n:]
	return p
}

func (d *dec) byte() byte {
	if p := d.take(1); p != nil {
		return p[0]
	}
	return 0
}

func (d *dec) i64() int64 {
	if p := d.take(8); p != nil {
		return int64(binary.BigEndian.Uint64(p))
	}
	return 0
}

func (d *dec) uvar() uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.fail("bad varint")
		return 0
	}
	d.b = d.b[n:]
	return v
}

// field returns a length-prefixed field without copying it.
func (d *dec) field() []byte {
	n := d.uvar()
	if d.err == nil && n > maxFieldLen {
		d.fail("field length %d over limit", n)
		return nil
	}
	return d.take(int(n))
}

func (d *dec) bytes() []byte {
	p := d.field()
	if p == nil {
		return nil
	}
	return append([]byte(nil), p...)
}

// str copies once (string conversion), not twice: adjacency rows are
// decoded once per edge of a super-node cascade, twice over.
func (d *dec) str() string { return string(d.field()) }

func (d *dec) uuid() uuid.UUID {
	var u uuid.UUID
	if p := d.take(16); p != nil {
		copy(u[:], p)
	}
	return u
}

func (d *dec) interval() Interval { return Interval{Start: Ts(d.i64()), End: Ts(d.i64())} }

func (d *dec) header(what string) {
	if v := d.byte(); d.err == nil && v != FormatVersion {
		d.fail("%s: format version %d, want %d", what, v, FormatVersion)
	}
}

func (d *dec) finish(what string) error {
	if d.err == nil && len(d.b) != 0 {
		d.fail("%d trailing bytes", len(d.b))
	}
	if d.err != nil {
		return fmt.Errorf("%w: %s: %v", ErrDecode, what, d.err)
	}
	return nil
}

func (e *enc) prov(p Provenance) {
	e.str(p.Actor)
	e.str(p.Reason)
	e.str(p.Source)
	e.str(p.RequestID)
}

func (d *dec) prov(p *Provenance) {
	p.Actor = d.str()
	p.Reason = d.str()
	p.Source = d.str()
	p.RequestID = d.str()
}

// EncodeVersion encodes a version record. The intervals come first so that
// liveness checks can read them without decoding the rest (versionIntervals).
func EncodeVersion(v *Version) []byte {
	p := &v.Prov
	return appendVersion(make([]byte, 0, 112+len(v.Label)+len(v.Props)+len(p.Actor)+len(p.Reason)+len(p.Source)+len(p.RequestID)), v)
}

func appendVersion(dst []byte, v *Version) []byte {
	e := enc{b: dst}
	e.byte(FormatVersion)
	e.byte(byte(v.Kind))
	var flags byte
	if v.Tombstone {
		flags |= flagTombstone
	}
	if v.Prov.DecidedAt != NoTs {
		flags |= flagDecidedAt
	}
	if v.Erased {
		flags |= flagErased
	}
	e.byte(flags)
	e.interval(v.Valid)
	e.interval(v.Tx)
	e.uuid(v.ID)
	if v.Kind == KindEdge {
		e.uuid(v.Src)
		e.uuid(v.Dst)
		e.str(v.Label)
	}
	e.bytes(v.Props)
	e.prov(v.Prov)
	if flags&flagDecidedAt != 0 {
		e.i64(int64(v.Prov.DecidedAt))
	}
	return e.b
}

// DecodeVersion decodes a version record.
func DecodeVersion(b []byte) (Version, error) {
	d := dec{b: b}
	var v Version
	d.header("version")
	v.Kind = Kind(d.byte())
	if d.err == nil && v.Kind != KindNode && v.Kind != KindEdge {
		d.fail("bad kind %d", v.Kind)
	}
	flags := d.byte()
	if d.err == nil && flags&^(flagTombstone|flagDecidedAt|flagErased) != 0 {
		d.fail("unknown flags %#x", flags)
	}
	v.Tombstone = flags&flagTombstone != 0
	v.Erased = flags&flagErased != 0
	v.Valid = d.interval()
	v.Tx = d.interval()
	v.ID = d.uuid()
	if v.Kind == KindEdge {
		v.Src = d.uuid()
		v.Dst = d.uuid()
		v.Label = d.str()
	}
	v.Props = d.bytes()
	d.prov(&v.Prov)
	v.Prov.DecidedAt = NoTs
	if flags&flagDecidedAt != 0 {
		v.Prov.DecidedAt = Ts(d.i64())
	}
	if err := d.finish("version"); err != nil {
		return Version{}, err
	}
	return v, nil
}

// versionIntervals reads the tombstone flag and intervals of an encoded
// version without decoding the rest.
func versionIntervals(b []byte) (valid, tx Interval, tombstone bool, err error) {
	if len(b) < 3+32 || b[0] != FormatVersion {
		return Interval{}, Interval{}, false, fmt.Errorf("%w: version header %x", ErrDecode, b[:min(len(b), 8)])
	}
	d := dec{b: b[3:]}
	valid, tx = d.interval(), d.interval()
	return valid, tx, b[2]&flagTombstone != 0, nil
}

// AdjRow is the value of an adjacency row: the edge's other endpoint (dst
// for out rows, src for in rows), label, intervals and tombstone flag.
type AdjRow struct {
	Other     uuid.UUID
	Label     string
	Valid, Tx Interval
	Tombstone bool
}

// EncodeAdj encodes an adjacency row value.
func EncodeAdj(r *AdjRow) []byte { return appendAdj(make([]byte, 0, 56+len(r.Label)), r) }

func appendAdj(dst []byte, r *AdjRow) []byte {
	e := enc{b: dst}
	e.byte(FormatVersion)
	var flags byte
	if r.Tombstone {
		flags |= flagTombstone
	}
	e.byte(flags)
	e.interval(r.Valid)
	e.interval(r.Tx)
	e.uuid(r.Other)
	e.str(r.Label)
	return e.b
}

// DecodeAdj decodes an adjacency row value.
func DecodeAdj(b []byte) (AdjRow, error) {
	d := dec{b: b}
	var r AdjRow
	d.header("adjacency")
	flags := d.byte()
	if d.err == nil && flags&^flagTombstone != 0 {
		d.fail("unknown flags %#x", flags)
	}
	r.Tombstone = flags&flagTombstone != 0
	r.Valid = d.interval()
	r.Tx = d.interval()
	r.Other = d.uuid()
	r.Label = d.str()
	if err := d.finish("adjacency"); err != nil {
		return AdjRow{}, err
	}
	return r, nil
}

// Op is a request operation.
type Op uint8

const (
	OpPutNode Op = 1 + iota
	OpPutEdge
	OpTombstoneNode
	OpTombstoneEdge
	OpEraseNode
	OpEraseEdge
)

var opNames = map[Op]string{
	OpPutNode: "put_node", OpPutEdge: "put_edge",
	OpTombstoneNode: "tombstone_node", OpTombstoneEdge: "tombstone_edge",
	OpEraseNode: "erase_node", OpEraseEdge: "erase_edge",
}

func (o Op) String() string {
	if s, ok := opNames[o]; ok {
		return s
	}
	return fmt.Sprintf("op(%d)", uint8(o))
}

// ParseOp parses an op name from the queue contract.
func ParseOp(s string) (Op, bool) {
	for o, n := range opNames {
		if n == s {
			return o, true
		}
	}
	return 0, false
}

// Ops lists every op in a fixed order.
func Ops() []Op {
	return []Op{OpPutNode, OpPutEdge, OpTombstoneNode, OpTombstoneEdge, OpEraseNode, OpEraseEdge}
}

// Status is the one vocabulary of request outcomes: what a receipt
// records, what a result's "status" field says (String is the wire name),
// and which sentinel error a refusal wraps (Err, StatusOf).
type Status uint8

const (
	StatusOK Status = 1 + iota
	StatusNotFound
	StatusAlreadyTombstoned
	StatusEndpointDead
	// StatusCascadeInFlight: refused while a journal fenced a node the
	// request touches. Stored like the others, so a redelivery of the
	// request gets the same answer (retry with a new request id).
	StatusCascadeInFlight
	// StatusInvalid: the request can never apply (never stored: deciding
	// again gives the same answer).
	StatusInvalid
	// StatusFailed: transient failures outlasted the delivery limit, or
	// the worker died handling it too often; nothing was applied (never
	// stored).
	StatusFailed
	// StatusConflict: the request id was used before in this tenant for a
	// different request; nothing was applied (never stored: the first
	// request's receipt stays the answer of its id).
	StatusConflict
)

var statusNames = [...]string{
	StatusOK: "ok", StatusNotFound: "not_found", StatusAlreadyTombstoned: "already_tombstoned",
	StatusEndpointDead: "endpoint_dead", StatusCascadeInFlight: "cascade_in_flight",
	StatusInvalid: "invalid", StatusFailed: "failed", StatusConflict: "conflict",
}

// String is the status's name in results (CONTRACT §5).
func (s Status) String() string {
	if int(s) < len(statusNames) && statusNames[s] != "" {
		return statusNames[s]
	}
	return fmt.Sprintf("status(%d)", uint8(s))
}

// Statuses lists every status, in order.
func Statuses() []Status {
	return []Status{StatusOK, StatusNotFound, StatusAlreadyTombstoned, StatusEndpointDead, StatusCascadeInFlight, StatusInvalid, StatusFailed, StatusConflict}
}

// Stored reports whether a receipt may record s.
func (s Status) Stored() bool { return s >= StatusOK && s <= StatusCascadeInFlight }

// Err returns the sentinel a refusal with status s wraps (nil for ok and
// for statuses without one).
func (s Status) Err() error {
	switch s {
	case StatusNotFound:
		return ErrNotFound
	case StatusAlreadyTombstoned:
		return ErrAlreadyTombstoned
	case StatusEndpointDead:
		return ErrEndpointDead
	case StatusCascadeInFlight:
		return ErrCascadeInFlight
	case StatusInvalid:
		return ErrInvalid
	case StatusConflict:
		return ErrConflict
	}
	return nil
}

// StatusOf returns the status of a decision's error: ok for nil, the
// refusal's status for a refusal sentinel, invalid for ErrInvalid. ok is
// false for anything else (a storage or decode failure: no answer).
func StatusOf(err error) (Status, bool) {
	if err == nil {
		return StatusOK, true
	}
	for _, s := range []Status{StatusNotFound, StatusAlreadyTombstoned, StatusEndpointDead, StatusCascadeInFlight, StatusInvalid, StatusConflict} {
		if errors.Is(err, s.Err()) {
			return s, true
		}
	}
	return 0, false
}

// Receipt is the durable record of a request's final outcome, stored in the
// same batch as its effect so that a request id seen again returns it
// unchanged (exactly-once effect).
type Receipt struct {
	Op              Op
	Status          Status
	ID              uuid.UUID
	Tx              Ts // set when Status == StatusOK
	EdgesTombstoned uint64
	Journaled       bool
	// Fingerprint of the request (op and fields, canonical); zero in
	// receipts of earlier builds.
	Fingerprint Fingerprint
	// VersionsErased: the versions an erase_* rewrote (erase receipts only).
	VersionsErased uint64
}

// Fingerprint identifies a request's content (cascade.Request.Fingerprint),
// so a request id used again for a different request is told from a retry.
type Fingerprint [16]byte

// IsZero reports whether no fingerprint was recorded.
func (f Fingerprint) IsZero() bool { return f == Fingerprint{} }

// EncodeReceipt encodes a receipt.
func EncodeReceipt(r *Receipt) []byte {
	e := enc{b: make([]byte, 0, 40)}
	e.byte(FormatVersion)
	e.byte(byte(r.Op))
	e.byte(byte(r.Status))
	var flags byte
	if r.Journaled {
		flags |= flagJournaled
	}
	if !r.Fingerprint.IsZero() {
		flags |= flagFingerprint
	}
	if r.Op == OpEraseNode || r.Op == OpEraseEdge {
		flags |= flagVersionsErased
	}
	e.byte(flags)
	e.uuid(r.ID)
	e.i64(int64(r.Tx))
	e.uvar(r.EdgesTombstoned)
	if flags&flagFingerprint != 0 {
		e.b = append(e.b, r.Fingerprint[:]...)
	}
	if flags&flagVersionsErased != 0 {
		e.uvar(r.VersionsErased)
	}
	return e.b
}

// DecodeReceipt decodes a receipt.
func DecodeReceipt(b []byte) (Receipt, error) {
	d := dec{b: b}
	var r Receipt
	d.header("receipt")
	r.Op = Op(d.byte())
	r.Status = Status(d.byte())
	flags := d.byte()
	if d.err == nil {
		if _, ok := opNames[r.Op]; !ok {
			d.fail("bad op %d", r.Op)
		}
		if !r.Status.Stored() {
			d.fail("bad status %d", r.Status)
		}
		if flags&^(flagJournaled|flagFingerprint|flagVersionsErased) != 0 {
			d.fail("unknown flags %#x", flags)
		}
		if isErase := r.Op == OpEraseNode || r.Op == OpEraseEdge; isErase != (flags&flagVersionsErased != 0) {
			d.fail("versions_erased flag %v for op %s", !isErase, r.Op)
		}
	}
	r.Journaled = flags&flagJournaled != 0
	r.ID = d.uuid()
	r.Tx = Ts(d.i64())
	r.EdgesTombstoned = d.uvar()
	if flags&flagFingerprint != 0 {
		copy(r.Fingerprint[:], d.take(16))
	}
	if flags&flagVersionsErased != 0 {
		r.VersionsErased = d.uvar()
	}
	if err := d.finish("receipt"); err != nil {
		return Receipt{}, err
	}
	return r, nil
}

// Journal is a cascade journal head: everything needed to rebuild the
// cascade's write-set byte-identically (the original tx, never a fresh
// one). The edges are the node's, frozen by the journal's fence from the
// head's commit on (see JournalEntry), so the head lists none: Edges and
// PageCount are 0 in heads this build writes. Heads of older builds list
// their edge ids in PageCount page rows of at most JournalPageSize ids;
// they are read the same way (the pages are ignored, then deleted with the
// head).
type Journal struct {
	NodeID    uuid.UUID
	ValidEnd  Ts
	Tx        Ts
	Edges     uint64 // number of journaled edge ids
	PageCount uint32
	Prov      Provenance // Prov.RequestID is the request to answer when done
	CreatedAt Ts         // wall-clock time the journal was written
	// Fingerprint of the request (zero in heads of earlier builds).
	Fingerprint Fingerprint
	// Quiet: the cascade of an erase_node (storage/erase.go); finishing it
	// stores no receipt and publishes no result (the erase does, later).
	Quiet bool
}

// JournalPageSize is the number of edge ids per journal page row.
const JournalPageSize = 4096

// EncodeJournal encodes a journal head.
func EncodeJournal(j *Journal) []byte {
	e := enc{b: make([]byte, 0, 96)}
	e.byte(FormatVersion)
	var flags byte
	if j.Prov.DecidedAt != NoTs {
		flags |= flagDecidedAt
	}
	if !j.Fingerprint.IsZero() {
		flags |= flagFingerprint
	}
	if j.Quiet {
		flags |= flagQuiet
	}
	e.byte(flags)
	e.uuid(j.NodeID)
	e.i64(int64(j.ValidEnd))
	e.i64(int64(j.Tx))
	e.uvar(j.Edges)
	e.uvar(uint64(j.PageCount))
	e.i64(int64(j.CreatedAt))
	e.prov(j.Prov)
	if flags&flagDecidedAt != 0 {
		e.i64(int64(j.Prov.DecidedAt))
	}
	if flags&flagFingerprint != 0 {
		e.b = append(e.b, j.Fingerprint[:]...)
	}
	return e.b
}

// DecodeJournal decodes a journal head.
func DecodeJournal(b []byte) (Journal, error) {
	d := dec{b: b}
	var j Journal
	d.header("journal")
	flags := d.byte()
	if d.err == nil && flags&^(flagDecidedAt|flagFingerprint|flagQuiet) != 0 {
		d.fail("unknown flags %#x", flags)
	}
	j.Quiet = flags&flagQuiet != 0
	j.NodeID = d.uuid()
	j.ValidEnd = Ts(d.i64())
	j.Tx = Ts(d.i64())
	j.Edges = d.uvar()
	pages := d.uvar()
	if d.err == nil && (pages > 1<<31 || pages != (j.Edges+JournalPageSize-1)/JournalPageSize) {
		d.fail("page count %d does not fit %d edges", pages, j.Edges)
	}
	j.PageCount = uint32(pages)
	j.CreatedAt = Ts(d.i64())
	d.prov(&j.Prov)
	j.Prov.DecidedAt = NoTs
	if flags&flagDecidedAt != 0 {
		j.Prov.DecidedAt = Ts(d.i64())
	}
	if flags&flagFingerprint != 0 {
		copy(j.Fingerprint[:], d.take(16))
	}
	if err := d.finish("journal"); err != nil {
		return Journal{}, err
	}
	return j, nil
}

// EncodeJournalPage encodes a page of edge ids.
func EncodeJournalPage(ids []uuid.UUID) []byte {
	e := enc{b: make([]byte, 0, 8+16*len(ids))}
	e.byte(FormatVersion)
	e.uvar(uint64(len(ids)))
	for _, id := range ids {
		e.uuid(id)
	}
	return e.b
}

// DecodeJournalPage decodes a page of edge ids.
func DecodeJournalPage(b []byte) ([]uuid.UUID, error) {
	d := dec{b: b}
	d.header("journal page")
	n := d.uvar()
	if d.err == nil && (n > JournalPageSize || uint64(len(d.b)) != 16*n) {
		d.fail("page of %d ids in %d bytes", n, len(d.b))
	}
	var ids []uuid.UUID
	if d.err == nil {
		ids = make([]uuid.UUID, n)
		for i := range ids {
			ids[i] = d.uuid()
		}
	}
	if err := d.finish("journal page"); err != nil {
		return nil, err
	}
	return ids, nil
}

// Outbox is a finished journaled request's result waiting to be published.
type Outbox struct {
	Tenant    string
	RequestID string
	Receipt   Receipt
}

// EncodeOutbox encodes an outbox row value.
func EncodeOutbox(o *Outbox) []byte {
	e := enc{}
	e.byte(FormatVersion)
	e.str(o.RequestID)
	e.bytes(EncodeReceipt(&o.Receipt))
	return e.b
}

// DecodeOutbox decodes an outbox row value (Tenant is filled from the key by
// the caller).
func DecodeOutbox(b []byte) (Outbox, error) {
	d := dec{b: b}
	var o Outbox
	d.header("outbox")
	o.RequestID = d.str()
	rb := d.bytes()
	if err := d.finish("outbox"); err != nil {
		return Outbox{}, err
	}
	r, err := DecodeReceipt(rb)
	if err != nil {
		return Outbox{}, fmt.Errorf("outbox: %w", err)
	}
	o.Receipt = r
	return o, nil
}
