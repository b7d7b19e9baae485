package app

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/telha/telha-cascade/api"
	"github.com/telha/telha-cascade/cascade"
	"github.com/telha/telha-cascade/metrics"
	"github.com/telha/telha-cascade/reaper"
	"github.com/telha/telha-cascade/slot"
	"github.com/telha/telha-cascade/storage"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// Build is set by main from linker flags.
var Build = metrics.Build{Version: "dev", Revision: "unknown"}

// Options are test seams; production leaves them zero. Most reach each
// slot the process runs (slotOptions).
type Options struct {
	// Clock replaces the wall clock of the store and reaper.
	Clock storage.Clock
	// OnReady is called once a slot is ready (consuming; journals a
	// previous process left may still be resuming in the background): a
	// static worker's one, each of a member's as it starts serving.
	OnReady func(*slot.Slot)
	// WrapEngine wraps the storage engine (fault injection).
	WrapEngine func(storage.Engine) storage.Engine
	// FS is the filesystem every slot's Pebble opens on (nil: the OS's);
	// tests inject disk faults with it.
	FS vfs.FS
	// DiskFree replaces the statfs of the disk-space guard.
	DiskFree func() (uint64, error)
	// CascadeHooks, when set, are called after the worker's own (tests:
	// cascade.Hooks.JournalStep holds a journal between two durable steps).
	CascadeHooks cascade.Hooks
	// ReaperHooks, when set, are called after the worker's own (tests).
	ReaperHooks reaper.Hooks
	// OnWriterTask, when set, also sees every task of the store's writer
	// (cmd/bench).
	OnWriterTask func(lane storage.Lane, wait, run time.Duration)
	// TracerProvider, when set, receives the spans (tests: an in-memory
	// exporter); nil: --otlp-endpoint decides.
	TracerProvider trace.TracerProvider
	// CopyScrubStep, when set, is called at each step of an erase's scrub
	// of the copies that runs beside the writer (slot.Options).
	CopyScrubStep func(step string)
	// CopyScrubbed, when set, receives the cost of every finished scrub of
	// the copies (cmd/bench).
	CopyScrubbed func(slot.ScrubStatus)
	// beforeStandbyApply, when set (tests), is called by a member's
	// standby before it applies each write-set; it may block.
	beforeStandbyApply func(slot int, seq uint64)
	// standbyApplied, when set (tests), stands for a static worker's
	// standbys (slot.Options.StandbyApplied; a member sets its own).
	standbyApplied func() []uint64
	// slotStopWait, when set (tests), is slot.Options.StopWait.
	slotStopWait time.Duration
}

// slotOptions are what every slot of this process is given: the seams,
// and the process's build and runtime tuning.
func (o Options) slotOptions(tracer trace.TracerProvider) slot.Options {
	return slot.Options{Build: Build, Tracer: tracer, Applying: Applying,
		Clock: o.Clock, OnReady: o.OnReady, WrapEngine: o.WrapEngine, FS: o.FS, DiskFree: o.DiskFree, CascadeHooks: o.CascadeHooks,
		ReaperHooks: o.ReaperHooks, OnWriterTask: o.OnWriterTask, CopyScrubStep: o.CopyScrubStep, CopyScrubbed: o.CopyScrubbed,
		StandbyApplied: o.standbyApplied, StopWait: o.slotStopWait}
}

// NewLogger builds the process logger from the configuration.
func NewLogger(cfg Config, w io.Writer) *slog.Logger {
	var lvl slog.Level
	_ = lvl.UnmarshalText([]byte(cfg.LogLevel))
	ho := &slog.HandlerOptions{Level: lvl}
	if cfg.LogFormat == "json" {
		return slog.New(slog.NewJSONHandler(w, ho))
	}
	return slog.New(slog.NewTextHandler(w, ho))
}

// Run runs the worker until ctx is done, then shuts down in order (each
// slot as slot.Run says; then NATS, and the embedded server last). It
// returns nil after a clean shutdown.
//
// A static worker (--partition-owner i/N) hosts one slot, i of N, with a
// connection and HTTP servers of its own (runStatic). With
// --partition-owner dynamic, the process is a member (runMember), which
// hosts the slots the group gives it on one connection and one HTTP
// server.
func Run(ctx context.Context, cfg Config, log *slog.Logger, opts Options) error {
	if cfg.Member.Dynamic {
		return runMember(ctx, cfg, log, opts)
	}
	return runStatic(ctx, cfg, log, opts)
}

// runStatic hosts the one slot of a static worker: HTTP first (the
// probes answer while a long start runs), NATS when the slot first needs
// it (Options.Dial), the embedded server shut down after the slot closed.
func runStatic(ctx context.Context, cfg Config, log *slog.Logger, opts Options) (err error) {
	tp, stopTracing, err := tracerFor(opts, cfg, log)
	if err != nil {
		return err
	}
	defer stopTracing()
	var conn *natsConn
	defer func() {
		if conn != nil {
			conn.shutdown() // the embedded server, after the store closed
		}
	}()
	so := opts.slotOptions(tp)
	so.AuthConfig = api.AuthConfig{Mode: cfg.AuthMode(), TokensFile: cfg.AuthTokensFile, Logger: log}
	so.Dial = func(ctx context.Context) (*nats.Conn, int, error) {
		c, err := dial(ctx, &cfg, log)
		if c != nil {
			conn = c // shut down at the end even when the connection failed
		}
		if err != nil {
			return nil, 0, err
		}
		return c.nc, cfg.StreamReplicas, nil
	}
	so.CloseConn = func() {
		if conn != nil {
			conn.drain()
		}
	}
	s, err := slot.New(cfg.Config, log, so)
	if err != nil {
		return err
	}
	logStartChoices(log, cfg, cfg.AuthMode())
	if err := listen(s, cfg); err != nil {
		return errors.Join(err, s.Close())
	}
	return s.Run(ctx)
}

// logStartChoices says, once at start, what the flags left to defaults and
// who the read API answers.
func logStartChoices(log *slog.Logger, cfg Config, mode api.AuthMode) {
	for _, d := range cfg.Defaulted {
		log.Info("flag not given; the layout implies it", "set", d)
	}
	switch mode {
	case api.AuthOff:
		log.Error("the read API is OPEN to everyone who reaches it (--auth off): every tenant's data, no token asked")
	case api.AuthLoopback:
		log.Warn("the read API has no tokens (--auth-tokens-file): it answers loopback clients only, without a token")
	case api.AuthTokens:
		log.Info("the read API asks for bearer tokens", "file", cfg.AuthTokensFile)
	}
}

// listen binds a static worker's HTTP servers (--http-addr, and
// --api-addr when the read API has its own) and serves s on them.
func listen(s *slot.Slot, cfg Config) error {
	ln, err := net.Listen("tcp", cfg.HTTPAddr)
	if err != nil {
		return fmt.Errorf("listen on --http-addr %s: %w", cfg.HTTPAddr, err)
	}
	s.Serve(ln, true, cfg.APIAddr == "")
	if cfg.APIAddr != "" && cfg.APIAddr != "off" {
		ln, err := net.Listen("tcp", cfg.APIAddr)
		if err != nil {
			return fmt.Errorf("listen on --api-addr %s: %w", cfg.APIAddr, err)
		}
		s.Serve(ln, false, true)
	}
	return nil
}

// natsConn is a process's NATS connection, and the embedded server it
// started, if any (no --nats-url).
type natsConn struct {
	nc     *nats.Conn
	ns     *server.Server
	closed chan struct{} // closed by the connection's ClosedHandler
}

// natsPingInterval and natsMaxPingsOut: a process's connection whose
// server leaves its pings unanswered is stale on the third tick without
// an answer (10-15 s after the server stopped) and reconnects to another
// server of --nats-url; natsFlusherTimeout: so is one whose socket write
// blocks that long (a paused server that stopped reading; nats.go holds
// the connection's lock meanwhile, for a minute by default). A member's
// record expires after --member-ttl (6 s) without renewal, so by then its
// slots have moved; it rejoins within seconds of the reconnect instead of
// minutes. A ping is a few bytes each way; 10 s of silence from a live
// server is past any pause a loaded machine makes.
const (
	natsPingInterval   = 5 * time.Second
	natsMaxPingsOut    = 2
	natsFlusherTimeout = 10 * time.Second
)

// dial connects to --nats-url, or starts the embedded server and connects
// to it, and settles --stream-replicas 0 in cfg (resolveReplicas).
func dial(ctx context.Context, cfg *Config, log *slog.Logger) (*natsConn, error) {
	c := &natsConn{closed: make(chan struct{})}
	opts := []nats.Option{
		nats.Name("telha-cascade"),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(time.Second),
		// A server paused (SIGSTOP, a frozen VM) or cut off behind a TCP
		// connection still open is noticed only by unanswered pings:
		// nats.go's default (every 2 minutes, 2 outstanding) kept a
		// member on such a server, out of the group, for about 6 minutes
		// while the others were up. See natsPingInterval.
		nats.PingInterval(natsPingInterval),
		nats.MaxPingsOutstanding(natsMaxPingsOut),
		nats.FlusherTimeout(natsFlusherTimeout),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err == nil { // our own close at shutdown
				log.Info("nats connection closed")
				return
			}
			log.Warn("nats disconnected", "err", err)
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) { log.Info("nats reconnected", "url", nc.ConnectedUrlRedacted()) }),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { log.Warn("nats", "err", err) }),
		// A refused login is retried like any other failure (credentials may
		// be rotated on the server after the worker), and said clearly.
		nats.IgnoreAuthErrorAbort(),
		nats.ReconnectErrHandler(func(_ *nats.Conn, err error) {
			log.Warn("nats connection attempt failed; retrying", "err", err)
		}),
		nats.ClosedHandler(func(*nats.Conn) { close(c.closed) }),
	}
	url := cfg.NATSURL
	if url == "" {
		host, p, err := checkNATSListen(cfg.NATSListen)
		if err != nil {
			log.Error("refusing to start the embedded NATS server", "nats_listen", cfg.NATSListen, "err", err)
			return nil, fmt.Errorf("%w: %w", ErrUsage, err)
		}
		ns, err := startEmbedded(ctx, log, &server.Options{
			ServerName: "telha-embedded", Host: host, Port: p, JetStream: true,
			StoreDir: filepath.Join(cfg.DataDir, "nats"), NoSigs: true, NoLog: true,
			// With the changelog on, the local commit is not fsynced: the
			// changelog is the durable copy, so the server must fsync it
			// before it acks (sync_interval: always).
			SyncAlways: cfg.Changelog == slot.ChangelogJetStream,
		}, cfg.NATSListen)
		if err != nil {
			return nil, err
		}
		c.ns = ns
		url = ns.ClientURL()
		log.Info("NATS: embedded JetStream server started in this process (no --nats-url)", "listen", cfg.NATSListen, "url", url, "store", filepath.Join(cfg.DataDir, "nats"))
	} else {
		log.Info("NATS: client of an external server; no embedded server is started", "url", RedactURLs(url), "from", cfg.NATSURLFrom)
		if cfg.NATSCreds != "" {
			opts = append(opts, nats.UserCredentials(cfg.NATSCreds))
		}
		if cfg.NATSUser != "" {
			opts = append(opts, nats.UserInfo(cfg.NATSUser, cfg.NATSPassword))
		}
		if cfg.NATSTLSCA != "" || cfg.NATSTLSCert != "" {
			tc, err := tlsConfig(*cfg)
			if err != nil {
				return nil, err
			}
			opts = append(opts, nats.Secure(tc))
		}
	}
	nc, err := nats.Connect(url, append(opts, nats.RetryOnFailedConnect(true))...)
	if err != nil {
		return c, fmt.Errorf("connect to nats: %w", err)
	}
	c.nc = nc
	resolveReplicas(ctx, cfg, nc, log)
	return c, nil
}

// close drains the connection and shuts the embedded server down.
func (c *natsConn) close() {
	c.drain()
	c.shutdown()
}

// drain drains the connection: what was published is sent.
func (c *natsConn) drain() {
	if c.nc != nil {
		if err := c.nc.Drain(); err == nil {
			select {
			case <-c.closed:
			case <-time.After(5 * time.Second):
			}
		}
		c.nc.Close()
	}
}

// shutdown shuts the embedded server down, if any.
func (c *natsConn) shutdown() {
	if c.ns != nil {
		c.ns.Shutdown()
		c.ns.WaitForShutdown()
	}
}

// resolveReplicas settles --stream-replicas 0 (auto) once connected: the
// servers the connection knows then include those the cluster advertised.
// The wait is short (a reachable server answers in milliseconds); a
// server not reachable by then (starting after the worker, refusing its
// credentials) leaves the URLs given to count, and the start goes on to
// say why it cannot connect.
func resolveReplicas(ctx context.Context, cfg *Config, nc *nats.Conn, log *slog.Logger) {
	if cfg.StreamReplicas > 0 {
		return
	}
	deadline := time.Now().Add(2 * time.Second)
	for !nc.IsConnected() && time.Now().Before(deadline) && ctx.Err() == nil {
		select {
		case <-ctx.Done():
		case <-time.After(50 * time.Millisecond):
		}
	}
	n, why := cfg.ResolveReplicas(len(nc.Servers()))
	if !nc.IsConnected() {
		why += " (not connected yet: only the URLs given were counted)"
		log.Warn("stream replicas", "replicas", n, "why", why)
		return
	}
	log.Info("stream replicas", "replicas", n, "why", why)
}

// checkNATSListen parses --nats-listen (host and port) and refuses an
// address that is not loopback. The embedded server has no
// authentication and no TLS: whoever reaches it can publish requests for
// every tenant, read every result and dead letter, and call the
// JetStream API (purge or delete the streams). So it listens on loopback
// only, like the read API without tokens; other hosts use a NATS server
// of their own, with accounts (--nats-url).
func checkNATSListen(addr string) (host string, port int, err error) {
	host, ps, err := net.SplitHostPort(addr)
	if err != nil {
		return "", 0, fmt.Errorf("--nats-listen %q: %v", addr, err)
	}
	if port, err = strconv.Atoi(ps); err != nil || port < 0 || port > 65535 {
		return "", 0, fmt.Errorf("--nats-listen %q: bad port", addr)
	}
	if !loopbackHost(host) {
		return "", 0, fmt.Errorf("--nats-listen %q: the embedded NATS server has no authentication, so it listens on a loopback address only (127.0.0.1, ::1 or localhost); to serve other hosts, run a NATS server with accounts and give its URL with --nats-url", addr)
	}
	return host, port, nil
}

// loopbackHost reports whether host (of --nats-listen) is a loopback
// address: an IP literal on loopback, or "localhost". "" and the
// unspecified addresses listen on every interface.
func loopbackHost(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

func tlsConfig(c Config) (*tls.Config, error) {
	tc := &tls.Config{MinVersion: tls.VersionTLS12}
	if c.NATSTLSCA != "" {
		pem, err := os.ReadFile(c.NATSTLSCA)
		if err != nil {
			return nil, fmt.Errorf("--nats-tls-ca: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--nats-tls-ca %s: no PEM certificate", c.NATSTLSCA)
		}
		tc.RootCAs = pool
	}
	if c.NATSTLSCert != "" {
		cert, err := tls.LoadX509KeyPair(c.NATSTLSCert, c.NATSTLSKey)
		if err != nil {
			return nil, fmt.Errorf("--nats-tls-cert/--nats-tls-key: %w", err)
		}
		tc.Certificates = []tls.Certificate{cert}
	}
	return tc, nil
}

// newOTLP is the OTLP/HTTP trace exporter behind a batching provider.
// tracerFor returns the tracer provider of a process: opts' if set, else
// one exporting to --otlp-endpoint (nil when it is empty), and the func
// that flushes and stops it.
func tracerFor(opts Options, cfg Config, log *slog.Logger) (trace.TracerProvider, func(), error) {
	if opts.TracerProvider != nil || cfg.OTLPEndpoint == "" {
		return opts.TracerProvider, func() {}, nil
	}
	sdk, err := newOTLP(cfg.OTLPEndpoint)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: --otlp-endpoint %q: %v", ErrUsage, cfg.OTLPEndpoint, err)
	}
	log.Info("tracing on", "otlp_endpoint", cfg.OTLPEndpoint)
	return sdk, func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := sdk.Shutdown(ctx); err != nil {
			log.Warn("flushing the last spans", "err", err)
		}
	}, nil
}

// tracesURL is the URL spans are posted to: endpoint is the collector's
// base URL (http://collector:4318, as OTEL_EXPORTER_OTLP_ENDPOINT is), to
// which the traces path /v1/traces is added; a URL with a path of its own
// is used as it is. (The exporter posts to a URL's own path, "/" when it
// has none, where a collector answers 404.)
func tracesURL(endpoint string) string {
	u, err := url.Parse(endpoint)
	if err != nil || (u.Path != "" && u.Path != "/") {
		return endpoint
	}
	u.Path = "/v1/traces"
	return u.String()
}

func newOTLP(endpoint string) (*sdktrace.TracerProvider, error) {
	exp, err := otlptracehttp.New(context.Background(), otlptracehttp.WithEndpointURL(tracesURL(endpoint)))
	if err != nil {
		return nil, err
	}
	res := resource.NewSchemaless(attribute.String("service.name", "telha-cascade"))
	return sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res)), nil
}

// startEmbedded starts the embedded NATS server on listen (opts' Host and
// Port) and waits until it takes connections. It fails at once when the
// address cannot be bound, with the server's own error when the server
// fails to start (its Fatalf, which it does not return), and with ctx's
// error when ctx ends first (SIGTERM during a long JetStream recovery).
func startEmbedded(ctx context.Context, log *slog.Logger, opts *server.Options, listen string) (*server.Server, error) {
	// The server reports a busy port only through its log, and
	// ReadyForConnections would wait out its whole timeout: bind first.
	ln, err := net.Listen("tcp", net.JoinHostPort(opts.Host, strconv.Itoa(opts.Port)))
	if err != nil {
		return nil, fmt.Errorf("embedded nats: cannot listen on --nats-listen %s: %w", listen, err)
	}
	if err := ln.Close(); err != nil {
		return nil, fmt.Errorf("embedded nats: --nats-listen %s: %w", listen, err)
	}
	ns, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("embedded nats: %w", err)
	}
	fatal := make(chan string, 1)
	ns.SetLoggerV2(&natsLog{log: log.With("component", "embedded-nats"), fatal: fatal}, false, false, false)
	go ns.Start()
	stop := func() { ns.Shutdown(); ns.WaitForShutdown() }
	deadline := time.Now().Add(time.Minute)
	for !ns.ReadyForConnections(100 * time.Millisecond) {
		select {
		case msg := <-fatal:
			stop()
			return nil, fmt.Errorf("embedded nats on --nats-listen %s did not start: %s", listen, msg)
		case <-ctx.Done():
			stop()
			return nil, fmt.Errorf("embedded nats on --nats-listen %s: startup stopped: %w", listen, context.Cause(ctx))
		default:
		}
		if time.Now().After(deadline) {
			stop()
			return nil, fmt.Errorf("embedded nats on --nats-listen %s: not ready within a minute", listen)
		}
	}
	return ns, nil
}

// natsLog is the embedded server's logger: warnings and errors go to the
// worker's log, and a fatal error (the server stops starting, and says so
// only here) also goes to startEmbedded.
type natsLog struct {
	log   *slog.Logger
	fatal chan string
}

func (l *natsLog) Noticef(format string, v ...any) { l.log.Debug(fmt.Sprintf(format, v...)) }
func (l *natsLog) Debugf(format string, v ...any)  { l.log.Debug(fmt.Sprintf(format, v...)) }
func (l *natsLog) Tracef(format string, v ...any)  {}
func (l *natsLog) Warnf(format string, v ...any)   { l.log.Warn(fmt.Sprintf(format, v...)) }
func (l *natsLog) Errorf(format string, v ...any)  { l.log.Warn(fmt.Sprintf(format, v...)) }
func (l *natsLog) Fatalf(format string, v ...any) {
	msg := fmt.Sprintf(format, v...)
	l.log.Error(msg)
	select {
	case l.fatal <- msg:
	default:
	}
}
