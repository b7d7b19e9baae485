package partition

import (
	"archive/tar"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/nats-io/nats.go/jetstream"
)

// ErrNoCheckpoint means the bucket holds no checkpoint of the partition.
var ErrNoCheckpoint = errors.New("partition: no checkpoint")

// CheckpointConfig configures the Object Store bucket checkpoints live in.
type CheckpointConfig struct {
	// Bucket is the Object Store bucket. Default "TELHA_CKPT".
	Bucket string
	// Replicas is the bucket's replica count. Default 1; 3 on a cluster,
	// like the changelog: a checkpoint is only as safe as its copies.
	Replicas int
}

// OpenCheckpoints creates the checkpoint bucket and the KV bucket of its
// tables' data keys (KeysBucket) if they do not exist (file storage, no
// TTL: checkpoints are removed by Prune only) and returns the bucket, a
// *Bucket: tables uploaded through it are sealed (seal.go).
func OpenCheckpoints(ctx context.Context, js jetstream.JetStream, cfg CheckpointConfig) (jetstream.ObjectStore, error) {
	if cfg.Bucket == "" {
		cfg.Bucket = "TELHA_CKPT"
	}
	if cfg.Replicas == 0 {
		cfg.Replicas = 1
	}
	obs, err := js.CreateOrUpdateObjectStore(ctx, jetstream.ObjectStoreConfig{
		Bucket:      cfg.Bucket,
		Description: "telha partition checkpoints (Pebble checkpoints as tar)",
		Storage:     jetstream.FileStorage,
		Replicas:    cfg.Replicas,
	})
	if err != nil {
		return nil, fmt.Errorf("partition: checkpoint bucket %s: %w", cfg.Bucket, err)
	}
	keys, err := openKeys(ctx, js, cfg.Bucket, cfg.Replicas)
	if err != nil {
		return nil, err
	}
	return &Bucket{ObjectStore: obs, js: js, keys: keys}, nil
}

// CheckpointInfo describes one stored checkpoint.
type CheckpointInfo struct {
	Partition int
	// Seq is the changelog sequence the checkpoint reflects: replay from
	// Seq + 1 on top of it.
	Seq  uint64
	Name string
	Size uint64
	// Modified is when the object store recorded it.
	Modified time.Time
	// Existed: SaveCheckpoint found this checkpoint already stored (nothing
	// committed since) and kept it rather than upload it again.
	Existed bool
	// Tables is how many tables the checkpoint holds (format 2), and
	// TablesUploaded how many of them this save uploaded (the others were
	// in the bucket already).
	Tables, TablesUploaded int
	// BytesUploaded is what this save sent to the bucket: the new tables,
	// the table list and the archive of the other files.
	BytesUploaded uint64
	// Stored is the partition's table objects the bucket holds after this
	// save, for the next save's SaveOptions.Stored (nil when the save found
	// its checkpoint already stored).
	Stored map[string]bool `json:"-"`
	// Base names the whole checkpoint a tail checkpoint extends (tail.go);
	// "" for a whole checkpoint. TailWriteSets is how many write-sets a
	// tail SaveTail stored holds.
	Base          string `json:",omitempty"`
	TailWriteSets int    `json:",omitempty"`
	// uploaded is each table object this save uploaded, by its stored size
	// (Listing.With adds them).
	uploaded map[string]uint64
}

// CheckpointName is the object name of partition p's checkpoint at seq.
// The zero-padded sequence makes names sort in sequence order.
func CheckpointName(p int, seq uint64) string {
	return fmt.Sprintf("partition-%d/seq-%020d.tar", p, seq)
}

// parseCheckpointName inverts CheckpointName; ok is false for any other
// name (objects that are not ours are ignored, not fatal).
func parseCheckpointName(name string) (p int, seq uint64, ok bool) {
	rest, found := strings.CutPrefix(name, "partition-")
	if !found {
		return 0, 0, false
	}
	ps, rest, found := strings.Cut(rest, "/seq-")
	if !found {
		return 0, 0, false
	}
	ss, found := strings.CutSuffix(rest, ".tar")
	if !found || len(ss) != 20 {
		return 0, 0, false
	}
	pi, err := strconv.Atoi(ps)
	if err != nil || pi < 0 || strconv.Itoa(pi) != ps {
		return 0, 0, false
	}
	sv, err := strconv.ParseUint(ss, 10, 64)
	if err != nil {
		return 0, 0, false
	}
	return pi, sv, true
}

// Object metadata keys of a checkpoint.
const (
	metaPartition = "telha-partition"
	metaSeq       = "telha-seq"
	metaFormat    = "telha-format"
	// metaTablesBytes: the bytes of a format-2 checkpoint's tables (its
	// object holds the rest), for listings.
	metaTablesBytes = "telha-tables-bytes"
	// formatTarV1: the archive holds every file of the Pebble checkpoint
	// (releases before issue 29; still restored).
	formatTarV1 = "pebble-checkpoint-tar/1"
	// formatTarV2: the archive holds every file but the tables, and a
	// table list (tablesFile); each table is an object of its own, named by
	// its content and shared by every checkpoint that holds it (tables.go).
	formatTarV2 = "pebble-checkpoint-tar/2"
)

// SaveOptions tunes SaveCheckpointWith.
type SaveOptions struct {
	// Staging is the directory the Pebble checkpoint is staged in, under a
	// fresh ".checkpoint-*" directory removed when the save returns. It
	// should be on the store's own filesystem, where Pebble hard-links the
	// tables instead of copying them (issue 29 item 2: the chart's /tmp is
	// a 64 MiB emptyDir). "" stages in the OS temp directory.
	Staging string
	// Tables caches the digests of the tables of one open store across
	// saves, so a save hashes only the tables written since the last one.
	// nil hashes every table.
	Tables *TableDigests
	// ChunkSize is the chunk size of the stored objects (ChunkSizeFor the
	// connection's max payload); 0 is DefaultChunkSize.
	ChunkSize uint32
	// Seq, when not 0, is the applied sequence the caller knows the
	// checkpoint reflects: nothing can commit meanwhile (it holds the
	// store's writer), so the save does not open the checkpoint to read
	// it. 0 reads it from the checkpoint.
	Seq uint64
	// Rate paces the upload of the tables, in bytes per second, so a save
	// beside a serving slot leaves NATS room for its commits (issue 29: an
	// erase's scrub uploads tens of MB), yet never stretches the upload
	// past uploadBudget (faster when the bytes need it); 0 uploads as fast
	// as NATS takes them.
	Rate int64
	// Stored, when not nil, is the partition's table objects the bucket
	// holds: a previous save's CheckpointInfo.Stored, with no collection
	// or delete since (the caller serialises them). The save then does not
	// list the bucket, which takes hundreds of milliseconds once it holds
	// hundreds of objects: an erase's last save, when it is whole (not a
	// tail), runs under the writer.
	Stored map[string]bool
}

// SaveCheckpoint is SaveCheckpointWith without options.
func SaveCheckpoint(ctx context.Context, obs jetstream.ObjectStore, p int, db *pebble.DB) (CheckpointInfo, error) {
	return SaveCheckpointWith(ctx, obs, p, db, SaveOptions{})
}

// SaveCheckpointWith takes a Pebble checkpoint of db (partition p's store)
// and stores it in obs under CheckpointName(p, seq), where seq is the
// applied sequence recorded INSIDE the checkpoint. The writer may go on
// committing while this runs: the checkpoint is one consistent view, and
// the applied key in that view is the only exact answer to "which sequence
// does it reflect" (a sequence read before or after could be off by
// whatever committed in between, and a checkpoint of a store committed
// without fsync can lag the last commit it was "taken after": measured in
// TestCheckpointPruneRestoreReplay before WithFlushedWAL was added, a
// checkpoint held sequence 15 while the owner had committed 17). The
// checkpoint is opened read-only before upload, which also proves it opens.
//
// Incremental (format 2): every table (an immutable .sst) is uploaded once,
// as the object TableObject(p, its SHA-256), unless the bucket holds it
// already; the checkpoint's own object is a tar of the other files
// (MANIFEST, OPTIONS, WAL) and the table list. So a save uploads what
// changed since the last one (the memtables flushed, the compactions'
// outputs), not the store. The table list is also stored alone
// (TablesName) for CollectTables. The checkpoint object is written last:
// it is the commit point, and a save cut short leaves only tables that the
// next CollectTables deletes.
func SaveCheckpointWith(ctx context.Context, obs jetstream.ObjectStore, p int, db *pebble.DB, opts SaveOptions) (CheckpointInfo, error) {
	tmp, err := os.MkdirTemp(opts.Staging, StagingPrefix+"*")
	if err != nil {
		return CheckpointInfo{}, fmt.Errorf("partition %d: checkpoint staging dir: %w", p, err)
	}
	defer os.RemoveAll(tmp)
	dir := filepath.Join(tmp, "ckpt")
	// WithFlushedWAL syncs the WAL first: commits made without fsync (the
	// owner's, once the changelog holds the write) may still sit in Pebble's
	// WAL buffer, and a checkpoint copies only what reached the file.
	if err := db.Checkpoint(dir, pebble.WithFlushedWAL()); err != nil {
		return CheckpointInfo{}, fmt.Errorf("partition %d: pebble checkpoint: %w", p, err)
	}
	seq := opts.Seq
	if seq == 0 {
		if seq, err = appliedSeqInDir(dir); err != nil {
			return CheckpointInfo{}, fmt.Errorf("partition %d: checkpoint: %w", p, err)
		}
	}
	name := CheckpointName(p, seq)
	if old, ok, err := storedAt(ctx, obs, p, seq); ok || err != nil {
		return old, err
	}
	chunk := opts.ChunkSize
	if chunk == 0 {
		chunk = DefaultChunkSize
	}
	up, err := uploadTables(ctx, obs, p, dir, opts.Tables, chunk, opts.Rate, opts.Stored)
	if err != nil {
		return CheckpointInfo{}, fmt.Errorf("partition %d: checkpoint %s: %w", p, name, err)
	}
	list, err := json.Marshal(tableList{Format: 2, Tables: up.tables})
	if err != nil {
		return CheckpointInfo{}, err
	}
	if err := os.WriteFile(filepath.Join(dir, tablesFile), list, 0o644); err != nil {
		return CheckpointInfo{}, fmt.Errorf("partition %d: checkpoint %s: %w", p, name, err)
	}
	uctx, done := uploadContext(ctx)
	defer done()
	if _, err := putObject(uctx, obs, jetstream.ObjectMeta{Name: TablesName(p, seq)}, bytes.NewReader(list)); err != nil {
		return CheckpointInfo{}, fmt.Errorf("partition %d: checkpoint %s: table list: %w", p, name, err)
	}
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(writeTar(pw, dir, isTable)) }()
	info, err := putObject(uctx, obs, jetstream.ObjectMeta{
		Name:        name,
		Description: fmt.Sprintf("partition %d at changelog sequence %d", p, seq),
		Metadata: map[string]string{
			metaPartition:   strconv.Itoa(p),
			metaSeq:         strconv.FormatUint(seq, 10),
			metaFormat:      formatTarV2,
			metaTablesBytes: strconv.FormatUint(up.total, 10),
		},
		Opts: &jetstream.ObjectMetaOptions{ChunkSize: chunk},
	}, pr)
	pr.CloseWithError(io.ErrClosedPipe) // stop the writer if Put returned early
	if err != nil {
		return CheckpointInfo{}, fmt.Errorf("partition %d: upload checkpoint %s: %w", p, name, err)
	}
	return CheckpointInfo{Partition: p, Seq: seq, Name: name, Size: info.Size + up.total, Modified: info.ModTime,
		Tables: len(up.tables), TablesUploaded: up.uploaded, BytesUploaded: info.Size + up.uploadedBytes + uint64(len(list)), Stored: up.stored,
		uploaded: up.sizes}, nil
}

// storedAt returns partition p's checkpoint at seq when the bucket holds
// one (Existed). A checkpoint at a sequence holds that sequence's state:
// it is kept, not replaced. A Put under its name would purge its chunks
// without overwriting them, leaving their bytes in the bucket's block
// files, where an erase could not reach them (erase.go).
func storedAt(ctx context.Context, obs jetstream.ObjectStore, p int, seq uint64) (CheckpointInfo, bool, error) {
	name := CheckpointName(p, seq)
	old, err := obs.GetInfo(ctx, name)
	if errors.Is(err, jetstream.ErrObjectNotFound) || err == nil && old.Deleted {
		return CheckpointInfo{}, false, nil
	}
	if err != nil {
		return CheckpointInfo{}, false, fmt.Errorf("partition %d: checkpoint %s: %w", p, name, err)
	}
	return CheckpointInfo{Partition: p, Seq: seq, Name: name, Size: old.Size, Modified: old.ModTime, Existed: true,
		Base: old.Metadata[metaBase]}, true, nil
}

// StagingPrefix starts the name of a directory SaveCheckpointWith stages
// in. One left by a crash holds a whole copy of the store: a start removes
// it (RemoveStaging).
const StagingPrefix = ".checkpoint-"

// RemoveStaging removes the staging directories a save or a restore cut
// short by a crash left in dir (".checkpoint-*", ".restore-*"), and
// returns their names.
func RemoveStaging(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var removed []string
	for _, e := range entries {
		if !e.IsDir() || !(strings.HasPrefix(e.Name(), StagingPrefix) || strings.HasPrefix(e.Name(), restorePrefix)) {
			continue
		}
		if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
			return removed, err
		}
		removed = append(removed, e.Name())
	}
	return removed, nil
}

// appliedSeqInDir opens the Pebble store in dir read-only and returns its
// applied sequence.
func appliedSeqInDir(dir string) (uint64, error) {
	db, err := pebble.Open(dir, &pebble.Options{ReadOnly: true, Logger: quietLogger{}})
	if err != nil {
		return 0, fmt.Errorf("open %s read-only: %w", dir, err)
	}
	seq, err := AppliedSeq(db)
	if cerr := db.Close(); err == nil && cerr != nil {
		err = cerr
	}
	return seq, err
}

type quietLogger struct{}

func (quietLogger) Infof(string, ...any)         {}
func (quietLogger) Errorf(string, ...any)        {}
func (quietLogger) Fatalf(f string, args ...any) { panic(fmt.Sprintf(f, args...)) }

// writeTar writes the regular files and directories under dir to w,
// except the files skip says to leave out.
func writeTar(w io.Writer, dir string, skip func(name string) bool) error {
	tw := tar.NewWriter(w)
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || path == dir {
			return err
		}
		rel, err := filepath.Rel(dir, path)
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		if !info.Mode().IsRegular() && !info.IsDir() {
			return fmt.Errorf("checkpoint holds %s, neither file nor directory", rel)
		}
		if skip != nil && info.Mode().IsRegular() && skip(rel) {
			return nil
		}
		hdr, err := tar.FileInfoHeader(info, "")
		if err != nil {
			return err
		}
		hdr.Name = filepath.ToSlash(rel)
		if info.IsDir() {
			hdr.Name += "/"
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if info.IsDir() {
			return nil
		}
		f, err := os.Open(path)
		if err != nil {
			return err
		}
		defer f.Close()
		_, err = io.Copy(tw, f)
		return err
	})
	if err != nil {
		return fmt.Errorf("archive checkpoint: %w", err)
	}
	return tw.Close()
}

// ListCheckpoints returns partition p's checkpoints, oldest first.
func ListCheckpoints(ctx context.Context, obs jetstream.ObjectStore, p int) ([]CheckpointInfo, error) {
	l, err := List(ctx, obs)
	if err != nil {
		return nil, fmt.Errorf("partition %d: list checkpoints: %w", p, err)
	}
	return l.Checkpoints(p), nil
}

// Listing is one listing of a checkpoint bucket: the info of every object
// it holds, as the Object Store listed them. A listing reads the bucket's
// meta messages, which lie among the tables' chunks: on a bucket of a
// gigabyte of tables it took 0.1-2.7 s on a 3-server cluster (the blocks
// that hold them are read). A caller that serialises its saves and
// deletes (an erase's scrub) lists once and derives the rest.
type Listing []*jetstream.ObjectInfo

// List lists obs (bounded by listTimeout); an empty bucket is an empty
// listing.
func List(ctx context.Context, obs jetstream.ObjectStore) (Listing, error) {
	objs, err := listObjects(ctx, obs)
	if errors.Is(err, jetstream.ErrNoObjectsFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list objects: %w", err)
	}
	return objs, nil
}

// Checkpoints returns partition p's checkpoints in l, oldest first.
func (l Listing) Checkpoints(p int) []CheckpointInfo {
	var out []CheckpointInfo
	for _, o := range l {
		op, seq, ok := parseCheckpointName(o.Name)
		if !ok || op != p || o.Deleted {
			continue
		}
		cp := CheckpointInfo{Partition: p, Seq: seq, Name: o.Name, Size: o.Size, Modified: o.ModTime}
		if o.Metadata[metaFormat] == formatTail {
			cp.Base = o.Metadata[metaBase]
		}
		out = append(out, cp)
	}
	slices.SortFunc(out, func(a, b CheckpointInfo) int { return cmp.Compare(a.Seq, b.Seq) })
	return out
}

// Tables returns partition p's table objects in l, the set a save's
// SaveOptions.Stored takes.
func (l Listing) Tables(p int) map[string]bool {
	return l.names(fmt.Sprintf("partition-%d/sst/", p))
}

// With returns l as it is after cp was stored (by this caller, with no
// other write to the bucket since l): its object, and for a whole
// checkpoint its table list and the tables it uploaded. A checkpoint found
// already stored (Existed) added nothing.
func (l Listing) With(cp CheckpointInfo) Listing {
	if cp.Existed || cp.Name == "" {
		return l
	}
	have := l.names("")
	out := slices.Clone(l)
	add := func(o *jetstream.ObjectInfo) {
		if !have[o.Name] {
			have[o.Name] = true
			out = append(out, o)
		}
	}
	meta := map[string]string{metaFormat: formatTarV2}
	if cp.Base != "" {
		meta = map[string]string{metaFormat: formatTail, metaBase: cp.Base}
	} else {
		add(&jetstream.ObjectInfo{ObjectMeta: jetstream.ObjectMeta{Name: TablesName(cp.Partition, cp.Seq)}})
		for _, name := range slices.Sorted(maps.Keys(cp.uploaded)) {
			add(&jetstream.ObjectInfo{ObjectMeta: jetstream.ObjectMeta{Name: name}, Size: cp.uploaded[name]})
		}
	}
	add(&jetstream.ObjectInfo{ObjectMeta: jetstream.ObjectMeta{Name: cp.Name, Metadata: meta}, Size: cp.Size, ModTime: cp.Modified})
	return out
}

// Without returns l without the objects named (deleted by this caller).
func (l Listing) Without(names ...string) Listing {
	gone := map[string]bool{}
	for _, n := range names {
		gone[n] = true
	}
	return slices.DeleteFunc(slices.Clone(l), func(o *jetstream.ObjectInfo) bool { return gone[o.Name] })
}

// BucketState is where the stream under an Object Store bucket stands:
// every put or delete of an object adds a message, so a listing taken when
// the stream stood at a state, and brought up to date by its one writer
// (With, Without), is still the bucket's while the stream stands there.
// Created tells a stream deleted and made again apart from the old one at
// the same sequence.
type BucketState struct {
	LastSeq uint64
	Created time.Time
}

// BucketStateOf returns the state of the stream under bucket: one stream
// info, where a listing reads every block holding a meta message.
func BucketStateOf(ctx context.Context, js jetstream.JetStream, bucket string) (BucketState, error) {
	s, err := bounded(ctx, func(ctx context.Context) (jetstream.Stream, error) { return js.Stream(ctx, "OBJ_"+bucket) })
	if err != nil {
		return BucketState{}, fmt.Errorf("partition: the stream of bucket %s: %w", bucket, err)
	}
	si := s.CachedInfo()
	return BucketState{LastSeq: si.State.LastSeq, Created: si.Created}, nil
}

// ListSince brings l, a listing of bucket that reflects every object meta
// message of its stream through sequence pos, up to date: it reads the
// meta messages stored after pos (an ordered consumer from pos + 1 on the
// meta subjects, so the server reads the blocks written since pos, not
// every block that holds a meta message as a listing does) and applies
// each in order: a put adds or replaces its object, a delete removes it.
// Whoever wrote them (this caller, another slot of the bucket, a former
// owner waking from a pause, an operator) is seen. The caller checks the
// stream is the same one (BucketState.Created) before.
func ListSince(ctx context.Context, js jetstream.JetStream, bucket string, l Listing, pos uint64) (Listing, error) {
	ctx, cancel := context.WithTimeout(ctx, listTimeout)
	defer cancel()
	fail := func(err error) (Listing, error) {
		return nil, fmt.Errorf("partition: read bucket %s since %d: %w", bucket, pos, err)
	}
	// The read ends at the last meta message as the stream's leader has
	// it, not where the consumer's replica says nothing is pending: the
	// server places the consumer on any replica, and one that lags (a
	// server just restarted or continued) would end the read early, the
	// objects stored lately missing from the listing.
	upTo, err := lastMetaSeq(ctx, js, bucket)
	if err != nil {
		return fail(err)
	}
	at := map[string]int{}
	out := slices.Clone(l)
	for i, o := range out {
		at[o.Name] = i
	}
	if upTo <= pos {
		return out, nil
	}
	cons, err := js.OrderedConsumer(ctx, "OBJ_"+bucket, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{"$O." + bucket + ".M.>"},
		DeliverPolicy:  jetstream.DeliverByStartSequencePolicy,
		OptStartSeq:    pos + 1,
	})
	if err != nil {
		return fail(err)
	}
	for reached := pos; reached < upTo; {
		msg, err := cons.Next(jetstream.FetchContext(ctx))
		if err != nil {
			return fail(err)
		}
		md, err := msg.Metadata()
		if err != nil {
			return fail(err)
		}
		var info jetstream.ObjectInfo
		if err := json.Unmarshal(msg.Data(), &info); err != nil || info.Name == "" {
			return nil, fmt.Errorf("%w: bucket %s: the meta message at %d does not decode (%v)", ErrCorrupt, bucket, md.Sequence.Stream, err)
		}
		info.ModTime = md.Timestamp
		switch i, ok := at[info.Name]; {
		case info.Deleted && ok:
			out[i] = nil
			delete(at, info.Name)
		case info.Deleted:
		case ok:
			out[i] = &info
		default:
			at[info.Name] = len(out)
			out = append(out, &info)
		}
		reached = md.Sequence.Stream
	}
	return slices.DeleteFunc(out, func(o *jetstream.ObjectInfo) bool { return o == nil }), nil
}

// lastMetaSeq returns the sequence of bucket's last object meta message
// as the stream's leader has it (0: none). The client's message get is a
// direct get for an object bucket (they allow it), which any replica
// answers; this request goes to the leader.
func lastMetaSeq(ctx context.Context, js jetstream.JetStream, bucket string) (uint64, error) {
	req, err := json.Marshal(map[string]string{"last_by_subj": "$O." + bucket + ".M.>"})
	if err != nil {
		return 0, err
	}
	subj := cmp.Or(js.Options().APIPrefix, jetstream.DefaultAPIPrefix) + "STREAM.MSG.GET.OBJ_" + bucket
	msg, err := js.Conn().RequestWithContext(ctx, subj, req)
	if err != nil {
		return 0, fmt.Errorf("the last meta message: %w", err)
	}
	var resp struct {
		Message *struct {
			Seq uint64 `json:"seq"`
		} `json:"message"`
		Error *jetstream.APIError `json:"error"`
	}
	if err := json.Unmarshal(msg.Data, &resp); err != nil {
		return 0, fmt.Errorf("the last meta message: %w", err)
	}
	switch {
	case resp.Error != nil && resp.Error.ErrorCode == jetstream.JSErrCodeMessageNotFound:
		return 0, nil
	case resp.Error != nil:
		return 0, fmt.Errorf("the last meta message: %w", resp.Error)
	case resp.Message == nil:
		return 0, errors.New("the last meta message: an answer without one")
	}
	return resp.Message.Seq, nil
}

// DeletedNames returns the object names DeleteCheckpoint(cp) deletes.
func DeletedNames(cp CheckpointInfo) []string {
	return []string{TablesName(cp.Partition, cp.Seq), cp.Name}
}

// names returns the names in l, not deleted, that start with prefix.
func (l Listing) names(prefix string) map[string]bool {
	out := map[string]bool{}
	for _, o := range l {
		if !o.Deleted && strings.HasPrefix(o.Name, prefix) {
			out[o.Name] = true
		}
	}
	return out
}

// restorePrefix starts the name of a directory Restore stages in.
const restorePrefix = ".restore-"

// Restore fetches partition p's newest checkpoint into dstDir, which must
// not exist or be empty, and returns the changelog sequence it reflects:
// replay from seq + 1 to catch up (a tail checkpoint: its base, then its
// write-sets, tail.go). It extracts into a sibling temporary
// directory, checks the object's digest (the Object Store verifies SHA-256
// at the end of the read), opens the result read-only to check that its
// applied sequence matches the object's name, and only then renames it
// into place, so dstDir is either absent/empty or a whole checkpoint.
func Restore(ctx context.Context, obs jetstream.ObjectStore, p int, dstDir string) (uint64, error) {
	r, err := RestoreNewest(ctx, obs, p, dstDir)
	return r.Seq, err
}

// Restored says which checkpoint RestoreNewest restored, and why each
// newer one was passed over.
type Restored struct {
	Seq     uint64
	Name    string
	Skipped []error // the newer checkpoints' errors, newest first
}

// RestoreNewest is Restore, saying which checkpoint it restored and why
// it passed over the newer ones: a caller whose replay then fails (the
// changelog purged above an older checkpoint) can say what went wrong
// first.
func RestoreNewest(ctx context.Context, obs jetstream.ObjectStore, p int, dstDir string) (Restored, error) {
	if err := requireEmpty(dstDir); err != nil {
		return Restored{}, fmt.Errorf("partition %d: restore: %w", p, err)
	}
	cps, err := ListCheckpoints(ctx, obs, p)
	if err != nil {
		return Restored{}, err
	}
	if len(cps) == 0 {
		return Restored{}, fmt.Errorf("partition %d: %w", p, ErrNoCheckpoint)
	}
	// The newest first; one that does not restore (a table gone: a zombie
	// owner's save raced a collection) is passed over for the next older.
	var skipped []error
	for i := len(cps) - 1; i >= 0; i-- {
		restore := restoreOne
		if cps[i].Base != "" {
			restore = restoreTail
		}
		seq, err := restore(ctx, obs, p, cps[i], dstDir)
		if err == nil {
			return Restored{Seq: seq, Name: cps[i].Name, Skipped: skipped}, nil
		}
		if ctx.Err() != nil {
			return Restored{}, err
		}
		skipped = append(skipped, err)
	}
	return Restored{}, skipped[0]
}

// restoreOne restores checkpoint cp into dstDir (see Restore).
func restoreOne(ctx context.Context, obs jetstream.ObjectStore, p int, cp CheckpointInfo, dstDir string) (uint64, error) {
	return stageRestore(p, cp, dstDir, func(dir string) error {
		if err := os.Mkdir(dir, 0o755); err != nil {
			return err
		}
		if err := fetchCheckpoint(ctx, obs, cp.Name, dir); err != nil {
			return err
		}
		return fetchTables(ctx, obs, p, dir)
	})
}

// stageRestore fills a directory beside dstDir with fill, checks that the
// store there reflects cp.Seq, and only then moves it into dstDir, so
// dstDir is either absent/empty or a whole checkpoint.
func stageRestore(p int, cp CheckpointInfo, dstDir string, fill func(dir string) error) (uint64, error) {
	parent := filepath.Dir(filepath.Clean(dstDir))
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return 0, fmt.Errorf("partition %d: restore: %w", p, err)
	}
	tmp, err := os.MkdirTemp(parent, restorePrefix+"*")
	if err != nil {
		return 0, fmt.Errorf("partition %d: restore: %w", p, err)
	}
	defer os.RemoveAll(tmp)
	dir := filepath.Join(tmp, "db")
	if err := fill(dir); err != nil {
		return 0, fmt.Errorf("partition %d: restore %s: %w", p, cp.Name, err)
	}
	seq, err := appliedSeqInDir(dir)
	if err != nil {
		return 0, fmt.Errorf("partition %d: restore %s: %w", p, cp.Name, err)
	}
	if seq != cp.Seq {
		return 0, fmt.Errorf("%w: partition %d: checkpoint %s holds applied sequence %d", ErrCorrupt, p, cp.Name, seq)
	}
	if err := moveRestored(dir, dstDir); err != nil {
		return 0, fmt.Errorf("partition %d: restore: %w", p, err)
	}
	return seq, nil
}

// moveRestored puts the restored store in dir into dstDir (absent or
// empty), durably.
func moveRestored(dir, dstDir string) error {
	if err := os.Remove(dstDir); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	if err := os.Rename(dir, dstDir); err != nil {
		return err
	}
	return syncDir(filepath.Dir(filepath.Clean(dstDir)))
}

func requireEmpty(dir string) error {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if len(entries) > 0 {
		return fmt.Errorf("%s is not empty", dir)
	}
	return nil
}

func syncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

// fetchCheckpoint extracts object name into dir. It accepts only relative
// paths that stay inside dir, and only files and directories.
func fetchCheckpoint(ctx context.Context, obs jetstream.ObjectStore, name, dir string) error {
	res, err := openObject(ctx, obs, name)
	if err != nil {
		return err
	}
	defer res.Close()
	tr := tar.NewReader(res)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return fmt.Errorf("read archive: %w", err)
		}
		rel := filepath.FromSlash(strings.TrimSuffix(hdr.Name, "/"))
		if !filepath.IsLocal(rel) {
			return fmt.Errorf("%w: archive entry %q leaves the directory", ErrCorrupt, hdr.Name)
		}
		path := filepath.Join(dir, rel)
		switch hdr.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(path, 0o755); err != nil {
				return err
			}
		case tar.TypeReg:
			if err := writeFile(path, tr); err != nil {
				return err
			}
		default:
			return fmt.Errorf("%w: archive entry %q of type %q", ErrCorrupt, hdr.Name, hdr.Typeflag)
		}
	}
	// Read to the end of the object so its digest is checked.
	if _, err := io.Copy(io.Discard, res); err != nil {
		return fmt.Errorf("read archive: %w", err)
	}
	return nil
}

func writeFile(path string, r io.Reader) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, r); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// Prune deletes all but partition p's newest keep checkpoints (and the
// bases of the tail checkpoints kept, tail.go) and returns
// the lowest changelog sequence still needed: the oldest of the newest
// keep checkpoints' sequence + 1 (1 when there is no checkpoint: the
// whole log is needed).
// Pass it to PurgeFloor, with the standbys' applied sequences, before
// PurgeBelow.
func Prune(ctx context.Context, obs jetstream.ObjectStore, p int, keep int) (uint64, error) {
	return PruneWith(ctx, obs, p, keep, func(ctx context.Context, name string) error { return obs.Delete(ctx, name) })
}

// PruneWith is Prune deleting each checkpoint with del (DeleteCheckpoint,
// so the pruned checkpoints' bytes leave the server's files: erasure).
func PruneWith(ctx context.Context, obs jetstream.ObjectStore, p int, keep int, del func(ctx context.Context, name string) error) (uint64, error) {
	if keep < 1 {
		return 0, fmt.Errorf("partition %d: prune must keep at least one checkpoint, not %d", p, keep)
	}
	cps, err := ListCheckpoints(ctx, obs, p)
	if err != nil {
		return 0, err
	}
	need, _, err := PruneIn(ctx, cps, p, keep, del)
	return need, err
}

// PruneIn is PruneWith over cps, partition p's checkpoints oldest first
// (Listing.Checkpoints), and also returns the ones it deleted.
func PruneIn(ctx context.Context, cps []CheckpointInfo, p int, keep int, del func(ctx context.Context, name string) error) (uint64, []CheckpointInfo, error) {
	if keep < 1 {
		return 0, nil, fmt.Errorf("partition %d: prune must keep at least one checkpoint, not %d", p, keep)
	}
	if len(cps) == 0 {
		return 1, nil, nil
	}
	cut := max(0, len(cps)-keep)
	bases := map[string]bool{}
	for _, cp := range cps[cut:] {
		if cp.Base != "" {
			bases[cp.Base] = true
		}
	}
	var pruned []CheckpointInfo
	for _, cp := range cps[:cut] {
		if bases[cp.Name] {
			continue // a kept tail's base: it goes with its tail
		}
		if err := del(ctx, cp.Name); err != nil && !errors.Is(err, jetstream.ErrObjectNotFound) {
			return 0, nil, fmt.Errorf("partition %d: prune %s: %w", p, cp.Name, err)
		}
		pruned = append(pruned, cp)
	}
	return cps[cut].Seq + 1, pruned, nil
}
