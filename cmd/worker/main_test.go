package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/telha/telha-cascade/internal/testnats"
	"github.com/telha/telha-cascade/queue"
)

var binary string

// TestMain builds the real worker binary once; the tests run it as a user
// (or Kubernetes) would.
func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "telha-worker-bin")
	if err != nil {
		panic(err)
	}
	binary = filepath.Join(dir, "worker")
	out, err := exec.Command("go", "build", "-o", binary, ".").CombinedOutput()
	if err != nil {
		fmt.Fprintf(os.Stderr, "build worker: %v\n%s", err, out)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

func TestBadFlagsExit2WithUsage(t *testing.T) {
	cases := []struct {
		name string
		args []string
		env  []string
	}{
		{"unknown flag", []string{"--no-such-flag"}, nil},
		{"partitions zero", []string{"--partitions", "0"}, nil},
		{"partitions not a number", []string{"--partitions", "many"}, nil},
		{"owner out of range", []string{"--partition-owner", "3/2"}, nil},
		{"owner malformed", []string{"--partition-owner", "first"}, nil},
		{"more replicas than partitions", []string{"--partitions", "2", "--partition-owner", "0/3"}, nil},
		{"auto without ordinal", []string{"--partition-owner", "auto/3"}, []string{"HOSTNAME=x"}},
		{"log format", []string{"--log-format", "xml"}, nil},
		{"reaper schedule", []string{"--reaper-schedule", "whenever"}, nil},
		{"max batch ops", []string{"--max-batch-ops", "-1"}, nil},
		{"env var", nil, []string{"TELHA_PARTITIONS=abc"}},
		{"env schedule", nil, []string{"TELHA_REAPER_SCHEDULE=nope"}},
		{"stray argument", []string{"serve"}, nil},
		{"tls half", []string{"--nats-url", "nats://x:1", "--nats-tls-cert", "c.pem"}, nil},
		{"dynamic without nats url", []string{"--partition-owner", "dynamic", "--changelog", "jetstream"}, nil},
		{"dynamic with the changelog off", []string{"--partition-owner", "dynamic", "--nats-url", "nats://x:1", "--changelog", "off"}, nil},
		{"dynamic zero slots", []string{"--partition-owner", "dynamic/0", "--nats-url", "nats://x:1", "--changelog", "jetstream"}, nil},
		{"dynamic slots malformed", []string{"--partition-owner", "dynamic4", "--nats-url", "nats://x:1", "--changelog", "jetstream"}, nil},
		{"dynamic more slots than partitions", []string{"--partitions", "2", "--partition-owner", "dynamic/3", "--nats-url", "nats://x:1", "--changelog", "jetstream"}, nil},
		{"dynamic bad member id", []string{"--partition-owner", "dynamic", "--nats-url", "nats://x:1", "--changelog", "jetstream", "--member-id", "a b"}, nil},
		{"dynamic with api addr", []string{"--partition-owner", "dynamic", "--nats-url", "nats://x:1", "--changelog", "jetstream", "--api-addr", ":9"}, nil},
		{"dynamic ttl too short", []string{"--partition-owner", "dynamic", "--nats-url", "nats://x:1", "--changelog", "jetstream", "--member-ttl", "10ms"}, nil},
		{"dynamic standbys", []string{"--partition-owner", "dynamic", "--nats-url", "nats://x:1", "--changelog", "jetstream", "--standbys", "9"}, nil},
		{"dynamic advertise url", []string{"--partition-owner", "dynamic", "--nats-url", "nats://x:1", "--changelog", "jetstream", "--advertise-url", "host:80"}, nil},
		// The dynamic mode's ranges hold in every mode, and an address no
		// listener can take is a bad value, not a failed start (exit 1).
		{"static standbys", []string{"--standbys", "9"}, nil},
		{"static negative standbys", []string{"--standbys", "-1"}, nil},
		{"static ttl zero", []string{"--member-ttl", "0s"}, nil},
		{"static ttl an hour", []string{"--member-ttl", "1h"}, nil},
		{"static forward wait", []string{"--forward-wait", "-1s"}, nil},
		{"http addr without a port", []string{"--http-addr", "nonsense"}, nil},
		{"http addr port out of range", []string{"--http-addr", ":70000"}, nil},
		{"api addr without a port", []string{"--api-addr", "nonsense"}, nil},
		// (a black-box probe found these accepted, or refused without usage)
		{"static bad member id", []string{"--member-id", "a b"}, nil},
		{"negative group wait", []string{"--group-wait", "-1s"}, nil},
		{"embedded nats on a public address", []string{"--nats-listen", "0.0.0.0:4222"}, nil},
		{"embedded nats without a port", []string{"--nats-listen", "127.0.0.1"}, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cmd := exec.Command(binary, c.args...)
			cmd.Dir = t.TempDir()
			cmd.Env = append(os.Environ(), c.env...)
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			err := cmd.Run()
			code := cmd.ProcessState.ExitCode()
			if code != 2 {
				t.Fatalf("exit %d (%v), want 2; stderr:\n%s", code, err, stderr.String())
			}
			if !strings.Contains(stderr.String(), "-data-dir") {
				t.Fatalf("no usage on stderr:\n%s", stderr.String())
			}
		})
	}
}

func TestHelpExits0(t *testing.T) {
	out, err := exec.Command(binary, "-h").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "-max-batch-ops") {
		t.Fatalf("-h: %v\n%s", err, out)
	}
}

// proc is a running worker process.
type proc struct {
	cmd  *exec.Cmd
	out  *syncBuffer
	http string
	done chan error
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func startProc(t *testing.T, dir string, args ...string) *proc {
	t.Helper()
	httpAddr := testnats.FreeAddr(t)
	cmd := exec.Command(binary, append([]string{"--http-addr", httpAddr, "--log-format", "json"}, args...)...)
	cmd.Dir = dir
	p := &proc{cmd: cmd, out: &syncBuffer{}, http: "http://" + httpAddr, done: make(chan error, 1)}
	cmd.Stdout, cmd.Stderr = p.out, p.out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.done <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-p.done
		if t.Failed() {
			t.Logf("worker output:\n%s", p.out.String())
		}
	})
	testnats.Eventually(t, 30*time.Second, "worker ready", func() bool {
		select {
		case err := <-p.done:
			p.done <- err
			t.Fatalf("worker exited before ready: %v\n%s", err, p.out.String())
		default:
		}
		resp, err := http.Get(p.http + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	})
	return p
}

// term sends SIGTERM and returns the exit code.
func (p *proc) term(t *testing.T) int {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.done:
		p.done <- nil
		return p.cmd.ProcessState.ExitCode()
	case <-time.After(60 * time.Second):
		t.Fatalf("no exit within 60s of SIGTERM\n%s", p.out.String())
		return -1
	}
}

func TestEmbeddedDefaultRunsAndStopsCleanly(t *testing.T) {
	dir := t.TempDir()
	natsAddr := testnats.FreeAddr(t)
	p := startProc(t, dir, "--nats-listen", natsAddr)
	nc := testnats.Connect(t, "nats://"+natsAddr)
	c, err := queue.NewClient(nc, queue.Config{})
	if err != nil {
		t.Fatal(err)
	}
	since := time.Now().Add(-time.Second)
	id, n := uuid.NewString(), uuid.NewString()
	body := fmt.Sprintf(`{"request_id":%q,"op":"put_node","tenant":"emb","id":%q}`, id, n)
	if _, err := c.Publish(context.Background(), "emb", id, []byte(body)); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	got, err := c.Wait(ctx, []string{"emb"}, since, map[string]bool{id: true})
	if err != nil || got[id].Status != queue.StatusOK {
		t.Fatalf("result %+v, %v", got, err)
	}
	nc.Close()
	if code := p.term(t); code != 0 {
		t.Fatalf("SIGTERM exit %d\n%s", code, p.out.String())
	}
	for _, sub := range []string{"data/pebble", "data/nats"} {
		if st, err := os.Stat(filepath.Join(dir, sub)); err != nil || !st.IsDir() {
			t.Errorf("%s missing under the working directory", sub)
		}
	}
	if !strings.Contains(p.out.String(), "worker stopped cleanly") {
		t.Errorf("no clean-stop log line:\n%s", p.out.String())
	}
}

// TestSIGTERMDrainsUnderLoad: SIGTERM in the middle of a burst. The worker
// stops fetching, finishes and acks what it holds, and exits 0; nothing is
// lost (every request gets its result, now or after a restart) and nothing
// is applied twice.
func TestSIGTERMDrainsUnderLoad(t *testing.T) {
	ns := testnats.Start(t)
	dir := t.TempDir()
	p := startProc(t, dir, "--nats-url", ns.ClientURL())
	nc := testnats.Connect(t, ns.ClientURL())
	c, err := queue.NewClient(nc, queue.Config{})
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu      sync.Mutex
		results = map[string]int{}
		first   = make(chan struct{})
		once    sync.Once
	)
	sub, err := nc.Subscribe("telha.res.*", func(m *nats.Msg) {
		var r queue.Result
		_ = json.Unmarshal(m.Data, &r)
		mu.Lock()
		results[r.RequestID]++
		mu.Unlock()
		once.Do(func() { close(first) })
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	const total = 3000
	ids, nodes := make([]string, total), make([]string, total)
	for i := range ids {
		ids[i], nodes[i] = uuid.NewString(), uuid.NewString()
		body := fmt.Sprintf(`{"request_id":%q,"op":"put_node","tenant":"drain","id":%q}`, ids[i], nodes[i])
		if _, err := c.PublishAsync("drain", ids[i], []byte(body)); err != nil {
			t.Fatal(err)
		}
	}
	<-c.JetStream().PublishAsyncComplete()
	<-first
	if code := p.term(t); code != 0 {
		t.Fatalf("SIGTERM under load: exit %d\n%s", code, p.out.String())
	}
	mu.Lock()
	answered := len(results)
	mu.Unlock()
	t.Logf("%d of %d requests answered before the drain finished", answered, total)
	// Whatever was not answered is still in the stream for the next start.
	p2 := startProc(t, dir, "--nats-url", ns.ClientURL())
	testnats.Eventually(t, 60*time.Second, "every request answered after the restart", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(results) == total
	})
	// Exactly one effect each: one version per request (sampled).
	for i := 0; i < total; i += 60 {
		resp, err := http.Get(p2.http + "/v1/tenants/drain/nodes/" + nodes[i] + "/history")
		if err != nil {
			t.Fatal(err)
		}
		var h struct{ Versions []json.RawMessage }
		err = json.NewDecoder(resp.Body).Decode(&h)
		resp.Body.Close()
		if err != nil || len(h.Versions) != 1 {
			t.Fatalf("node of request %s has %d versions (%v), want exactly 1", ids[i], len(h.Versions), err)
		}
	}
	if code := p2.term(t); code != 0 {
		t.Fatalf("second SIGTERM: exit %d", code)
	}
	st, err := c.JetStream().Stream(context.Background(), "TELHA_RES")
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != total {
		t.Fatalf("results stream holds %d results for %d requests (want exactly one each)", info.State.Msgs, total)
	}
}
