package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/telha/telha-cascade/app"
)

type options struct {
	jsonOut       bool
	jsonFile      string
	quick         bool
	requests      int
	naiveRequests int
	publishers    int
	window        int
	tenants       int
	lightRate     int
	lightDuration time.Duration
	mixedDuration time.Duration
	hubEdges      int
	scalingEdges  []int
	// erase_changelog phases: store sizes (MB), erases per size, and the
	// time between two erases.
	erasureStoreMB  []int
	erasureCount    int
	erasureInterval time.Duration
	phases          map[string]bool
	dir             string
	keep            bool
	profileDir      string
	workerLog       bool
	traceFile       string
	waitIdle        time.Duration
	// changelogSyncAlways runs small_changelog against a server of its own
	// that fsyncs every write (what the embedded server does with the
	// changelog on).
	changelogSyncAlways bool
	// read_member phase: slots of the group, readers, time per target.
	memberSlots     int
	readConcurrency int
	readDuration    time.Duration

	// child modes (hidden)
	hubChild string // "hub" or "raw"
}

// The worker's Go processors, without and while a journaled cascade is
// applied (app.SetProcs).
var procsBase, procsCascading int

func main() {
	// The worker's runtime setting (cmd/worker makes the same): every phase
	// runs in this process (or a child that comes here too), so the raw
	// limits are measured with it as well.
	procsBase, procsCascading, _ = app.SetProcs(os.Getenv)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	o, err := parseFlags(args, stderr)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		fmt.Fprintln(stderr, "bench:", err)
		return 2
	}
	if o.hubChild != "" {
		if err := runChild(ctx, o, stdout); err != nil {
			fmt.Fprintln(stderr, "bench child:", err)
			return 1
		}
		return 0
	}
	rep, err := runAll(ctx, o, stderr)
	if rep != nil && o.jsonFile != "" {
		if b, jerr := json.MarshalIndent(rep, "", "  "); jerr == nil {
			if werr := os.WriteFile(o.jsonFile, append(b, '\n'), 0o644); werr != nil && err == nil {
				err = werr
			}
		}
	}
	if rep != nil {
		if o.jsonOut {
			enc := json.NewEncoder(stdout)
			enc.SetIndent("", "  ")
			_ = enc.Encode(rep)
		} else {
			printTable(stdout, rep)
		}
	}
	if err != nil {
		fmt.Fprintln(stderr, "bench:", err)
		return 1
	}
	return 0
}

func parseFlags(args []string, stderr io.Writer) (*options, error) {
	o := &options{}
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: go run ./cmd/bench [--quick] [--json] [flags]\n\nMeasures the worker (small cascades end to end, a super-node cascade) against\nthe raw limits of the same machine; see the package documentation.\n\nflags:")
		fs.PrintDefaults()
	}
	fs.BoolVar(&o.jsonOut, "json", false, "print one JSON object instead of the table")
	fs.StringVar(&o.jsonFile, "json-file", "", "also write the JSON object to this file")
	fs.BoolVar(&o.quick, "quick", false, "smaller run that finishes in under a minute (100k-edge hub)")
	fs.IntVar(&o.requests, "requests", 0, "measured requests of the small, pipeline runs (default 60000, quick 15000)")
	fs.IntVar(&o.naiveRequests, "naive-requests", 0, "measured requests of the naive run (default 15000, quick 5000)")
	fs.IntVar(&o.publishers, "publishers", 32, "concurrent publisher goroutines")
	fs.IntVar(&o.window, "window", 16, "requests each publisher keeps outstanding (awaiting their result)")
	fs.IntVar(&o.tenants, "tenants", 8, "tenants the requests are spread over")
	fs.IntVar(&o.lightRate, "light-rate", 1000, "requests per second of the light-load latency run")
	fs.DurationVar(&o.lightDuration, "light-duration", 0, "length of the light-load run (default 10s, quick 3s)")
	fs.IntVar(&o.hubEdges, "hub-edges", 0, "edges of the hub (default 1000000, quick 100000)")
	fs.DurationVar(&o.mixedDuration, "mixed-duration", 0, "length of the mixed phase's small requests; must outlast the hub's cascade (default 25s, quick 8s)")
	phases := fs.String("phases", "small,small_feed_off,pipeline,naive,mixed,hub", "phases to run (comma-separated subset; \"small_changelog\" (the small phase with --changelog jetstream, issue 21), \"small_changelog_r3\" (the same on an R3 changelog, a 3-server cluster in this process), \"mixed_changelog\" (the mixed phase with --changelog jetstream, on a NATS server of its own), \"scaling\", \"erase\", \"erase_changelog\" (erases beside another tenant's puts on stores of --erasure-store-mb, R1, issue 29) \"erase_changelog_r3\" (the same on a 3-server cluster) and \"read_member\" (reads through a member of 3 against a static replica, and NATS connections per member, issue 30) are not in the default; \"small_feed_off\" is the small phase with --change-feed=false, issue 31)")
	scaling := fs.String("scaling-edges", "100000,1000000,4000000", "hub sizes of the scaling phase (quick: 100000,400000)")
	erasureMB := fs.String("erasure-store-mb", "", "store sizes of the erase_changelog phases, in MB (default 100,1000; quick 20)")
	fs.IntVar(&o.erasureCount, "erasure-count", 5, "erases per store size in the erase_changelog phases (after one warm-up erase)")
	fs.DurationVar(&o.erasureInterval, "erasure-interval", 4*time.Second, "time between two erases in the erase_changelog phases")
	scaling10M := fs.Bool("scaling-10m", false, "add a 10,000,000-edge hub to the scaling phase (minutes, and a few GB of disk)")
	fs.StringVar(&o.dir, "dir", "", "parent of the temporary data directory (default: the system temp dir)")
	fs.BoolVar(&o.keep, "keep", false, "keep the data directory")
	fs.StringVar(&o.profileDir, "profile-dir", "", "write pprof CPU and allocs profiles of the small, pipeline, mixed and hub runs here, and mixed.trace (a 3 s runtime trace in the middle of the mixed phase's cascade)")
	fs.BoolVar(&o.workerLog, "worker-log", false, "echo the worker's log (info and up) to stderr")
	fs.DurationVar(&o.waitIdle, "wait-idle", 0, "before each measured phase, wait up to this long for other processes to use < 0.2 cores")
	fs.StringVar(&o.traceFile, "trace", "", "write a runtime/trace of the small saturation run to this file")
	fs.BoolVar(&o.changelogSyncAlways, "changelog-sync-always", false, "run small_changelog and mixed_changelog against a NATS server of their own with sync_interval: always (as the embedded server runs with --changelog jetstream)")
	fs.IntVar(&o.memberSlots, "member-slots", 0, "slots of the read_member phase's group of 3 members (dynamic/N; default 6, quick 3)")
	fs.IntVar(&o.readConcurrency, "read-concurrency", 16, "concurrent readers of the read_member phase")
	fs.DurationVar(&o.readDuration, "read-duration", 0, "reads per target of the read_member phase (default 10s, quick 3s)")
	fs.StringVar(&o.hubChild, "hub-child", "", "internal: run the hub (hub) or raw Pebble (raw) measurement and print JSON")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	def := func(p *int, full, quick int) {
		if *p <= 0 {
			*p = full
			if o.quick {
				*p = quick
			}
		}
	}
	def(&o.requests, 60_000, 15_000)
	def(&o.naiveRequests, 15_000, 5_000)
	def(&o.hubEdges, 1_000_000, 100_000)
	def(&o.memberSlots, 6, 3)
	if o.readDuration <= 0 {
		o.readDuration = 10 * time.Second
		if o.quick {
			o.readDuration = 3 * time.Second
		}
	}
	if o.readConcurrency < 1 {
		return nil, errors.New("--read-concurrency must be positive")
	}
	if o.lightDuration <= 0 {
		o.lightDuration = 10 * time.Second
		if o.quick {
			o.lightDuration = 3 * time.Second
		}
	}
	if o.mixedDuration <= 0 {
		o.mixedDuration = 25 * time.Second
		if o.quick {
			o.mixedDuration = 8 * time.Second
		}
	}
	if o.publishers < 1 || o.window < 1 || o.tenants < 1 || o.lightRate < 1 {
		return nil, errors.New("--publishers, --window, --tenants and --light-rate must be positive")
	}
	scalingSet := false
	fs.Visit(func(f *flag.Flag) { scalingSet = scalingSet || f.Name == "scaling-edges" })
	if o.quick && !scalingSet {
		*scaling = "100000,400000"
	}
	for _, f := range strings.Split(*scaling, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("--scaling-edges: %q is not a positive number", f)
		}
		o.scalingEdges = append(o.scalingEdges, n)
	}
	if *scaling10M {
		o.scalingEdges = append(o.scalingEdges, 10_000_000)
	}
	if *erasureMB == "" {
		*erasureMB = "100,1000"
		if o.quick {
			*erasureMB = "20"
		}
	}
	for _, f := range strings.Split(*erasureMB, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("--erasure-store-mb: %q is not a positive number", f)
		}
		o.erasureStoreMB = append(o.erasureStoreMB, n)
	}
	if o.erasureCount < 1 || o.erasureInterval <= 0 {
		return nil, fmt.Errorf("--erasure-count must be at least 1 and --erasure-interval positive")
	}
	o.phases = map[string]bool{}
	for _, p := range strings.Split(*phases, ",") {
		p = strings.TrimSpace(p)
		switch p {
		case "small", "small_feed_off", "small_changelog", "small_changelog_r3", "pipeline", "naive", "mixed", "mixed_changelog", "hub", "scaling", "erase", "erase_changelog", "erase_changelog_r3", "read_member":
			o.phases[p] = true
		case "":
		default:
			return nil, fmt.Errorf("--phases: unknown phase %q (want small, small_feed_off, small_changelog, small_changelog_r3, pipeline, naive, mixed, mixed_changelog, hub, scaling, erase, erase_changelog, erase_changelog_r3, read_member)", p)
		}
	}
	if o.profileDir != "" {
		if err := os.MkdirAll(o.profileDir, 0o755); err != nil {
			return nil, err
		}
		abs, err := filepath.Abs(o.profileDir)
		if err != nil {
			return nil, err
		}
		o.profileDir = abs
	}
	return o, nil
}

// progress prints a progress line on stderr.
type progress struct{ w io.Writer }

func (p progress) printf(format string, args ...any) {
	fmt.Fprintf(p.w, "bench: "+format+"\n", args...)
}

func runAll(ctx context.Context, o *options, stderr io.Writer) (*Report, error) {
	pg := progress{stderr}
	started := time.Now()
	rep := newReport(o)
	root, err := os.MkdirTemp(o.dir, "telha-bench-")
	if err != nil {
		return nil, err
	}
	if o.keep {
		pg.printf("data directory %s (kept)", root)
	} else {
		defer os.RemoveAll(root)
	}

	ns, err := startNATS(filepath.Join(root, "nats"))
	if err != nil {
		return nil, err
	}
	defer ns.stop()

	specs := makeSpecs(o)

	if o.phases["small"] {
		if err := runSmall(ctx, o, pg, ns, filepath.Join(root, "worker"), specs, rep); err != nil {
			return rep, fmt.Errorf("small: %w", err)
		}
	}
	if o.phases["small_feed_off"] {
		if err := runSmallWith(ctx, o, pg, ns, filepath.Join(root, "worker-feed-off"), specs, rep.SmallFeedOff, "small_feed_off", []string{"--change-feed=false"}); err != nil {
			return rep, fmt.Errorf("small_feed_off: %w", err)
		}
	}
	if o.phases["small_changelog"] {
		cns := ns
		if o.changelogSyncAlways {
			if cns, err = startNATSWith(filepath.Join(root, "nats-sync"), true); err != nil {
				return rep, err
			}
		}
		err := runSmallChangelog(ctx, o, pg, cns, filepath.Join(root, "worker-changelog"), specs, rep)
		if cns != ns {
			cns.stop()
		}
		if err != nil {
			return rep, fmt.Errorf("small_changelog: %w", err)
		}
	}
	if o.phases["small_changelog_r3"] {
		cl, err := startNATSCluster(filepath.Join(root, "nats-r3"), 3)
		if err != nil {
			return rep, err
		}
		// First local-only on the same cluster (what R3 costs the queue
		// path), then with the changelog (its own cost).
		err = runSmallWith(ctx, o, pg, cl, filepath.Join(root, "worker-r3"), specs, rep.SmallR3, "small_r3",
			[]string{"--stream-replicas", "3"})
		if err == nil {
			err = runSmallWith(ctx, o, pg, cl, filepath.Join(root, "worker-changelog-r3"), specs, rep.SmallChangelogR3, "small_changelog_r3",
				[]string{"--changelog", "jetstream", "--checkpoint-schedule", "@every 1h", "--stream-replicas", "3"})
		}
		cl.stop()
		if err != nil {
			return rep, fmt.Errorf("small_changelog_r3: %w", err)
		}
	}
	if o.phases["pipeline"] {
		if err := runPipeline(ctx, o, pg, ns, filepath.Join(root, "pipeline"), specs, rep); err != nil {
			return rep, fmt.Errorf("pipeline: %w", err)
		}
	}
	if o.phases["naive"] {
		if err := runNaive(ctx, o, pg, ns, filepath.Join(root, "naive"), specs, rep); err != nil {
			return rep, fmt.Errorf("naive: %w", err)
		}
	}
	if o.phases["mixed"] {
		if err := runMixed(ctx, o, pg, ns, filepath.Join(root, "mixed"), specs.mixed, rep); err != nil {
			return rep, fmt.Errorf("mixed: %w", err)
		}
	}
	if o.phases["mixed_changelog"] {
		// A server of its own: the changelog stream of small_changelog,
		// if it ran, belongs to another store.
		cns, err := startNATSWith(filepath.Join(root, "nats-mixed-changelog"), o.changelogSyncAlways)
		if err != nil {
			return rep, err
		}
		err = runMixedChangelog(ctx, o, pg, cns, filepath.Join(root, "mixed-changelog"), specs.mixed, rep)
		cns.stop()
		if err != nil {
			return rep, fmt.Errorf("mixed_changelog: %w", err)
		}
	}
	ns.stop()
	if o.phases["hub"] {
		if err := runHub(ctx, o, pg, root, rep); err != nil {
			return rep, fmt.Errorf("hub: %w", err)
		}
	}
	if o.phases["erase"] {
		if err := runErase(ctx, o, pg, root, rep); err != nil {
			return rep, fmt.Errorf("erase: %w", err)
		}
	}
	for _, r3 := range []bool{false, true} {
		name := map[bool]string{false: "erase_changelog", true: "erase_changelog_r3"}[r3]
		if !o.phases[name] {
			continue
		}
		ph, err := runEraseChangelog(ctx, o, pg, root, r3)
		if r3 {
			rep.EraseChangelogR3 = ph
		} else {
			rep.EraseChangelog = ph
		}
		if err != nil {
			return rep, fmt.Errorf("%s: %w", name, err)
		}
	}
	if o.phases["read_member"] {
		ph, err := runReadMember(ctx, o, pg, filepath.Join(root, "read-member"))
		rep.ReadMember = ph
		if err != nil {
			return rep, fmt.Errorf("read_member: %w", err)
		}
	}
	if o.phases["scaling"] {
		if err := runScaling(ctx, o, pg, root, rep); err != nil {
			return rep, fmt.Errorf("scaling: %w", err)
		}
	}
	rep.finish(time.Since(started))
	pg.printf("done in %s", time.Since(started).Round(100*time.Millisecond))
	return rep, nil
}

// buildInfo returns the VCS revision stamped into the binary, if any.
func buildInfo() (rev string, modified bool, goVersion string) {
	goVersion = runtime.Version()
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown", false, goVersion
	}
	rev = "unknown"
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
			if len(rev) > 12 {
				rev = rev[:12]
			}
		case "vcs.modified":
			modified = s.Value == "true"
		}
	}
	if rev == "unknown" {
		// Built without VCS stamping (-buildvcs=false): ask git, read-only.
		if out, err := exec.Command("git", "rev-parse", "--short=12", "HEAD").Output(); err == nil {
			rev = strings.TrimSpace(string(out))
			if st, err := exec.Command("git", "status", "--porcelain", "--untracked-files=no").Output(); err == nil {
				modified = len(strings.TrimSpace(string(st))) > 0
			}
		}
	}
	return rev, modified, goVersion
}
