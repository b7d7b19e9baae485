//go:build race

package cascade

// raceOn: the race detector makes every read ten times slower; the tests
// that race readers against a 200k-edge cascade use a 20k-edge hub under
// it (the same interleavings, chunk for chunk), and .ci/run runs them at
// full size without it.
const raceOn = true
