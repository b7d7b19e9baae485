package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// runCheckpoints is `enqueue checkpoints` (issue 21 item 2: the
// checkpoints are the backup): it lists a layout's checkpoints in the
// Object Store (TELHA_CKPT_STATIC<N>, objects partition-<i>/seq-<n>.tar),
// or copies one out of the cluster into a file (--get NAME --out FILE).
// A checkpoint is a tar of a Pebble checkpoint: `tar -xf FILE -C
// <data-dir>/pebble` restores it (docs/RUNBOOK.md, "Backups").
func runCheckpoints(ctx context.Context, g *globals, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("checkpoints", flag.ContinueOnError)
	fs.SetOutput(stderr)
	slots := fs.Int("slots", 0, "N of the layout: the replicas of i/N, or the slots of dynamic/N (required)")
	slot := fs.Int("slot", -1, "list only slot (replica) i's checkpoints")
	get := fs.String("get", "", "copy this checkpoint (its name, as listed) into --out")
	out := fs.String("out", "", "with --get: the file to write (it must not exist)")
	pos, err := parseConn(fs, g, args)
	if err != nil {
		return err
	}
	switch {
	case len(pos) > 0:
		return usageError{"checkpoints takes no arguments"}
	case *slots < 1:
		return usageError{"checkpoints needs --slots N (the N of --partition-owner i/N or dynamic/N)"}
	case (*get == "") != (*out == ""):
		return usageError{"--get and --out go together"}
	}
	nc, c, err := connect(g)
	if err != nil {
		return err
	}
	defer nc.Close()
	bucket := fmt.Sprintf("TELHA_CKPT_STATIC%d", *slots)
	obs, err := c.JetStream().ObjectStore(ctx, bucket)
	if err != nil {
		return fmt.Errorf("bucket %s: %w", bucket, err)
	}
	if *get != "" {
		if err := obs.GetFile(ctx, *get, *out); err != nil {
			return fmt.Errorf("copy %s out of %s: %w", *get, bucket, err)
		}
		fmt.Fprintf(stdout, `{"name":%q,"out":%q}`+"\n", *get, *out)
		return nil
	}
	infos, err := obs.List(ctx)
	if errors.Is(err, jetstream.ErrNoObjectsFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("list %s: %w", bucket, err)
	}
	type row struct {
		Name     string    `json:"name"`
		Slot     int       `json:"slot"`
		Seq      uint64    `json:"seq"`
		Bytes    uint64    `json:"bytes"`
		Modified time.Time `json:"modified"`
	}
	var rows []row
	for _, in := range infos {
		if in.Deleted {
			continue
		}
		p, seq, ok := parseCheckpointName(in.Name)
		if !ok || (*slot >= 0 && p != *slot) {
			continue
		}
		rows = append(rows, row{Name: in.Name, Slot: p, Seq: seq, Bytes: in.Size, Modified: in.ModTime.UTC()})
	}
	sort.Slice(rows, func(i, j int) bool {
		if rows[i].Slot != rows[j].Slot {
			return rows[i].Slot < rows[j].Slot
		}
		return rows[i].Seq < rows[j].Seq
	})
	enc := json.NewEncoder(stdout)
	for _, r := range rows {
		if err := enc.Encode(r); err != nil {
			return err
		}
	}
	return nil
}

// parseCheckpointName reads partition-<i>/seq-<n>.tar (the name
// package partition gives a checkpoint; this command links no Pebble).
func parseCheckpointName(name string) (slot int, seq uint64, ok bool) {
	a, b, found := strings.Cut(name, "/")
	if !found || !strings.HasPrefix(a, "partition-") || !strings.HasPrefix(b, "seq-") || !strings.HasSuffix(b, ".tar") {
		return 0, 0, false
	}
	p, err1 := strconv.Atoi(strings.TrimPrefix(a, "partition-"))
	n, err2 := strconv.ParseUint(strings.TrimSuffix(strings.TrimPrefix(b, "seq-"), ".tar"), 10, 64)
	return p, n, err1 == nil && err2 == nil && p >= 0
}
