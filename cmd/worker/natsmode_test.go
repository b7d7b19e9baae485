package main

import (
	"bytes"
	"net"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/telha/telha-cascade/internal/testnats"
)

// runExit runs the worker binary to its exit (within deadline) and returns
// its exit code and output.
func runExit(t *testing.T, deadline time.Duration, env []string, args ...string) (int, string) {
	t.Helper()
	cmd := exec.Command(binary, args...)
	cmd.Dir = t.TempDir()
	cmd.Env = append(withoutTelha(os.Environ()), env...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(deadline):
		_ = cmd.Process.Kill()
		<-done
		t.Fatalf("no exit within %s; output:\n%s", deadline, out.String())
	}
	return cmd.ProcessState.ExitCode(), out.String()
}

// withoutTelha drops the TELHA_* variables of the test's own environment,
// so each case sets exactly the ones it means.
func withoutTelha(env []string) []string {
	var out []string
	for _, kv := range env {
		if !strings.HasPrefix(kv, "TELHA_") {
			out = append(out, kv)
		}
	}
	return out
}

// TestExternalURLAndNATSListenConflict (issue 23 item 3): TELHA_NATS_URL
// (which enqueue -h suggests exporting) together with --nats-listen used to
// make the worker a client of that URL, retrying "connection refused" for
// ever while the embedded server the user asked for never started. Both
// given is now a usage error (exit 2) that names both and says what to do.
func TestExternalURLAndNATSListenConflict(t *testing.T) {
	addr := testnats.FreeAddr(t)
	cases := []struct {
		name  string
		env   []string
		args  []string
		names []string
	}{
		{"env url, flag listen", []string{"TELHA_NATS_URL=nats://" + addr}, []string{"--nats-listen", addr}, []string{"TELHA_NATS_URL", "--nats-listen"}},
		{"flag url, env listen", []string{"TELHA_NATS_LISTEN=" + addr}, []string{"--nats-url", "nats://" + addr}, []string{"--nats-url", "TELHA_NATS_LISTEN"}},
		{"both flags", nil, []string{"--nats-url", "nats://u:secret@" + addr, "--nats-listen", addr}, []string{"--nats-url", "--nats-listen"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			code, out := runExit(t, 30*time.Second, c.env, append([]string{"--http-addr", testnats.FreeAddr(t)}, c.args...)...)
			if code != 2 {
				t.Fatalf("exit %d, want 2; output:\n%s", code, out)
			}
			for _, n := range c.names {
				if !strings.Contains(out, n+"=") {
					t.Errorf("the error does not name %s:\n%s", n, out)
				}
			}
			if !strings.Contains(out, "give one of them") {
				t.Errorf("the error does not say what to do:\n%s", out)
			}
			if strings.Contains(out, "secret") {
				t.Errorf("the error shows the URL's password:\n%s", out)
			}
		})
	}
}

// TestNATSModeIsLogged (issue 23 item 3): the startup log says which NATS
// the worker uses: the embedded server at its address, or the external
// URL and where that URL came from (a variable the user may have forgotten).
func TestNATSModeIsLogged(t *testing.T) {
	t.Run("embedded", func(t *testing.T) {
		addr := testnats.FreeAddr(t)
		p := startProc(t, t.TempDir(), "--nats-listen", addr)
		out := p.out.String()
		if !strings.Contains(out, "NATS: embedded JetStream server started") || !strings.Contains(out, `"listen":"`+addr+`"`) {
			t.Fatalf("no log line naming the embedded server at %s:\n%s", addr, out)
		}
	})
	t.Run("client from TELHA_NATS_URL", func(t *testing.T) {
		ns := testnats.Start(t)
		t.Setenv("TELHA_NATS_URL", ns.ClientURL())
		p := startProc(t, t.TempDir())
		out := p.out.String()
		if !strings.Contains(out, "NATS: client of an external server") || !strings.Contains(out, `"from":"TELHA_NATS_URL"`) ||
			!strings.Contains(out, ns.ClientURL()) {
			t.Fatalf("no log line naming the external URL and TELHA_NATS_URL:\n%s", out)
		}
	})
}

// TestBusyNATSPortFailsFast (issue 23 item 4): with --nats-listen on a port
// another process holds, the worker used to wait 30 s for its embedded
// server (ignoring SIGTERM meanwhile) before a vague error. It now exits 1
// at once with an error naming the address. The deadline is generous: the
// point is that it is not the old 30-second wait.
func TestBusyNATSPortFailsFast(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	addr := ln.Addr().String()
	code, out := runExit(t, 20*time.Second, nil, "--http-addr", testnats.FreeAddr(t), "--nats-listen", addr)
	if code != 1 {
		t.Fatalf("exit %d, want 1; output:\n%s", code, out)
	}
	if !strings.Contains(out, "--nats-listen "+addr) || !strings.Contains(out, "address already in use") {
		t.Fatalf("the error does not name the busy address %s:\n%s", addr, out)
	}
}

// TestEmbeddedNATSStartErrorIsReported (issue 23 item 4): an embedded
// server that cannot start (here its JetStream store dir is a file) reports
// its failure only in its own log, which the worker used to discard: it
// waited 30 s and said "is the port in use?". The server's error now ends
// the startup at once, in words.
func TestEmbeddedNATSStartErrorIsReported(t *testing.T) {
	dir := t.TempDir()
	if err := os.MkdirAll(dir+"/data", 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dir+"/data/nats", []byte("not a directory"), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(binary, "--http-addr", testnats.FreeAddr(t), "--nats-listen", testnats.FreeAddr(t), "--data-dir", dir+"/data")
	cmd.Env = withoutTelha(os.Environ())
	var out syncBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		_ = cmd.Process.Signal(syscall.SIGKILL)
		<-done
		t.Fatalf("no exit within 20s; output:\n%s", out.String())
	}
	if code := cmd.ProcessState.ExitCode(); code != 1 || !strings.Contains(out.String(), "did not start") {
		t.Fatalf("exit %d; want 1 with the embedded server's error; output:\n%s", code, out.String())
	}
}
