// Package sealed owns the format of a sealed object (issue 29's
// crypto-shredding of the checkpoints' tables): AES-256-GCM over
// fixed-size segments, each bound to its place and to whether it is the
// last, and the naming of the KV bucket that holds each object's data key.
// It seals and opens byte streams and reads keys; it does not choose what
// is sealed, store keys, or destroy them (package partition does), and it
// links no Pebble (cmd/enqueue opens sealed tables through it).
package sealed
