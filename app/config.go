package app

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/telha/telha-cascade/api"

	"github.com/telha/telha-cascade/cascade"
	"github.com/telha/telha-cascade/queue"
	"github.com/telha/telha-cascade/reaper"
	"github.com/telha/telha-cascade/slot"
)

// Config is the worker's configuration, from flags and TELHA_* variables.
type Config struct {
	// The slot's configuration (package slot): its store, queue, reaper
	// and changelog. A static worker runs one slot with it; a member runs
	// each slot it is given with a copy (memberRun.slotConfig).
	slot.Config

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
	PartitionOwner string
	LogFormat      string
	LogLevel       string
	// Defaulted lists what the layout filled in (layoutDefaults).
	Defaulted []string
	// OTLPEndpoint: --otlp-endpoint, or OTEL_EXPORTER_OTLP_ENDPOINT.
	OTLPEndpoint string
	// Auth is --auth; AuthTokensFile --auth-tokens-file (see AuthMode).
	Auth, AuthTokensFile string
	Hostname             string
	// Member: --partition-owner dynamic and its flags (member_config.go).
	Member MemberConfig

	// NATSURLFrom says where NATSURL came from ("--nats-url" or
	// "TELHA_NATS_URL"), for the startup log.
	NATSURLFrom string
}

// ErrUsage marks a configuration error: the process exits 2 with usage.
// It is the slot's: a slot's configuration refused at its start is one.
var ErrUsage = slot.ErrUsage

// ParseFlags reads args, then fills every flag not given on the command
// line from its environment variable (TELHA_ + the flag name in upper case,
// "-" as "_"). Errors wrap ErrUsage; usage is written to usageOut.
func ParseFlags(args []string, getenv func(string) string, usageOut io.Writer) (Config, error) {
	var c Config
	fs := flag.NewFlagSet("worker", flag.ContinueOnError)
	fs.SetOutput(usageOut)
	fs.Usage = func() {
		fmt.Fprint(usageOut, "usage: worker [flags]\n\nEvery flag also reads the environment variable TELHA_ + its name in upper case,\n"+
			"with - as _ (--max-batch-ops: TELHA_MAX_BATCH_OPS); a flag on the command line wins.\n\nflags:\n")
		fs.PrintDefaults()
	}
	registerNames(fs, &c)
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
	fromEnv := map[string]bool{}
	var errs []error
	fs.VisitAll(func(f *flag.Flag) {
		if set[f.Name] {
			return
		}
		env := EnvName(f.Name)
		if v := getenv(env); v != "" {
			fromEnv[f.Name] = true
			if err := fs.Set(f.Name, v); err != nil {
				errs = append(errs, fmt.Errorf("%s=%q does not parse as --%s (%s)", env, v, f.Name, f.Usage))
			}
		}
	})
	if err := natsMode(&c, set, fromEnv); err != nil {
		errs = append(errs, err)
	}
	layoutDefaults(&c, func(name string) bool { return set[name] || fromEnv[name] })
	if c.OTLPEndpoint == "" {
		c.OTLPEndpoint = getenv("OTEL_EXPORTER_OTLP_ENDPOINT") // the standard variable, as OpenTelemetry SDKs read it
	}
	if c.Hostname == "" {
		c.Hostname, _ = os.Hostname()
	}
	if len(errs) == 0 {
		// A variable that does not parse leaves its flag's default, which
		// validate would then misreport: stop at the variable.
		for _, err := range c.validate() {
			errs = append(errs, fromEnvNamed(err, fromEnv))
		}
	}
	if len(errs) > 0 {
		fs.Usage()
		return c, fmt.Errorf("%w: %w", ErrUsage, errors.Join(errs...))
	}
	return c, nil
}

// fromEnvNamed adds to a validation error the variables it came from:
// validate names flags, and an operator who set TELHA_MAX_BATCH_OPS
// would otherwise look for a --max-batch-ops nobody passed.
func fromEnvNamed(err error, fromEnv map[string]bool) error {
	var vars []string
	msg := err.Error()
	for name := range fromEnv {
		if namesFlag(msg, name) {
			vars = append(vars, EnvName(name))
		}
	}
	if len(vars) == 0 {
		return err
	}
	slices.Sort(vars)
	return fmt.Errorf("%w (set by %s)", err, strings.Join(vars, ", "))
}

// namesFlag reports whether msg names --name itself (followed by
// anything but another letter, digit or dash of a longer flag's name).
func namesFlag(msg, name string) bool {
	flag := "--" + name
	for i := strings.Index(msg, flag); i >= 0; {
		end := i + len(flag)
		if end == len(msg) || !strings.ContainsRune("abcdefghijklmnopqrstuvwxyz0123456789-", rune(msg[end])) {
			return true
		}
		j := strings.Index(msg[end:], flag)
		if j < 0 {
			return false
		}
		i = end + j
	}
	return false
}

// natsMode refuses an external NATS URL together with an explicit
// --nats-listen (issue 23 item 3): the URL makes the worker a client of
// another server and --nats-listen starts the embedded one, so one of the
// two would be silently ignored. TELHA_NATS_URL is also enqueue's
// variable, which makes the mix easy to get by accident.
func natsMode(c *Config, set, fromEnv map[string]bool) error {
	name := func(flag string) string {
		if fromEnv[flag] {
			return EnvName(flag)
		}
		return "--" + flag
	}
	if c.NATSURL != "" {
		c.NATSURLFrom = name("nats-url")
	}
	if c.NATSURL == "" || !(set["nats-listen"] || fromEnv["nats-listen"]) {
		return nil
	}
	return fmt.Errorf("%s=%s makes the worker a client of an external NATS server, and %s=%s starts the embedded one: give one of them "+
		"(to run the embedded server, unset %s for the worker: TELHA_NATS_URL is also enqueue's variable)",
		name("nats-url"), RedactURLs(c.NATSURL), name("nats-listen"), c.NATSListen, name("nats-url"))
}

// RedactURLs returns a comma-separated list of URLs with their passwords
// replaced by xxxxx (for logs and errors); what does not parse is kept.
func RedactURLs(urls string) string {
	parts := strings.Split(urls, ",")
	for i, p := range parts {
		if u, err := url.Parse(strings.TrimSpace(p)); err == nil && u.User != nil {
			parts[i] = u.Redacted()
		}
	}
	return strings.Join(parts, ",")
}

// registerNames defines every flag of the worker on fs, bound to c.
func registerNames(fs *flag.FlagSet, c *Config) {
	fs.StringVar(&c.DataDir, "data-dir", "./data", "directory of the Pebble store (pebble/) and the embedded NATS store (nats/)")
	fs.StringVar(&c.HTTPAddr, "http-addr", ":8080", "address of /metrics, /healthz, /readyz and the read API")
	fs.StringVar(&c.APIAddr, "api-addr", "", `separate address for the read API /v1/... ("" = on --http-addr, "off" = disabled)`)
	fs.StringVar(&c.NATSURL, "nats-url", "", "external NATS URL(s): the worker is their client; empty starts an embedded JetStream server (not both with --nats-listen)")
	fs.StringVar(&c.NATSListen, "nats-listen", "127.0.0.1:4222", "client address of the embedded NATS server (loopback only; not with --nats-url)")
	fs.StringVar(&c.NATSCreds, "nats-creds", "", "NATS credentials (.creds) file")
	fs.StringVar(&c.NATSUser, "nats-user", "", "NATS user")
	fs.StringVar(&c.NATSPassword, "nats-password", "", "NATS password")
	fs.StringVar(&c.NATSTLSCA, "nats-tls-ca", "", "CA certificate file to verify the NATS server")
	fs.StringVar(&c.NATSTLSCert, "nats-tls-cert", "", "client certificate file for NATS mutual TLS")
	fs.StringVar(&c.NATSTLSKey, "nats-tls-key", "", "client key file for NATS mutual TLS")
	fs.IntVar(&c.Partitions, "partitions", 1, "partition count P of the request stream (fixed at install)")
	fs.StringVar(&c.PartitionOwner, "partition-owner", "0/1", "i/N: own partitions p with p % N == i; auto/N reads i from the pod name; "+
		"dynamic/N: N slots (slot i: the partitions p % N == i) move between the live members of the group (needs --nats-url and --changelog jetstream; see --member-id); dynamic: dynamic/<--partitions>")
	registerMember(fs, c)
	fs.IntVar(&c.MaxBatchOps, "max-batch-ops", cascade.DefaultMaxBatchOps, fmt.Sprintf("most puts in one durable batch: a request whose writes (receipt included) fit commits inline, "+
		"a larger cascade is journaled; no group's batch holds more (floored at %d; the chunk size is --journal-chunk-ops)", cascade.MinMaxBatchOps))
	fs.IntVar(&c.ChunkOps, "journal-chunk-ops", 0, fmt.Sprintf("puts per durable chunk of a journaled cascade (0: %d; never more than --max-batch-ops)", cascade.DefaultChunkOps))
	fs.StringVar(&c.ReaperSchedule, "reaper-schedule", "@every 30s", "cron spec of the reaper")
	fs.StringVar(&c.LogFormat, "log-format", "text", "text or json")
	fs.StringVar(&c.LogLevel, "log-level", "info", "debug, info, warn or error")
	fs.IntVar(&c.GroupMax, "group-max", 512, "most requests committed in one durable batch")
	fs.DurationVar(&c.GroupWait, "group-wait", 0, "how long a group waits for more requests (0: none)")
	fs.IntVar(&c.MaxDeliver, "max-deliver", 5, "deliveries of a transiently failing request before it is dead-lettered")
	fs.IntVar(&c.MaxDeaths, "max-deaths", 3, "a request the worker died handling this many times (from its second delivery on) is dead-lettered as crash_loop")
	fs.DurationVar(&c.AckWait, "ack-wait", 30*time.Second, "consumer AckWait")
	fs.DurationVar(&c.ResultsMaxAge, "results-max-age", 24*time.Hour, "how long TELHA_RES keeps results")
	fs.DurationVar(&c.DLQMaxAge, "dlq-max-age", 14*24*time.Hour, "how long TELHA_DLQ keeps dead letters")
	c.ResultsMaxBytes, c.DLQMaxBytes = 1<<30, 1<<30
	fs.Var((*byteSize)(&c.ResultsMaxBytes), "results-max-bytes", "size limit of TELHA_RES (bytes, or with a unit: 512MiB, 1GiB, 2GB); the oldest results go first")
	fs.Var((*byteSize)(&c.DLQMaxBytes), "dlq-max-bytes", "size limit of TELHA_DLQ (bytes, or with a unit: 512MiB, 1GiB, 2GB); the oldest dead letters go first")
	fs.BoolFunc("change-feed", "publish every committed change to TELHA_CHG (default true; false: the feed pauses where it stands, and resumes there when turned on)", func(s string) error {
		v, err := strconv.ParseBool(s)
		c.ChangeFeedOff = !v
		return err
	})
	fs.BoolFunc("change-feed-props", "a put's change carries its props (default true)", func(s string) error {
		v, err := strconv.ParseBool(s)
		c.ChangeFeedNoProps = !v
		return err
	})
	fs.DurationVar(&c.ChangesMaxAge, "change-feed-max-age", 7*24*time.Hour, "how long TELHA_CHG keeps changes (a consumer further behind resyncs from the read API's listing)")
	fs.IntVar(&c.ChangesMaxRate, "change-feed-max-rate", 20_000, "most changes a slot's feed publishes per second: a burst (a finished super-node cascade) is paced so that requests keep their latency, and the feed lags meanwhile (0: unbounded)")
	c.ChangesMaxBytes = 1 << 30
	fs.Var((*byteSize)(&c.ChangesMaxBytes), "change-feed-max-bytes", "size limit of TELHA_CHG (bytes, or with a unit: 512MiB, 1GiB, 2GB); the oldest changes go first")
	fs.Int64Var(&c.ChangesMaxPerTenant, "change-feed-max-per-tenant", 1_000_000, "most changes TELHA_CHG keeps per tenant subject (telha.chg.<tenant>.<kind>.<op>), its oldest going first (0: no per-tenant limit)")
	fs.Int64Var(&c.ResultsMaxPerTenant, "results-max-per-tenant", 1_000_000, "most results TELHA_RES keeps per tenant subject, its oldest going first (0: no per-tenant limit)")
	fs.Int64Var(&c.DLQMaxPerTenant, "dlq-max-per-tenant", 10_000, "most dead letters TELHA_DLQ keeps per tenant subject, its oldest going first (0: no per-tenant limit)")
	fs.IntVar(&c.StreamReplicas, "stream-replicas", 0, "replicas of the streams, buckets and changelogs this worker creates; 0: as many as the NATS servers the worker learns of when it connects, at most 3 (1 for the embedded server)")
	fs.DurationVar(&c.LeaseTTL, "lease-ttl", time.Minute, "a journal applier that makes no progress this long is abandoned and retried")
	fs.DurationVar(&c.ShutdownGrace, "shutdown-grace", 60*time.Second, "how long SIGTERM waits for the drain (requests held, journal appliers) before the worker exits anyway")
	fs.IntVar(&c.CacheMB, "pebble-cache-mb", 128, "Pebble block cache")
	fs.IntVar(&c.MemTableMB, "pebble-memtable-mb", 32, "Pebble memtable size (two may be in memory at once)")
	fs.StringVar(&c.Auth, "auth", "auto", "read-API access: auto (tokens if --auth-tokens-file is set, else loopback clients only), tokens, or off (open to everyone)")
	fs.StringVar(&c.AuthTokensFile, "auth-tokens-file", "", `bearer tokens of the read API, JSON {"tokens": [{"name", "token", "tenants": [...] or ["*"], "role": "read"|"operate"}]}; re-read when it changes`)
	fs.StringVar(&c.OTLPEndpoint, "otlp-endpoint", "", "OTLP/HTTP collector URL (http://host:4318) for traces; empty reads OTEL_EXPORTER_OTLP_ENDPOINT; neither: tracing off")
	fs.BoolVar(&c.SecureDeleteRequests, "secure-delete-requests", false, "overwrite each handled request in the request stream's files before acking it (no request's bytes linger there; about 300 requests/s)")
	fs.IntVar(&c.MinFreeDiskMB, "min-free-disk-mb", 128, "disk-space reserve: writes are refused (and retried) while less is free; 0 disables")
	registerChangelog(fs, c)
}

// EnvName is the environment variable of a flag: TELHA_ + its name in
// upper case, "-" as "_".
func EnvName(flagName string) string {
	return "TELHA_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// UnknownEnv lists the TELHA_* variables of environ that name no flag (a
// typo would otherwise be silently ignored). TELHA_TEST_* and the client's
// TELHA_NATS_* ones are known, and so is TELHA_MEMORY_LIMIT, the
// container's memory limit that cmd/worker derives its soft memory limit
// from (the Helm chart's goMemLimit: auto).
func UnknownEnv(environ []string) []string {
	known := map[string]bool{"TELHA_MEMORY_LIMIT": true}
	fs := flag.NewFlagSet("worker", flag.ContinueOnError)
	var c Config
	registerNames(fs, &c)
	fs.VisitAll(func(f *flag.Flag) { known[EnvName(f.Name)] = true })
	var out []string
	for _, kv := range environ {
		k, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, "TELHA_") && !known[k] && !strings.HasPrefix(k, "TELHA_TEST_") {
			out = append(out, k)
		}
	}
	return out
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
	if dyn, isDyn := c.parseDynamic(); isDyn {
		owner, err = dyn, nil
		errs = append(errs, c.validateDynamic()...)
	}
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
	if c.ShutdownGrace <= 0 {
		bad("--shutdown-grace must be positive, got %s", c.ShutdownGrace)
	}
	if c.ResultsMaxAge < time.Minute || c.DLQMaxAge < time.Minute {
		bad("--results-max-age and --dlq-max-age must be at least 1m")
	}
	if c.ChangesMaxRate < 0 {
		bad("--change-feed-max-rate must not be negative, got %d", c.ChangesMaxRate)
	}
	if c.ChangesMaxAge < time.Minute {
		bad("--change-feed-max-age must be at least 1m, got %s", c.ChangesMaxAge)
	}
	for _, l := range []struct {
		name string
		v    int64
	}{{"--results-max-bytes", c.ResultsMaxBytes}, {"--dlq-max-bytes", c.DLQMaxBytes}, {"--change-feed-max-bytes", c.ChangesMaxBytes}} {
		if l.v < minStreamBytes || l.v > maxStreamBytes {
			bad("%s must be between 2MiB and 1PiB, got %d bytes", l.name, l.v)
		}
	}
	if c.ResultsMaxPerTenant < 0 || c.DLQMaxPerTenant < 0 || c.ChangesMaxPerTenant < 0 {
		bad("--results-max-per-tenant, --dlq-max-per-tenant and --change-feed-max-per-tenant must not be negative (0: no per-tenant limit)")
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
	if c.GroupWait < 0 {
		bad("--group-wait must not be negative, got %s", c.GroupWait)
	}
	if c.NATSURL == "" {
		if _, _, err := checkNATSListen(c.NATSListen); err != nil {
			errs = append(errs, err)
		}
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
	if c.StreamReplicas < 0 || c.StreamReplicas > 5 {
		bad("--stream-replicas must be between 0 (the cluster's size, at most 3) and 5")
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
	} else if err := checkListenAddr(c.HTTPAddr); err != nil {
		bad("--http-addr: %v", err)
	}
	if c.APIAddr != "" && c.APIAddr != "off" {
		if err := checkListenAddr(c.APIAddr); err != nil {
			bad("--api-addr: %v", err)
		}
	}
	errs = append(errs, c.validateMemberRanges()...)
	errs = append(errs, c.validateChangelog()...)
	switch {
	case c.Auth != "auto" && c.Auth != "tokens" && c.Auth != "off":
		bad("--auth must be auto, tokens or off, got %q", c.Auth)
	case c.Auth == "tokens" && c.AuthTokensFile == "":
		bad("--auth tokens needs --auth-tokens-file")
	case c.Auth == "off" && c.AuthTokensFile != "":
		bad("--auth off and --auth-tokens-file contradict each other")
	}
	return errs
}

// AuthMode is the read API's access mode the flags select.
func (c *Config) AuthMode() api.AuthMode {
	switch {
	case c.Auth == "off":
		return api.AuthOff
	case c.AuthTokensFile != "":
		return api.AuthTokens
	}
	return api.AuthLoopback
}

// Bounds of --results-max-bytes and --dlq-max-bytes: room for the largest
// message (1 MiB) twice, and a petabyte.
const (
	minStreamBytes = 2 << 20
	maxStreamBytes = 1 << 50
)

// byteSize is a flag of a size in bytes: an integer, or an integer with a
// unit (B, KB, MB, GB, TB in powers of 1000; KiB, MiB, GiB, TiB in powers
// of 1024).
type byteSize int64

var byteUnits = []struct {
	suffix string
	mult   int64
}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1 << 40},
	{"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12}, {"B", 1}}

func (b *byteSize) String() string {
	if b == nil {
		return "0"
	}
	for _, u := range byteUnits[:4] {
		if v := int64(*b); v != 0 && v%u.mult == 0 && (v/u.mult < 1024 || u.suffix == "TiB") {
			return strconv.FormatInt(v/u.mult, 10) + u.suffix
		}
	}
	return strconv.FormatInt(int64(*b), 10)
}

func (b *byteSize) Set(s string) error {
	num, mult := s, int64(1)
	for _, u := range byteUnits {
		if n, ok := strings.CutSuffix(s, u.suffix); ok {
			num, mult = n, u.mult
			break
		}
	}
	v, err := strconv.ParseInt(num, 10, 64)
	if err != nil || num == "" || num[0] == '+' {
		return fmt.Errorf("%q is not a size (an integer of bytes, or with a unit: 512MiB, 1GiB, 2GB)", s)
	}
	if v != 0 && (v > math.MaxInt64/mult || v < math.MinInt64/mult) {
		return fmt.Errorf("%q is too large", s)
	}
	*b = byteSize(v * mult)
	return nil
}

// layoutDefaults fills what the layout implies when it was not given
// (issue 32 item 2: the common case with fewer flags):
//   - dynamic ownership implies --changelog jetstream (what lets a slot
//     move); an explicit --changelog off is still refused;
//   - --partitions defaults to the N of --partition-owner i/N, auto/N or
//     dynamic/N when that is more than 1 (N replicas or slots need at
//     least N partitions).
//
// Flags given keep their value. Defaulted records what was filled, for
// the start's log line.
func layoutDefaults(c *Config, given func(string) bool) {
	owner := c.PartitionOwner
	if strings.HasPrefix(owner, "dynamic") && !given("changelog") {
		c.Changelog = slot.ChangelogJetStream
		c.Defaulted = append(c.Defaulted, "--changelog jetstream (dynamic ownership moves slots through their changelogs)")
	}
	if _, n, ok := strings.Cut(owner, "/"); ok && !given("partitions") {
		if v, err := strconv.Atoi(n); err == nil && v > c.Partitions && v <= 1024 {
			c.Partitions = v
			c.Defaulted = append(c.Defaulted, fmt.Sprintf("--partitions %d (one for each of the %d replicas or slots of --partition-owner %s)", v, v, owner))
		}
	}
}

// ResolveReplicas sets --stream-replicas when it is 0 (auto): the number
// of NATS servers the connection knows (the URLs given and the ones the
// cluster advertised), at most 3. It returns the value and why.
func (c *Config) ResolveReplicas(servers int) (int, string) {
	if c.StreamReplicas > 0 {
		return c.StreamReplicas, "--stream-replicas"
	}
	c.StreamReplicas = min(max(servers, 1), 3)
	return c.StreamReplicas, fmt.Sprintf("--stream-replicas 0 (auto): %d NATS server(s) known, at most 3", servers)
}

// checkListenAddr refuses an address a listener could never take
// ("nonsense", "host:port:x", a port out of 0-65535), so that it exits 2
// with usage rather than 1 once the listener fails.
func checkListenAddr(addr string) error {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("%q: want host:port or :port: %w", addr, err)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
		return fmt.Errorf("%q: the port must be a number from 0 to 65535", addr)
	}
	return nil
}
