package crashtest

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/telha/telha-cascade/internal/testnats"
)

// buildWorker builds cmd/worker (without -race) into dir and returns the
// binary's path.
func buildWorker(t *testing.T, dir string) string {
	t.Helper()
	goBin := "go"
	if _, err := exec.LookPath(goBin); err != nil {
		goBin = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	gomod, err := exec.Command(goBin, "env", "GOMOD").Output()
	if err != nil {
		t.Fatalf("go env GOMOD: %v", err)
	}
	root := filepath.Dir(strings.TrimSpace(string(gomod)))
	bin := filepath.Join(dir, "worker")
	cmd := exec.Command(goBin, "build", "-o", bin, "./cmd/worker")
	cmd.Dir = root
	cmd.Env = childEnv()
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/worker: %v\n%s", err, out)
	}
	return bin
}

// childEnv is the environment without TELHA_* variables (every worker flag
// reads one; the test passes what it means on the command line).
func childEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "TELHA_") {
			env = append(env, kv)
		}
	}
	return env
}

// workerRunner starts, kills and restarts the worker binary on one data dir.
type workerRunner struct {
	t       *testing.T
	bin     string
	dataDir string
	logDir  string
	addr    string // host:port of its HTTP server (the same every run)
	args    []string

	mu   sync.Mutex
	runs []*workerProc
}

// workerProc is one run of the binary.
type workerProc struct {
	n       int
	cmd     *exec.Cmd
	logPath string
	started time.Time
	done    chan struct{}
	err     error // from Wait, valid after done
	killed  atomic.Bool
}

func (w *workerRunner) base() string { return "http://" + w.addr }

// start starts run n and returns without waiting for readiness.
func (w *workerRunner) start() *workerProc {
	w.t.Helper()
	w.mu.Lock()
	n := len(w.runs)
	w.mu.Unlock()
	logPath := filepath.Join(w.logDir, fmt.Sprintf("worker-%03d.log", n))
	f, err := os.Create(logPath)
	if err != nil {
		w.t.Fatal(err)
	}
	cmd := exec.Command(w.bin, w.args...)
	testnats.DieWithParent(cmd)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.Env = childEnv()
	if err := cmd.Start(); err != nil {
		f.Close()
		w.t.Fatalf("start worker: %v", err)
	}
	p := &workerProc{n: n, cmd: cmd, logPath: logPath, started: time.Now(), done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		f.Close()
		close(p.done)
	}()
	w.mu.Lock()
	w.runs = append(w.runs, p)
	w.mu.Unlock()
	return p
}

func (p *workerProc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// waitReady polls /readyz until it answers 200. It reports an error if the
// process exits first or the deadline passes.
func (w *workerRunner) waitReady(p *workerProc, within time.Duration) error {
	c := &http.Client{Timeout: time.Second}
	deadline := time.Now().Add(within)
	for {
		if p.exited() {
			return fmt.Errorf("worker run %d exited before ready: %v", p.n, p.err)
		}
		resp, err := c.Get(w.base() + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("worker run %d not ready within %s", p.n, within)
		}
		time.Sleep(15 * time.Millisecond)
	}
}

// huntJournal polls /v1/journals until it lists a journal (true) or the
// time is up or the process exits (false).
func (w *workerRunner) huntJournal(p *workerProc, within time.Duration) bool {
	c := &http.Client{Timeout: 200 * time.Millisecond}
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) && !p.exited() {
		resp, err := c.Get(w.base() + "/v1/journals")
		if err != nil {
			time.Sleep(time.Millisecond)
			continue
		}
		var j struct {
			Journals []json.RawMessage `json:"journals"`
		}
		err = json.NewDecoder(resp.Body).Decode(&j)
		resp.Body.Close()
		if err == nil && len(j.Journals) > 0 {
			return true
		}
	}
	return false
}

// kill SIGKILLs the process (by its own pid) and waits for it to be gone.
// It reports false when the process had already exited on its own.
func (p *workerProc) kill() bool {
	if p.exited() {
		return false
	}
	p.killed.Store(true)
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
	return true
}

// term sends SIGTERM and waits up to within for the exit; it returns the
// exit code (-1 when it had to be killed).
func (p *workerProc) term(within time.Duration) int {
	if !p.exited() {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
	}
	select {
	case <-p.done:
	case <-time.After(within):
		p.kill()
		return -1
	}
	if p.cmd.ProcessState == nil {
		return -1
	}
	return p.cmd.ProcessState.ExitCode()
}

// stopAll kills whatever still runs (test cleanup).
func (w *workerRunner) stopAll() {
	w.mu.Lock()
	runs := append([]*workerProc(nil), w.runs...)
	w.mu.Unlock()
	for _, p := range runs {
		p.kill()
	}
}

// tail returns the last n lines of a run's log.
func (p *workerProc) tail(n int) string {
	b, err := os.ReadFile(p.logPath)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// logLines returns the lines of every run's log that contain one of the
// needles (at most max), prefixed with the run number.
func (w *workerRunner) logLines(max int, needles ...string) []string {
	w.mu.Lock()
	runs := append([]*workerProc(nil), w.runs...)
	w.mu.Unlock()
	var out []string
	for _, p := range runs {
		f, err := os.Open(p.logPath)
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			line := sc.Bytes()
			for _, nd := range needles {
				if bytes.Contains(line, []byte(nd)) {
					if len(out) < max {
						out = append(out, fmt.Sprintf("run %03d: %s", p.n, line))
					}
					break
				}
			}
		}
		f.Close()
	}
	return out
}

// dumpLogs writes the tails of the last runs' logs to the test log.
func (w *workerRunner) dumpLogs(lastRuns, lines int) {
	w.mu.Lock()
	runs := append([]*workerProc(nil), w.runs...)
	w.mu.Unlock()
	for i := max(0, len(runs)-lastRuns); i < len(runs); i++ {
		p := runs[i]
		state := "running"
		if p.exited() {
			state = fmt.Sprintf("exited (%v), killed by the test: %v", p.err, p.killed.Load())
		}
		w.t.Logf("---- tail of worker run %03d (%s, %s) ----\n%s", p.n, p.logPath, state, p.tail(lines))
	}
	if errs := w.logLines(30, `"level":"ERROR"`, "panic:", "fatal error:"); len(errs) > 0 {
		w.t.Logf("---- ERROR/panic lines of all runs (first %d) ----\n%s", len(errs), strings.Join(errs, "\n"))
	}
}
