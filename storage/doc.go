// Package storage is the tritemporal version store of telha-cascade, built on
// Pebble.
//
// It owns the data model (Ts, Interval, Scope, Version, Provenance), the one
// key codec for every keyspace (keys.go), the versioned binary record
// encodings (codec.go), the one vocabulary of outcomes (Status), the
// transaction clock (TxClock), the engine seam used for fault injection
// (Engine), the one writer every durable commit goes through (writer.go)
// with its read-write transaction (Store.Update / Txn) and the ordinary
// append-only write path (PutNode, PutEdge), the read path (as-of reads,
// adjacency, histories, index scans), request receipts, cascade journal
// rows and the in-memory fence registry that keeps writes away from a node
// whose cascade is in flight, the committed tx reads are answered at (safe
// time, safetime.go), and erasure's records: erase heads, erasure records,
// the one rewrite of a version's value, and the disk scrub (erase.go), and
// the change feed's source: a tenant's changes read from its tx_time_index
// up to its horizon, erases' feed rows and the feed's cursors (feed.go),
// and the listing of live entities (list.go).
//
// Invariants kept here:
//
//   - One writer: nothing commits between a decision's reads and its batch
//     (writer.go says how).
//
//   - Puts only. Versions, adjacency rows and index entries are never
//     deleted; a delete is a tombstone version. The only deletes the store
//     ever issues are of jobs rows (journal and erase heads, outbox rows,
//     erases' feed rows) and delivery markers. The one rewrite is erasure's: a version's value
//     with its payload erased, under the same key (I4: liveness unchanged).
//
//   - Latest-tx-wins: at (v, t) the version with the highest tx.start among
//     those whose valid interval contains v and whose tx interval contains t
//     wins; a winning tombstone reads as absent. Every read path decides
//     with the winner type (read.go) and nothing else.
//
//   - Keys are a pure function of (id, tx, valid): replaying a version with the
//     same tx rewrites the same bytes.
//
//   - Frozen neighbourhood: while a journal is registered, no version of an
//     edge touching its node is written but its own and earlier journals'
//     tombstones (journals.go).
//
// What it must not do: know about NATS, HTTP or metrics; decide cascade
// membership (that is package cascade); read or write across tenants (every
// key starts with the tenant's length-prefixed name); end the process (a
// fatal Pebble error is raised as ErrFatal for the caller to act on).
package storage
