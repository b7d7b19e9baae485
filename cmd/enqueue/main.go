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
	natsURL, creds, user, password, tlsCA, tlsCert, tlsKey, inbox string
	prefix                                                        string
	wait                                                          bool
	timeout                                                       time.Duration
	maxInflight                                                   int
}

const usage = `usage: enqueue [global flags] <command> [flags]

commands:
  put-node        publish one put_node
  put-edge        publish one put_edge
  tombstone-node  publish one tombstone_node (a cascade)
  tombstone-edge  publish one tombstone_edge
  erase-node      publish one erase_node (tombstone if live, then erase the
                  payload of every version of the node and its edges;
                  needs --reason)
  erase-edge      publish one erase_edge (needs --reason)
  file [PATH|-]   publish the JSON-lines requests of PATH (default stdin)
  demo            build a demo graph with a super-node, then delete a few things
  dlq list|show|retry|discard
                  the dead letters: list them, show one, republish one to
                  its original subject, or remove one
  owner --tenant T
                  the partition of a tenant and the replica that owns it
  pause --replica N|--slot N|--all [--for D]
                  pause a replica's (slot's) consumer (JetStream consumer pause):
                  its worker takes no request until resumed (or for D);
                  the pause survives a restart
  resume --replica N|--slot N|--all
                  resume it
  checkpoints --slots N [--slot I] [--get NAME --out FILE]
                  list the checkpoints of the layout i/N or dynamic/N (the
                  changelog's backups), or copy one out into FILE
  changes --tenant T [--from TX|--from-seq N] [--durable NAME] [--follow]
                  a tenant's change feed (TELHA_CHG) as JSON lines, until
                  caught up (or for ever, with --follow)

enqueue <command> -h lists a command's own flags. Global flags may also
follow the command (enqueue put-node --wait ...). Every NATS flag also reads
TELHA_<FLAG> (TELHA_NATS_URL, ...): these variables are the client's; the
worker reads TELHA_NATS_URL too, and it makes the worker a client of that
server instead of running its embedded one.

global flags:
`

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	g := globals{natsURL: envOr("TELHA_NATS_URL", "nats://127.0.0.1:4222"), creds: os.Getenv("TELHA_NATS_CREDS"),
		user: os.Getenv("TELHA_NATS_USER"), password: os.Getenv("TELHA_NATS_PASSWORD"), tlsCA: os.Getenv("TELHA_NATS_TLS_CA"),
		tlsCert: os.Getenv("TELHA_NATS_TLS_CERT"), tlsKey: os.Getenv("TELHA_NATS_TLS_KEY"), inbox: os.Getenv("TELHA_NATS_INBOX_PREFIX"), prefix: "telha",
		timeout: 2 * time.Minute, maxInflight: 256}
	fs := flag.NewFlagSet("enqueue", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, usage); fs.PrintDefaults() }
	g.register(fs)
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
	case "put-node", "put-edge", "tombstone-node", "tombstone-edge", "erase-node", "erase-edge":
		err = runOne(ctx, &g, cmd, rest, stdout, stderr)
	case "file":
		err = runFile(ctx, &g, rest, stdout, stderr)
	case "demo":
		err = runDemo(ctx, &g, rest, stdout, stderr)
	case "dlq":
		err = runDLQ(ctx, &g, rest, stdout, stderr)
	case "owner":
		err = runOwner(ctx, &g, rest, stdout, stderr)
	case "pause", "resume":
		err = runPause(ctx, &g, cmd, rest, stdout, stderr)
	case "checkpoints":
		err = runCheckpoints(ctx, &g, rest, stdout, stderr)
	case "changes":
		err = runChanges(ctx, &g, rest, stdout, stderr)
	default:
		fmt.Fprintf(stderr, "enqueue: unknown command %q\n\n", cmd)
		fs.Usage()
		return 2
	}
	var ue usageError
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return 0
	case errors.As(err, &ue):
		fmt.Fprintln(stderr, "enqueue:", err)
		return 2
	default:
		fmt.Fprintln(stderr, "enqueue:", err)
		return 1
	}
}

// register adds the global flags to fs with their current values as
// defaults, so that they may be given before or after the command.
func (g *globals) register(fs *flag.FlagSet) {
	g.registerConn(fs)
	g.registerPublish(fs)
}

// registerConn adds the flags every command that talks to NATS takes.
func (g *globals) registerConn(fs *flag.FlagSet) {
	fs.StringVar(&g.natsURL, "nats-url", g.natsURL, "NATS URL (env TELHA_NATS_URL)")
	fs.StringVar(&g.creds, "nats-creds", g.creds, "NATS credentials file (env TELHA_NATS_CREDS)")
	fs.StringVar(&g.user, "nats-user", g.user, "NATS user (env TELHA_NATS_USER)")
	fs.StringVar(&g.password, "nats-password", g.password, "NATS password (env TELHA_NATS_PASSWORD)")
	fs.StringVar(&g.tlsCA, "nats-tls-ca", g.tlsCA, "CA file for NATS TLS (env TELHA_NATS_TLS_CA)")
	fs.StringVar(&g.tlsCert, "nats-tls-cert", g.tlsCert, "client certificate for NATS TLS (env TELHA_NATS_TLS_CERT)")
	fs.StringVar(&g.tlsKey, "nats-tls-key", g.tlsKey, "client key for NATS TLS (env TELHA_NATS_TLS_KEY)")
	fs.StringVar(&g.inbox, "nats-inbox-prefix", g.inbox, "the inbox prefix of replies, e.g. _INBOX_acme for a tenant's user of docs/examples/nats-tenants.conf (env TELHA_NATS_INBOX_PREFIX)")
	fs.StringVar(&g.prefix, "prefix", g.prefix, "subject prefix")
}

// registerPublish adds the flags of the commands that publish requests.
func (g *globals) registerPublish(fs *flag.FlagSet) {
	fs.BoolVar(&g.wait, "wait", g.wait, "wait for each request's result, print it, exit 1 unless all are ok")
	fs.DurationVar(&g.timeout, "timeout", g.timeout, "how long --wait waits for results")
	fs.IntVar(&g.maxInflight, "max-inflight", g.maxInflight, "most publishes awaiting the stream's ack")
}

// parseSub parses a publishing command's flags (the global ones included),
// before or after its arguments, and returns the arguments; -h prints the
// command's own flags and ends the command with flag.ErrHelp (exit 0).
func parseSub(fs *flag.FlagSet, g *globals, args []string) ([]string, error) {
	return parseWith(fs, g, args, g.register)
}

// parseConn is parseSub for commands that only read or manage (dlq, owner):
// they take the NATS flags, not the publishing ones.
func parseConn(fs *flag.FlagSet, g *globals, args []string) ([]string, error) {
	return parseWith(fs, g, args, g.registerConn)
}

func parseWith(fs *flag.FlagSet, g *globals, args []string, register func(*flag.FlagSet)) ([]string, error) {
	own := map[string]bool{}
	fs.VisitAll(func(f *flag.Flag) { own[f.Name] = true })
	register(fs)
	fs.Usage = func() { commandUsage(fs, own) }
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return nil, err
			}
			return nil, usageError{err.Error()}
		}
		args = fs.Args()
		if len(args) == 0 {
			return pos, nil
		}
		pos = append(pos, args[0]) // an argument; flags may follow it
		args = args[1:]
	}
}

// commandUsage prints a command's own flags only; the global ones (the ten
// NATS flags and --wait) are listed once, by enqueue -h.
func commandUsage(fs *flag.FlagSet, own map[string]bool) {
	w := fs.Output()
	fmt.Fprintf(w, "usage: enqueue %s [flags]\n\n", fs.Name())
	mine := flag.NewFlagSet(fs.Name(), flag.ContinueOnError)
	mine.SetOutput(w)
	fs.VisitAll(func(f *flag.Flag) {
		if own[f.Name] {
			mine.Var(f.Value, f.Name, f.Usage)
		}
	})
	if len(own) > 0 {
		fmt.Fprintln(w, "flags:")
		mine.PrintDefaults()
		fmt.Fprintln(w)
	}
	fmt.Fprintln(w, "The global flags (--nats-url and the other NATS flags, --wait, ...) are listed by enqueue -h.")
}

type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}
