package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"math"
	"os"
	"os/signal"
	"runtime"
	"runtime/debug"
	"syscall"

	"github.com/telha/telha-cascade/app"
	"github.com/telha/telha-cascade/storage"
)

// Set by the linker: -X main.version=... -X main.revision=...
var version, revision string

// Exit statuses.
const (
	exitOK    = 0
	exitError = 1
	exitUsage = 2
	// exitFatalStorage: Pebble hit an error it cannot continue after (a
	// failed WAL or MANIFEST write). Everything synced is intact; the
	// supervisor restarts the process.
	exitFatalStorage = 3
)

func main() {
	os.Exit(run())
}

func run() int {
	cfg, err := app.ParseFlags(os.Args[1:], os.Getenv, os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		return exitOK
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		return exitUsage
	}
	if version != "" {
		app.Build.Version = version
	}
	if revision != "" {
		app.Build.Revision = revision
	}
	log := app.NewLogger(cfg, os.Stderr)
	procs, boosted, why := app.SetProcs(os.Getenv)
	log.Info("scheduler", "gomaxprocs", procs, "while_cascading", boosted, "cpus", runtime.NumCPU(), "why", why)
	setMemoryLimit(log, cfg)
	for _, k := range app.UnknownEnv(os.Environ()) {
		log.Warn("environment variable names no flag; ignored (a typo?)", "name", k)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := app.Run(ctx, cfg, log, app.Options{}); err != nil {
		switch {
		case errors.Is(err, storage.ErrFatal):
			log.Error("fatal storage error: exiting for the supervisor to restart the worker; synced data is intact", "err", err, "exit", exitFatalStorage)
			return exitFatalStorage
		case errors.Is(err, app.ErrUsage):
			log.Error("worker failed", "err", err)
			return exitUsage
		}
		log.Error("worker failed", "err", err)
		return exitError
	}
	log.Info("worker stopped cleanly")
	return exitOK
}

// setMemoryLimit sets the Go runtime's soft memory limit as
// planMemoryLimit decides (memlimit.go) and logs the limit in force and
// why, like the scheduler line above it.
func setMemoryLimit(log *slog.Logger, cfg app.Config) {
	p := planMemoryLimit(os.Getenv, cfg, cgoBuild)
	if p.Set {
		debug.SetMemoryLimit(p.Soft)
	}
	soft := debug.SetMemoryLimit(-1) // the limit in force
	attrs := []any{"cgo", cgoBuild, "why", p.Why}
	if soft == math.MaxInt64 {
		attrs = append([]any{"soft_limit", "none"}, attrs...)
	} else {
		attrs = append([]any{"soft_limit", mib(soft), "soft_limit_bytes", soft}, attrs...)
	}
	if p.Container > 0 {
		attrs = append(attrs, "container_limit_bytes", p.Container, "pebble_off_heap_bytes", p.OffHeap)
	}
	if p.Warn {
		log.Warn("memory", attrs...)
		return
	}
	log.Info("memory", attrs...)
}
