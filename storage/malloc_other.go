//go:build !(linux && cgo)

package storage

// Without cgo Pebble's block cache and memtables are Go memory (its
// manual allocator falls back to make): there is no C heap to trim.
func mallocTrim() bool { return false }
