package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"regexp"
	"strconv"
	"strings"

	"github.com/telha/telha-cascade/queue/client"
)

// runDLQ is `enqueue dlq list|show|retry|discard`.
func runDLQ(ctx context.Context, g *globals, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return usageError{"dlq needs a command: list, show SEQ, retry SEQ or discard SEQ"}
	}
	sub, rest := args[0], args[1:]
	fs := flag.NewFlagSet("dlq "+sub, flag.ContinueOnError)
	fs.SetOutput(stderr)
	stream := fs.String("stream", "TELHA_DLQ", "the dead-letter stream")
	tenant := fs.String("tenant", "", "list: only this tenant's dead letters")
	reason := fs.String("reason", "", "list: only dead letters with this reason")
	limit := fs.Int("limit", 100, "list: at most this many, newest first")
	pos, err := parseSub(fs, g, rest)
	if err != nil {
		return err
	}
	var seq uint64
	switch sub {
	case "list":
		if len(pos) > 0 {
			return usageError{"dlq list takes no arguments"}
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
	switch sub {
	case "list":
		out, total, err := client.ListDeadLetters(ctx, s, g.prefix, client.DeadLetterFilter{Tenant: *tenant, Reason: *reason, Limit: *limit})
		if err != nil {
			return err
		}
		for _, d := range out {
			_ = enc.Encode(d)
		}
		fmt.Fprintf(stderr, "%d dead letters shown (of %d in %s)\n", len(out), total, *stream)
		return nil
	case "show":
		m, err := s.GetMsg(ctx, seq)
		if err != nil {
			return fmt.Errorf("dead letter %d: %w", seq, err)
		}
		return enc.Encode(client.DeadLetterOf(m, g.prefix, true))
	case "retry":
		r, err := client.RetryDeadLetter(ctx, js, s, g.prefix, seq)
		if err != nil {
			return err
		}
		return enc.Encode(r)
	case "discard":
		if err := client.DiscardDeadLetter(ctx, s, seq); err != nil {
			return err
		}
		return enc.Encode(map[string]any{"discarded": seq})
	}
	return nil
}

var partitionRE = regexp.MustCompile(`\{\{\s*partition\(\s*(\d+)\s*,`)

// runOwner is `enqueue owner --tenant T`: which partition holds the
// tenant's requests, and which replica (consumer telha-worker-<i>) owns it.
func runOwner(ctx context.Context, g *globals, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("owner", flag.ContinueOnError)
	fs.SetOutput(stderr)
	tenant := fs.String("tenant", "", "tenant (required)")
	stream := fs.String("stream", "TELHA_REQ", "the request stream")
	if _, err := parseSub(fs, g, args); err != nil {
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
	}
	return json.NewEncoder(stdout).Encode(out)
}
