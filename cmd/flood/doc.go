// Command flood runs the hostile-tenant floods of docs/RELIABILITY.md
// against a real worker process and prints, for each, what it cost the
// worker: its peak RSS growth, and what the flood was answered.
//
//	go run ./cmd/flood            # all three floods (about a minute)
//	go run ./cmd/flood --json     # one JSON object on stdout
//
// It builds ./cmd/worker, starts it on its embedded default (embedded NATS
// and Pebble in a temp dir, free loopback ports, no tokens: the status page
// and the read API answer loopback clients), and measures the worker
// process alone through /proc/<pid>/status: before each flood the peak is
// reset (echo 5 > /proc/<pid>/clear_refs) and VmRSS read; after it, VmHWM
// less that is the flood's peak RSS growth.
//
// The floods (issue "No tenant can hurt another"):
//
//   - ops: --op-messages requests whose "op" is --op-bytes of random
//     letters (a label value taken from input would grow /metrics by that
//     much per message); then /metrics is scraped and its size reported.
//   - deep: --deep-letters dead letters of about 20 KB nested --deep-depth
//     deep, then the dead-letter page viewed --deep-views times with and
//     without a tenant filter.
//   - waits: a hub with --hub-edges edges is deleted (a journaled cascade:
//     its node is fenced until the cascade ends) and --waits concurrent reads
//     of the hub with ?wait=30 are sent meanwhile; their statuses are counted
//     (200, 404 or 503 past the bound of waiting reads).
//
// Flood is a measuring tool, not a test: it asserts nothing about time or
// memory, but it exits 1 when the worker dies, a flood cannot be sent, or
// an answer is one the contract does not allow.
//
// It owns nothing of the product: it drives the worker only through its
// public contracts (NATS subjects, the HTTP API and status page, flags) and
// reads the worker's memory from /proc. It must not import the product's
// packages, so that it floods the worker exactly as an outsider would, and
// it must not assert timings: it reports figures for docs/RELIABILITY.md.
package main
