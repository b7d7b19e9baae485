// Package attempt bounds a request to NATS that may go unanswered, and
// sends it again.
//
// A NATS server that is paused (SIGSTOP, a frozen VM) keeps its routes
// open for a while: a request routed to it (a direct get, answered by any
// of a stream's replicas; an API request to a leader it still holds) gets
// no answer, and waits out its whole context. A black-box probe paused one
// of three servers for 30 s and saw an erase's scrub of the checkpoints
// wait its full 2 minutes, a scheduled checkpoint its 10, and every
// member's round fail for the whole pause (each round's gets, a third of
// them sent to the paused server's replica, waited out the round).
//
// It owns the retry of one request, nothing else: what to send, and
// whether sending it twice is safe, are the caller's.
package attempt
