package main

import (
	"testing"
	"time"
)

func TestStepAtNamesTheScrubStepOfAPut(t *testing.T) {
	t0 := time.Date(2026, 12, 7, 0, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	windows := [][2]time.Time{{at(100), at(400)}, {at(1000), at(1200)}}
	steps := []scrubStep{{"checkpointed", at(200)}, {"purged", at(300)}, {"checkpointed", at(1100)}}
	for _, c := range []struct {
		ms   int
		want string
	}{
		{50, "outside"}, {100, "save"}, {199, "save"}, {200, "held"}, {299, "held"},
		{300, "collect"}, {399, "collect"}, {400, "outside"}, {999, "outside"},
		{1050, "save"}, {1150, "held"}, {1250, "outside"},
	} {
		if got := stepAt(at(c.ms), windows, steps); got != c.want {
			t.Errorf("a put at %d ms: %q, want %q", c.ms, got, c.want)
		}
	}
}
