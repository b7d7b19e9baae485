// Package cascade owns every write decision of telha-cascade: the six
// request ops (put_node, put_edge, tombstone_edge, tombstone_node,
// erase_node, erase_edge) applied in groups of at most max_batch_ops puts
// through the store's one writer (group commit), the tombstone cascade with
// its inline and journaled paths, the mechanics of applying a journal
// (ApplyJournal, ResumeJournals), and of applying an erase (erase.go:
// ApplyErase rewrites the versions in chunks, then scrubs the disk).
//
// The protocol is the seed's (shared/seed/tombstone-cascade.md) as corrected
// by CONTRACT §3:
//
//   - Puts only. Every write-set is new versions; the journal row's removal
//     is the one delete, in the jobs keyspace.
//   - Node-tombstone-last. A write-set is edges first, node last, and a
//     journaled cascade applies it in chunks of whole version groups in that
//     order, so no durable state ever shows the node dead while one of its
//     journaled edges reads live.
//   - Same-tx replay is byte-identical. A journal carries the cascade's tx
//     and valid_end (no edge ids: see the journaled path below); resuming
//     re-derives the same edges from the frozen neighbourhood and rebuilds
//     exactly the same puts, skipping edges whose tombstone with that tx
//     already landed.
//   - Collection: every edge touching the node whose latest-recorded version
//     is not a tombstone, and every edge whose latest-recorded version is a
//     tombstone starting after valid_end (it gets a narrowing tombstone
//     [valid_end, open) so it cannot read live beside the dead node).
//   - No ghost through a race: every decision reads and writes on the
//     store's one writer (nothing commits in between); a journaled cascade
//     fences its node from its head's commit until its removal; every write
//     touching a fenced node is refused with ErrCascadeInFlight, checked
//     before the states the journal writes; a journaled cascade sharing an
//     edge with an earlier journal waits for it.
//   - The journaled path (journal.go): the head is the commit point and
//     holds no edge list; the write-set is re-derived from the frozen
//     neighbourhood by ScanJournal, first pass and resume alike, and
//     applied by ApplyJournal in chunks through the writer's background
//     lane, node last.
//
// Who applies journals, when, and what happens to their results is package
// reaper's: cascade hands each journal over through the JournalSink it
// declares.
//
// What it must not do: speak NATS or HTTP, build keys by hand (storage owns
// the codec), decide liveness any other way than storage's rule, commit
// anything but through the store's writer, or import the packages above it.
package cascade
