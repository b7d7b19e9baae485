// Package reaper owns every cascade journal's life after its commit point,
// and every erase's (one eraser applies erase heads one at a time, oldest
// first: the hand-off of cascade.EraseSink, the ones a previous process
// left, failed ones after a backoff; results from the same outbox).
//
// A journaled tombstone_node commits its journal head in its group's batch
// (package cascade decides that); from then on this package has it:
//
//   - hand-off: Service.Begin (cascade.JournalSink) starts an applier at
//     once, on the writer's word that the head is durable;
//   - applying: cascade.Ops.ApplyJournal, at most one applier per journal
//     (the lease is the service's record of it; leases live in memory
//     because one process owns a store, so a restarted process starts with
//     every journal unowned);
//   - passes: RunOnce, once at startup in the background (StartResume:
//     every journal a previous process left is applied to completion while
//     the worker consumes; their fences, loaded with the store, hold back
//     only the requests touching their nodes), then on a cron schedule (robfig/cron) for journals whose applier
//     failed; a pass that would overlap the previous one is skipped;
//   - backoff and poison: a failing journal is retried after
//     RetryBackoff * 2^(failures-1) (at most 10 minutes) and reported as
//     poison after PoisonAfter failures; an undecodable head is poison from
//     the start. Neither stops the others;
//   - results: the journal's removal stores its request's receipt and a
//     result-outbox row in one batch; the service publishes the outbox
//     (Publisher, the queue's results stream) and deletes each row once
//     published; a row that fails is retried after a backoff without
//     holding up the others, and parked (reported, retried rarely) after
//     PoisonAfter failures;
//   - progress: Journals and Summarize, for /v1/journals and the gauges.
//
// What it must not do: decide cascade semantics (package cascade does),
// commit anything but through the store's writer, delete journals it cannot
// read, or import the queue (it takes a Publisher).
package reaper
