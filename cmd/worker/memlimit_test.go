package main

import (
	"encoding/json"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/telha/telha-cascade/app"
	"github.com/telha/telha-cascade/internal/testnats"
)

const mi = int64(1) << 20

// TestSoftMemLimit: the soft limit is 90 % of the container's limit minus
// Pebble's off-heap memory (cgo builds only: block cache + 2 memtables per
// store; one store per slot in dynamic mode, each with its floored share),
// never below the floor (64 MiB, or 90 % of a smaller container).
func TestSoftMemLimit(t *testing.T) {
	cases := []struct {
		name                  string
		container             int64
		cacheMB, memTableMB   int
		slots                 int
		cgo                   bool
		wantOffHeap, wantSoft int64
		wantWarn              bool
	}{
		{"static build: all of it on the Go heap", 2048 * mi, 128, 32, 0, false, 0, 2048 * mi * 9 / 10, false},
		{"static build, dynamic: still on the Go heap", 2048 * mi, 128, 32, 8, false, 0, 2048 * mi * 9 / 10, false},
		{"cgo, static ownership: cache + 2 memtables", 2048 * mi, 128, 32, 0, true, 192 * mi, (2048 - 192) * mi * 9 / 10, false},
		{"cgo, 8 slots: 8 x (16 + 2 x 4)", 2048 * mi, 128, 32, 8, true, 192 * mi, (2048 - 192) * mi * 9 / 10, false},
		{"cgo, 16 slots: shares floored at 8 and 4", 2048 * mi, 128, 32, 16, true, 256 * mi, (2048 - 256) * mi * 9 / 10, false},
		{"cgo, 4 slots, large cache", 4096 * mi, 1024, 64, 4, true, 1152 * mi, (4096 - 1152) * mi * 9 / 10, false},
		{"cgo, off-heap above the container: the floor", 256 * mi, 256, 32, 0, true, 320 * mi, 64 * mi, true},
		{"cgo, little left: the floor", 300 * mi, 200, 16, 0, true, 232 * mi, 64 * mi, true},
		{"tiny container: 90 % of it, not the floor", 32 * mi, 128, 32, 0, false, 0, 32 * mi * 9 / 10, false},
		{"tiny container with cgo: 90 % of it", 32 * mi, 128, 32, 0, true, 192 * mi, 32 * mi * 9 / 10, true},
		{"odd byte count rounds down", 1000000007, 128, 32, 0, false, 0, 900000006, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			off := pebbleOffHeap(c.cacheMB, c.memTableMB, c.slots, c.cgo)
			if off != c.wantOffHeap {
				t.Fatalf("off-heap %s, want %s", mib(off), mib(c.wantOffHeap))
			}
			p := softMemLimit(c.container, off)
			if p.Soft != c.wantSoft || p.Warn != c.wantWarn {
				t.Errorf("soft limit %s (%d, warn %v), want %s (%d, warn %v)", mib(p.Soft), p.Soft, p.Warn, mib(c.wantSoft), c.wantSoft, c.wantWarn)
			}
			if p.Soft <= 0 || p.Soft > c.container {
				t.Errorf("soft limit %d outside (0, %d]", p.Soft, c.container)
			}
		})
	}
	// A huge value does not overflow.
	if p := softMemLimit(1<<62, 0); p.Soft <= 0 || p.Soft >= 1<<62 {
		t.Errorf("soft limit of 2^62: %d", p.Soft)
	}
}

// TestPlanMemoryLimit: GOMEMLIMIT in the environment wins; without it
// TELHA_MEMORY_LIMIT (bytes, or a size with a unit) gives the soft limit;
// with neither there is none; a value that does not parse sets none and
// warns.
func TestPlanMemoryLimit(t *testing.T) {
	static := parse(t)
	dynamic := parse(t, "--partitions", "16", "--partition-owner", "dynamic/16", "--nats-url", "nats://127.0.0.1:1", "--changelog", "jetstream")
	cases := []struct {
		name     string
		cfg      app.Config
		env      map[string]string
		cgo      bool
		wantSet  bool
		wantSoft int64
		wantWarn bool
		why      string
	}{
		{"GOMEMLIMIT wins", static, map[string]string{"GOMEMLIMIT": "1500MiB", "TELHA_MEMORY_LIMIT": "2147483648"}, true, false, 0, false, "GOMEMLIMIT is set"},
		{"neither", static, nil, true, false, 0, false, "no soft memory limit"},
		{"bytes, cgo", static, map[string]string{"TELHA_MEMORY_LIMIT": "2147483648"}, true, true, (2048 - 192) * mi * 9 / 10, false, "minus Pebble's off-heap memory (192MiB"},
		{"bytes, no cgo", static, map[string]string{"TELHA_MEMORY_LIMIT": "2147483648"}, false, true, 2048 * mi * 9 / 10, false, "no cgo"},
		{"with a unit", static, map[string]string{"TELHA_MEMORY_LIMIT": "2Gi"}, false, true, 2048 * mi * 9 / 10, false, "90% of TELHA_MEMORY_LIMIT (2048MiB)"},
		{"dynamic, 16 slots, cgo", dynamic, map[string]string{"TELHA_MEMORY_LIMIT": "2GiB"}, true, true, (2048 - 256) * mi * 9 / 10, false, "256MiB"},
		{"too small for Pebble", static, map[string]string{"TELHA_MEMORY_LIMIT": "128Mi"}, true, true, 64 * mi, true, "raise the container's memory limit"},
		{"not a size", static, map[string]string{"TELHA_MEMORY_LIMIT": "2G"}, true, false, 0, true, `TELHA_MEMORY_LIMIT="2G"`},
		{"zero", static, map[string]string{"TELHA_MEMORY_LIMIT": "0"}, true, false, 0, true, "not a positive size"},
		{"negative", static, map[string]string{"TELHA_MEMORY_LIMIT": "-1"}, true, false, 0, true, "not a positive size"},
		{"overflow", static, map[string]string{"TELHA_MEMORY_LIMIT": "9000000000TiB"}, true, false, 0, true, "too large"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := planMemoryLimit(func(k string) string { return c.env[k] }, c.cfg, c.cgo)
			if p.Set != c.wantSet || p.Soft != c.wantSoft || p.Warn != c.wantWarn {
				t.Errorf("plan %+v, want set %v soft %d warn %v", p, c.wantSet, c.wantSoft, c.wantWarn)
			}
			if !strings.Contains(p.Why, c.why) {
				t.Errorf("why %q does not say %q", p.Why, c.why)
			}
		})
	}
}

func parse(t *testing.T, args ...string) app.Config {
	t.Helper()
	cfg, err := app.ParseFlags(args, func(string) string { return "" }, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// TestMemoryLimitEnvIsKnown: the chart's TELHA_MEMORY_LIMIT names no flag
// but is no typo: the worker does not warn about it.
func TestMemoryLimitEnvIsKnown(t *testing.T) {
	if got := app.UnknownEnv([]string{memoryLimitEnv + "=2147483648", "TELHA_MEMORY_LIMT=1"}); len(got) != 1 || got[0] != "TELHA_MEMORY_LIMT" {
		t.Fatalf("unknown TELHA_ variables: %v, want only the typo TELHA_MEMORY_LIMT", got)
	}
}

// TestWorkerLogsMemoryLimit: the real binary sets the soft limit from
// TELHA_MEMORY_LIMIT and logs it with the container's limit and Pebble's
// off-heap memory, without a warning about the variable; GOMEMLIMIT wins
// over it. The worker stops at once on a busy NATS port: the memory line
// comes before.
func TestWorkerLogsMemoryLimit(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	run := func(t *testing.T, env ...string) map[string]any {
		t.Helper()
		_, out := runExit(t, 20*time.Second, env, "--log-format", "json", "--http-addr", testnats.FreeAddr(t), "--nats-listen", ln.Addr().String())
		if strings.Contains(out, "names no flag") {
			t.Errorf("a warning about an environment variable:\n%s", out)
		}
		for _, line := range strings.Split(out, "\n") {
			var rec map[string]any
			if json.Unmarshal([]byte(line), &rec) == nil && rec["msg"] == "memory" {
				return rec
			}
		}
		t.Fatalf("no memory line:\n%s", out)
		return nil
	}
	t.Run("from TELHA_MEMORY_LIMIT", func(t *testing.T) {
		rec := run(t, "GOMEMLIMIT=", "TELHA_MEMORY_LIMIT=2147483648")
		cgo, _ := rec["cgo"].(bool)
		want := planMemoryLimit(envMap{memoryLimitEnv: "2147483648"}.get, parse(t), cgo)
		if got, _ := rec["soft_limit_bytes"].(float64); int64(got) != want.Soft || rec["container_limit_bytes"] != float64(2<<30) {
			t.Errorf("memory line %v, want soft_limit_bytes %d of container_limit_bytes %d", rec, want.Soft, 2<<30)
		}
		if rec["level"] != "INFO" {
			t.Errorf("level %v, want INFO", rec["level"])
		}
	})
	t.Run("GOMEMLIMIT wins", func(t *testing.T) {
		rec := run(t, "GOMEMLIMIT=1500MiB", "TELHA_MEMORY_LIMIT=2147483648")
		if got, _ := rec["soft_limit_bytes"].(float64); int64(got) != 1500*mi || !strings.Contains(rec["why"].(string), "GOMEMLIMIT is set") {
			t.Errorf("memory line %v, want GOMEMLIMIT's 1500MiB", rec)
		}
	})
	t.Run("neither", func(t *testing.T) {
		rec := run(t, "GOMEMLIMIT=")
		if rec["soft_limit"] != "none" {
			t.Errorf("memory line %v, want soft_limit none", rec)
		}
	})
}

type envMap map[string]string

func (m envMap) get(k string) string { return m[k] }
