// Package metrics owns the worker's Prometheus registry: every metric family
// SREs' dashboards and alerts rely on (telha_*), initialised with every
// label set at start so rate() sees zeros rather than gaps, plus the Go,
// process and Pebble health collectors. It is a leaf: it imports none of
// the product's packages. They expose hooks or state functions, and the
// wiring (package app) turns those into the observations and gauges here.
//
// Gauges that describe state (journals in flight, oldest journal age, queue
// backlog and the oldest pending request's age, parked results, Pebble
// health) are computed at scrape time from in-memory state and cached
// consumer info (its read time is telha_queue_info_timestamp_seconds); a
// scrape never blocks on NATS or on disk I/O.
//
// What it must not do: use per-tenant or per-id labels (unbounded
// cardinality), or change what it observes.
package metrics
