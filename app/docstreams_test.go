package app

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/telha/telha-cascade/internal/testnats"
)

// TestDeployStreamsTableHolds (issue 32 item 4: DEPLOY gave TELHA_REQ a
// 2-minute duplicate window it does not have, and missed
// TELHA_REQ_NODEDUP): every stream of DEPLOY's "Streams and consumers"
// table exists on a worker's server once it is ready, with the duplicate
// window the row states ("no duplicate window" or "duplicate window 2 m"),
// and every stream the worker created is in the table.
func TestDeployStreamsTableHolds(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("..", "docs", "DEPLOY.md"))
	if err != nil {
		t.Fatal(err)
	}
	sec := string(doc)
	i := strings.Index(sec, "### Streams and consumers")
	if i < 0 {
		t.Fatal(`DEPLOY.md has no "### Streams and consumers"`)
	}
	sec = sec[i:]
	if j := strings.Index(sec[4:], "\n#"); j > 0 {
		sec = sec[:j+4]
	}
	rows := map[string]string{}
	for _, m := range regexp.MustCompile("(?m)^\\| `(TELHA_[A-Z_]+)` \\|(.*)$").FindAllStringSubmatch(sec, -1) {
		rows[m[1]] = m[2]
	}
	if len(rows) < 3 {
		t.Fatalf("the table lists %d streams: %v", len(rows), rows)
	}
	ns := testnats.Start(t)
	startWorker(t, ns, t.TempDir(), Options{})
	js, err := jetstream.New(testnats.Connect(t, ns.ClientURL()))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for name, row := range rows {
		s, err := js.Stream(ctx, name)
		if err != nil {
			t.Errorf("DEPLOY lists %s: %v", name, err)
			continue
		}
		dup := s.CachedInfo().Config.Duplicates
		switch {
		case strings.Contains(row, "no duplicate window") && dup != 0:
			t.Errorf("DEPLOY says %s has no duplicate window; it has %s", name, dup)
		case strings.Contains(row, "duplicate window 2 m") && dup != 2*time.Minute:
			t.Errorf("DEPLOY says %s has a 2 m duplicate window; it has %s", name, dup)
		}
	}
	names := js.StreamNames(ctx)
	for n := range names.Name() {
		if _, ok := rows[n]; !ok && strings.HasPrefix(n, "TELHA_") {
			t.Errorf("the worker created %s, which DEPLOY's streams table does not list", n)
		}
	}
}
