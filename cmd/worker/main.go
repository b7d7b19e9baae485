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
