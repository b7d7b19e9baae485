package storage

import (
	"encoding/binary"
	"fmt"

	"github.com/google/uuid"
)

// This file is the one key codec. No other code builds or parses keys
// (TestKeysBuiltOnlyInKeysGo): other files use the keyspace bytes only as
// arguments to this file's functions, in comparisons and case labels.
//
// All integers are big-endian; timestamps have the sign bit flipped so that
// negative times sort first. T is the tenant as one length byte + bytes, so a
// tenant's key range never contains another tenant's (the length byte of
// "a" and "ab" differ; no prefix of one is a prefix of the other):
//
//	meta            0x00 | sub | ...
//	node_versions   0x01 | T | node_id | tx.start | valid.start
//	edge_versions   0x02 | T | edge_id | tx.start | valid.start
//	adjacency_out   0x03 | T | src | edge_id | tx.start | valid.start
//	adjacency_in    0x04 | T | dst | edge_id | tx.start | valid.start
//	valid_time_idx  0x05 | T | valid.start | kind | id | tx.start
//	tx_time_idx     0x06 | T | tx.start | kind | id | valid.start
//	jobs            0x07 | T | state | priority | created_at | job_id [| page]
//	partition       0xF0 | 0x01            applied changelog sequence (package partition)
//
// The 0xF0 keyspace is package partition's (the changelog's bookkeeping in
// a partition's own Pebble); this package writes exactly one key of it,
// AppliedSeqKey, and only when a Durable is set (Options.Durable). No
// other keyspace may take 0xF0, and a write-set read back from a changelog
// may not touch it (partition.ValidateWriteSet refuses it).
//
// Meta sub-keyspaces: 0x01 format version, 0x03 | T tenant registry,
// 0x04 | T | request_id request receipts, 0x05 | stream (length byte +
// name) | sequence delivery markers of redelivered request messages,
// 0x06 | T | request_id erasure records (erase.go). (0x02 is reserved: the
// clock's high-water mark is derived from the tx index, see
// Store.readHWM.)
//
// Jobs states: 0xC0 cascade journal head (the commit point), 0xC1 journal
// pages of edge ids (same priority/created_at/job_id as the head, plus a
// 4-byte page number), 0xC2 erase head (job id: a SHA-1 name UUID of the
// request id), 0xD0 result outbox of a finished journaled request, 0xD1
// change-feed row of a finished erase (created_at: the committed tx when it
// finished), 0xD2 the tenant's change-feed cursor (feed.go).

// Keyspace bytes.
const (
	ksMeta     byte = 0x00
	ksNode     byte = 0x01
	ksEdge     byte = 0x02
	ksAdjOut   byte = 0x03
	ksAdjIn    byte = 0x04
	ksValidIdx byte = 0x05
	ksTxIdx    byte = 0x06
	ksJobs     byte = 0x07
)

// Meta sub-keyspaces.
const (
	metaFormat  byte = 0x01
	metaTenant  byte = 0x03
	metaReceipt byte = 0x04
	metaDeliver byte = 0x05
	metaErasure byte = 0x06
)

// Jobs state bytes.
const (
	// CascadeJournalState is the reserved jobs state byte of cascade journal
	// heads; JobsInState(scope, CascadeJournalState) finds every incomplete
	// cascade of a tenant in (priority, created_at) order.
	CascadeJournalState byte = 0xC0
	// JournalPageState holds a journal's edge-id pages.
	JournalPageState byte = 0xC1
	// EraseJobState is the jobs state byte of erase heads (erase.go).
	EraseJobState byte = 0xC2
	// ResultOutboxState holds the result of a finished journaled request
	// until the queue has published it.
	ResultOutboxState byte = 0xD0
	// FeedEraseState holds an erase's change-feed entry until it is
	// published (feed.go), keyed by the committed tx when it finished.
	FeedEraseState byte = 0xD1
	// FeedCursorState holds where the tenant's change feed stands (one
	// row, feed.go).
	FeedCursorState byte = 0xD2
)

// FormatVersion is the on-disk format version recorded in meta and as the
// first byte of every record encoding.
const FormatVersion byte = 1

func putTs(b []byte, t Ts) []byte {
	return binary.BigEndian.AppendUint64(b, uint64(t)^(1<<63))
}

func getTs(b []byte) Ts { return Ts(binary.BigEndian.Uint64(b) ^ (1 << 63)) }

func appendTenant(b []byte, s Scope) []byte {
	b = append(b, byte(len(s.tenant)))
	return append(b, s.tenant...)
}

func scopePrefix(space byte, s Scope, extra int) []byte {
	b := make([]byte, 0, 2+len(s.tenant)+extra)
	b = append(b, space)
	return appendTenant(b, s)
}

// The append forms below build keys into a caller's buffer (the batch
// writers reuse one buffer for every key); the allocating forms call them.

func appendVersionKey(dst []byte, space byte, s Scope, id uuid.UUID, tx, valid Ts) []byte {
	dst = appendTenant(append(dst, space), s)
	dst = append(dst, id[:]...)
	dst = putTs(dst, tx)
	return putTs(dst, valid)
}

func appendAdjKey(dst []byte, s Scope, out bool, node, edge uuid.UUID, tx, valid Ts) []byte {
	space := ksAdjIn
	if out {
		space = ksAdjOut
	}
	dst = appendTenant(append(dst, space), s)
	dst = append(dst, node[:]...)
	dst = append(dst, edge[:]...)
	dst = putTs(dst, tx)
	return putTs(dst, valid)
}

func appendIdxKey(dst []byte, space byte, s Scope, t1 Ts, k Kind, id uuid.UUID, t2 Ts) []byte {
	dst = appendTenant(append(dst, space), s)
	dst = putTs(dst, t1)
	dst = append(dst, byte(k))
	dst = append(dst, id[:]...)
	return putTs(dst, t2)
}

// NodeKey is the key of a node version.
func NodeKey(s Scope, id uuid.UUID, tx, valid Ts) []byte {
	return versionKey(ksNode, s, id, tx, valid)
}

// EdgeKey is the key of an edge version.
func EdgeKey(s Scope, id uuid.UUID, tx, valid Ts) []byte {
	return versionKey(ksEdge, s, id, tx, valid)
}

func versionKey(space byte, s Scope, id uuid.UUID, tx, valid Ts) []byte {
	return appendVersionKey(make([]byte, 0, 34+len(s.tenant)), space, s, id, tx, valid)
}

// VersionPrefix is the prefix of every version of one node or edge.
func VersionPrefix(s Scope, k Kind, id uuid.UUID) []byte {
	space := ksNode
	if k == KindEdge {
		space = ksEdge
	}
	b := scopePrefix(space, s, 16)
	return append(b, id[:]...)
}

// VersionKey is the key of a version of kind k.
func VersionKey(s Scope, k Kind, id uuid.UUID, tx, valid Ts) []byte {
	if k == KindEdge {
		return EdgeKey(s, id, tx, valid)
	}
	return NodeKey(s, id, tx, valid)
}

func versionSpace(k Kind) byte {
	if k == KindEdge {
		return ksEdge
	}
	return ksNode
}

// AdjKey is an adjacency row: out=true keys by src, out=false by dst.
func AdjKey(s Scope, out bool, node, edge uuid.UUID, tx, valid Ts) []byte {
	return appendAdjKey(make([]byte, 0, 50+len(s.tenant)), s, out, node, edge, tx, valid)
}

// AdjPrefix is the prefix of a node's out (or in) adjacency rows.
func AdjPrefix(s Scope, out bool, node uuid.UUID) []byte {
	space := ksAdjIn
	if out {
		space = ksAdjOut
	}
	b := scopePrefix(space, s, 16)
	return append(b, node[:]...)
}

// ValidIdxKey is a valid_time_index entry.
func ValidIdxKey(s Scope, valid Ts, k Kind, id uuid.UUID, tx Ts) []byte {
	return appendIdxKey(make([]byte, 0, 35+len(s.tenant)), ksValidIdx, s, valid, k, id, tx)
}

// TxIdxKey is a tx_time_index entry.
func TxIdxKey(s Scope, tx Ts, k Kind, id uuid.UUID, valid Ts) []byte {
	return appendIdxKey(make([]byte, 0, 35+len(s.tenant)), ksTxIdx, s, tx, k, id, valid)
}

// IdxRange returns [lower, upper) bounds of the valid-time (validAxis) or
// tx-time index entries whose time lies in [from, to).
func IdxRange(s Scope, validAxis bool, from, to Ts) (lower, upper []byte) {
	space := ksTxIdx
	if validAxis {
		space = ksValidIdx
	}
	lower = putTs(scopePrefix(space, s, 8), from)
	if to == OpenEnd {
		return lower, PrefixEnd(scopePrefix(space, s, 0))
	}
	return lower, putTs(scopePrefix(space, s, 8), to)
}

// JobKey is the key of a row in the jobs keyspace.
func JobKey(s Scope, state, priority byte, createdAt Ts, jobID uuid.UUID) []byte {
	b := scopePrefix(ksJobs, s, 30)
	b = append(b, state, priority)
	b = putTs(b, createdAt)
	return append(b, jobID[:]...)
}

// JournalPageKey is the key of page n of a journal's edge-id list.
func JournalPageKey(s Scope, priority byte, createdAt Ts, jobID uuid.UUID, page uint32) []byte {
	b := JobKey(s, JournalPageState, priority, createdAt, jobID)
	return binary.BigEndian.AppendUint32(b, page)
}

// JournalPagesRange bounds every page row of one journal.
func JournalPagesRange(s Scope, priority byte, createdAt Ts, jobID uuid.UUID) (lower, upper []byte) {
	p := JobKey(s, JournalPageState, priority, createdAt, jobID)
	return p, PrefixEnd(p)
}

// JobsInState returns the [lower, upper) bounds of a tenant's job rows in one
// state, ordered by (priority, created_at, job_id).
func JobsInState(s Scope, state byte) (lower, upper []byte) {
	p := append(scopePrefix(ksJobs, s, 1), state)
	return p, PrefixEnd(p)
}

// ReceiptKey is the key of a request's receipt.
func ReceiptKey(s Scope, requestID string) []byte {
	b := []byte{ksMeta, metaReceipt}
	b = appendTenant(b, s)
	return append(b, requestID...)
}

// DeliveryKey is the key of a request message's delivery marker: stream
// and stream sequence (a marker is not tenant data: the message may not
// even name a readable tenant).
func DeliveryKey(stream string, seq uint64) []byte {
	b := []byte{ksMeta, metaDeliver, byte(len(stream))}
	b = append(b, stream...)
	return binary.BigEndian.AppendUint64(b, seq)
}

// TenantKey is a tenant's row in the tenant registry.
func TenantKey(s Scope) []byte { return appendTenant([]byte{ksMeta, metaTenant}, s) }

// TenantRegistryRange bounds the whole tenant registry.
func TenantRegistryRange() (lower, upper []byte) {
	p := []byte{ksMeta, metaTenant}
	return p, PrefixEnd(p)
}

func formatKey() []byte { return []byte{ksMeta, metaFormat} }

// ksPartition is the keyspace package partition reserves (see the table).
const ksPartition byte = 0xF0

// AppliedSeqKey is the key holding the changelog sequence a store reflects,
// an 8-byte big-endian integer: partition.AppliedKey, repeated here so
// that storage never imports partition (app checks at startup, and a test
// in app checks, that the two are the same bytes).
func AppliedSeqKey() []byte { return []byte{ksPartition, 0x01} }

// TenantRange bounds every key of one tenant in one keyspace (used by
// isolation tests and tools).
func TenantRange(space byte, s Scope) (lower, upper []byte) {
	p := scopePrefix(space, s, 0)
	return p, PrefixEnd(p)
}

// EntitySplit is the store's Pebble Split: the prefix of a version key
// (0x01, 0x02) or an adjacency key (0x03, 0x04) is its keyspace, tenant and
// entity (keyspace | T | id), everything after it the suffix; any other
// key, or one too short to hold that prefix, is all prefix. Bloom filters
// are built on these prefixes, so a read of one entity's versions or one
// node's adjacency (a prefix iteration) skips every table that holds
// nothing of it.
//
// Pebble's rules for a Split hold (TestEntitySplitIsAValidSplit): within a
// keyspace and tenant every full-length key has the same prefix length,
// and two tenants' keys differ inside the tenant bytes (or in the length
// byte), so ordering by prefix first and then by suffix is plain bytewise
// order.
func EntitySplit(k []byte) int {
	if len(k) < 2 {
		return len(k)
	}
	switch k[0] {
	case ksNode, ksEdge, ksAdjOut, ksAdjIn:
		if n := 2 + int(k[1]) + 16; n <= len(k) {
			return n
		}
	}
	return len(k)
}

// PrefixEnd returns the smallest key greater than every key with prefix p, or
// nil if there is none (p is all 0xff).
func PrefixEnd(p []byte) []byte {
	end := append([]byte(nil), p...)
	for i := len(end) - 1; i >= 0; i-- {
		end[i]++
		if end[i] != 0 {
			return end[:i+1]
		}
	}
	return nil
}

// Key is a decoded key. Which fields are set depends on Space.
type Key struct {
	Space     byte
	Sub       byte // meta sub-keyspace
	Tenant    string
	ID        uuid.UUID // entity id (versions, index), or the edge of an adjacency row
	Node      uuid.UUID // adjacency: the node the row is filed under
	Kind      Kind      // versions and index entries
	Tx, Valid Ts
	State     byte
	Priority  byte
	CreatedAt Ts
	JobID     uuid.UUID
	Page      uint32
	HasPage   bool
	RequestID string
	Stream    string // delivery markers
	Seq       uint64
}

// Scope returns the key's tenant as a Scope (zero when the key has none).
func (k Key) Scope() Scope { return Scope{tenant: k.Tenant} }

// DecodeKey parses any key this package builds. It never panics; malformed
// input is an ErrDecode.
func DecodeKey(b []byte) (Key, error) {
	d := keyDecoder{b: b}
	var k Key
	k.Space = d.byte()
	switch k.Space {
	case ksMeta:
		k.Sub = d.byte()
		switch k.Sub {
		case metaFormat:
		case metaTenant:
			k.Tenant = d.tenant()
		case metaReceipt:
			k.Tenant = d.tenant()
			k.RequestID = string(d.rest())
			if d.err == nil && k.RequestID == "" {
				d.fail("empty request id")
			}
		case metaErasure:
			k.Tenant = d.tenant()
			k.RequestID = string(d.rest())
			if d.err == nil && k.RequestID == "" {
				d.fail("empty request id")
			}
		case metaDeliver:
			n := int(d.byte())
			k.Stream = string(d.take(n))
			if b := d.take(8); d.err == nil {
				k.Seq = binary.BigEndian.Uint64(b)
			}
		default:
			d.fail("unknown meta sub-keyspace")
		}
	case ksNode, ksEdge:
		k.Kind = KindNode
		if k.Space == ksEdge {
			k.Kind = KindEdge
		}
		k.Tenant = d.tenant()
		k.ID = d.uuid()
		k.Tx = d.ts()
		k.Valid = d.ts()
	case ksAdjOut, ksAdjIn:
		k.Kind = KindEdge
		k.Tenant = d.tenant()
		k.Node = d.uuid()
		k.ID = d.uuid()
		k.Tx = d.ts()
		k.Valid = d.ts()
	case ksValidIdx, ksTxIdx:
		k.Tenant = d.tenant()
		t1 := d.ts()
		k.Kind = Kind(d.byte())
		if d.err == nil && k.Kind != KindNode && k.Kind != KindEdge {
			d.fail("bad kind")
		}
		k.ID = d.uuid()
		t2 := d.ts()
		if k.Space == ksValidIdx {
			k.Valid, k.Tx = t1, t2
		} else {
			k.Tx, k.Valid = t1, t2
		}
	case ksJobs:
		k.Tenant = d.tenant()
		k.State = d.byte()
		k.Priority = d.byte()
		k.CreatedAt = d.ts()
		k.JobID = d.uuid()
		if k.State == JournalPageState {
			k.Page = d.u32()
			k.HasPage = true
		}
	default:
		d.fail("unknown keyspace")
	}
	if d.err == nil && len(d.b) != 0 {
		d.fail("trailing bytes")
	}
	if d.err != nil {
		return Key{}, fmt.Errorf("%w: key %x: %v", ErrDecode, b, d.err)
	}
	return k, nil
}

type keyDecoder struct {
	b   []byte
	err error
}

func (d *keyDecoder) fail(msg string) {
	if d.err == nil {
		d.err = fmt.Errorf("%s", msg)
	}
}

func (d *keyDecoder) take(n int) []byte {
	if d.err != nil {
		return nil
	}
	if n < 0 || len(d.b) < n {
		d.fail("short key")
		return nil
	}
	out := d.b[:n]
	d.b = d.b[n:]
	return out
}

func (d *keyDecoder) byte() byte {
	if p := d.take(1); p != nil {
		return p[0]
	}
	return 0
}

func (d *keyDecoder) tenant() string {
	n := int(d.byte())
	p := d.take(n)
	if d.err != nil {
		return ""
	}
	if !ValidTenant(string(p)) {
		d.fail("bad tenant")
		return ""
	}
	return string(p)
}

func (d *keyDecoder) uuid() uuid.UUID {
	var u uuid.UUID
	if p := d.take(16); p != nil {
		copy(u[:], p)
	}
	return u
}

func (d *keyDecoder) ts() Ts {
	if p := d.take(8); p != nil {
		return getTs(p)
	}
	return 0
}

func (d *keyDecoder) u32() uint32 {
	if p := d.take(4); p != nil {
		return binary.BigEndian.Uint32(p)
	}
	return 0
}

func (d *keyDecoder) rest() []byte {
	if d.err != nil {
		return nil
	}
	out := d.b
	d.b = nil
	return out
}

// EraseJobKey is the key of an erase head (job id: a hash of the request id).
func EraseJobKey(s Scope, tx Ts, requestID string) []byte {
	return JobKey(s, EraseJobState, 0, tx, uuid.NewSHA1(uuid.NameSpaceOID, []byte(requestID)))
}

// ErasureKey is the key of a request's erasure record.
func ErasureKey(s Scope, requestID string) []byte {
	b := []byte{ksMeta, metaErasure}
	b = appendTenant(b, s)
	return append(b, requestID...)
}

// keyspaceStart is the first key a keyspace may hold (a scan bound).
func keyspaceStart(ks byte) []byte { return []byte{ks} }
