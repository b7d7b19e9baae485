// Package scrubmark owns the erase marker: the typed record an erase's
// marker write-set carries so that every copy of a store (a standby's, a
// replay's) compacts the key ranges the erase rewrote.
//
// The marker is the payload of a Pebble LogData record: log data is never
// applied to a keyspace, and a tenant's data only ever reaches a write-set
// as the key or value of a set (or a delete), so no tenant can forge one
// (FuzzNoForgery). It starts with a magic that no other log data of the
// product uses (the changelog's claim starts with "telha claim") and
// carries the ranges to compact, so a copy compacts what the erase touched
// and not its whole keyspace.
//
// It owns the encoding only; storage writes the marker and partition finds
// it in write-sets (both import this package; it imports neither). It must
// not grow behaviour beyond encode and decode.
package scrubmark
