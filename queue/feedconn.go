package queue

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// FeedConn is the change feed's NATS connection, one per process, shared
// by the feeds of all its slots: dialled with the options and servers of
// the process's connection (the server that one is connected to first),
// and never reconnecting. A connection that reconnects keeps what it had
// not yet written to its socket and sends it to the next server, while
// what was in the socket when its server died is lost: a round would
// store a tenant's later changes without an earlier one, out of order.
// Closed instead, every round in flight fails whole (its publishes'
// answers end with the connection), and the next round dials again and
// publishes from its cursor.
type FeedConn struct {
	tmpl    *nats.Conn
	ackWait time.Duration

	mu     sync.Mutex
	nc     *nats.Conn
	js     jetstream.JetStream
	closed chan struct{}
	done   bool
}

// NewFeedConn returns the feed's connection, made from the process's nc
// (dialled when a round first needs it).
func NewFeedConn(nc *nats.Conn) *FeedConn { return newFeedConn(nc, feedAckWait) }

func newFeedConn(nc *nats.Conn, ackWait time.Duration) *FeedConn {
	return &FeedConn{tmpl: nc, ackWait: ackWait}
}

// get returns the open connection, dialled again if it closed; closed is
// closed when it closes.
func (c *FeedConn) get() (nc *nats.Conn, js jetstream.JetStream, closed <-chan struct{}, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.done {
		return nil, nil, nil, fmt.Errorf("change feed: %w", nats.ErrConnectionClosed)
	}
	if c.nc != nil && !c.nc.IsClosed() {
		return c.nc, c.js, c.closed, nil
	}
	o := c.tmpl.Opts
	o.Servers = nil
	for _, u := range append([]string{c.tmpl.ConnectedUrl(), o.Url}, c.tmpl.Servers()...) {
		if u != "" && !slices.Contains(o.Servers, u) {
			o.Servers = append(o.Servers, u)
		}
	}
	o.Url = ""
	o.Name = strings.TrimSpace(o.Name + " change-feed")
	o.AllowReconnect, o.RetryOnFailedConnect = false, false
	// The process's handlers log its own connection's life; this one's
	// end fails the rounds in flight (logged by their feeds).
	ch := make(chan struct{})
	o.ClosedCB = func(*nats.Conn) { close(ch) }
	o.DisconnectedCB, o.DisconnectedErrCB, o.ReconnectedCB, o.ConnectedCB = nil, nil, nil, nil
	o.DiscoveredServersCB, o.LameDuckModeHandler, o.ReconnectErrCB = nil, nil, nil
	nc, err = o.Connect()
	if err != nil {
		return nil, nil, nil, fmt.Errorf("change feed: connect to NATS: %w", err)
	}
	js, err = jetstream.New(nc, jetstream.WithPublishAsyncTimeout(c.ackWait))
	if err != nil {
		nc.Close()
		return nil, nil, nil, fmt.Errorf("change feed: jetstream: %w", err)
	}
	c.nc, c.js, c.closed = nc, js, ch
	return nc, js, ch, nil
}

// Close closes the connection for good (its process is stopping).
func (c *FeedConn) Close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.done = true
	if c.nc != nil {
		c.nc.Close()
	}
}
