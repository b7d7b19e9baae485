package queue

import (
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/telha/telha-cascade/queue/client"
)

// Client is the upstream client (package queue/client, which an upstream
// service imports without the worker).
type Client = client.Client

// NewClient returns a client for the subjects and results stream of cfg.
func NewClient(nc *nats.Conn, cfg Config, opts ...jetstream.JetStreamOpt) (*Client, error) {
	cfg = cfg.Defaults()
	return client.New(nc, client.Config{Prefix: cfg.Prefix, ResStream: cfg.ResStream}, opts...)
}
