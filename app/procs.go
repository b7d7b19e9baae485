package app

import (
	"runtime"
	"runtime/debug"
	"sync"
	"time"

	"github.com/telha/telha-cascade/storage"
)

// While a journaled cascade is applied, the worker process runs
// differently in two ways (DECISIONS 71 and 72), both undone when the last
// cascade in the process ends.
//
// More Go processors. BackgroundProcs is how many Ps (GOMAXPROCS) it adds
// to the machine's CPUs: one for each of the jobs that then compute for
// long stretches without blocking (the cascade's applier, Pebble's flush
// and its compaction share them with the request path). A small request
// crosses about eight goroutines between its message and its result (the
// NATS server's, the consumer's, the group's, the writer's, the
// publisher's). When every P runs one of those jobs, each woken goroutine
// waits for one of them to block or to be preempted, up to 10 ms each
// time. With a spare P it runs on a thread of its own and the kernel's
// scheduler, which preempts within a millisecond, shares the CPUs. Only
// while cascading, because idle spare Ps spin looking for work, which
// costs a saturated worker about a tenth of its CPU.
//
// Pebble's churned memory handed back. The cascade churns Pebble's block
// cache: with cgo its blocks come from C's malloc and the freed ones stay
// in the process's pages, so the C heap is trimmed every TrimEvery
// (storage.TrimMalloc); without cgo (the container image) they are Go
// memory, and the garbage collector runs at CascadeGOGC (unless GOGC is
// set in the environment), since what it keeps live is mostly those
// fixed-size buffers and GOGC 100 lets the heap grow to twice that
// (a 1M-edge cascade's peak RSS growth: 349-351 MB at 100, 256 at 50, 221
// at 25, at the same speed; docs/BENCHMARKS.md, "Memory beside a
// super-node"; DECISIONS 72).
const (
	BackgroundProcs = 2
	TrimEvery       = 200 * time.Millisecond
	CascadeGOGC     = 25
)

// cascading is the process's state: n cascades are being applied; while n
// > 0 the runtime has boosted Ps and the trimmer runs. Nothing changes
// until SetProcs has said what may.
var cascading struct {
	mu            sync.Mutex
	set           bool // SetProcs was called
	base, boosted int  // GOMAXPROCS without and while cascading (equal: no boost)
	gogcSet       bool // GOGC is set in the environment: left alone
	n             int
	stopTrim      chan struct{}
	gogc          int // the GC percent before the first cascade, when lowered (else 0)
}

// SetProcs decides how the process runs while a cascade is applied
// (Applying) and says what it decided and why: with BackgroundProcs more
// Ps than CPUs unless GOMAXPROCS is set in the environment (the operator's
// choice stands) or the runtime's default is below the CPU count, which
// means a CPU limit (a container's cgroup quota): more threads than the
// quota would spend it early in each 100 ms period and be throttled for
// the rest, a worse stall than the one spare Ps avoid. Call it once, at
// the start of main; a process that never calls it (tests running
// workers in-process) keeps its runtime as it is.
func SetProcs(getenv func(string) string) (base, boosted int, why string) {
	cpus, def := runtime.NumCPU(), runtime.GOMAXPROCS(0)
	base, boosted = def, cpus+BackgroundProcs
	switch {
	case getenv("GOMAXPROCS") != "":
		boosted, why = def, "GOMAXPROCS is set in the environment"
	case def < cpus:
		boosted, why = def, "a CPU limit below the machine's CPUs: the runtime's default, no spare processors"
	default:
		why = "the CPUs, and two more while a journaled cascade is applied"
	}
	cascading.mu.Lock()
	defer cascading.mu.Unlock()
	cascading.set, cascading.base, cascading.boosted = true, base, boosted
	cascading.gogcSet = getenv("GOGC") != ""
	return base, boosted, why
}

// Applying marks one more (on) or one fewer (off) journaled cascade being
// applied in this process: the first one's start boosts the Ps and starts
// the trimmer, the last one's end undoes both. The worker calls it from the
// reaper's Hooks.Applying; cmd/bench's cascade child, which applies a
// journal without a reaper, around its cascade.
func Applying(on bool) {
	cascading.mu.Lock()
	defer cascading.mu.Unlock()
	if !cascading.set {
		return
	}
	if on {
		cascading.n++
		if cascading.n > 1 {
			return
		}
		if cascading.boosted != cascading.base {
			runtime.GOMAXPROCS(cascading.boosted)
		}
		switch {
		case storage.TrimMalloc():
			cascading.stopTrim = make(chan struct{})
			go trim(cascading.stopTrim)
		case !cascading.gogcSet:
			cascading.gogc = debug.SetGCPercent(CascadeGOGC)
		}
		return
	}
	cascading.n--
	if cascading.n > 0 {
		return
	}
	if cascading.boosted != cascading.base {
		// Back to the runtime's default, which also lets the runtime
		// follow a changed CPU limit again (a GOMAXPROCS call stops that).
		runtime.SetDefaultGOMAXPROCS()
	}
	if cascading.stopTrim != nil {
		close(cascading.stopTrim)
		cascading.stopTrim = nil
	}
	if cascading.gogc != 0 {
		debug.SetGCPercent(cascading.gogc)
		cascading.gogc = 0
	}
}

func trim(stop <-chan struct{}) {
	t := time.NewTicker(TrimEvery)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
			storage.TrimMalloc()
		}
	}
}
