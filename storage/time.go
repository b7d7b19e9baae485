package storage

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"time"
	"unicode/utf8"
)

// Ts is a point in time: microseconds since the Unix epoch, UTC. Negative
// values are before 1970 and are valid.
type Ts int64

// OpenEnd is the end of an interval that has no end.
const OpenEnd Ts = math.MaxInt64

// NoTs marks an absent optional time (for example Provenance.DecidedAt). No
// RFC 3339 time maps to it: years 0000-9999 lie well inside int64 microseconds.
const NoTs Ts = math.MinInt64

// TsFromTime converts t to microseconds since the epoch, truncating below a
// microsecond.
func TsFromTime(t time.Time) Ts { return Ts(t.UnixMicro()) }

// Time returns ts as a UTC time.Time.
func (ts Ts) Time() time.Time { return time.UnixMicro(int64(ts)).UTC() }

// TimeLayout is the one format in which the service writes times: RFC 3339,
// UTC, exactly six fractional digits.
const TimeLayout = "2006-01-02T15:04:05.000000Z07:00"

// String formats ts as RFC 3339 UTC with six fractional digits; OpenEnd
// formats as "open" and NoTs as "none".
func (ts Ts) String() string {
	switch ts {
	case OpenEnd:
		return "open"
	case NoTs:
		return "none"
	}
	return ts.Time().Format(TimeLayout)
}

// ParseTs parses any RFC 3339 time (fractional digits optional, after a
// '.'; 'T' and 'Z' in either case, as RFC 3339 §5.6 allows), whose UTC
// form lies in years 0000-9999 (so that it prints back as RFC 3339).
func ParseTs(s string) (Ts, error) {
	in := s
	if strings.ContainsAny(s, "tz") {
		in = strings.ToUpper(s) // nothing else of a valid time has a letter
	}
	t, err := time.Parse(time.RFC3339Nano, in)
	if err == nil && !offsetInRange(in) {
		err = errors.New("offset out of range")
	}
	if err != nil || strings.Contains(s, ",") {
		hint := ""
		if strings.Contains(s, " ") {
			hint = " (a '+' in a URL query must be written %2B)"
		}
		return 0, fmt.Errorf("%s is not an RFC 3339 time such as 2026-01-02T15:04:05Z or 2026-01-02T15:04:05.123456+02:00%s", QuoteShort(s), hint)
	}
	if y := t.UTC().Year(); y < 0 || y > 9999 {
		return 0, fmt.Errorf("time %s is outside years 0000-9999 in UTC", QuoteShort(s))
	}
	return TsFromTime(t), nil
}

// offsetInRange reports whether the numeric offset that ends s, if any,
// is one RFC 3339 allows: hours 00-23 and minutes 00-59. Go's parser takes
// +24:00 and +23:60 (a day ahead, read as another instant).
func offsetInRange(s string) bool {
	n := len(s)
	if n < 6 || (s[n-6] != '+' && s[n-6] != '-') || s[n-3] != ':' {
		return true
	}
	return s[n-5:n-3] <= "23" && s[n-2:] <= "59"
}

// QuoteShort quotes s for an error message, cut to its first 64 bytes
// (an 8 KB parameter must not make a 24 KB answer).
func QuoteShort(s string) string {
	if len(s) <= 64 {
		return fmt.Sprintf("%q", s)
	}
	cut := 64
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return fmt.Sprintf("%q… (%d bytes)", s[:cut], len(s))
}

// MarshalJSON writes ts in TimeLayout, or null for OpenEnd and NoTs.
func (ts Ts) MarshalJSON() ([]byte, error) {
	if ts == OpenEnd || ts == NoTs {
		return []byte("null"), nil
	}
	return json.Marshal(ts.Time().Format(TimeLayout))
}

// Interval is the half-open interval [Start, End).
type Interval struct {
	Start Ts
	End   Ts
}

// Open returns [t, OpenEnd).
func Open(t Ts) Interval { return Interval{Start: t, End: OpenEnd} }

// Contains reports whether Start <= t < End.
func (i Interval) Contains(t Ts) bool { return i.Start <= t && t < i.End }

// IsOpen reports whether the interval has no end.
func (i Interval) IsOpen() bool { return i.End == OpenEnd }

// Valid reports whether the interval is non-empty.
func (i Interval) Valid() bool { return i.Start < i.End }

func (i Interval) String() string { return "[" + i.Start.String() + ", " + i.End.String() + ")" }

// Clock is the wall-clock source of the TxClock. Tests inject their own.
type Clock interface{ Now() time.Time }

// SystemClock reads time.Now.
type SystemClock struct{}

// Now returns time.Now().
func (SystemClock) Now() time.Time { return time.Now() }

// TxClock hands out strictly increasing transaction times: max(now, last+1).
//
// Invariant: every tx the clock has handed out is <= Last(), and a reopened
// store starts the clock at its durable high-water mark (the largest tx any
// durable record carries), so no tx is ever reused or reordered, even if the
// wall clock stepped back in between.
type TxClock struct {
	mu   sync.Mutex
	src  Clock
	last Ts
}

// NewTxClock returns a clock that never returns a value <= floor.
func NewTxClock(src Clock, floor Ts) *TxClock {
	if src == nil {
		src = SystemClock{}
	}
	return &TxClock{src: src, last: floor}
}

// Next returns the next transaction time.
func (c *TxClock) Next() Ts {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := TsFromTime(c.src.Now())
	if now <= c.last {
		now = c.last + 1
	}
	c.last = now
	return now
}

// Last returns the highest transaction time handed out (or the floor).
func (c *TxClock) Last() Ts {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.last
}

// Now returns the wall clock's reading as a Ts (not a transaction time).
func (c *TxClock) Now() Ts { return TsFromTime(c.src.Now()) }

// Wall returns the wall-clock source.
func (c *TxClock) Wall() Clock { return c.src }

// ManualClock is a Clock that only moves when told to. Tests inject it.
type ManualClock struct {
	mu sync.Mutex
	t  time.Time
}

// NewManualClock returns a clock reading t.
func NewManualClock(t time.Time) *ManualClock { return &ManualClock{t: t} }

// Now returns the clock's reading.
func (c *ManualClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

// Set moves the clock to t (backwards too).
func (c *ManualClock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = t
}

// Advance moves the clock by d.
func (c *ManualClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}
