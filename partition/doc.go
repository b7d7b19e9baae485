// Package partition makes a partition's state outlive the machine it runs
// on: a replicated changelog on JetStream is the truth, a partition's Pebble
// is a cache of it, and checkpoints in the JetStream Object Store bound how
// much of the log a new copy has to replay (issue 21, items 1 and 2).
//
// It owns, for one partition:
//
//   - the changelog stream (Changelog): one JetStream stream per partition,
//     appended to by exactly one writer, fenced by the stream's expected last
//     sequence, read back by Replay (to the current end) and Tail (forever,
//     for warm standbys);
//   - the applied position: the changelog sequence a local Pebble reflects,
//     kept in that Pebble under a reserved key and written in the same batch
//     as the write-set it applies (ApplyTo, MarkApplied, AppliedSeq);
//   - checkpoints (SaveCheckpoint, Restore, Prune, ListCheckpoints): a
//     Pebble checkpoint of the partition, archived with the standard
//     library's tar, in an Object Store bucket, named by partition and by the
//     changelog sequence it reflects.
//
// The shape, Kafka Streams' and Temporal's (docs/ARCHITECTURE.md):
//
//	owner (one per partition)                     standby / new owner
//	─────────────────────────                     ───────────────────
//	writer builds batch b
//	seq := Append(b.Repr()) ──► TELHA_LOG_<p> ──► Tail / Replay
//	MarkApplied(b, seq)          (R1 or R3,        ApplyTo(db, seq, ws)
//	commit b to Pebble            fenced by           (ws + applied key,
//	  (no fsync needed)           expected last seq)   one Pebble batch)
//	       │
//	       └── SaveCheckpoint ──► TELHA_CKPT ──► Restore (empty disk),
//	                                              then Replay(seq+1)
//
// # What it must not do
//
// It must not import the product's packages (storage, queue, api, app,
// cascade, reaper): storage will depend on a small interface that this
// package implements ("append this write-set durably"), never the reverse,
// and storage must never learn about NATS. It does not decide who owns a
// partition: membership and epochs (issue 21 item 3) live elsewhere and only
// suggest an owner; the conditional append here decides. It never interprets
// a write-set beyond checking that it is a well-formed Pebble batch that
// does not touch the reserved keyspace below.
//
// # The seam storage will call
//
// storage declares its own one-method interface, so it never imports this
// package, and *Changelog satisfies it:
//
//	type Durable interface {
//		// Append makes a write-set (a batch's Repr) durable and returns the
//		// sequence to record with it; an error is terminal for the store.
//		Append(ctx context.Context, writeSet []byte) (seq uint64, err error)
//	}
//
// Store.commit then does: seq, err := d.Append(ctx, b.Repr()); on error
// fail the store (fenced or unknown: stop answering); else MarkApplied(b,
// seq) and commit b without fsync.
//
// # The reserved keyspace
//
// Invariant: the applied sequence lives at key 0xF0 0x01 of the partition's
// own Pebble, outside every keyspace the product uses (storage/keys.go uses
// 0x00..0x07). ApplyTo refuses a write-set that writes, deletes or
// range-deletes anything in [0xF0, 0xF1). Lead: add the line
//
//	partition       0xF0 | 0x01            applied changelog sequence (partition package)
//
// to the keyspace table in storage/keys.go so no future keyspace takes it.
//
// # Fencing and ownership
//
// Invariant: every message is published with the expected last sequence
// the writer believes the stream has. A writer whose belief is stale (a
// zombie after a pause, the losing side of a split brain) gets
// ErrFenced before anything of its write-set is stored, and its Changelog
// refuses all further appends. Open reads the current last sequence, so
// Open itself is not a fence: call it only after winning ownership (the
// epoch compare-and-set of item 3), and never to "recover" from ErrFenced.
//
// # Purging
//
// Rule: never purge the changelog below the oldest kept checkpoint's
// sequence + 1 (a tail's base, kept only for its tail, does not count:
// the tail is restored, not the base), nor below any standby's applied
// sequence + 1. PurgeFloor
// computes that minimum; Prune returns the checkpoint half of it.
//
// # Erasure
//
// A purge below a sequence inside a block file, and an object delete, leave
// the removed messages' bytes in the server's block files (erase.go says
// where, from nats-server's file store). So an erase purges the changelog
// whole (below its last sequence + 1, after a checkpoint at that sequence,
// with no append in between: slot/changelog.go ScrubCopies) and checkpoints
// are deleted with DeleteCheckpoint (each chunk overwritten in place, then
// the object deleted); Prune's caller passes it to PruneWith. Tables
// uploaded through the *Bucket OpenCheckpoints returns are sealed, each
// with a data key of its own in the KV bucket KeysBucket: deleting one
// destroys its key (a secure delete of one small message) and deletes its
// chunks plainly (seal.go; the format is internal/sealed).
package partition
