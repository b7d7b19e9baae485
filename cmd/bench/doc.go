// Command bench measures telha-cascade end to end, in one process tree,
// against an embedded NATS JetStream server and fresh Pebble stores, and
// prints a table (or, with --json, one JSON object).
//
//	go run ./cmd/bench            # full run (1,000,000-edge hub; about 2 minutes)
//	go run ./cmd/bench --quick    # under 60 s (100,000-edge hub, fewer requests)
//	go run ./cmd/bench --json     # one JSON object on stdout; progress on stderr
//
// docs/BENCHMARKS.md has the method in more detail, results and what limits
// each figure.
//
// # Method
//
// Every phase runs on the same machine in the same run, on one embedded
// nats-server (JetStream, file storage in a temp dir) and on fresh Pebble
// stores opened with the worker's own options (storage.OpenStore). Every
// durable write is a pebble.Sync commit.
//
// small: the real worker (app.Run, in-process, default flags, --nats-url of
// the embedded server). Before it starts, the graph is written straight into
// its store: per request target either a standalone edge (for a
// tombstone_edge) or a node with 0..8 edges (for a tombstone_node; 4 on
// average, out and in edges mixed). The measured requests alternate
// tombstone_edge and tombstone_node, over --tenants tenants, as CONTRACT §5
// JSON published with queue.Client.RequestMsg (Nats-Msg-Id = request_id) by
// --publishers goroutines with async publish, each keeping at most --window
// requests outstanding (a closed loop: a slot frees when its result
// arrives). A core NATS subscription on telha.res.* receives every result as
// it is published. Latency = result arrival - publish call, per request.
// small.per_sec = requests / (last result - first publish). Every result
// must be "ok" with the expected edges_tombstoned, or the run fails.
// small.light_p99_ms: once the worker's Pebble has no flush or compaction
// running, the same kind of requests published open-loop at a fixed
// --light-rate (1000/s) for --light-duration; p99 of their latency.
//
// pipeline: the raw limit. Same streams and consumer configuration
// (queue.Provision under another prefix), same publishers, same message count
// and bodies; a minimal consumer with the worker's structure (Consume with
// the same buffer, groups of up to 512 taken from what has arrived, one
// synced Pebble batch per group, then results published async, their
// publish acks awaited, messages acked, overlapped with the next group's
// commit). No request decoding and no reads: each message writes exactly the
// versions its cascade writes (storage.AppendVersion of the same kinds,
// label and provenance, plus the receipt), so the number and size of puts
// match (the table shows both, measured at the commit).
//
// naive: the same messages, one at a time: one synced commit per message,
// then its result is published (async, not awaited) and the message acked.
// It is the design group commit has to beat.
//
// hub: in a child process (re-exec with --hub-child) on a fresh store, a node
// with --hub-edges out-edges is built, flushed and left to settle
// (compactions finished); then GC runs, the peak-RSS counter is reset
// (echo 5 > /proc/self/clear_refs) and VmRSS read; the cascade
// (cascade.Ops.TombstoneNode, default max_batch_ops 100000, so the journaled
// path) runs; hub.seconds is its wall time until the journal is removed and
// hub.peak_rss_growth_mb = VmHWM after - VmRSS before. raw_pebble_seconds
// comes from another child that writes the same versions (N edge tombstones,
// the node tombstone: 5N+3 puts of the same key and value sizes) into a
// fresh store in synced batches of at most 100,000 puts.
//
// mixed: the real worker again, on a fresh store holding a --hub-edges hub
// and the small targets; small requests open loop at --light-rate, and one
// second in the hub's tombstone_node. mixed.p99_ms is over the small
// requests published between the hub's publish and its result.
//
// The changelog's cost, side by side (not in the default phases):
// small_changelog and small_changelog_r3 are the small phase, and
// mixed_changelog the mixed phase, with --changelog jetstream (every group
// and every cascade chunk appended to the changelog before its local
// commit); mixed_changelog runs on a NATS server of its own, since a
// changelog belongs to one store. --changelog-sync-always gives those
// servers sync_interval: always.
//
// read_member (issue 30 item 8, not in the default phases; readmember.go
// has the details): a static replica (R1 NATS server of its own) and 3
// members of --partition-owner dynamic/--member-slots (a 3-server cluster
// in this process, member i on server i), both --changelog jetstream and
// loaded with the same tenants, nodes and edges through the queue; then
// --read-concurrency readers for --read-duration per target, in slices
// taken in turn: the static replica, one member ("any": most reads are
// forwarded to the owner's member over HTTP) and each tenant's owner
// (every read local). Reported: reads/s, p50, p99, the local and
// forwarded reads of "any", the ratios to the static replica, and the
// NATS client connections of each member (the server's Connz).
//
// Ratios: small_vs_pipeline = small.per_sec / pipeline.per_sec,
// small_vs_naive = small.per_sec / naive.per_sec, hub_vs_raw = hub.seconds /
// hub.raw_pebble_seconds. The targets are reported as PASS or MISS; missing
// one never makes the command fail (only real errors do: a wrong or missing
// result, a failed commit).
//
// Every phase also reports the CPU it used (this process, and the rest of
// the machine: a run where other processes used more than ~0.2 cores is
// disturbed; --wait-idle waits for quiet before each phase), Pebble's
// flushes, compactions, block-cache hit rate and write stalls, and the
// synced commits (count, mean and max duration, share of wall time).
//
// --profile-dir writes pprof profiles of each measured phase (small, light,
// pipeline; hub and raw from the children): <phase>.cpu.pprof, and
// <phase>.allocs.base.pprof / <phase>.allocs.pprof taken before and after
// (go tool pprof -base ...base.pprof ...allocs.pprof shows the phase alone).
// Goroutines are labelled side=worker|client|pipeline|naive (filter with
// -tagfocus=side=worker). The children also write <phase>.heap-peak.pprof,
// the in-use heap near the RSS peak.
//
// It owns measurement only: it must not change how the worker behaves
// (it runs the real worker with its default flags, tuned only through the
// same TELHA_* variables a deployment would use) and it never fails because
// a target is missed.
package main
