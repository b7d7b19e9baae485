//go:build !cgo

package main

// cgoBuild: this binary is built without cgo (the container image), so
// Pebble's block cache and memtables are Go memory (memlimit.go).
const cgoBuild = false
