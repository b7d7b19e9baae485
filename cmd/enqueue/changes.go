package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/telha/telha-cascade/queue/client"
)

// runChanges is `enqueue changes` (issue 31): a tenant's change feed as
// JSON lines (client.Change), from the start of what TELHA_CHG keeps, a
// tx_time (--from) or a stream sequence (--from-seq). It stops when it has
// caught up, or follows the feed with --follow; with --durable the
// position survives (the next run with the same name resumes after the
// last change printed).
func runChanges(ctx context.Context, g *globals, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("changes", flag.ContinueOnError)
	fs.SetOutput(stderr)
	tenant := fs.String("tenant", "", "the tenant whose feed to print (required)")
	from := fs.String("from", "", "start at this tx_time (RFC 3339): every change with a tx_time at or after it, and the erases stored from about then on (an erase's tx_time, its entity's death, may be older)")
	fromSeq := fs.Uint64("from-seq", 0, "start at this stream sequence (a change's seq)")
	durable := fs.String("durable", "", "a durable consumer name: the next run with it resumes after the last change printed")
	follow := fs.Bool("follow", false, "keep printing new changes until interrupted")
	withSeq := fs.Bool("seq", false, `print each change as {"seq", "change"} (the seq --from-seq takes)`)
	pos, err := parseConn(fs, g, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usageError{"changes takes no arguments (--tenant T)"}
	}
	if *tenant == "" {
		return usageError{"changes needs --tenant"}
	}
	if !client.ValidTenant(*tenant) {
		return usageError{fmt.Sprintf("--tenant %q must match ^[a-z0-9][a-z0-9_-]{0,62}$ (no wildcard: a tenant reads its own feed)", *tenant)}
	}
	if *from != "" && *fromSeq > 0 {
		return usageError{"--from and --from-seq contradict each other: give one"}
	}
	cfg := client.ChangesConfig{Prefix: g.prefix, Tenant: *tenant, Durable: *durable, FromSeq: *fromSeq}
	if *from != "" {
		t, err := time.Parse(time.RFC3339Nano, *from)
		if err != nil {
			return usageError{fmt.Sprintf("--from %q is not an RFC 3339 time (2026-12-05T10:00:00Z)", *from)}
		}
		cfg.From = t
	}
	nc, c, err := connect(g)
	if err != nil {
		return err
	}
	defer nc.Close()
	r, err := c.OpenChanges(ctx, cfg)
	if err != nil {
		return err
	}
	defer r.Close()
	if !*follow {
		if n, err := r.Pending(ctx); err == nil && n == 0 {
			return nil
		}
	}
	enc := json.NewEncoder(stdout)
	for {
		m, err := r.Next(ctx)
		if errors.Is(err, context.Canceled) {
			return nil // interrupted
		}
		if err != nil && m == nil {
			return err
		}
		if err != nil { // not a change: say so, and go on
			fmt.Fprintln(stderr, "enqueue:", err)
		} else if *withSeq {
			_ = enc.Encode(struct {
				Seq    uint64        `json:"seq"`
				Change client.Change `json:"change"`
			}{m.Seq, m.Change})
		} else {
			_ = enc.Encode(m.Change)
		}
		if err := m.Ack(); err != nil {
			return fmt.Errorf("ack change %d: %w", m.Seq, err)
		}
		if !*follow && m.Pending == 0 {
			return nil
		}
	}
}
