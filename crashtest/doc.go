// Package crashtest holds the process-crash test of the worker: it builds
// the real cmd/worker binary, runs it against an embedded NATS JetStream
// server owned by the test process, SIGKILLs it at random moments under a
// mixed load, restarts it on the same data dir, and finally checks every
// result and the store (through the HTTP read API) against a reference
// model kept by the test. See crash_test.go for how to run it.
//
// The dynamic-mode tests keep their members' logs in a temporary directory
// (the test log names it) when they fail, and after a pass too with
// TELHA_KEEP_LOGS=1.
//
// The package has no non-test code; everything lives in _test.go files.
package crashtest
