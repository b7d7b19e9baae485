package app

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/telha/telha-cascade/internal/testnats"
)

// TestStreamLimitFlags (issue 20 item 22): TELHA_RES and TELHA_DLQ have
// size limits, from flags or TELHA_ variables, with sane defaults; bad
// values are usage errors.
func TestStreamLimitFlags(t *testing.T) {
	parse := func(env map[string]string, args ...string) (Config, error) {
		return ParseFlags(append([]string{"--data-dir", t.TempDir()}, args...), func(k string) string { return env[k] }, io.Discard)
	}
	c, err := parse(nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.ResultsMaxBytes != 1<<30 || c.DLQMaxBytes != 1<<30 || c.ResultsMaxPerTenant != 1_000_000 || c.DLQMaxPerTenant != 10_000 || c.ChangesMaxPerTenant != 1_000_000 {
		t.Fatalf("defaults: results %d bytes, %d per tenant; dlq %d bytes, %d per tenant; changes %d per tenant",
			c.ResultsMaxBytes, c.ResultsMaxPerTenant, c.DLQMaxBytes, c.DLQMaxPerTenant, c.ChangesMaxPerTenant)
	}
	c, err = parse(map[string]string{"TELHA_DLQ_MAX_BYTES": "512MiB", "TELHA_RESULTS_MAX_PER_TENANT": "0"},
		"--results-max-bytes", "2GB", "--dlq-max-per-tenant", "50")
	if err != nil {
		t.Fatal(err)
	}
	if c.ResultsMaxBytes != 2e9 || c.DLQMaxBytes != 512<<20 || c.ResultsMaxPerTenant != 0 || c.DLQMaxPerTenant != 50 {
		t.Fatalf("set: %+v", c)
	}
	for _, bad := range [][]string{
		{"--results-max-bytes", "0"}, {"--results-max-bytes", "-1"}, {"--results-max-bytes", "12XB"},
		{"--dlq-max-bytes", "1000"}, {"--dlq-max-bytes", "1.5GiB"}, {"--dlq-max-bytes", "99999999TiB"},
		{"--results-max-per-tenant", "-3"}, {"--dlq-max-per-tenant", "x"}, {"--change-feed-max-per-tenant", "-1"},
	} {
		if _, err := parse(nil, bad...); !errors.Is(err, ErrUsage) {
			t.Errorf("%q: %v, want a usage error", bad, err)
		}
	}
	if _, err := parse(map[string]string{"TELHA_RESULTS_MAX_BYTES": "lots"}); !errors.Is(err, ErrUsage) || !strings.Contains(err.Error(), "TELHA_RESULTS_MAX_BYTES") {
		t.Errorf("bad variable: %v", err)
	}
}

// TestStreamLimitsProvisioned: the worker gives the streams its limits
// (TELHA_CHG its per-tenant one: a tenant's flood of changes ages out its
// own history, not the other tenants').
func TestStreamLimitsProvisioned(t *testing.T) {
	ns := testnats.Start(t)
	startWorker(t, ns, t.TempDir(), Options{}, "--results-max-bytes", "64MiB", "--dlq-max-bytes", "32MiB",
		"--results-max-per-tenant", "1000", "--dlq-max-per-tenant", "0", "--change-feed-max-per-tenant", "500")
	b := newBus(t, ns)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for name, want := range map[string][2]int64{"TELHA_RES": {64 << 20, 1000}, "TELHA_DLQ": {32 << 20, -1}, "TELHA_CHG": {1 << 30, 500}} {
		s, err := b.js.Stream(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		cfg := s.CachedInfo().Config
		if cfg.MaxBytes != want[0] || cfg.MaxMsgsPerSubject != want[1] || cfg.Discard != jetstream.DiscardOld {
			t.Errorf("%s: max bytes %d, per subject %d, discard %v; want %d, %d, old", name, cfg.MaxBytes, cfg.MaxMsgsPerSubject, cfg.Discard, want[0], want[1])
		}
	}
}
