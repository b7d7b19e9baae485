package queue

import (
	"strconv"
	"unicode/utf8"
)

// Bounds on what the worker writes from its input (issue 20): headers of a
// dead letter, values echoed in an error or a result. A value over its
// bound is cut, with a marker saying how long it was, so a dead letter
// always fits and a result stays small whatever a request holds.
const (
	// MaxHeaderBytes bounds each header value built from input
	// (Telha-Error, Telha-Original-Subject, Telha-Stream-Subject,
	// Telha-Original-Msg-Id).
	MaxHeaderBytes = 1024
	// MaxEchoBytes bounds a value of the request quoted in an error, and
	// the op and id a result echoes from a request it could not read.
	MaxEchoBytes = 128
)

// clip returns s cut to at most n bytes, at a rune boundary, ending in the
// marker "…[cut: <len(s)> bytes]" when it was cut.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	marker := "…[cut: " + strconv.Itoa(len(s)) + " bytes]"
	keep := max(0, n-len(marker))
	for keep > 0 && !utf8.RuneStart(s[keep]) {
		keep--
	}
	return s[:keep] + marker
}
