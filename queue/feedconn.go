package queue

import (
	"context"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
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

	mu       sync.Mutex
	nc       *nats.Conn
	closed   chan struct{}
	dialing  chan struct{} // closed when the dial in flight ends; nil when none is
	stop     chan struct{} // closed by Close: a wait for a dial ends
	done     bool
	failErr  error // the last dial's failure, standing until failedAt+feedDialRetry
	failedAt time.Time
}

// NewFeedConn returns the feed's connection, made from the process's nc
// (dialled when a round first needs it).
func NewFeedConn(nc *nats.Conn) *FeedConn { return newFeedConn(nc, feedAckWait) }

func newFeedConn(nc *nats.Conn, ackWait time.Duration) *FeedConn {
	return &FeedConn{tmpl: nc, ackWait: ackWait, stop: make(chan struct{})}
}

// get returns the open connection, dialled again if it closed; closed is
// closed when it closes. A failed dial is the answer for a second: the
// slots' feeds of a process cut off from NATS do not each wait out a
// dial of their own, in turn, on every round. The dial runs on its own,
// outside the lock, and get waits for it only until ctx ends: a server
// that takes the TCP connection and never answers holds a dial for
// nats.go's Timeout per server, and a slot that stops must not wait for
// it (nats.go's Connect takes no context).
func (c *FeedConn) get(ctx context.Context) (nc *nats.Conn, closed <-chan struct{}, err error) {
	c.mu.Lock()
	for {
		switch {
		case c.done:
			c.mu.Unlock()
			return nil, nil, fmt.Errorf("change feed: %w", nats.ErrConnectionClosed)
		case c.nc != nil && !c.nc.IsClosed():
			nc, closed = c.nc, c.closed
			c.mu.Unlock()
			return nc, closed, nil
		case c.failErr != nil && time.Since(c.failedAt) < feedDialRetry:
			err = c.failErr
			c.mu.Unlock()
			return nil, nil, err
		}
		if c.dialing == nil {
			c.dialing = make(chan struct{})
			go c.dial(c.dialing)
		}
		dialing := c.dialing
		c.mu.Unlock()
		select {
		case <-dialing:
		case <-c.stop:
		case <-ctx.Done():
			return nil, nil, fmt.Errorf("change feed: connect to NATS: %w", ctx.Err())
		}
		c.mu.Lock()
	}
}

// dial dials the connection and closes done when it is set (or failed).
// A dial that ends after Close closes what it opened.
func (c *FeedConn) dial(done chan struct{}) {
	o := c.tmpl.Opts
	o.Servers, o.Url, o.NoRandomize = dialOrder(o.Url, o.Servers, c.tmpl.ConnectedUrl()), "", true
	o.Name = strings.TrimSpace(o.Name + " change-feed")
	o.AllowReconnect, o.RetryOnFailedConnect = false, false
	// The process's handlers log its own connection's life; this one's
	// end fails the rounds in flight (logged by their feeds).
	ch := make(chan struct{})
	o.ClosedCB, o.NoCallbacksAfterClientClose = func(*nats.Conn) { close(ch) }, false
	o.DisconnectedCB, o.DisconnectedErrCB, o.ReconnectedCB, o.ConnectedCB = nil, nil, nil, nil
	o.DiscoveredServersCB, o.LameDuckModeHandler, o.ReconnectErrCB, o.AsyncErrorCB = nil, nil, nil, nil
	nc, err := o.Connect()
	c.mu.Lock()
	defer c.mu.Unlock()
	defer close(done)
	c.dialing = nil
	switch {
	case err != nil:
		c.failErr, c.failedAt = fmt.Errorf("change feed: connect to NATS: %w", err), time.Now()
	case c.done:
		nc.Close()
	default:
		c.nc, c.closed, c.failErr = nc, ch, nil
	}
}

// feedDialRetry: how long a failed dial of the feed's connection stands.
const feedDialRetry = time.Second

// dialOrder lists the servers the feed's connection tries, in order: the
// one the process's connection is connected to (as the process was given
// it, credentials included, when it was given), then the others it was
// given. Servers it only discovered are left out but for the current one:
// their URLs carry no credentials.
func dialOrder(optsURL string, optsServers []string, cur string) []string {
	given := optsServers
	if optsURL != "" {
		given = append([]string{optsURL}, given...)
	}
	var first, rest []string
	for _, u := range given {
		switch {
		case slices.Contains(first, u) || slices.Contains(rest, u):
		case cur != "" && hostOf(u) == hostOf(cur):
			first = append(first, u)
		default:
			rest = append(rest, u)
		}
	}
	if len(first) == 0 && cur != "" {
		first = []string{cur}
	}
	return append(first, rest...)
}

// hostOf is a server URL's host:port ("" if it does not parse).
func hostOf(u string) string {
	if !strings.Contains(u, "://") {
		u = "nats://" + u
	}
	p, err := url.Parse(u)
	if err != nil {
		return ""
	}
	return p.Host
}

// drop closes nc if it is still the feed's connection (a publish on it
// went unanswered); the next round dials again.
func (c *FeedConn) drop(nc *nats.Conn) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if nc != nil && c.nc == nc {
		nc.Close()
	}
}

// Close closes the connection for good (its process is stopping).
func (c *FeedConn) Close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.done {
		close(c.stop)
	}
	c.done = true
	if c.nc != nil {
		c.nc.Close()
	}
}
