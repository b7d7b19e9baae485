package main

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// TestSuperNodeCascadeInConstantMemory deletes a 1,000,000-edge hub in a
// child process (this command's hub phase, built without -race) under
// GOMEMLIMIT=32MiB and checks what it sampled: the Go heap never held more
// than 32 MB during the cascade (the build before the one-writer rework
// peaked at 79 MB for this hub: it collected every edge id before writing
// its journal, about 80 bytes an edge), and that RSS stayed under a hard
// bound: 384 MB of growth, Pebble's block cache (128 MB) and memtables (up
// to 3 x 32 MB) with room to spare, none of which grows with the hub (the
// bench's scaling table measures the growth itself: about 230 MB at 1M
// edges here). The cascade must also be whole: every edge tombstoned, on
// the journaled path.
func TestSuperNodeCascadeInConstantMemory(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and deletes a million-edge hub (about 30 s)")
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "bench")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	const edges = 1_000_000
	cmd := exec.Command(bin, "--hub-child", "hub", "--hub-edges", "1000000", "--dir", filepath.Join(dir, "store"))
	cmd.Env = append(os.Environ(), "GOMEMLIMIT=32MiB")
	var out, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("hub child: %v\n%s", err, stderr.String())
	}
	var res childResult
	if err := json.Unmarshal(out.Bytes(), &res); err != nil {
		t.Fatalf("child output %q: %v", out.String(), err)
	}
	t.Logf("%d edges in %.2fs: peak Go heap %.1f MB, peak RSS growth %.0f MB, %.0f MB allocated in all, %d GC cycles",
		res.Tombstoned, res.Seconds, res.PeakGoHeapMB, res.GrowthMB, res.HeapAllocMB, res.GCCycles)
	if !res.Journaled || res.Tombstoned != edges {
		t.Fatalf("cascade: journaled %v, %d edges tombstoned; want journaled, %d", res.Journaled, res.Tombstoned, edges)
	}
	if res.PeakGoHeapMB > 32 {
		t.Errorf("peak Go heap %.1f MB under GOMEMLIMIT=32MiB: the cascade's memory grows with its hub", res.PeakGoHeapMB)
	}
	if res.GrowthMB > 384 {
		t.Errorf("peak RSS growth %.0f MB, over the hard bound of 384 MB", res.GrowthMB)
	}
}
