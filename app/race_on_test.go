//go:build race

package app

// raceOn: the race detector slows the worker about tenfold; the browser
// test deletes a 20k-edge hub under it instead of 200k.
const raceOn = true
