package app

import "runtime"

// BackgroundProcs is how many Ps (GOMAXPROCS) the worker runs beyond the
// machine's CPUs: one for each of Pebble's background jobs that compute
// for long stretches without blocking (a flush and a compaction, Pebble's
// default concurrency).
//
// Why more Ps than CPUs: a small request crosses about eight goroutines
// between its message and its result (the NATS server's, the consumer's,
// the group's, the writer's, the publisher's). When every P runs a
// compaction, a flush or a super-node's applier, each woken goroutine
// waits for one of them to block or to be preempted, up to 10 ms each
// time. With a spare P it runs on a thread of its own and the kernel's
// scheduler, which preempts within a millisecond, shares the CPUs. On 2
// CPUs beside a 1M-edge cascade (docs/BENCHMARKS.md, "Small requests
// beside a super-node"): small requests' p99 84-94 ms with 2 Ps, 41-55
// with 3, 31-43 with 4, 25-30 with 8; the cascade itself 5-15 % faster;
// saturation throughput 19.2k req/s with 2, 18.0k with 4, 16.4k with 8.
const BackgroundProcs = 2

// SetProcs sets GOMAXPROCS for the worker process and says what it set and
// why: the machine's CPUs plus BackgroundProcs, unless GOMAXPROCS is set in
// the environment (the operator's choice stands) or the runtime's default
// is below the CPU count, which means a CPU limit (a container's cgroup
// quota): more threads than the quota would spend it early in each period
// and be throttled for the rest, a worse stall than the one spare Ps
// avoid. Call it once, at the start of main.
func SetProcs(getenv func(string) string) (procs int, why string) {
	cpus, def := runtime.NumCPU(), runtime.GOMAXPROCS(0)
	switch {
	case getenv("GOMAXPROCS") != "":
		return def, "GOMAXPROCS is set in the environment"
	case def < cpus:
		return def, "the runtime's default: a CPU limit below the machine's CPUs"
	}
	runtime.GOMAXPROCS(cpus + BackgroundProcs)
	return cpus + BackgroundProcs, "the machine's CPUs plus one each for Pebble's flush and compaction"
}
