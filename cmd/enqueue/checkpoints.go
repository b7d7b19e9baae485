package main

import (
	"archive/tar"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/telha/telha-cascade/internal/sealed"
)

// runCheckpoints is `enqueue checkpoints` (issue 21 item 2: the
// checkpoints are the backup): it lists a layout's checkpoints in the
// Object Store (TELHA_CKPT_STATIC<N>, objects partition-<i>/seq-<n>.tar),
// or copies one out of the cluster into a file (--get NAME --out FILE).
// What --get writes is a tar of a whole Pebble checkpoint (a format-2
// checkpoint's tables fetched into it): `tar -xf FILE -C <data-dir>/pebble`
// restores it (docs/RUNBOOK.md, "Backups").
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
	case *slot < -1 || *slot >= *slots:
		return usageError{fmt.Sprintf("--slot %d: want 0 to %d (of --slots %d)", *slot, *slots-1, *slots)}
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
		keys := func() (jetstream.KeyValue, error) { return c.JetStream().KeyValue(ctx, sealed.KeysBucket(bucket)) }
		if err := copyCheckpoint(ctx, obs, keys, *get, *out); err != nil {
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
		// Base: a tail checkpoint's base (docs/CONTRACT.md); --get
		// copies whole checkpoints only.
		Base string `json:"base,omitempty"`
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
		size := in.Size
		if tb, err := strconv.ParseUint(in.Metadata[metaTablesBytes], 10, 64); err == nil {
			size += tb // format 2: the tables are objects of their own
		}
		r := row{Name: in.Name, Slot: p, Seq: seq, Bytes: size, Modified: in.ModTime.UTC()}
		if in.Metadata[metaFormat] == formatTail {
			r.Base = in.Metadata[metaBase]
		}
		rows = append(rows, r)
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

// metaTablesBytes is the metadata key of a format-2 checkpoint that gives
// the bytes of its tables (package partition writes it).
const metaTablesBytes = "telha-tables-bytes"

// A tail checkpoint (metaFormat formatTail) is its base (metaBase) and
// the write-sets committed after it: not a store a tar can restore.
const (
	metaFormat = "telha-format"
	formatTail = "telha-checkpoint-tail/1"
	metaBase   = "telha-base"
)

// tablesFile is the table list in a format-2 checkpoint's archive
// (docs/CONTRACT.md: the checkpoint bucket): the tables are objects of
// their own, named by their SHA-256.
const tablesFile = "telha-tables.json"

// copyCheckpoint writes checkpoint name into the new file out as one tar
// that `tar -xf` restores whole: a format-1 checkpoint as stored, a
// format-2 one with its tables fetched from their objects (each opened
// with its data key from keys when it is sealed, and checked against its
// size and SHA-256) and without its table list.
func copyCheckpoint(ctx context.Context, obs jetstream.ObjectStore, keys func() (jetstream.KeyValue, error), name, out string) (err error) {
	f, err := os.OpenFile(out, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			_ = os.Remove(out)
		}
	}()
	res, err := obs.Get(ctx, name)
	if err != nil {
		return err
	}
	defer res.Close()
	if info, err := res.Info(); err != nil {
		return err
	} else if info.Metadata[metaFormat] == formatTail {
		return fmt.Errorf("%s is a tail checkpoint (its base %s and the write-sets committed after it, stored by an erase's scrub): "+
			"not a whole store; copy the next scheduled checkpoint, which is whole (its base lacks the write-sets the tail holds, and the changelog no longer has them)", name, info.Metadata[metaBase])
	}
	src, err := openObject(ctx, res, keys) // sealed since DECISIONS 94
	if err != nil {
		return err
	}
	tr, tw := tar.NewReader(src), tar.NewWriter(f)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return fmt.Errorf("read archive: %w", err)
		}
		if hdr.Name == tablesFile {
			if err := copyTables(ctx, obs, keys, tr, tw, hdr); err != nil {
				return err
			}
			continue
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if _, err := io.Copy(tw, tr); err != nil {
			return err
		}
	}
	if _, err := io.Copy(io.Discard, src); err != nil { // the digest is checked at the end
		return fmt.Errorf("read archive: %w", err)
	}
	if err := tw.Close(); err != nil {
		return err
	}
	return f.Sync()
}

// copyTables reads a table list from r and writes every table it names,
// fetched from its object, into tw.
func copyTables(ctx context.Context, obs jetstream.ObjectStore, keys func() (jetstream.KeyValue, error), r io.Reader, tw *tar.Writer, list *tar.Header) error {
	var tl struct {
		Format int `json:"format"`
		Tables []struct {
			Name   string `json:"name"`
			Object string `json:"object"`
			Size   int64  `json:"size"`
			SHA256 string `json:"sha256"`
		} `json:"tables"`
	}
	if err := json.NewDecoder(r).Decode(&tl); err != nil || tl.Format != 2 {
		return fmt.Errorf("table list: format %d: %v", tl.Format, err)
	}
	for _, t := range tl.Tables {
		if !strings.HasSuffix(t.Name, ".sst") || strings.ContainsAny(t.Name, "/\\") || t.Size < 0 {
			return fmt.Errorf("table list names %q", t.Name)
		}
		res, err := obs.Get(ctx, t.Object)
		if err != nil {
			return fmt.Errorf("table %s: %w", t.Name, err)
		}
		var src io.Reader = res
		if src, err = openObject(ctx, res, keys); err != nil {
			res.Close()
			return fmt.Errorf("table %s: %w", t.Name, err)
		}
		hdr := &tar.Header{Name: t.Name, Mode: 0o644, Size: t.Size, ModTime: list.ModTime, Typeflag: tar.TypeReg}
		if err := tw.WriteHeader(hdr); err != nil {
			res.Close()
			return err
		}
		h := sha256.New()
		n, err := io.Copy(io.MultiWriter(tw, h), io.LimitReader(src, t.Size+1))
		res.Close()
		if err != nil {
			return fmt.Errorf("table %s: %w", t.Name, err)
		}
		if n != t.Size || hex.EncodeToString(h.Sum(nil)) != t.SHA256 {
			return fmt.Errorf("table %s: %d bytes of SHA-256 %x, want %d bytes of %s", t.Name, n, h.Sum(nil), t.Size, t.SHA256)
		}
	}
	return nil
}

// openObject returns the plaintext of the object res (a table, or a
// checkpoint's archive): as stored, or opened with its data key when it is
// sealed (docs/CONTRACT.md).
func openObject(ctx context.Context, res jetstream.ObjectResult, keys func() (jetstream.KeyValue, error)) (io.Reader, error) {
	info, err := res.Info()
	if err != nil {
		return nil, err
	}
	format := info.Metadata[sealed.Meta]
	if format == "" {
		return res, nil
	}
	kv, err := keys()
	if err != nil {
		return nil, fmt.Errorf("sealed, and its key bucket: %w", err)
	}
	return sealed.Open(ctx, kv, info.Name, format, res)
}
