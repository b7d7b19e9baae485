package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"regexp"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/telha/telha-cascade/member"
	"github.com/telha/telha-cascade/queue/client"
)

// runDLQ is `enqueue dlq list|show|retry|discard`.
func runDLQ(ctx context.Context, g *globals, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return usageError{"dlq needs a command: list, show SEQ, retry SEQ or discard SEQ (enqueue dlq -h)"}
	}
	sub, rest := args[0], args[1:]
	switch sub {
	case "-h", "-help", "--help", "help":
		fmt.Fprint(stderr, dlqUsage)
		return flag.ErrHelp
	}
	fs := flag.NewFlagSet("dlq "+sub, flag.ContinueOnError)
	fs.SetOutput(stderr)
	stream := fs.String("stream", "TELHA_DLQ", "the dead-letter stream")
	tenant := fs.String("tenant", "", "list: only this tenant's dead letters")
	reason := fs.String("reason", "", "list: only dead letters with this reason")
	limit := fs.Int("limit", 100, "list: at most this many, newest first")
	format := fs.String("format", "auto", "list: table (for people), json (JSON lines, for scripts), or auto: a table on a terminal, JSON lines otherwise")
	force := fs.Bool("force", false, "retry: republish even a dead letter refused as malformed (decode, invalid, tenant_mismatch, too_large, conflict), which fails again as it is")
	pos, err := parseConn(fs, g, rest)
	if err != nil {
		return err
	}
	var seq uint64
	switch sub {
	case "list":
		if len(pos) > 0 {
			return usageError{"dlq list takes no arguments"}
		}
		if *limit < 1 {
			return usageError{fmt.Sprintf("--limit %d: want at least 1", *limit)}
		}
		if *tenant != "" && !client.ValidTenant(*tenant) {
			return usageError{fmt.Sprintf("--tenant %q must match ^[a-z0-9][a-z0-9_-]{0,62}$", *tenant)}
		}
		switch *format {
		case "auto", "table", "json":
		default:
			return usageError{fmt.Sprintf("--format %q: want table, json or auto", *format)}
		}
	case "show", "retry", "discard":
		if len(pos) != 1 {
			return usageError{fmt.Sprintf("dlq %s takes the dead letter's SEQ (see dlq list)", sub)}
		}
		n, err := strconv.ParseUint(pos[0], 10, 64)
		if err != nil || n == 0 {
			return usageError{fmt.Sprintf("SEQ %q must be a positive number (see dlq list)", pos[0])}
		}
		seq = n
	default:
		return usageError{fmt.Sprintf("unknown dlq command %q (list, show, retry, discard)", sub)}
	}
	nc, c, err := connect(g)
	if err != nil {
		return err
	}
	defer nc.Close()
	js := c.JetStream()
	s, err := js.Stream(ctx, *stream)
	if err != nil {
		return fmt.Errorf("stream %s: %w", *stream, err)
	}
	enc := json.NewEncoder(stdout)
	if seq != 0 {
		// Look first, so a sequence the stream does not hold is answered
		// in words for every command (a delete of one answers a bare
		// "stream store EOF").
		if _, err := s.GetMsg(ctx, seq); err != nil {
			return missing(err, seq, *stream)
		}
	}
	switch sub {
	case "list":
		out, total, err := client.ListDeadLetters(ctx, s, g.prefix, client.DeadLetterFilter{Tenant: *tenant, Reason: *reason, Limit: *limit})
		if err != nil {
			return err
		}
		if *format == "table" || (*format == "auto" && isTerminal(stdout)) {
			printDeadLetterTable(stdout, out)
		} else {
			for _, d := range out {
				_ = enc.Encode(d)
			}
		}
		if *tenant != "" {
			fmt.Fprintf(stderr, "%d dead letters shown (of %d of tenant %s in %s)\n", len(out), total, *tenant, *stream)
		} else {
			fmt.Fprintf(stderr, "%d dead letters shown (of %d in %s)\n", len(out), total, *stream)
		}
		return nil
	case "show":
		m, err := s.GetMsg(ctx, seq)
		if err != nil {
			return missing(err, seq, *stream)
		}
		return enc.Encode(client.DeadLetterOf(m, g.prefix, true))
	case "retry":
		m, err := s.GetMsg(ctx, seq)
		if err != nil {
			return missing(err, seq, *stream)
		}
		if d := client.DeadLetterOf(m, g.prefix, false); refusedAsIs[d.Reason] && !*force {
			// The same body is refused again at once, and dead-lettered again
			// (issue 32 item 7): say so instead of looping it.
			// A conflict's request id is taken (its first request's answer
			// stands): the new request needs a new id (RUNBOOK).
			instead := "publish a corrected request under its request id instead"
			if d.Reason == "conflict" {
				instead = "publish the new request under a new request id instead (this one is taken: its first request's answer stands)"
			}
			return usageError{fmt.Sprintf("dead letter %d was refused as %s (%s): republished as it is, it is refused again at once; "+
				"%s, or pass --force to republish it anyway", seq, d.Reason, shorten(d.Error, 200), instead)}
		}
		r, err := client.RetryDeadLetter(ctx, js, s, g.prefix, seq)
		if err != nil {
			return missing(err, seq, *stream)
		}
		return enc.Encode(r)
	case "discard":
		if err := client.DiscardDeadLetter(ctx, s, seq); err != nil {
			return missing(err, seq, *stream)
		}
		return enc.Encode(map[string]any{"discarded": seq})
	}
	return nil
}

// refusedAsIs are the dead-letter reasons whose body the worker refuses
// again as it is (queue/request.go); the others (retries_exhausted,
// crash_loop, wrong_partition) may succeed on a retry.
var refusedAsIs = map[string]bool{"decode": true, "invalid": true, "tenant_mismatch": true, "too_large": true, "conflict": true}

func shorten(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

const dlqUsage = `usage: enqueue dlq <command> [flags]

commands:
  list                 the dead letters, newest first (--tenant, --reason,
                       --limit; --format table|json|auto)
  show SEQ             one dead letter with its headers and body (JSON)
  retry SEQ            republish its payload to the request subject of its
                       own tenant, then remove it (a dead letter refused as
                       malformed only with --force: it would fail again)
  discard SEQ          remove it

SEQ is the dead letter's sequence in the stream (dlq list shows it).
enqueue dlq <command> -h lists a command's flags.
`

// missing turns the stream's answer for a sequence it does not hold (a
// "no message found" API error) into words.
func missing(err error, seq uint64, stream string) error {
	var apiErr *jetstream.APIError
	if errors.Is(err, jetstream.ErrMsgNotFound) || (errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeMessageNotFound) {
		return fmt.Errorf("dead letter %d is not in %s (already retried or discarded? see enqueue dlq list): %w", seq, stream, err)
	}
	return err
}

// printDeadLetterTable writes dead letters as an aligned table.
func printDeadLetterTable(w io.Writer, ds []client.DeadLetter) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SEQ\tTIME\tTENANT\tREASON\tREQUEST\tDELIVERIES\tERROR")
	for _, d := range ds {
		req := d.RequestID
		if req == "" {
			req = d.MsgID
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\n", d.Seq, d.Time, d.Tenant, d.Reason, clip(req, 40), d.Deliveries, clip(d.Error, 80))
	}
	_ = tw.Flush()
}

// clip shortens s to n runes for a table cell, on one line.
func clip(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if r := []rune(s); len(r) > n {
		return string(r[:n-1]) + "…"
	}
	return s
}

// isTerminal reports whether w is a character device (a person's terminal).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

var partitionRE = regexp.MustCompile(`\{\{\s*partition\(\s*(\d+)\s*,`)

// runOwner is `enqueue owner --tenant T`: which partition holds the
// tenant's requests, and which replica (consumer telha-worker-<i>) owns it.
func runOwner(ctx context.Context, g *globals, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("owner", flag.ContinueOnError)
	fs.SetOutput(stderr)
	tenant := fs.String("tenant", "", "tenant (required)")
	stream := fs.String("stream", "TELHA_REQ", "the request stream")
	if _, err := parseConn(fs, g, args); err != nil {
		return err
	}
	if !client.ValidTenant(*tenant) {
		return usageError{fmt.Sprintf("--tenant %q must match ^[a-z0-9][a-z0-9_-]{0,62}$", *tenant)}
	}
	nc, c, err := connect(g)
	if err != nil {
		return err
	}
	defer nc.Close()
	s, err := c.JetStream().Stream(ctx, *stream)
	if err != nil {
		return fmt.Errorf("stream %s: %w", *stream, err)
	}
	p := 1
	if st := s.CachedInfo().Config.SubjectTransform; st != nil {
		if m := partitionRE.FindStringSubmatch(st.Destination); m != nil {
			p, _ = strconv.Atoi(m[1])
		}
	}
	replicas := 0
	names := s.ConsumerNames(ctx)
	for name := range names.Name() {
		if i, err := strconv.Atoi(strings.TrimPrefix(name, "telha-worker-")); err == nil && strings.HasPrefix(name, "telha-worker-") {
			replicas = max(replicas, i+1)
		}
	}
	part := client.Partition(*tenant, p)
	out := map[string]any{"tenant": *tenant, "partitions": p, "partition": part, "replicas": replicas,
		"rule": "partition = fnv1a32(tenant) % partitions; replica i of N owns the partitions p with p % N == i"}
	if replicas > 0 {
		out["replica"] = part % replicas
		out["consumer"] = fmt.Sprintf("telha-worker-%d", part%replicas)
		// Dynamic ownership (issue 30): the slot's owner is whoever the
		// group assigned it to, not replica i.
		if dyn, err := dynamicOwner(ctx, c.JetStream(), replicas, part%replicas); err != nil {
			return err
		} else if dyn != nil {
			delete(out, "replica")
			for k, v := range dyn {
				out[k] = v
			}
			out["rule"] = "partition = fnv1a32(tenant) % partitions; slot = partition % slots; the slot's owner is the member " +
				member.OwnersBucket(replicas) + " assigns it to (it moves between live members)"
		}
	}
	return json.NewEncoder(stdout).Encode(out)
}

// dynamicOwner reads slot s's assignment in a dynamic layout of n slots
// (nil when the layout is static: no TELHA_OWNERS_<n> bucket): the slot,
// its owner, the owner's URL, its epoch and standbys.
func dynamicOwner(ctx context.Context, js jetstream.JetStream, n, s int) (map[string]any, error) {
	owners, err := js.KeyValue(ctx, member.OwnersBucket(n))
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("bucket %s: %w", member.OwnersBucket(n), err)
	}
	out := map[string]any{"mode": "dynamic", "slots": n, "slot": s}
	e, err := owners.Get(ctx, fmt.Sprintf("slot-%d", s))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		out["owner"] = nil // not assigned yet: no member has joined
		return out, nil
	}
	if err != nil {
		return nil, fmt.Errorf("bucket %s: slot %d: %w", member.OwnersBucket(n), s, err)
	}
	var a member.Assignment
	if err := json.Unmarshal(e.Value(), &a); err != nil {
		return nil, fmt.Errorf("bucket %s: slot %d: %w", member.OwnersBucket(n), s, err)
	}
	out["owner"], out["epoch"], out["standbys"] = a.Owner, a.Epoch, a.Standbys
	if members, err := js.KeyValue(ctx, member.MembersBucket); err == nil && a.Owner != "" {
		if me, err := members.Get(ctx, a.Owner); err == nil {
			var m member.Member
			if json.Unmarshal(me.Value(), &m) == nil {
				out["owner_url"] = m.URL
			}
		} else if errors.Is(err, jetstream.ErrKeyNotFound) {
			out["owner_live"] = false // its record expired: the slot is about to move
		}
	}
	return out, nil
}
