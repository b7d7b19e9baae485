//go:build cgo

package main

// cgoBuild: this binary is built with cgo, so Pebble allocates its block
// cache and memtables with C's malloc, outside the Go heap (memlimit.go).
const cgoBuild = true
