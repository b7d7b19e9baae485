package testnats

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// ProcCluster is n nats-server processes (the binary built from the
// nats-server module this project depends on), clustered on loopback:
// what the replication tests SIGKILL.
type ProcCluster struct {
	t     testing.TB
	bin   string
	Procs []*ServerProc
}

// ServerProc is one nats-server process.
type ServerProc struct {
	Name, ClientAddr, StoreDir, LogPath string
	args                                []string
	mu                                  sync.Mutex
	cmd                                 *exec.Cmd
	done                                chan struct{}
}

// BuildServer builds the nats-server binary into dir.
func BuildServer(t testing.TB, dir string) string {
	t.Helper()
	goBin := "go"
	if _, err := exec.LookPath(goBin); err != nil {
		goBin = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	bin := filepath.Join(dir, "nats-server")
	cmd := exec.Command(goBin, "build", "-o", bin, "github.com/nats-io/nats-server/v2")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build nats-server: %v\n%s", err, out)
	}
	return bin
}

// StartProcCluster starts n clustered nats-server processes with
// JetStream (sync_interval: always, as the chart configures it) and waits
// for a meta leader; they are killed when the test ends.
//
// A cluster that does not form within 30 s (a server that exited at once,
// as when another process took one of its ports between FreeAddr and the
// server's bind) is logged with the tail of each server's log, killed, and
// started again on fresh ports and stores, up to three times.
func StartProcCluster(t testing.TB, n int) *ProcCluster {
	t.Helper()
	bin := BuildServer(t, t.TempDir())
	const attempts = 3
	for attempt := 1; ; attempt++ {
		c := &ProcCluster{t: t, bin: bin}
		c.launch(n)
		err := c.waitFormed(30 * time.Second)
		if err == nil {
			t.Cleanup(func() {
				for _, p := range c.Procs {
					p.Kill()
				}
			})
			return c
		}
		for _, p := range c.Procs {
			p.Kill()
			t.Logf("nats-server %s (%s) log tail:\n%s", p.Name, p.ClientAddr, logTail(p.LogPath, 2048))
		}
		if attempt == attempts {
			t.Fatalf("a %d-server cluster did not form in %d attempts: %v", n, attempts, err)
		}
		t.Logf("a %d-server cluster did not form (%v): starting it again on fresh ports", n, err)
	}
}

// launch writes the servers' configurations (fresh ports and stores) and
// starts them.
func (c *ProcCluster) launch(n int) {
	t := c.t
	t.Helper()
	var routes []string
	routeAddrs := make([]string, n)
	for i := range routeAddrs {
		routeAddrs[i] = FreeAddr(t)
		routes = append(routes, "nats-route://"+routeAddrs[i])
	}
	for i := 0; i < n; i++ {
		p := &ServerProc{Name: fmt.Sprintf("n%d", i+1), ClientAddr: FreeAddr(t), StoreDir: t.TempDir()}
		p.LogPath = filepath.Join(p.StoreDir, "server.log")
		conf := filepath.Join(p.StoreDir, "server.conf")
		host, port, _ := net.SplitHostPort(p.ClientAddr)
		rhost, rport, _ := net.SplitHostPort(routeAddrs[i])
		body := fmt.Sprintf(`server_name: %s
host: %s
port: %s
jetstream { store_dir: %q, sync_interval: always }
cluster { name: telha-test, host: %s, port: %s, routes: [%s] }
`, p.Name, host, port, filepath.Join(p.StoreDir, "js"), rhost, rport, strings.Join(routes, ", "))
		if err := os.WriteFile(conf, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		p.args = []string{"-c", conf, "-l", p.LogPath}
		c.Procs = append(c.Procs, p)
		c.start(p)
	}
}

// waitFormed waits until JetStream answers through every server, and
// gives up early when one of them has exited.
func (c *ProcCluster) waitFormed(within time.Duration) error {
	deadline := time.Now().Add(within)
	for _, p := range c.Procs {
		for !jetStreamReady(p.ClientAddr) {
			p.mu.Lock()
			done := p.done
			p.mu.Unlock()
			select {
			case <-done:
				return fmt.Errorf("nats-server %s exited", p.Name)
			case <-time.After(50 * time.Millisecond):
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("no JetStream meta leader via %s within %s", p.Name, within)
			}
		}
	}
	return nil
}

// logTail returns the last max bytes of a file.
func logTail(path string, max int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	if len(b) > max {
		b = b[len(b)-max:]
	}
	return string(b)
}

func (c *ProcCluster) start(p *ServerProc) {
	c.t.Helper()
	cmd := exec.Command(c.bin, p.args...)
	DieWithParent(cmd)
	if err := cmd.Start(); err != nil {
		c.t.Fatalf("start nats-server %s: %v", p.Name, err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	p.mu.Lock()
	p.cmd, p.done = cmd, done
	p.mu.Unlock()
}

// Kill SIGKILLs the server and waits for it to exit.
func (p *ServerProc) Kill() {
	p.mu.Lock()
	cmd, done := p.cmd, p.done
	p.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Kill()
	<-done
}

// Restart starts a killed server again on its store.
func (c *ProcCluster) Restart(p *ServerProc) { c.start(p) }

// jetStreamReady reports whether JetStream answers through the server at
// addr (it has a meta leader).
func jetStreamReady(addr string) bool {
	nc, err := nats.Connect("nats://"+addr, nats.Timeout(time.Second))
	if err != nil {
		return false
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return false
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_, err = js.AccountInfo(ctx)
	return err == nil
}

// URLs is the comma-separated client URLs of every server.
func (c *ProcCluster) URLs() string {
	var us []string
	for _, p := range c.Procs {
		us = append(us, "nats://"+p.ClientAddr)
	}
	return strings.Join(us, ",")
}

// WaitJetStream waits until JetStream answers through every server.
func (c *ProcCluster) WaitJetStream(within time.Duration) {
	c.t.Helper()
	for _, p := range c.Procs {
		Eventually(c.t, within, "JetStream meta leader via "+p.Name, func() bool { return jetStreamReady(p.ClientAddr) })
	}
}

// Pause SIGSTOPs the server: its sockets stay open and nothing answers
// (a frozen VM, a process stuck in the kernel). Resume ends it.
func (p *ServerProc) Pause() { p.signal(syscall.SIGSTOP) }

// Resume SIGCONTs a paused server.
func (p *ServerProc) Resume() { p.signal(syscall.SIGCONT) }

func (p *ServerProc) signal(s os.Signal) {
	p.mu.Lock()
	cmd := p.cmd
	p.mu.Unlock()
	if cmd != nil {
		_ = cmd.Process.Signal(s)
	}
}
