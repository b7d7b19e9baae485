package queue

import "testing"

// TestAnsweringDepthKeepsResultsUnderTheClientBound: the groups a worker
// has published and not settled (the buffered ones, plus one being
// settled and one being published) never hold more results than nats.go
// lets wait for an acknowledgement, whatever the group size that allows.
func TestAnsweringDepthKeepsResultsUnderTheClientBound(t *testing.T) {
	for _, g := range []int{1, 16, 100, 512, 1000, 1333, 2000, 4000} {
		d := answeringDepth(g)
		if d < 0 || d > 8 {
			t.Fatalf("GroupMax %d: depth %d, want 0..8", g, d)
		}
		if inFlight := (d + 2) * g; inFlight > maxAsyncResults && d > 0 {
			t.Fatalf("GroupMax %d: depth %d lets %d results wait, over %d", g, d, inFlight, maxAsyncResults)
		}
	}
	if d := answeringDepth(512); d != 5 {
		t.Fatalf("default GroupMax 512: depth %d, want 5", d)
	}
}
