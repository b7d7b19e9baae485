package storage

// TrimMalloc hands the C heap's free pages back to the operating system
// (glibc's malloc_trim) and reports whether it could: false without cgo
// (Pebble's memory is Go memory then) or on a C library without it.
//
// With cgo Pebble allocates its block cache with C's malloc, one block at
// a time. A super-node cascade churns the cache (its scan hits about
// 0.1 % of the time), and the freed blocks stay in malloc's arenas, in
// pages the process keeps: a 2M-edge cascade's peak RSS grew 256-275 MB,
// 191 MB of it the cache and memtables. Trimming every 200 ms while a
// cascade runs, 179-183 MB, at the same speed (docs/BENCHMARKS.md,
// "Memory beside a super-node"); package app does that.
func TrimMalloc() bool { return mallocTrim() }
