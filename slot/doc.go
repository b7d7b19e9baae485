// Package slot runs one slot on this process: the unit of state that a
// static worker hosts once (--partition-owner i/N) and a member hosts as
// the group assigns it (--partition-owner dynamic/N), issue 30.
//
// It owns a slot's life, from New to the end of Run (Run returns once its
// context ends and the slot has drained and closed):
//
//   - open: with --changelog jetstream, restore the newest checkpoint and
//     replay the changelog into the slot's Pebble, claim the changelog
//     (fencing any earlier writer), and open the store with the changelog
//     as its Durable (changelog.go);
//   - serve: the queue consumer of the partitions the slot owns, the
//     cascade engine, the reaper (journals, erases, outbox), the scheduled
//     checkpoints and an erase's scrub of the copies, the read API and the
//     status page (Handler, ServeHosted), the slot's metrics registry;
//   - drain and close, in order (Run's comment).
//
// A standby's catch-up of the same copy is here too (OpenChangelog,
// Changelog.CatchUp); the member tails it.
//
// What it must not do: dial NATS, bind a port of its own choosing, read
// flags or environment, or decide who owns the slot. The host gives it
// the process's shared parts in Options: the NATS connection (or a Dial),
// the access control, the tracer, and, for a member, the status page's
// view of the group (Host). Ownership is package member's; the fence is
// the changelog's expected-last-sequence append (package partition).
package slot
