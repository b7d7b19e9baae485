package partition

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/telha/telha-cascade/internal/attempt"
)

// Tables as objects (checkpoint format 2, issue 29).
//
// Invariant (content addressing): the object TableObject(p, d) holds
// exactly the bytes whose SHA-256 is d. So an object is uploaded once and
// shared by every checkpoint that holds the table, a save uploads only the
// tables written since the previous save, and a restore checks each
// table's digest as it writes it.
//
// Invariant (collection): a table object is deleted only when no stored
// checkpoint's table list (TablesName) names it. Saves and collections of
// one partition run one at a time (the changelog's owner serialises them);
// a save cut short leaves tables no list names, which the next collection
// deletes. Every delete is a secure one (DeleteObject): a table that held a
// value erased later must not outlive its last checkpoint in a block file.

// tablesFile is the table list's name inside a format-2 archive.
const tablesFile = "telha-tables.json"

// tableList is a checkpoint's table list.
type tableList struct {
	Format int          `json:"format"`
	Tables []tableEntry `json:"tables"`
}

type tableEntry struct {
	Name   string `json:"name"`   // the file's name in the Pebble directory
	Object string `json:"object"` // TableObject(p, SHA256)
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256"`
}

// TableObject is the object name of partition p's table with SHA-256 d
// (hex).
func TableObject(p int, d string) string { return fmt.Sprintf("partition-%d/sst/%s.sst", p, d) }

// TablesName is the object name of the table list of partition p's
// checkpoint at seq.
func TablesName(p int, seq uint64) string {
	return fmt.Sprintf("partition-%d/seq-%020d.tables", p, seq)
}

func isTable(name string) bool {
	return strings.HasSuffix(name, ".sst") && !strings.ContainsRune(name, '/')
}

// TableDigests caches table digests across the saves of one open store: a
// table file is immutable and its name is never reused while the store is
// open, so its digest is computed once. Reset it when the store reopens.
type TableDigests struct {
	mu sync.Mutex
	m  map[string]string // name + "/" + size -> hex SHA-256
}

func (t *TableDigests) get(key string) (string, bool) {
	if t == nil {
		return "", false
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	d, ok := t.m[key]
	return d, ok
}

func (t *TableDigests) put(key, d string) {
	if t == nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.m == nil {
		t.m = make(map[string]string)
	}
	t.m[key] = d
}

// Reset forgets every digest (the store was closed and opened again).
func (t *TableDigests) Reset() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.m = nil
}

type uploaded struct {
	tables        []tableEntry
	total         uint64 // bytes of every table
	uploaded      int
	uploadedBytes uint64
	stored        map[string]bool   // the partition's table objects in the bucket after
	sizes         map[string]uint64 // each table object uploaded, by its stored size
}

// uploadTables stores every table of the checkpoint in dir that the
// bucket does not hold yet: what stored names (when not nil), or else a
// listing of the bucket.
func uploadTables(ctx context.Context, obs jetstream.ObjectStore, p int, dir string, cache *TableDigests, chunk uint32, rate int64, stored map[string]bool) (uploaded, error) {
	var up uploaded
	entries, err := os.ReadDir(dir)
	if err != nil {
		return up, err
	}
	have := maps.Clone(stored)
	if have == nil {
		if have, err = objectNames(ctx, obs, fmt.Sprintf("partition-%d/sst/", p)); err != nil {
			return up, err
		}
	}
	up.stored = have
	var news []tableEntry // to upload
	var newBytes int64
	for _, e := range entries {
		if !isTable(e.Name()) {
			continue
		}
		info, err := e.Info()
		if err != nil {
			return up, err
		}
		key := fmt.Sprintf("%s/%d", e.Name(), info.Size())
		d, ok := cache.get(key)
		if !ok {
			if d, err = digestFile(filepath.Join(dir, e.Name())); err != nil {
				return up, err
			}
			cache.put(key, d)
		}
		t := tableEntry{Name: e.Name(), Object: TableObject(p, d), Size: info.Size(), SHA256: d}
		up.tables = append(up.tables, t)
		up.total += uint64(info.Size())
		if !have[t.Object] {
			have[t.Object] = true // a table listed twice is uploaded once
			news = append(news, t)
			newBytes += t.Size
		}
	}
	pace := newPace(rate, newBytes)
	up.sizes = map[string]uint64{}
	for _, t := range news {
		size, err := uploadTable(ctx, obs, filepath.Join(dir, t.Name), t.Object, chunk, pace)
		if err != nil {
			return up, fmt.Errorf("upload table %s: %w", t.Name, err)
		}
		up.sizes[t.Object] = size
		up.uploaded++
		up.uploadedBytes += uint64(t.Size)
	}
	return up, nil
}

// uploadTable stores the table at path as object obj (putObject: sealed
// with a new data key when obs is a *Bucket), at pace (nil: unpaced).
func uploadTable(ctx context.Context, obs jetstream.ObjectStore, path, obj string, chunk uint32, pace *pace) (uint64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	var r io.Reader = f
	if pace != nil {
		r = &pacedReader{ctx: ctx, r: r, pace: pace}
	}
	uctx, done := uploadContext(ctx)
	defer done()
	info, err := putObject(uctx, obs, jetstream.ObjectMeta{Name: obj, Opts: &jetstream.ObjectMetaOptions{ChunkSize: chunk}}, r)
	if err != nil {
		return 0, err
	}
	return info.Size, nil
}

func digestFile(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// objectNames lists the live objects whose names start with prefix.
func objectNames(ctx context.Context, obs jetstream.ObjectStore, prefix string) (map[string]bool, error) {
	l, err := List(ctx, obs)
	if err != nil {
		return nil, err
	}
	return l.names(prefix), nil
}

// DefaultChunkSize is the Object Store's own chunk size, used when
// SaveOptions.ChunkSize is 0.
const DefaultChunkSize = 128 << 10

// ChunkSizeFor returns the chunk size to store objects with over a
// connection whose max payload is maxPayload: the largest a message may
// carry, less room for headers. Fewer chunks make a secure delete cheaper:
// the server rewrites a block file (up to 8 MB) for each chunk it
// overwrites (erase.go).
func ChunkSizeFor(maxPayload int64) uint32 {
	if maxPayload <= 2*headerRoom+DefaultChunkSize {
		return DefaultChunkSize
	}
	return uint32(min(maxPayload-2*headerRoom, 64<<20))
}

// fetchTables completes a format-2 archive extracted into dir: it reads
// the table list, fetches every table into dir and checks its size and
// digest. A format-1 archive (no list) holds its tables already.
func fetchTables(ctx context.Context, obs jetstream.ObjectStore, p int, dir string) error {
	raw, err := os.ReadFile(filepath.Join(dir, tablesFile))
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	list, err := decodeTableList(raw)
	if err != nil {
		return err
	}
	for _, t := range list.Tables {
		if err := fetchTable(ctx, obs, t, filepath.Join(dir, t.Name)); err != nil {
			return fmt.Errorf("table %s (%s): %w", t.Name, t.Object, err)
		}
	}
	return os.Remove(filepath.Join(dir, tablesFile))
}

// decodeTableList decodes and checks a table list: names that stay in the
// directory and are tables, objects named by their digests.
func decodeTableList(raw []byte) (tableList, error) {
	var list tableList
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&list); err != nil {
		return tableList{}, fmt.Errorf("%w: table list: %w", ErrCorrupt, err)
	}
	if list.Format != 2 {
		return tableList{}, fmt.Errorf("%w: table list of format %d", ErrCorrupt, list.Format)
	}
	seen := map[string]bool{}
	for _, t := range list.Tables {
		d, err := hex.DecodeString(t.SHA256)
		if !isTable(t.Name) || !filepath.IsLocal(t.Name) || seen[t.Name] || err != nil || len(d) != sha256.Size || t.Size < 0 ||
			!strings.HasSuffix(t.Object, "/sst/"+t.SHA256+".sst") {
			return tableList{}, fmt.Errorf("%w: table list entry %+v", ErrCorrupt, t)
		}
		seen[t.Name] = true
	}
	return list, nil
}

func fetchTable(ctx context.Context, obs jetstream.ObjectStore, t tableEntry, path string) error {
	r, err := openObject(ctx, obs, t.Object)
	if err != nil {
		return err
	}
	defer r.Close()
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(f, h), r)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	if n != t.Size || hex.EncodeToString(h.Sum(nil)) != t.SHA256 {
		return fmt.Errorf("%w: %d bytes of digest %x, want %d bytes of %s", ErrCorrupt, n, h.Sum(nil), t.Size, t.SHA256)
	}
	return nil
}

// CollectTables deletes, securely, every table object of partition p that
// no stored checkpoint's table list names, and returns how many it deleted
// and their bytes. A format-2 checkpoint whose list cannot be read stops
// the collection (nothing is deleted on a guess).
func CollectTables(ctx context.Context, js jetstream.JetStream, obs jetstream.ObjectStore, bucket string, p int) (n int, size uint64, err error) {
	l, err := List(ctx, obs)
	if err != nil {
		return 0, 0, fmt.Errorf("partition %d: %w", p, err)
	}
	deleted, size, err := CollectTablesIn(ctx, js, obs, bucket, p, l.Checkpoints(p), l, nil)
	return len(deleted), size, err
}

// CollectTablesIn is CollectTables for a caller that listed the bucket
// once (l) and serialises every save and delete of partition p since:
// cps are the checkpoints stored now, and stored the table objects
// uploaded since the listing (a save's CheckpointInfo.Stored; nil if
// none), whose data keys are live though l does not show them. It deletes
// the unlisted tables side by side (deleteConcurrency at a time): most
// are sealed, and each delete is a few round trips. deleted names the
// objects it deleted.
func CollectTablesIn(ctx context.Context, js jetstream.JetStream, obs jetstream.ObjectStore, bucket string, p int, cps []CheckpointInfo, l Listing, stored map[string]bool) (deleted []string, size uint64, err error) {
	keep := map[string]bool{}
	for _, cp := range cps {
		raw, err := ReadObject(ctx, obs, TablesName(p, cp.Seq))
		if errors.Is(err, jetstream.ErrObjectNotFound) {
			continue // format 1 (its tables are inside it), or a tail
		}
		if err != nil {
			return nil, 0, fmt.Errorf("partition %d: table list of %s: %w", p, cp.Name, err)
		}
		list, err := decodeTableList(raw)
		if err != nil {
			return nil, 0, fmt.Errorf("partition %d: table list of %s: %w", p, cp.Name, err)
		}
		for _, t := range list.Tables {
			keep[t.Object] = true
		}
	}
	prefix := fmt.Sprintf("partition-%d/", p)
	var doomed []*jetstream.ObjectInfo
	for _, o := range l {
		if o.Deleted || keep[o.Name] || !strings.HasPrefix(o.Name, prefix) {
			continue
		}
		rest := strings.TrimPrefix(o.Name, prefix)
		orphanList := strings.HasSuffix(rest, ".tables") && !listed(cps, o.Name, p)
		if !strings.HasPrefix(rest, "sst/") && !orphanList {
			continue
		}
		doomed = append(doomed, o)
	}
	if err := DeleteEach(ctx, len(doomed), func(ctx context.Context, i int) error {
		return DeleteObject(ctx, js, obs, bucket, doomed[i].Name)
	}); err != nil {
		return nil, 0, err
	}
	for _, o := range doomed {
		deleted = append(deleted, o.Name)
		size += o.Size
	}
	if b, ok := obs.(*Bucket); ok {
		// A key of the partition whose object is not in the bucket: an
		// upload cut short after its key was stored (a table, or an archive,
		// table list or tail whose sealed chunks a killed process left in
		// the stream: with the key gone, no one can read them), or a delete
		// cut short after its key's destruction.
		live := maps.Clone(stored)
		if live == nil {
			live = map[string]bool{}
		}
		for _, o := range l {
			live[o.Name] = live[o.Name] || !o.Deleted
		}
		// Every table a kept checkpoint names, whatever l says: a listing
		// read from a replica that lags behind the stream's leader (the
		// server places its consumer on any replica) misses what was
		// stored lately, and the older kept checkpoints' tables need not
		// be in stored.
		for name := range keep {
			live[name] = true
		}
		var newest uint64
		for _, cp := range cps { // stored now, though l may predate them
			live[cp.Name], live[TablesName(p, cp.Seq)] = true, true
			newest = max(newest, cp.Seq)
		}
		names, err := attempt.Bounded(ctx, listPolicy, func(ctx context.Context) ([]string, error) {
			l, err := b.keys.ListKeys(ctx)
			if err != nil {
				return nil, err
			}
			defer l.Stop()
			var out []string
			for k := range l.Keys() {
				out = append(out, k)
			}
			return out, ctx.Err() // a listing cut short is no listing
		})
		if err != nil {
			return deleted, size, fmt.Errorf("partition %d: list data keys: %w", p, err)
		}
		for _, name := range names {
			if strings.HasPrefix(name, prefix) && !live[name] && !newerThan(name, newest) {
				if err := destroyKey(ctx, js, b.keys, bucket, name); err != nil {
					return deleted, size, err
				}
			}
		}
	}
	return deleted, size, nil
}

// newerThan reports whether name is a checkpoint's archive, tail or table
// list at a sequence above seq. The sweep leaves their keys: a writer's
// own cut-short uploads are never above its newest checkpoint (the
// changelog only moves on), while a successor's new ones, which a former
// owner woken after its ownership check would not see, are.
func newerThan(name string, seq uint64) bool {
	if s, ok := strings.CutSuffix(name, ".tables"); ok {
		name = s + ".tar"
	}
	_, n, ok := parseCheckpointName(name)
	return ok && n > seq
}

// deleteConcurrency is how many objects CollectTablesIn deletes at once.
const deleteConcurrency = 8

// DeleteEach runs del(ctx, i) for i in [0, n), deleteConcurrency at a
// time, and returns the first error (the others stop at their next
// call: their context is cancelled).
func DeleteEach(ctx context.Context, n int, del func(ctx context.Context, i int) error) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var wg sync.WaitGroup
	next := make(chan int)
	for range min(n, deleteConcurrency) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				if err := del(ctx, i); err != nil {
					cancel(err)
				}
			}
		}()
	}
feed:
	for i := range n {
		select {
		case next <- i:
		case <-ctx.Done():
			break feed
		}
	}
	close(next)
	wg.Wait()
	return context.Cause(ctx)
}

// listed reports whether the table list name belongs to a stored
// checkpoint.
func listed(cps []CheckpointInfo, name string, p int) bool {
	for _, cp := range cps {
		if TablesName(p, cp.Seq) == name {
			return true
		}
	}
	return false
}

// listTimeout bounds one listing of a bucket: the client's List of an
// empty bucket waits for its context when its first read of the bucket is
// not answered ("no responders" from a bucket just created on a cluster),
// and some callers' contexts have no deadline (a start's).
const listTimeout = 30 * time.Second

// listObjects is obs.List, bounded by listTimeout.
func listObjects(ctx context.Context, obs jetstream.ObjectStore) ([]*jetstream.ObjectInfo, error) {
	ctx, cancel := context.WithTimeout(ctx, listTimeout)
	defer cancel()
	return attempt.Bounded(ctx, listPolicy, func(ctx context.Context) ([]*jetstream.ObjectInfo, error) { return obs.List(ctx) })
}

// uploadBudget bounds how long pacing may stretch one save's upload: a
// save holds the changelog's lock, and an erase's scrub waits for it.
const uploadBudget = 2 * time.Second

// pace spreads a save's uploads over time, across all its tables: at
// rate bytes per second, or faster when that would take longer than
// uploadBudget for the bytes to upload.
type pace struct {
	rate float64
	t0   time.Time
	n    int64
}

// newPace returns the pace of an upload of bytes at rate; nil (unpaced)
// when rate is 0.
func newPace(rate, bytes int64) *pace {
	if rate <= 0 {
		return nil
	}
	r := max(float64(rate), float64(bytes)/uploadBudget.Seconds())
	return &pace{rate: r, t0: time.Now()}
}

// pacedReader reads from r no faster than its pace, and stops waiting
// when ctx ends.
type pacedReader struct {
	ctx  context.Context
	r    io.Reader
	pace *pace
}

func (p *pacedReader) Read(b []byte) (int, error) {
	n, err := p.r.Read(b)
	p.pace.n += int64(n)
	if d := time.Duration(float64(p.pace.n)/p.pace.rate*float64(time.Second)) - time.Since(p.pace.t0); d > 0 {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-p.ctx.Done():
			return n, p.ctx.Err()
		case <-t.C:
		}
	}
	return n, err
}
