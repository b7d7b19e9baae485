// Command worker is telha-cascade's worker: it consumes delete and write
// requests from NATS JetStream and applies them to its Pebble store.
//
// With no flags it runs on its embedded default: a NATS JetStream server on
// 127.0.0.1:4222 storing under ./data/nats, Pebble under ./data/pebble, and
// HTTP (metrics, health, read API) on :8080. Every flag also reads from an
// environment variable: TELHA_ + the flag name in upper case, "-" as "_".
// Run with -h for the flags. Bad flags exit 2; SIGTERM drains and exits 0.
//
// One variable names no flag: TELHA_MEMORY_LIMIT, a container's memory
// limit in bytes (the Helm chart passes it). Without GOMEMLIMIT in the
// environment, the worker sets the Go runtime's soft memory limit to 90 %
// of it minus Pebble's memory outside the Go heap, and logs what it chose
// (memlimit.go).
//
// It owns the process: flags and environment (through package app), signals
// and the exit status (0 clean stop, 1 error, 2 bad usage, 3 fatal storage
// error). It must not hold product logic: everything else is in app and the
// packages it wires.
package main
