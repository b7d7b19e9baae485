package testnats

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Cluster is n JetStream servers in one process, routed to each other on
// loopback, each with its own name and store dir: enough for R3 streams,
// Raft leader elections and the loss of one server.
type Cluster struct {
	Servers []*Server
}

// StartCluster starts n (>= 1) clustered JetStream servers, waits until
// JetStream has a meta leader (streams can be created), and shuts them all
// down when the test ends. opts adjust each server's options before start.
//
// The cluster ports are picked free before any server starts (routes must
// name them); a port taken in between makes the start fail loudly, not
// flakily hang.
func StartCluster(t testing.TB, n int, opts ...func(*server.Options)) *Cluster {
	t.Helper()
	if n < 1 {
		t.Fatalf("StartCluster: n = %d", n)
	}
	routePorts := make([]int, n)
	for i := range routePorts {
		_, p, err := net.SplitHostPort(FreeAddr(t))
		if err != nil {
			t.Fatal(err)
		}
		routePorts[i], _ = strconv.Atoi(p)
	}
	var routes []*url.URL
	for _, p := range routePorts {
		routes = append(routes, &url.URL{Scheme: "nats-route", Host: net.JoinHostPort("127.0.0.1", strconv.Itoa(p))})
	}
	c := &Cluster{}
	for i := 0; i < n; i++ {
		o := &server.Options{
			ServerName: fmt.Sprintf("n%d", i+1),
			Host:       "127.0.0.1",
			Port:       -1,
			JetStream:  true,
			StoreDir:   t.TempDir(),
			NoLog:      true,
			NoSigs:     true,
			Cluster: server.ClusterOpts{
				Name: "telha-test",
				Host: "127.0.0.1",
				Port: routePorts[i],
			},
			Routes: routes,
		}
		for _, f := range opts {
			f(o)
		}
		c.Servers = append(c.Servers, start(t, o))
	}
	c.WaitJetStream(t, 30*time.Second)
	return c
}

// URLs is the comma-separated client URLs of the servers, for
// nats.Connect: a client fails over to another server when its own stops.
func (c *Cluster) URLs() string {
	var us []string
	for _, s := range c.Servers {
		us = append(us, s.ClientURL())
	}
	return strings.Join(us, ",")
}

// WaitJetStream waits until the running servers have elected a JetStream
// meta leader and a client can read account info through each of them.
func (c *Cluster) WaitJetStream(t testing.TB, within time.Duration) {
	t.Helper()
	for _, s := range c.Servers {
		if !s.Running() {
			continue
		}
		nc, err := nats.Connect(s.ClientURL())
		if err != nil {
			t.Fatalf("connect %s: %v", s.ClientURL(), err)
		}
		js, err := jetstream.New(nc)
		if err != nil {
			nc.Close()
			t.Fatal(err)
		}
		Eventually(t, within, "JetStream meta leader via "+s.Name(), func() bool {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			_, err := js.AccountInfo(ctx)
			return err == nil
		})
		nc.Close()
	}
}

// Index returns the index of the server named name (a stream's
// Cluster.Leader, say), or -1.
func (c *Cluster) Index(name string) int {
	for i, s := range c.Servers {
		if s.Name() == name {
			return i
		}
	}
	return -1
}
