package app

import (
	"testing"
	"time"
)

// TestOverviewRatesOverTheLastMinute (issue 23 item 7): the overview's
// rates come from a ring the worker samples every 5 s whether or not the
// page is loaded: over the newest sample at least a minute old, since
// start while the worker is younger; the ring stays bounded.
func TestOverviewRatesOverTheLastMinute(t *testing.T) {
	var w rateWindow
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	w.add(t0, map[string]float64{}) // the start: every counter at 0
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	for d := 5 * time.Second; d <= 30*time.Second; d += 5 * time.Second {
		w.add(at(d), map[string]float64{"ok": float64(d / time.Second)})
	}
	// A first page load 30 s after start: over the 30 s since start.
	if base, when := w.base(at(30 * time.Second)); base["ok"] != 0 || !when.Equal(t0) {
		t.Fatalf("after 30 s: base %v at %s, want the start's (0 at %s)", base, when, t0)
	}
	for d := 35 * time.Second; d <= 10*time.Minute; d += 5 * time.Second {
		w.add(at(d), map[string]float64{"ok": float64(d / time.Second)})
		if len(w.samples) > 26 {
			t.Fatalf("at %s the ring holds %d samples, want at most 26 (two minutes every 5 s)", d, len(w.samples))
		}
	}
	now := at(10*time.Minute + 2*time.Second)
	base, when := w.base(now)
	if want := at(9 * time.Minute); base["ok"] != 540 || !when.Equal(want) {
		t.Fatalf("after 10 min: base %v at %s, want 540 at %s (the newest sample a minute old)", base, when, want)
	}
}
