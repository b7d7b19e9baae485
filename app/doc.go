// Package app assembles the worker process: flags and environment
// (CONTRACT §7), the embedded or external NATS connection, the HTTP
// servers, the access control and the tracer, and the slots the process
// hosts (package slot): one fixed slot for a static worker (runStatic), or
// the slots a member is given (member*.go: the membership loop, where a
// read goes, the standbys' copies, what a member reports). cmd/worker is
// a thin main around it, and end-to-end tests run it in-process.
//
// What it must not do: hold product logic or a slot's state; everything
// here is wiring and hosting.
package app
