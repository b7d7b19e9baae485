// Command worker is telha-cascade's worker: it consumes delete and write
// requests from NATS JetStream and applies them to its Pebble store.
//
// With no flags it runs on its embedded default: a NATS JetStream server on
// 127.0.0.1:4222 storing under ./data/nats, Pebble under ./data/pebble, and
// HTTP (metrics, health, read API) on :8080. Every flag also reads from an
// environment variable: TELHA_ + the flag name in upper case, "-" as "_".
// Run with -h for the flags. Bad flags exit 2; SIGTERM drains and exits 0.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/telha/telha-cascade/app"
)

// Set by the linker: -X main.version=... -X main.revision=...
var version, revision string

func main() {
	os.Exit(run())
}

func run() int {
	cfg, err := app.ParseFlags(os.Args[1:], os.Getenv, os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		return 2
	}
	if version != "" {
		app.Build.Version = version
	}
	if revision != "" {
		app.Build.Revision = revision
	}
	log := app.NewLogger(cfg, os.Stderr)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := app.Run(ctx, cfg, log, app.Options{}); err != nil {
		log.Error("worker failed", "err", err)
		if errors.Is(err, app.ErrUsage) {
			return 2
		}
		return 1
	}
	log.Info("worker stopped cleanly")
	return 0
}
