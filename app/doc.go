// Package app assembles the worker process: flags and environment
// (CONTRACT §7), the Pebble store, the cascade engine, the embedded or
// external NATS connection, the queue worker, the reaper, metrics and the
// HTTP server, and their startup and shutdown order. cmd/worker is a thin
// main around it, and end-to-end tests run it in-process.
//
// What it must not do: hold product logic; everything here is wiring.
package app
