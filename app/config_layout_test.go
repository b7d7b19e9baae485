package app

import (
	"io"
	"strings"
	"testing"

	"github.com/telha/telha-cascade/slot"
)

// TestLayoutDefaults (issue 32 item 2: the common case with fewer flags):
// dynamic/N alone implies --changelog jetstream and N partitions; i/N
// alone implies N partitions; what is given stays as given.
func TestLayoutDefaults(t *testing.T) {
	none := func(string) string { return "" }
	cfg, err := ParseFlags([]string{"--partition-owner", "dynamic/4", "--nats-url", "nats://127.0.0.1:4222"}, none, io.Discard)
	if err != nil || cfg.Changelog != slot.ChangelogJetStream || cfg.Partitions != 4 || cfg.Owner.Count != 4 || len(cfg.Defaulted) != 2 {
		t.Fatalf("dynamic/4 alone: %v %+v", err, cfg)
	}
	cfg, err = ParseFlags([]string{"--partition-owner", "1/3"}, none, io.Discard)
	if err != nil || cfg.Partitions != 3 || cfg.Changelog != slot.ChangelogOff {
		t.Fatalf("1/3 alone: %v %+v", err, cfg)
	}
	cfg, err = ParseFlags([]string{"--partition-owner", "dynamic/2", "--partitions", "8", "--nats-url", "nats://127.0.0.1:4222"}, none, io.Discard)
	if err != nil || cfg.Partitions != 8 {
		t.Fatalf("--partitions given: %v %+v", err, cfg)
	}
	// An explicit --changelog off with dynamic ownership is still refused,
	// and so is a --partitions given below N.
	for _, args := range [][]string{
		{"--partition-owner", "dynamic/2", "--nats-url", "nats://127.0.0.1:4222", "--changelog", "off"},
		{"--partition-owner", "dynamic/3", "--nats-url", "nats://127.0.0.1:4222", "--partitions", "2"},
	} {
		if _, err := ParseFlags(args, none, io.Discard); err == nil {
			t.Errorf("%s: accepted", strings.Join(args, " "))
		}
	}
	env := map[string]string{"TELHA_CHANGELOG": "off"}
	if _, err := ParseFlags([]string{"--partition-owner", "dynamic/2", "--nats-url", "nats://127.0.0.1:4222"}, func(k string) string { return env[k] }, io.Discard); err == nil {
		t.Error("TELHA_CHANGELOG=off with dynamic ownership: accepted")
	}
}
