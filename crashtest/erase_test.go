package crashtest

import (
	"context"
	"encoding/json"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/telha/telha-cascade/internal/diskscan"
	"github.com/telha/telha-cascade/internal/testnats"
	"github.com/telha/telha-cascade/queue"
)

// TestEraseSurvivesKill: the worker binary is SIGKILLed while an erase_node
// of a hub (journaled cascade, then the erase in chunks) is in flight; the
// restarted worker resumes it, publishes its result once, and afterwards
// no file under the Pebble directory holds the hub's data.
func TestEraseSurvivesKill(t *testing.T) {
	edges := 3000
	if testing.Short() {
		edges = 600
	}
	tmp := t.TempDir()
	bin := buildWorker(t, tmp)
	ns := testnats.Start(t)
	nc := testnats.Connect(t, ns.ClientURL())
	client, err := queue.NewClient(nc, queue.Config{})
	if err != nil {
		t.Fatal(err)
	}
	runner := &workerRunner{t: t, bin: bin, dataDir: t.TempDir(), logDir: t.TempDir(), addr: testnats.FreeAddr(t)}
	runner.args = []string{"--data-dir", runner.dataDir, "--http-addr", runner.addr, "--nats-url", ns.ClientURL(),
		"--max-batch-ops", "1000", "--journal-chunk-ops", "50", "--reaper-schedule", "@every 1s", "--log-format", "json"}
	t.Cleanup(runner.stopAll)
	defer func() {
		if t.Failed() {
			runner.dumpLogs(2, 40)
		}
	}()
	p := runner.start()
	if err := runner.waitReady(p, 60*time.Second); err != nil {
		t.Fatal(err)
	}

	const tenant = "gdpr"
	marker := diskscan.Marker("KILL")
	since := time.Now().Add(-time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	publish := func(body map[string]any) string {
		rid := uuid.NewString()
		body["request_id"], body["tenant"] = rid, tenant
		raw, _ := json.Marshal(body)
		if _, err := client.Publish(ctx, tenant, rid, raw); err != nil {
			t.Fatal(err)
		}
		return rid
	}
	props := map[string]any{"name": marker}
	hub, other := uuid.NewString(), uuid.NewString()
	ids := map[string]bool{}
	ids[publish(map[string]any{"op": "put_node", "id": hub, "props": props})] = true
	ids[publish(map[string]any{"op": "put_node", "id": other})] = true
	for i := 0; i < edges; i++ {
		ids[publish(map[string]any{"op": "put_edge", "id": uuid.NewString(), "src": hub, "dst": other, "label": "x", "props": props})] = true
	}
	got, err := client.Wait(ctx, []string{tenant}, since, ids)
	if err != nil {
		t.Fatalf("%d of %d puts answered: %v", len(got), len(ids), err)
	}
	for _, r := range got {
		if r.Status != queue.StatusOK {
			t.Fatalf("put: %+v", r)
		}
	}

	rid := publish(map[string]any{"op": "erase_node", "id": hub, "provenance": map[string]any{"reason": "GDPR art. 17"}})
	// Kill as soon as the erase is seen in flight.
	c := &http.Client{Timeout: time.Second}
	inFlight := false
	deadline := time.Now().Add(time.Minute)
	for !inFlight && time.Now().Before(deadline) {
		resp, err := c.Get(runner.base() + "/v1/tenants/" + tenant + "/erasures/" + rid)
		if err == nil {
			var e struct{ State string }
			_ = json.NewDecoder(resp.Body).Decode(&e)
			resp.Body.Close()
			if e.State == "done" {
				break
			}
			inFlight = e.State == "in_flight"
		}
	}
	if !inFlight {
		t.Fatal("the erase was never seen in flight: nothing was killed in its middle")
	}
	if !p.kill() {
		t.Fatal("the worker exited on its own")
	}
	p = runner.start()
	if err := runner.waitReady(p, 60*time.Second); err != nil {
		t.Fatal(err)
	}
	res, err := client.Wait(ctx, []string{tenant}, since, map[string]bool{rid: true})
	if err != nil {
		t.Fatalf("no result for the erase after the restart: %v", err)
	}
	r := res[rid]
	if r.Status != queue.StatusOK || r.VersionsErased == nil || *r.VersionsErased < uint64(edges+1) {
		t.Fatalf("erase result after the kill: %+v", r)
	}
	hits, err := diskscan.FilesContaining(filepath.Join(runner.dataDir, "pebble"), marker)
	if err != nil {
		t.Fatal(err)
	}
	if len(hits) > 0 {
		t.Fatalf("erased data still on disk after the kill and resume: %v", hits)
	}
	t.Logf("killed mid-erase; resumed: %d versions erased, no file holds the data", *r.VersionsErased)
}
