// Package api is the worker's HTTP surface: /healthz, /readyz, /metrics and
// the read-only audit API of CONTRACT §6 (as-of reads of nodes and edges, a
// node's edges by direction, version histories, journals in flight).
//
// Every read decides liveness through storage's one rule; the handlers only
// parse parameters and shape JSON. Bad parameters get 400 with
// {"error": "..."}, absent entities 404.
//
// What it must not do: write to the store, or answer for a tenant other than
// the one in the path.
package api
