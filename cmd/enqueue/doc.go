// Command enqueue publishes telha-cascade requests to NATS JetStream and,
// with --wait, prints each request's result (one JSON line per request) and
// exits non-zero if any result is not "ok".
//
//	enqueue [global flags] put-node       --tenant T [--id UUID] [--valid-from T] [--valid-to T] [--props JSON]
//	enqueue [global flags] put-edge       --tenant T --src UUID --dst UUID [--label L] [--id UUID] ...
//	enqueue [global flags] tombstone-node --tenant T --id UUID [--valid-end T]
//	enqueue [global flags] tombstone-edge --tenant T --id UUID [--valid-end T]
//	enqueue [global flags] file [PATH|-]  (JSON lines, one request object per line)
//	enqueue [global flags] demo [--tenant demo] [--people N] [--hub-edges N]
//
// Exit status: 0 all ok (or published, without --wait), 1 a result was not
// ok or did not arrive in time, 2 bad usage.
//
// It owns the client side of the wire contract for operators and scripts:
// building request bodies, publishing with Nats-Msg-Id = request_id, and
// collecting results. It must not reach into the worker's store or streams
// beyond what any upstream service may do (publish requests, read results).
package main
