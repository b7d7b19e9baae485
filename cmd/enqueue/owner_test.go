package main

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/telha/telha-cascade/app"
	"github.com/telha/telha-cascade/internal/testnats"
	"github.com/telha/telha-cascade/queue/client"
)

// TestOwnerInDynamicMode (issue 30: enqueue owner answered with the static
// rule in dynamic mode): against a dynamic member, owner names the tenant's
// slot, the member that owns it and where it answers.
func TestOwnerInDynamicMode(t *testing.T) {
	ns := testnats.Start(t)
	addr := testnats.FreeAddr(t)
	cfg, err := app.ParseFlags([]string{"--data-dir", t.TempDir(), "--http-addr", addr, "--advertise-url", "http://" + addr, "--nats-url", ns.ClientURL(),
		"--partitions", "4", "--partition-owner", "dynamic/2", "--changelog", "jetstream", "--member-id", "solo", "--member-ttl", "2s",
		"--standbys", "0", "--auth", "off"}, func(string) string { return "" }, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- app.Run(ctx, cfg, slog.New(slog.NewTextHandler(io.Discard, nil)), app.Options{}) }()
	t.Cleanup(func() { cancel(); <-done })
	var own struct {
		Mode      string
		Slots     int
		Slot      int
		Partition int
		Owner     string
		OwnerURL  string `json:"owner_url"`
		Consumer  string
		Rule      string
	}
	testnats.Eventually(t, 60*time.Second, "owner names the slot's owner", func() bool {
		code, out, _ := enqueue(t, "owner", "--tenant", "acme", "--nats-url", ns.ClientURL())
		return code == 0 && json.Unmarshal([]byte(out), &own) == nil && own.Owner == "solo"
	})
	if own.Mode != "dynamic" || own.Slots != 2 || own.Slot != client.Partition("acme", 4)%2 || own.OwnerURL != "http://"+addr ||
		!strings.Contains(own.Rule, "slot") {
		t.Fatalf("owner in dynamic mode: %+v", own)
	}
}
