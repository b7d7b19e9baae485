package app

import (
	"runtime"
	"testing"
)

func TestSetProcs(t *testing.T) {
	before := runtime.GOMAXPROCS(0)
	t.Cleanup(func() { runtime.GOMAXPROCS(before) })
	cpus := runtime.NumCPU()

	runtime.GOMAXPROCS(cpus)
	if n, why := SetProcs(func(k string) string {
		if k == "GOMAXPROCS" {
			return "1"
		}
		return ""
	}); n != cpus || runtime.GOMAXPROCS(0) != cpus {
		t.Fatalf("with GOMAXPROCS in the environment: %d Ps (%s), want the runtime's %d left alone", runtime.GOMAXPROCS(0), why, cpus)
	}

	n, why := SetProcs(func(string) string { return "" })
	if n != cpus+BackgroundProcs || runtime.GOMAXPROCS(0) != n {
		t.Fatalf("default: SetProcs says %d (%s), the runtime has %d, want %d", n, why, runtime.GOMAXPROCS(0), cpus+BackgroundProcs)
	}

	// A default below the CPU count is a CPU limit: left alone.
	runtime.GOMAXPROCS(max(1, cpus-1))
	if cpus > 1 {
		if n, _ := SetProcs(func(string) string { return "" }); n != cpus-1 || runtime.GOMAXPROCS(0) != cpus-1 {
			t.Fatalf("under a CPU limit (%d of %d CPUs): %d Ps, want %d", cpus-1, cpus, runtime.GOMAXPROCS(0), cpus-1)
		}
	}
}
