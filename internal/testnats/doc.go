// Package testnats is test support: it starts real embedded NATS JetStream
// servers (store in a temp dir, free loopback port) for tests, restarts them
// on the same port and store, and offers Eventually for polling state that
// lives in another process.
//
// It must not be imported by production code, and it must never stand in
// for NATS: tests talk to a real server through it.
package testnats
