package client

import (
	"os/exec"
	"strings"
	"testing"
)

// TestClientLinksNoEngine: this package and cmd/enqueue are clients; they
// must not link the store, the cascade engine or Pebble.
func TestClientLinksNoEngine(t *testing.T) {
	for _, pkg := range []string{"github.com/telha/telha-cascade/queue/client", "github.com/telha/telha-cascade/cmd/enqueue"} {
		out, err := exec.Command("go", "list", "-deps", pkg).CombinedOutput()
		if err != nil {
			t.Fatalf("go list -deps %s: %v\n%s", pkg, err, out)
		}
		for _, dep := range strings.Fields(string(out)) {
			if strings.Contains(dep, "cockroachdb/pebble") || strings.HasSuffix(dep, "telha-cascade/storage") ||
				strings.HasSuffix(dep, "telha-cascade/cascade") || strings.HasSuffix(dep, "telha-cascade/queue") {
				t.Errorf("%s links %s", pkg, dep)
			}
		}
	}
}
