package testnats

import (
	"net"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// Start runs a JetStream server on a free loopback port with its store in
// a temp dir, and shuts it down when the test ends. opts may adjust the
// server options (auth, TLS) before it starts.
func Start(t testing.TB, opts ...func(*server.Options)) *Server {
	t.Helper()
	o := &server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: t.TempDir(), NoLog: true, NoSigs: true}
	for _, f := range opts {
		f(o)
	}
	return start(t, o)
}

// Server is a running test server and the options it was started with.
type Server struct {
	*server.Server
	Opts *server.Options
}

func start(t testing.TB, o *server.Options) *Server {
	t.Helper()
	s, err := server.NewServer(o)
	if err != nil {
		t.Fatalf("nats server: %v", err)
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats server did not start")
	}
	t.Cleanup(func() {
		s.Shutdown()
		s.WaitForShutdown()
	})
	if o.Port <= 0 {
		o.Port = s.Addr().(*net.TCPAddr).Port
	}
	return &Server{Server: s, Opts: o}
}

// Stop shuts the server down and waits.
func (s *Server) Stop() {
	s.Shutdown()
	s.WaitForShutdown()
}

// Restart starts a new server on the same port and store as s (which must
// have been stopped) and returns it.
func (s *Server) Restart(t testing.TB) *Server {
	t.Helper()
	return start(t, s.Opts.Clone())
}

// Connect opens a client connection that is closed when the test ends.
func Connect(t testing.TB, url string, opts ...nats.Option) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		t.Fatalf("connect %s: %v", url, err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// FreeAddr returns a loopback address with a port that was free a moment ago.
func FreeAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// Eventually polls cond every few milliseconds until it holds or the
// deadline passes, then fails the test with msg. It is for conditions
// that have no signal to wait on (state in another process).
func Eventually(t testing.TB, within time.Duration, msg string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	delay := time.Millisecond
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %s: %s", within, msg)
		}
		time.Sleep(delay)
		delay = min(2*delay, 50*time.Millisecond)
	}
}
