// Package client is what an upstream Go service imports to talk to
// telha-cascade: the wire types of the queue contract (Request, Result,
// the statuses, the message ids), and a Client that publishes requests and
// waits for their results over NATS JetStream.
//
// It owns the wire format as a publisher and a result reader see it, and
// nothing else: it must not import the worker's packages (the store, the
// cascade, the queue worker), so a client never links Pebble or the engine
// it talks to over the wire (`go list -deps ./cmd/enqueue` shows no
// Pebble). The worker's package queue decodes and validates requests
// itself and uses this package's Result and message ids when it answers.
package client
