package app

import (
	"runtime"
	"sync"
)

// BackgroundProcs is how many Go processors (GOMAXPROCS) the worker adds
// to the machine's CPUs while a journaled cascade is applied: one for each
// of the jobs that then compute for long stretches without blocking (the
// cascade's applier, Pebble's flush and its compaction share them with
// the request path).
//
// Why more Ps than CPUs then: a small request crosses about eight
// goroutines between its message and its result (the NATS server's, the
// consumer's, the group's, the writer's, the publisher's). When every P
// runs a compaction, a flush or a super-node's applier, each woken
// goroutine waits for one of them to block or to be preempted, up to 10 ms
// each time. With a spare P it runs on a thread of its own and the
// kernel's scheduler, which preempts within a millisecond, shares the
// CPUs. Why only then: idle spare Ps spin looking for work, which costs a
// saturated worker about a tenth of its CPU (docs/BENCHMARKS.md,
// "Scheduling and prefix reads"; DECISIONS 71).
const BackgroundProcs = 2

// procs is the process's boost: while boosts > 0 the runtime has boosted
// Ps, otherwise base. base is 0 until SetProcs allows boosting.
var procs struct {
	mu            sync.Mutex
	base, boosted int
	boosts        int
}

// SetProcs decides whether the process may run spare Ps while a cascade is
// applied (boostProcs), and says what it decided and why: it may unless
// GOMAXPROCS is set in the environment (the operator's choice stands) or
// the runtime's default is below the CPU count, which means a CPU limit (a
// container's cgroup quota): more threads than the quota would spend it
// early in each 100 ms period and be throttled for the rest, a worse stall
// than the one spare Ps avoid. Call it once, at the start of main; a
// process that never calls it (tests running workers in-process) keeps
// its Ps as they are.
func SetProcs(getenv func(string) string) (base, boosted int, why string) {
	cpus, def := runtime.NumCPU(), runtime.GOMAXPROCS(0)
	switch {
	case getenv("GOMAXPROCS") != "":
		return def, def, "GOMAXPROCS is set in the environment"
	case def < cpus:
		return def, def, "a CPU limit below the machine's CPUs: the runtime's default, no spare processors"
	}
	procs.mu.Lock()
	defer procs.mu.Unlock()
	procs.base, procs.boosted = def, cpus+BackgroundProcs
	return def, cpus + BackgroundProcs, "the CPUs, and two more while a journaled cascade is applied"
}

// boostProcs marks one more (on) or one fewer (off) cascade being applied
// in this process: the first raises GOMAXPROCS to the boosted count, the
// last one's end sets it back (both are no-ops unless SetProcs allowed
// boosting).
func boostProcs(on bool) {
	procs.mu.Lock()
	defer procs.mu.Unlock()
	if procs.base == 0 {
		return
	}
	if on {
		procs.boosts++
		if procs.boosts == 1 {
			runtime.GOMAXPROCS(procs.boosted)
		}
		return
	}
	procs.boosts--
	if procs.boosts == 0 {
		runtime.GOMAXPROCS(procs.base)
	}
}
