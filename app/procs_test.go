package app

import (
	"runtime"
	"runtime/debug"
	"testing"

	"github.com/telha/telha-cascade/storage"
)

func TestSetProcs(t *testing.T) {
	before := runtime.GOMAXPROCS(0)
	gcBefore := debug.SetGCPercent(100)
	debug.SetGCPercent(gcBefore)
	t.Cleanup(func() {
		runtime.GOMAXPROCS(before)
		cascading.mu.Lock()
		cascading.set, cascading.base, cascading.boosted, cascading.n = false, 0, 0, 0
		cascading.mu.Unlock()
	})
	runtime.SetDefaultGOMAXPROCS()
	cpus, def := runtime.NumCPU(), runtime.GOMAXPROCS(0)
	noEnv := func(string) string { return "" }

	if def < cpus { // this machine has a CPU limit: nothing is added
		if base, boosted, why := SetProcs(noEnv); base != def || boosted != def {
			t.Fatalf("under a CPU limit (%d of %d CPUs): %d and %d while cascading (%s), want %d", def, cpus, base, boosted, why, def)
		}
		Applying(true)
		defer Applying(false)
		if n := runtime.GOMAXPROCS(0); n != def {
			t.Fatalf("%d Ps while cascading under a CPU limit, want %d", n, def)
		}
		return
	}

	// GOMAXPROCS in the environment: no boost.
	if base, boosted, why := SetProcs(func(k string) string {
		if k == "GOMAXPROCS" {
			return "1"
		}
		return ""
	}); base != def || boosted != def {
		t.Fatalf("with GOMAXPROCS in the environment: %d and %d while cascading (%s), want %d left alone", base, boosted, why, def)
	}
	Applying(true)
	if n := runtime.GOMAXPROCS(0); n != def {
		t.Fatalf("boosted to %d Ps with GOMAXPROCS set", n)
	}
	Applying(false)

	// The default: the CPUs, and two more while any cascade is applied.
	base, boosted, why := SetProcs(noEnv)
	if base != def || boosted != cpus+BackgroundProcs {
		t.Fatalf("default: %d and %d while cascading (%s), want %d and %d", base, boosted, why, def, cpus+BackgroundProcs)
	}
	Applying(true)
	Applying(true)
	if n := runtime.GOMAXPROCS(0); n != cpus+BackgroundProcs {
		t.Fatalf("%d Ps while two cascades run, want %d", n, cpus+BackgroundProcs)
	}
	if trims := storage.TrimMalloc(); trims != (cascading.stopTrim != nil) {
		t.Fatalf("the C heap can be trimmed: %v; the trimmer runs: %v", trims, cascading.stopTrim != nil)
	} else if !trims { // Pebble's memory is Go memory: the collector runs tighter
		if p := debug.SetGCPercent(CascadeGOGC); p != CascadeGOGC {
			t.Fatalf("GC percent %d while cascading without cgo, want %d", p, CascadeGOGC)
		}
	}
	Applying(false)
	if n := runtime.GOMAXPROCS(0); n != cpus+BackgroundProcs {
		t.Fatalf("%d Ps while one cascade still runs, want %d", n, cpus+BackgroundProcs)
	}
	Applying(false)
	if n := runtime.GOMAXPROCS(0); n != def || cascading.stopTrim != nil {
		t.Fatalf("%d Ps after the last cascade (want the runtime's default, %d), trimmer stopped: %v", n, def, cascading.stopTrim == nil)
	}
	if p := debug.SetGCPercent(gcBefore); p != gcBefore {
		t.Fatalf("GC percent %d after the last cascade, want %d as before", p, gcBefore)
	}
}
