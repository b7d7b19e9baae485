// Package cascade owns every write of telha-cascade: the four request ops
// (put_node, put_edge, tombstone_edge, tombstone_node) applied in groups
// through one serialised storage transaction (group commit), the tombstone
// cascade with its inline and journaled paths, and ResumeJournals.
//
// The protocol is the seed's (shared/seed/tombstone-cascade.md) as corrected
// by DESIGN §3:
//
//   - Puts only. Every write-set is new versions; the journal row's removal
//     is the one delete, in the jobs keyspace.
//   - Node-tombstone-last. A write-set is edges first, node last, and a
//     journaled cascade applies it in chunks of whole version groups in that
//     order, so no durable state ever shows the node dead while one of its
//     journaled edges reads live.
//   - Same-tx replay is byte-identical. A journal carries the cascade's tx and
//     edge ids; resuming rebuilds exactly the same puts, skipping edges whose
//     tombstone with that tx already landed.
//   - Collection: every edge touching the node whose latest-recorded version
//     is not a tombstone, and every edge whose latest-recorded version is a
//     tombstone starting after valid_end (it gets a narrowing tombstone
//     [valid_end, open) so it cannot read live beside the dead node).
//   - No ghost through a race: decisions and inline writes happen inside one
//     serialised transaction; a journaled cascade fences its node from the
//     journal's commit until its removal, and every write touching a fenced
//     node is refused with ErrCascadeInFlight.
//
// What it must not do: speak NATS or HTTP, build keys by hand (storage owns
// the codec), or decide liveness any other way than storage's rule.
package cascade
