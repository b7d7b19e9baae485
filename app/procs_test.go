package app

import (
	"runtime"
	"testing"
)

func TestSetProcs(t *testing.T) {
	before := runtime.GOMAXPROCS(0)
	t.Cleanup(func() {
		runtime.GOMAXPROCS(before)
		procs.mu.Lock()
		procs.base, procs.boosted, procs.boosts = 0, 0, 0
		procs.mu.Unlock()
	})
	cpus := runtime.NumCPU()
	runtime.GOMAXPROCS(cpus)

	// GOMAXPROCS in the environment: no boost.
	if base, boosted, why := SetProcs(func(k string) string {
		if k == "GOMAXPROCS" {
			return "1"
		}
		return ""
	}); base != cpus || boosted != cpus {
		t.Fatalf("with GOMAXPROCS in the environment: %d and %d while cascading (%s), want %d left alone", base, boosted, why, cpus)
	}
	boostProcs(true)
	if n := runtime.GOMAXPROCS(0); n != cpus {
		t.Fatalf("boosted to %d Ps with GOMAXPROCS set", n)
	}
	boostProcs(false)

	// The default: the CPUs, and two more while any cascade is applied.
	base, boosted, why := SetProcs(func(string) string { return "" })
	if base != cpus || boosted != cpus+BackgroundProcs {
		t.Fatalf("default: %d and %d while cascading (%s), want %d and %d", base, boosted, why, cpus, cpus+BackgroundProcs)
	}
	if n := runtime.GOMAXPROCS(0); n != cpus {
		t.Fatalf("%d Ps before any cascade, want %d", n, cpus)
	}
	boostProcs(true)
	boostProcs(true)
	if n := runtime.GOMAXPROCS(0); n != cpus+BackgroundProcs {
		t.Fatalf("%d Ps while two cascades run, want %d", n, cpus+BackgroundProcs)
	}
	boostProcs(false)
	if n := runtime.GOMAXPROCS(0); n != cpus+BackgroundProcs {
		t.Fatalf("%d Ps while one cascade still runs, want %d", n, cpus+BackgroundProcs)
	}
	boostProcs(false)
	if n := runtime.GOMAXPROCS(0); n != cpus {
		t.Fatalf("%d Ps after the last cascade, want %d", n, cpus)
	}

	// A default below the CPU count is a CPU limit: no boost.
	if cpus > 1 {
		procs.mu.Lock()
		procs.base = 0
		procs.mu.Unlock()
		runtime.GOMAXPROCS(cpus - 1)
		if base, boosted, _ := SetProcs(func(string) string { return "" }); base != cpus-1 || boosted != cpus-1 {
			t.Fatalf("under a CPU limit (%d of %d CPUs): %d and %d while cascading, want %d", cpus-1, cpus, base, boosted, cpus-1)
		}
	}
}
