// Package reaper makes crash recovery automatic: it resumes orphaned cascade
// journals (PR-030 of the seed), once at startup before the worker consumes
// anything, and then on a cron schedule (robfig/cron).
//
// A journal is an orphan when no live applier holds its lease. Leases live
// in memory (storage.JournalEntry): one process owns a store, so a lease
// needs no durable record, and a restarted process starts with every
// journal unowned. An applier heartbeats its lease on every chunk; the
// reaper takes a journal only when its lease is free or its heartbeat is
// older than the lease TTL, and chunk commits happen under the lease, so the
// reaper never races a live applier and never applies a journal twice at
// once. A pass that would overlap the previous one is skipped, not stacked.
//
// A journal that cannot be decoded, or keeps failing, never crashes or
// wedges a pass: it is counted, logged with its key, backed off, and
// reported (metrics and /v1/journals); the others are still resumed.
//
// What it must not do: decide cascade semantics (cascade.Ops.Resume does),
// delete journals it cannot read, or publish results itself (the queue's
// result outbox does, from the receipt the resume stores).
package reaper
