package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"
)

type globals struct {
	natsURL, creds, user, password, tlsCA, tlsCert, tlsKey string
	prefix                                                 string
	wait                                                   bool
	timeout                                                time.Duration
	maxInflight                                            int
}

const usage = `usage: enqueue [global flags] <command> [flags]

commands:
  put-node        publish one put_node
  put-edge        publish one put_edge
  tombstone-node  publish one tombstone_node (a cascade)
  tombstone-edge  publish one tombstone_edge
  file [PATH|-]   publish the JSON-lines requests of PATH (default stdin)
  demo            build a demo graph with a super-node, then delete a few things

global flags:
`

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	var g globals
	fs := flag.NewFlagSet("enqueue", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, usage); fs.PrintDefaults() }
	fs.StringVar(&g.natsURL, "nats-url", envOr("TELHA_NATS_URL", "nats://127.0.0.1:4222"), "NATS URL (env TELHA_NATS_URL)")
	fs.StringVar(&g.creds, "nats-creds", os.Getenv("TELHA_NATS_CREDS"), "NATS credentials file")
	fs.StringVar(&g.user, "nats-user", os.Getenv("TELHA_NATS_USER"), "NATS user")
	fs.StringVar(&g.password, "nats-password", os.Getenv("TELHA_NATS_PASSWORD"), "NATS password")
	fs.StringVar(&g.tlsCA, "nats-tls-ca", os.Getenv("TELHA_NATS_TLS_CA"), "CA file for NATS TLS")
	fs.StringVar(&g.tlsCert, "nats-tls-cert", os.Getenv("TELHA_NATS_TLS_CERT"), "client certificate for NATS TLS")
	fs.StringVar(&g.tlsKey, "nats-tls-key", os.Getenv("TELHA_NATS_TLS_KEY"), "client key for NATS TLS")
	fs.StringVar(&g.prefix, "prefix", "telha", "subject prefix")
	fs.BoolVar(&g.wait, "wait", false, "wait for each request's result, print it, exit 1 unless all are ok")
	fs.DurationVar(&g.timeout, "timeout", 2*time.Minute, "how long --wait waits for results")
	fs.IntVar(&g.maxInflight, "max-inflight", 256, "most publishes awaiting the stream's ack")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() == 0 {
		fs.Usage()
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	cmd, rest := fs.Arg(0), fs.Args()[1:]
	var err error
	switch cmd {
	case "put-node", "put-edge", "tombstone-node", "tombstone-edge":
		err = runOne(ctx, &g, cmd, rest, stdout, stderr)
	case "file":
		err = runFile(ctx, &g, rest, stdout, stderr)
	case "demo":
		err = runDemo(ctx, &g, rest, stdout, stderr)
	default:
		fmt.Fprintf(stderr, "enqueue: unknown command %q\n\n", cmd)
		fs.Usage()
		return 2
	}
	var ue usageError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ue):
		fmt.Fprintln(stderr, "enqueue:", err)
		return 2
	default:
		fmt.Fprintln(stderr, "enqueue:", err)
		return 1
	}
}

type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}
