package storage

import (
	"github.com/google/uuid"
)

// Kind says whether a version belongs to a node or an edge. Its byte value
// is part of the index keys.
type Kind uint8

const (
	KindNode Kind = 1
	KindEdge Kind = 2
)

func (k Kind) String() string {
	switch k {
	case KindNode:
		return "node"
	case KindEdge:
		return "edge"
	}
	return "kind?"
}

// Provenance records who decided a change, why, and when (decision time, the
// third time axis: recorded, never used for liveness).
type Provenance struct {
	Actor     string
	Reason    string
	Source    string
	RequestID string
	DecidedAt Ts // NoTs when not given
}

// Version is one immutable version record of a node or an edge.
//
// Src, Dst and Label are set for edges only. Props is a compact JSON object
// ("{}" when empty). Tx is always [tx, OpenEnd): versions are never closed;
// supersession is decided by latest-tx-wins.
type Version struct {
	Kind      Kind
	ID        uuid.UUID
	Src, Dst  uuid.UUID
	Label     string
	Valid     Interval
	Tx        Interval
	Tombstone bool
	// Erased: the payload (props, actor, reason, source) was erased
	// (storage/erase.go); everything liveness reads is unchanged.
	Erased bool
	Props  []byte
	Prov   Provenance
}

// Other returns the endpoint of an edge version that is not n (n itself for
// a self-loop).
func (v *Version) Other(n uuid.UUID) uuid.UUID {
	if v.Src == n {
		return v.Dst
	}
	return v.Src
}

// Touches reports whether the edge version has n as an endpoint.
func (v *Version) Touches(n uuid.UUID) bool { return v.Src == n || v.Dst == n }

// OpsPerNodeVersion and OpsPerEdgeVersion are the puts one version costs:
// version + 2 index entries; version + 2 adjacency rows + 2 index entries.
const (
	OpsPerNodeVersion = 3
	OpsPerEdgeVersion = 5
)
