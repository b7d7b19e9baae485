package app

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/telha/telha-cascade/cascade"
	"github.com/telha/telha-cascade/queue"
	"github.com/telha/telha-cascade/reaper"
)

// Config is the worker's configuration, from flags and TELHA_* variables.
type Config struct {
	DataDir        string
	HTTPAddr       string
	APIAddr        string // "" serves the read API on HTTPAddr; "off" disables it
	NATSURL        string
	NATSListen     string
	NATSCreds      string
	NATSUser       string
	NATSPassword   string
	NATSTLSCA      string
	NATSTLSCert    string
	NATSTLSKey     string
	Partitions     int
	PartitionOwner string
	Owner          queue.Owner
	MaxBatchOps    int
	ChunkOps       int
	ReaperSchedule string
	LogFormat      string
	LogLevel       string
	GroupMax       int
	GroupWait      time.Duration
	MaxDeliver     int
	MaxDeaths      int
	AckWait        time.Duration
	ResultsMaxAge  time.Duration
	StreamReplicas int
	LeaseTTL       time.Duration
	ShutdownGrace  time.Duration
	MinFreeDiskMB  int
	CacheMB        int
	MemTableMB     int
	Hostname       string
}

// ErrUsage marks a configuration error: the process exits 2 with usage.
var ErrUsage = errors.New("usage")

// ParseFlags reads args, then fills every flag not given on the command
// line from its environment variable (TELHA_ + the flag name in upper case,
// "-" as "_"). Errors wrap ErrUsage; usage is written to usageOut.
func ParseFlags(args []string, getenv func(string) string, usageOut io.Writer) (Config, error) {
	var c Config
	fs := flag.NewFlagSet("worker", flag.ContinueOnError)
	fs.SetOutput(usageOut)
	fs.StringVar(&c.DataDir, "data-dir", "./data", "directory of the Pebble store (pebble/) and the embedded NATS store (nats/)")
	fs.StringVar(&c.HTTPAddr, "http-addr", ":8080", "address of /metrics, /healthz, /readyz and the read API")
	fs.StringVar(&c.APIAddr, "api-addr", "", `separate address for the read API /v1/... ("" = on --http-addr, "off" = disabled)`)
	fs.StringVar(&c.NATSURL, "nats-url", "", "external NATS URL(s); empty starts an embedded JetStream server")
	fs.StringVar(&c.NATSListen, "nats-listen", "127.0.0.1:4222", "client address of the embedded NATS server")
	fs.StringVar(&c.NATSCreds, "nats-creds", "", "NATS credentials (.creds) file")
	fs.StringVar(&c.NATSUser, "nats-user", "", "NATS user")
	fs.StringVar(&c.NATSPassword, "nats-password", "", "NATS password")
	fs.StringVar(&c.NATSTLSCA, "nats-tls-ca", "", "CA certificate file to verify the NATS server")
	fs.StringVar(&c.NATSTLSCert, "nats-tls-cert", "", "client certificate file for NATS mutual TLS")
	fs.StringVar(&c.NATSTLSKey, "nats-tls-key", "", "client key file for NATS mutual TLS")
	fs.IntVar(&c.Partitions, "partitions", 1, "partition count P of the request stream (fixed at install)")
	fs.StringVar(&c.PartitionOwner, "partition-owner", "0/1", "i/N: own partitions p with p % N == i; auto/N reads i from the pod name")
	fs.IntVar(&c.MaxBatchOps, "max-batch-ops", cascade.DefaultMaxBatchOps, "inline vs journaled threshold and chunk size (floored at 7)")
	fs.IntVar(&c.ChunkOps, "journal-chunk-ops", 0, "puts per durable chunk of a journaled cascade (0: 5000; never more than --max-batch-ops)")
	fs.StringVar(&c.ReaperSchedule, "reaper-schedule", "@every 30s", "cron spec of the reaper")
	fs.StringVar(&c.LogFormat, "log-format", "text", "text or json")
	fs.StringVar(&c.LogLevel, "log-level", "info", "debug, info, warn or error")
	fs.IntVar(&c.GroupMax, "group-max", 512, "most requests committed in one durable batch")
	fs.DurationVar(&c.GroupWait, "group-wait", 0, "how long a group waits for more requests (0: none)")
	fs.IntVar(&c.MaxDeliver, "max-deliver", 5, "deliveries of a transiently failing request before it is dead-lettered")
	fs.IntVar(&c.MaxDeaths, "max-deaths", 3, "a request the worker died handling this many times (from its second delivery on) is dead-lettered as crash_loop")
	fs.DurationVar(&c.AckWait, "ack-wait", 30*time.Second, "consumer AckWait")
	fs.DurationVar(&c.ResultsMaxAge, "results-max-age", 24*time.Hour, "how long TELHA_RES keeps results")
	fs.IntVar(&c.StreamReplicas, "stream-replicas", 1, "replicas of the streams this worker creates (3 on a JetStream cluster)")
	fs.DurationVar(&c.LeaseTTL, "lease-ttl", time.Minute, "a journal applier that makes no progress this long is abandoned and retried")
	fs.DurationVar(&c.ShutdownGrace, "shutdown-grace", 60*time.Second, "how long SIGTERM waits for in-flight work")
	fs.IntVar(&c.CacheMB, "pebble-cache-mb", 128, "Pebble block cache")
	fs.IntVar(&c.MemTableMB, "pebble-memtable-mb", 32, "Pebble memtable size (two may be in memory at once)")
	fs.IntVar(&c.MinFreeDiskMB, "min-free-disk-mb", 128, "disk-space reserve: writes are refused (and retried) while less is free; 0 disables")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return c, err
		}
		return c, fmt.Errorf("%w: %v", ErrUsage, err)
	}
	if fs.NArg() > 0 {
		fs.Usage()
		return c, fmt.Errorf("%w: unexpected arguments %q", ErrUsage, fs.Args())
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	var errs []error
	fs.VisitAll(func(f *flag.Flag) {
		if set[f.Name] {
			return
		}
		env := "TELHA_" + strings.ToUpper(strings.ReplaceAll(f.Name, "-", "_"))
		if v := getenv(env); v != "" {
			if err := fs.Set(f.Name, v); err != nil {
				errs = append(errs, fmt.Errorf("%s=%q: %v", env, v, err))
			}
		}
	})
	if c.Hostname == "" {
		c.Hostname, _ = os.Hostname()
	}
	errs = append(errs, c.validate()...)
	if len(errs) > 0 {
		fs.Usage()
		return c, fmt.Errorf("%w: %w", ErrUsage, errors.Join(errs...))
	}
	return c, nil
}

func (c *Config) validate() []error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if c.DataDir == "" {
		bad("--data-dir must not be empty")
	}
	if c.Partitions < 1 || c.Partitions > 1024 {
		bad("--partitions must be between 1 and 1024, got %d", c.Partitions)
	}
	owner, err := queue.ParseOwner(c.PartitionOwner, c.Hostname)
	if err != nil {
		bad("--partition-owner: %v", err)
	} else if owner.Count > c.Partitions {
		bad("--partition-owner %s: %d replicas cannot share %d partitions (replica %d would own none)", c.PartitionOwner, owner.Count, c.Partitions, c.Partitions)
	}
	c.Owner = owner
	if c.MaxBatchOps < 1 {
		bad("--max-batch-ops must be positive, got %d", c.MaxBatchOps)
	}
	if c.ChunkOps < 0 {
		bad("--journal-chunk-ops must not be negative, got %d", c.ChunkOps)
	}
	if c.LeaseTTL <= 0 {
		bad("--lease-ttl must be positive, got %s", c.LeaseTTL)
	}
	if _, err := reaper.ParseSchedule(c.ReaperSchedule); err != nil {
		bad("--reaper-schedule %q: %v", c.ReaperSchedule, err)
	}
	if c.LogFormat != "text" && c.LogFormat != "json" {
		bad("--log-format must be text or json, got %q", c.LogFormat)
	}
	switch c.LogLevel {
	case "debug", "info", "warn", "error":
	default:
		bad("--log-level must be debug, info, warn or error, got %q", c.LogLevel)
	}
	if c.GroupMax < 1 {
		bad("--group-max must be positive")
	}
	if c.MaxDeliver < 1 {
		bad("--max-deliver must be positive")
	}
	if c.MaxDeaths < 1 {
		bad("--max-deaths must be positive")
	}
	if c.AckWait < time.Second {
		bad("--ack-wait must be at least 1s")
	}
	if c.StreamReplicas < 1 || c.StreamReplicas > 5 {
		bad("--stream-replicas must be between 1 and 5")
	}
	if (c.NATSTLSCert == "") != (c.NATSTLSKey == "") {
		bad("--nats-tls-cert and --nats-tls-key go together")
	}
	if c.NATSURL == "" && (c.NATSCreds != "" || c.NATSUser != "" || c.NATSTLSCA != "" || c.NATSTLSCert != "") {
		bad("NATS credentials and TLS options need --nats-url (the embedded server uses none)")
	}
	if c.CacheMB < 1 || c.MemTableMB < 1 || c.MemTableMB > 1024 {
		bad("--pebble-cache-mb must be positive and --pebble-memtable-mb between 1 and 1024")
	}
	if c.MinFreeDiskMB < 0 {
		bad("--min-free-disk-mb must not be negative")
	}
	if c.HTTPAddr == "" {
		bad("--http-addr must not be empty")
	}
	return errs
}
