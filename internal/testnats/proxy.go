package testnats

import (
	"net"
	"sync"
	"testing"
)

// Proxy is a TCP proxy to a NATS server that a test can cut: while cut,
// every connection through it is closed and new ones are closed as soon
// as they are accepted (a process cut off from NATS, itself still up).
type Proxy struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	cut    bool
	conns  map[net.Conn]bool
	// thaw: closed when the proxy forwards; while frozen, a new channel
	// that SetFrozen(false) closes.
	thaw chan struct{}
}

// StartProxy listens on a free loopback port and forwards to target
// (host:port) until the test ends.
func StartProxy(t testing.TB, target string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &Proxy{ln: ln, target: target, conns: map[net.Conn]bool{}, thaw: make(chan struct{})}
	close(p.thaw)
	go p.serve()
	t.Cleanup(func() { ln.Close(); p.SetCut(true); p.SetFrozen(false) })
	return p
}

// Conns is how many client connections the proxy carries now.
func (p *Proxy) Conns() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.conns) / 2
}

// URL is the proxy's NATS URL.
func (p *Proxy) URL() string { return "nats://" + p.ln.Addr().String() }

// Cut cuts the proxy (SetCut(true)).
func (p *Proxy) Cut() { p.SetCut(true) }

// SetCut cuts the proxy (every connection closed, new ones refused) or
// mends it.
func (p *Proxy) SetCut(cut bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = cut
	if cut {
		for c := range p.conns {
			c.Close()
		}
		p.conns = map[net.Conn]bool{}
	}
}

// SetFrozen freezes the proxy (the connections stay open, nothing goes
// through them either way: a server paused by SIGSTOP) or thaws it.
func (p *Proxy) SetFrozen(frozen bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.thaw: // forwarding
		if frozen {
			p.thaw = make(chan struct{})
		}
	default:
		if !frozen {
			close(p.thaw)
		}
	}
}

// gate returns once the proxy is not frozen.
func (p *Proxy) gate() {
	p.mu.Lock()
	thaw := p.thaw
	p.mu.Unlock()
	<-thaw
}

// copy forwards src to dst, chunk by chunk, each through the gate.
func (p *Proxy) copy(dst, src net.Conn) {
	defer func() {
		dst.Close()
		src.Close()
		p.mu.Lock()
		delete(p.conns, dst)
		delete(p.conns, src)
		p.mu.Unlock()
	}()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.gate()
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func (p *Proxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		if p.cut {
			p.mu.Unlock()
			c.Close()
			continue
		}
		up, err := net.Dial("tcp", p.target)
		if err != nil {
			p.mu.Unlock()
			c.Close()
			continue
		}
		p.conns[c], p.conns[up] = true, true
		p.mu.Unlock()
		go p.copy(up, c)
		go p.copy(c, up)
	}
}
