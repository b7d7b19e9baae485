package main

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/telha/telha-cascade/app"
)

// The Go runtime's soft memory limit (issue 32 item 3).
//
// GOMEMLIMIT set to a container's whole memory limit leaves no room for
// what the Go runtime does not manage: with cgo, Pebble's block cache
// (--pebble-cache-mb) and memtables (--pebble-memtable-mb) come from C's
// malloc, so the heap could grow to the container's limit on top of them
// and the pod would meet the OOM killer before the collector worked
// harder. So the Helm chart (goMemLimit: auto) passes the container's limit
// in TELHA_MEMORY_LIMIT (bytes, from the downward API) instead of
// GOMEMLIMIT, and the worker sets its soft limit to
//
//	softLimitPercent % of (TELHA_MEMORY_LIMIT - Pebble's off-heap memory)
//
// never below softLimitFloor (nor above softLimitPercent % of the
// container's limit). Pebble's off-heap memory is, per open store, the
// block cache plus pebbleMemtables memtables (Pebble's default
// MemTableStopWritesThreshold: writes stop when the queued memtables reach
// twice the memtable size), with cgo; without cgo (the image's static
// build) it is Go memory and under the soft limit already, so 0. In
// dynamic mode a member holds at most one store per slot, each with its
// share of the flags' sizes (app's slotConfig: max(8, cache/slots) and
// max(4, memtable/slots) MiB), so the bound is slots times that. The rest
// (softLimitPercent's 10 %) is headroom for the runtime's own overhead,
// malloc's fragmentation and the goroutine stacks.
//
// GOMEMLIMIT in the environment wins (the runtime read it at start): the
// chart's goMemLimit with a size, or an extraEnv GOMEMLIMIT.
const (
	memoryLimitEnv   = "TELHA_MEMORY_LIMIT"
	softLimitPercent = 90
	softLimitFloor   = 64 << 20
	pebbleMemtables  = 2
)

// memPlan is what the worker does with the soft memory limit, and why.
type memPlan struct {
	// Set: call debug.SetMemoryLimit(Soft). False: leave the runtime's
	// limit (GOMEMLIMIT, or none) as it is.
	Set  bool
	Soft int64
	// Container is TELHA_MEMORY_LIMIT in bytes (0: not set or unreadable).
	Container int64
	// OffHeap is Pebble's memory outside the Go heap, in bytes.
	OffHeap int64
	// Warn: log at warning level (a value that does not parse, or a limit
	// raised to the floor).
	Warn bool
	Why  string
}

// planMemoryLimit decides the soft memory limit from the environment and
// the configuration. It has no effect of its own.
func planMemoryLimit(getenv func(string) string, cfg app.Config, cgo bool) memPlan {
	if v := getenv("GOMEMLIMIT"); v != "" {
		return memPlan{Why: "GOMEMLIMIT is set in the environment (" + v + "): the runtime's reading of it stands"}
	}
	raw := getenv(memoryLimitEnv)
	if raw == "" {
		return memPlan{Why: "neither GOMEMLIMIT nor " + memoryLimitEnv + " is set: no soft memory limit"}
	}
	container, err := parseBytes(raw)
	if err != nil {
		return memPlan{Warn: true, Why: fmt.Sprintf("%s=%q: %v; no soft memory limit", memoryLimitEnv, raw, err)}
	}
	slots := 0
	if cfg.Member.Dynamic {
		slots = cfg.Owner.Count
	}
	p := softMemLimit(container, pebbleOffHeap(cfg.CacheMB, cfg.MemTableMB, slots, cgo))
	p.Set = true
	switch {
	case p.Warn:
		p.Why = fmt.Sprintf("%s (%s) leaves too little beside Pebble's off-heap memory (%s: block cache and memtables, C memory in this cgo build): "+
			"the soft limit is raised to its floor; raise the container's memory limit or lower --pebble-cache-mb",
			memoryLimitEnv, mib(container), mib(p.OffHeap))
	case cgo:
		p.Why = fmt.Sprintf("%d%% of %s (%s) minus Pebble's off-heap memory (%s: block cache + %d memtables per store, C memory in this cgo build)",
			softLimitPercent, memoryLimitEnv, mib(container), mib(p.OffHeap), pebbleMemtables)
	default:
		p.Why = fmt.Sprintf("%d%% of %s (%s); no cgo: Pebble's block cache and memtables are Go memory, under the limit",
			softLimitPercent, memoryLimitEnv, mib(container))
	}
	return p
}

// pebbleOffHeap is the most memory Pebble holds outside the Go heap: 0
// without cgo; with it the block cache and pebbleMemtables memtables of
// each store, one store (slots == 0, static) or one per slot, each with
// its share (dynamic).
func pebbleOffHeap(cacheMB, memTableMB, slots int, cgo bool) int64 {
	if !cgo {
		return 0
	}
	stores, cache, mem := 1, cacheMB, memTableMB
	if slots > 0 {
		stores, cache, mem = slots, max(8, cacheMB/slots), max(4, memTableMB/slots)
	}
	return int64(stores) * (int64(cache) + pebbleMemtables*int64(mem)) << 20
}

// softMemLimit is softLimitPercent % of what container leaves beside
// offHeap, never below the floor (the smaller of softLimitFloor and
// softLimitPercent % of container); Warn when it took the floor.
func softMemLimit(container, offHeap int64) memPlan {
	p := memPlan{Container: container, OffHeap: offHeap}
	floor := min(int64(softLimitFloor), percent(container))
	p.Soft = percent(container - offHeap)
	if p.Soft < floor {
		p.Soft, p.Warn = floor, true
	}
	return p
}

// percent is softLimitPercent % of n (0 for n <= 0), without overflow.
func percent(n int64) int64 {
	if n <= 0 {
		return 0
	}
	return n/100*softLimitPercent + n%100*softLimitPercent/100
}

// parseBytes reads a memory size: bytes (what the downward API gives with
// divisor 1), or with a unit as GOMEMLIMIT takes it (B, KiB, MiB, GiB,
// TiB) or as Kubernetes writes it (Ki, Mi, Gi, Ti).
func parseBytes(s string) (int64, error) {
	num, mult := s, int64(1)
	for _, u := range []struct {
		suffix string
		mult   int64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1 << 40},
		{"Ki", 1 << 10}, {"Mi", 1 << 20}, {"Gi", 1 << 30}, {"Ti", 1 << 40}, {"B", 1}} {
		if n, ok := strings.CutSuffix(s, u.suffix); ok {
			num, mult = n, u.mult
			break
		}
	}
	v, err := strconv.ParseInt(num, 10, 64)
	if err != nil || num == "" || num[0] == '+' || v <= 0 {
		return 0, fmt.Errorf("not a positive size in bytes (an integer, or with a unit: 2147483648, 2GiB, 2Gi)")
	}
	if v > math.MaxInt64/mult {
		return 0, fmt.Errorf("too large")
	}
	return v * mult, nil
}

// mib formats a size in MiB for the log.
func mib(n int64) string {
	if n%(1<<20) == 0 {
		return strconv.FormatInt(n>>20, 10) + "MiB"
	}
	return strconv.FormatFloat(float64(n)/(1<<20), 'f', 1, 64) + "MiB"
}
