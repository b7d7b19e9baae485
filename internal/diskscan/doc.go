// Package diskscan reads every file under a directory, byte by byte, for a
// given string: the tests that prove erased data left the disk (Pebble's
// directory, the request stream's files) use it.
//
// It owns nothing of the product and must not be imported by it: tests
// only.
package diskscan
