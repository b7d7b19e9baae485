package ui

import (
	"math"
	"sync"
	"time"

	"github.com/telha/telha-cascade/api"
)

// Progress keeps the journals' progress as sampled over time, for the
// journals page's rate and ETA (issue 32 item 7.4). The rate is the
// progress observed between samples, over the last ProgressWindow, from
// the first sample that had progress: never the edges done divided by the
// journal's age, which counts the time it waited for a slot, an earlier
// journal or its count of edges (a journal of 5.5 s read an ETA of 44 s
// after its first chunk). Until progress has been observed over
// MinProgressSpan the page says "estimating".
//
// The worker's sampler feeds it every second whether or not the page is
// open (Options.Progress); without one, the page feeds its own at each
// view (it refreshes itself every second while a journal runs).
type Progress struct {
	mu     sync.Mutex
	byKey  map[string][]progressSample // oldest first
	window time.Duration
}

type progressSample struct {
	at   time.Time
	done int64
}

const (
	// ProgressWindow is the span the rate is measured over.
	ProgressWindow = 10 * time.Second
	// MinProgressSpan is the least span of observed progress an estimate
	// needs (a sampler ticking every second, with its jitter).
	MinProgressSpan = 900 * time.Millisecond
	// progressSamples bounds the samples kept of a journal.
	progressSamples = 64
)

// NewProgress returns an empty Progress.
func NewProgress() *Progress {
	return &Progress{byKey: map[string][]progressSample{}, window: ProgressWindow}
}

// JournalKey identifies a journal across samples (its tenant, node,
// request, tx and, for a poison head, its key).
func JournalKey(j api.Journal) string {
	tx := ""
	if j.TxTime != nil {
		tx = *j.TxTime
	}
	return j.Tenant + "\x00" + j.NodeID + "\x00" + j.RequestID + "\x00" + tx + "\x00" + j.Key
}

// Observe records the journals' progress at now (every journal in flight:
// the ones not listed are forgotten). A sample older than a journal's
// newest is dropped (two observers reading out of order).
func (p *Progress) Observe(now time.Time, journals []api.Journal) {
	p.mu.Lock()
	defer p.mu.Unlock()
	seen := make(map[string]bool, len(journals))
	for _, j := range journals {
		k := JournalKey(j)
		seen[k] = true
		s := p.byKey[k]
		if n := len(s); n > 0 {
			last := s[n-1]
			switch {
			case now.Before(last.at):
				continue
			case j.EdgesDone < last.done:
				s = nil // progress went back (a new attempt re-counted): start over
			case now.Sub(last.at) < 100*time.Millisecond:
				s = s[:n-1] // two looks at once: keep the later
			}
		}
		s = append(s, progressSample{at: now, done: j.EdgesDone})
		// Forget what is out of the window, keeping the newest sample at
		// or before its start (the rate's base once progress resumes).
		cut := 0
		for cut+1 < len(s) && now.Sub(s[cut+1].at) >= p.window {
			cut++
		}
		if len(s)-cut > progressSamples {
			cut = len(s) - progressSamples
		}
		p.byKey[k] = append(s[:0:0], s[cut:]...)
	}
	for k := range p.byKey {
		if !seen[k] {
			delete(p.byKey, k)
		}
	}
}

// Estimate returns journal j's rate (edges a second) and the time it
// needs for the edges left at that rate, from the progress observed: ok
// is false until progress has been seen over MinProgressSpan; eta is -1
// when it cannot be told (no progress in the window: stalled or retried
// after a backoff; the edges not counted yet).
func (p *Progress) Estimate(j api.Journal) (rate float64, eta time.Duration, ok bool) {
	p.mu.Lock()
	s := p.byKey[JournalKey(j)]
	p.mu.Unlock()
	if len(s) < 2 {
		return 0, -1, false
	}
	newest := s[len(s)-1]
	// The base: the first sample that had progress (the ones before it
	// span the wait and the count, not the applying), or the window's
	// start when every sample had.
	b := -1
	for i, x := range s[:len(s)-1] {
		if x.done > 0 {
			b = i
			break
		}
	}
	if b < 0 {
		return 0, -1, false // no progress yet
	}
	base := s[b]
	span := newest.at.Sub(base.at)
	if span < MinProgressSpan {
		return 0, -1, false
	}
	rate = float64(newest.done-base.done) / span.Seconds()
	if rate <= 0 || j.EdgesTotal == 0 {
		return rate, -1, true
	}
	left := max(float64(int64(j.EdgesTotal)-j.EdgesDone), 0)
	return rate, time.Duration(left / rate * float64(time.Second)), true
}

// estimate is a journal's rate and ETA as the journals page shows them.
func estimate(p *Progress, j api.Journal) (rate float64, rateText, eta string) {
	rate, left, ok := p.Estimate(j)
	switch {
	case !ok && j.State == "applying":
		return 0, "estimating", "estimating"
	case !ok:
		return 0, "-", "-"
	}
	if rate >= 10 {
		rate = math.Round(rate)
	}
	rateText = Num(rate) + "/s"
	switch {
	case left < 0:
		eta = "-"
	case left < time.Second:
		eta = "<1s"
	default:
		eta = left.Round(time.Second).String()
	}
	return rate, rateText, eta
}
