package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/telha/telha-cascade/app"
	"github.com/telha/telha-cascade/internal/sealed"
	"github.com/telha/telha-cascade/internal/testnats"
	"github.com/telha/telha-cascade/slot"
)

// startChangelogWorker runs a worker with --changelog jetstream on dir and
// returns it (ready) and a stop that waits for it.
func startChangelogWorker(t *testing.T, url, dir string) (*slot.Slot, func()) {
	t.Helper()
	cfg, err := app.ParseFlags([]string{"--data-dir", dir, "--http-addr", "127.0.0.1:0", "--nats-url", url, "--changelog", "jetstream",
		"--checkpoint-schedule", "@every 1h"}, func(string) string { return "" }, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	ready := make(chan *slot.Slot, 1)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- app.Run(ctx, cfg, slog.New(slog.NewTextHandler(io.Discard, nil)), app.Options{OnReady: func(a *slot.Slot) { ready <- a }})
	}()
	select {
	case a := <-ready:
		stopped := false
		stop := func() {
			if !stopped {
				stopped = true
				cancel()
				<-done
			}
		}
		t.Cleanup(stop)
		return a, stop
	case err := <-done:
		t.Fatalf("worker: %v", err)
	case <-time.After(60 * time.Second):
		t.Fatal("worker not ready")
	}
	return nil, nil
}

// TestCheckpointsBackupAndRestore runs docs/RUNBOOK.md's "Backups" path:
// list the checkpoints, copy the newest out of the cluster into a file
// (enqueue checkpoints --get), lose every NATS server and the worker's
// disk, extract the file with tar into an empty data directory, and start
// the worker on a new NATS: it seeds a new changelog from the restored
// store, and every node written before the checkpoint reads 200.
func TestCheckpointsBackupAndRestore(t *testing.T) {
	if _, err := exec.LookPath("tar"); err != nil {
		t.Skip("no tar on this machine")
	}
	ns := testnats.Start(t)
	url := ns.ClientURL()
	a, stop := startChangelogWorker(t, url, t.TempDir())
	var ids []string
	for i := 0; i < 5; i++ {
		id := uuid.NewString()
		if code, out, errOut := enqueue(t, "put-node", "--nats-url", url, "--tenant", "acme", "--id", id, "--wait"); code != 0 || !strings.Contains(out, `"status":"ok"`) {
			t.Fatalf("put-node: %d %q %q", code, out, errOut)
		}
		ids = append(ids, id)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// A table to seal: five puts sit in the memtable (the start opens its
	// store on the Pebble its catch-up left open, so no reopen flushes
	// them), and a checkpoint uploads tables only.
	if err := a.Store().DB().Flush(); err != nil {
		t.Fatal(err)
	}
	cp, err := a.Checkpoint(ctx)
	if err != nil {
		t.Fatal(err)
	}
	stop()
	// The copy must open sealed tables (issue 29): the checkpoint has one.
	if n := sealedTables(t, url, "TELHA_CKPT_STATIC1"); n == 0 {
		t.Fatal("the checkpoint holds no sealed table: the copy's opening is untested")
	}

	if code, _, errOut := enqueue(t, "checkpoints", "--nats-url", url); code != 2 || !strings.Contains(errOut, "--slots") {
		t.Fatalf("checkpoints without --slots: %d %q, want 2", code, errOut)
	}
	code, out, errOut := enqueue(t, "checkpoints", "--nats-url", url, "--slots", "1")
	if code != 0 {
		t.Fatalf("checkpoints: %d %q", code, errOut)
	}
	var newest struct {
		Name string `json:"name"`
		Seq  uint64 `json:"seq"`
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &newest); err != nil || newest.Seq != cp.Seq || newest.Name != cp.Name {
		t.Fatalf("newest listed %q (%v), want %s at %d", lines[len(lines)-1], err, cp.Name, cp.Seq)
	}
	file := filepath.Join(t.TempDir(), "backup.tar")
	if code, out, errOut := enqueue(t, "checkpoints", "--nats-url", url, "--slots", "1", "--get", newest.Name, "--out", file); code != 0 {
		t.Fatalf("checkpoints --get: %d %q %q", code, out, errOut)
	}

	// Disaster: every NATS server and the disk are gone.
	ns.Shutdown()
	ns2 := testnats.Start(t)
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "pebble"), 0o755); err != nil {
		t.Fatal(err)
	}
	if b, err := exec.Command("tar", "-xf", file, "-C", filepath.Join(dir, "pebble")).CombinedOutput(); err != nil {
		t.Fatalf("tar -xf: %v\n%s", err, b)
	}
	a2, _ := startChangelogWorker(t, ns2.ClientURL(), dir)
	if st := a2.ChangelogStatus(); !st.Seeded {
		t.Fatalf("the restored store did not seed the new changelog: %+v", st)
	}
	for _, id := range ids {
		resp, err := http.Get(fmt.Sprintf("http://%s/v1/tenants/acme/nodes/%s", a2.HTTPAddr(), id))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("node %s after the restore: %d", id, resp.StatusCode)
		}
	}
}

// sealedTables counts the live sealed table objects of bucket.
func sealedTables(t *testing.T, url, bucket string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	js, err := jetstream.New(testnats.Connect(t, url))
	if err != nil {
		t.Fatal(err)
	}
	obs, err := js.ObjectStore(ctx, bucket)
	if err != nil {
		t.Fatal(err)
	}
	infos, err := obs.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, in := range infos {
		if !in.Deleted && strings.Contains(in.Name, "/sst/") && in.Metadata[sealed.Meta] != "" {
			n++
		}
	}
	return n
}

// TestCheckpointsGetRefusesATail: a tail checkpoint (an erase's scrub
// stores one) is listed with its base, and --get refuses it with a
// message naming the base, writing no file.
func TestCheckpointsGetRefusesATail(t *testing.T) {
	ns := testnats.Start(t)
	url := ns.ClientURL()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	js, err := jetstream.New(testnats.Connect(t, url))
	if err != nil {
		t.Fatal(err)
	}
	obs, err := js.CreateObjectStore(ctx, jetstream.ObjectStoreConfig{Bucket: "TELHA_CKPT_STATIC1"})
	if err != nil {
		t.Fatal(err)
	}
	base, name := "partition-0/seq-00000000000000000007.tar", "partition-0/seq-00000000000000000009.tar"
	if _, err := obs.Put(ctx, jetstream.ObjectMeta{Name: name, Metadata: map[string]string{
		"telha-partition": "0", "telha-seq": "9", metaFormat: formatTail, metaBase: base}}, strings.NewReader("telha-tail/1\n")); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := enqueue(t, "checkpoints", "--nats-url", url, "--slots", "1")
	if code != 0 || !strings.Contains(out, `"base":"`+base+`"`) {
		t.Fatalf("checkpoints: %d %q %q, want the tail listed with its base", code, out, errOut)
	}
	file := filepath.Join(t.TempDir(), "tail.tar")
	code, out, errOut = enqueue(t, "checkpoints", "--nats-url", url, "--slots", "1", "--get", name, "--out", file)
	if code == 0 || !strings.Contains(errOut, "tail checkpoint") || !strings.Contains(errOut, base) {
		t.Fatalf("checkpoints --get of a tail: %d %q %q, want a refusal naming its base", code, out, errOut)
	}
	if _, err := os.Stat(file); !os.IsNotExist(err) {
		t.Fatalf("--get of a tail left %s: %v", file, err)
	}
}
