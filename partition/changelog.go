package partition

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Errors a caller can test with errors.Is.
var (
	// ErrFenced means the stream's last sequence is not the one this writer
	// expected: another writer has appended to the partition since this one
	// opened it. Nothing of the refused write-set is in the stream. The
	// Changelog refuses every later append; its owner must stop serving the
	// partition.
	ErrFenced = errors.New("partition: changelog fenced: another writer appended")
	// ErrUnknownOutcome means an append could not be confirmed or refused
	// before its context ended: the write-set may or may not be in the
	// stream. The Changelog refuses every later append; the next owner
	// (possibly this process, after re-acquiring ownership) opens a new one
	// and replays from its applied sequence, which settles the question.
	ErrUnknownOutcome = errors.New("partition: changelog append outcome unknown")
	// ErrTruncated means the changelog no longer holds a sequence the reader
	// needs (it was purged): restore a checkpoint instead.
	ErrTruncated = errors.New("partition: changelog truncated below the requested sequence")
	// ErrCorrupt means a changelog message does not decode (a bad part
	// header, parts out of order) or a write-set is not a valid Pebble batch.
	ErrCorrupt = errors.New("partition: corrupt changelog data")
)

// PartHeader names the header that marks a message as one part of a
// write-set split over several messages. Its value is "i/n/first": part i
// (1-based) of n, of the write-set whose first part is at stream sequence
// first. A message without it is a whole write-set.
const PartHeader = "Telha-Part"

// maxParts bounds n in a part header, so a corrupt header cannot make a
// reader wait for (or allocate for) billions of parts. At the default 1 MB
// payload this is 64 GiB per write-set, far above any real batch.
const maxParts = 1 << 16

// headerRoom is the part of the server's max payload kept for headers
// (message id, expected last sequence, part header): a part's data is at
// most maxPayload - headerRoom bytes.
const headerRoom = 1024

// Config configures one partition's changelog. The zero value of every
// field but Partition is replaced by its default in Open.
type Config struct {
	// Partition is the partition number, >= 0.
	Partition int
	// StreamPrefix names the stream: StreamPrefix + "_" + partition.
	// Default "TELHA_LOG", so partition 3 is TELHA_LOG_3.
	StreamPrefix string
	// SubjectPrefix names the subject: SubjectPrefix + ".log." + partition.
	// Default "telha", so partition 3 appends to telha.log.3.
	SubjectPrefix string
	// Replicas is the stream's replica count. Default 1 (the embedded,
	// single-node setup); a cluster runs 3 so the log survives a server.
	Replicas int
	// DuplicateWindow is how long the stream remembers a message id. A
	// retried append within it is answered as a duplicate; past it, the
	// expected-last-sequence check still refuses the retry and Append
	// recognises its own message by id. Default 2 minutes (JetStream's).
	DuplicateWindow time.Duration
	// AttemptTimeout bounds one publish attempt; an attempt that times out
	// is retried with the same message id until the caller's context ends.
	// Default 5 s: above a leader election on a healthy cluster, so a retry
	// is rarely needed.
	AttemptTimeout time.Duration
	// IdleCheck is how long a reader (Replay, Tail) waits with nothing
	// delivered before it checks that no purge overtook it. Default 1 s.
	IdleCheck time.Duration
	// MaxPartBytes is the largest data of one message. Default (and upper
	// bound): the server's max payload as the connection reports it, less
	// 1 KiB for headers. Write-sets above it are split into parts.
	MaxPartBytes int
}

func (c Config) withDefaults(maxPayload int64) (Config, error) {
	if c.Partition < 0 {
		return c, fmt.Errorf("partition: negative partition %d", c.Partition)
	}
	if c.StreamPrefix == "" {
		c.StreamPrefix = "TELHA_LOG"
	}
	if c.SubjectPrefix == "" {
		c.SubjectPrefix = "telha"
	}
	if c.Replicas == 0 {
		c.Replicas = 1
	}
	if c.DuplicateWindow == 0 {
		c.DuplicateWindow = 2 * time.Minute
	}
	if c.AttemptTimeout == 0 {
		c.AttemptTimeout = 5 * time.Second
	}
	if c.IdleCheck <= 0 {
		c.IdleCheck = time.Second
	}
	limit := int(maxPayload) - headerRoom
	if limit < 1 {
		return c, fmt.Errorf("partition: server max payload %d leaves no room for data", maxPayload)
	}
	if c.MaxPartBytes <= 0 || c.MaxPartBytes > limit {
		c.MaxPartBytes = limit
	}
	return c, nil
}

// StreamName is the name of partition p's changelog stream under cfg.
func (c Config) StreamName() string { return fmt.Sprintf("%s_%d", c.StreamPrefix, c.Partition) }

// Subject is the subject partition p's changelog is appended to.
func (c Config) Subject() string { return fmt.Sprintf("%s.log.%d", c.SubjectPrefix, c.Partition) }

// Changelog is one partition's changelog stream. The owner calls Append;
// owner and standbys call Replay and Tail. Its methods are safe for
// concurrent use; appends are serialised (each waits for the previous
// one's ack, because each is fenced on the previous one's sequence).
type Changelog struct {
	js     jetstream.JetStream
	stream jetstream.Stream
	cfg    Config
	writer string // random per Open: makes message ids unique per writer

	mu   sync.Mutex
	last uint64 // the stream's last sequence as this writer knows it
	// lastSeen mirrors last for Last, which must not wait for an Append
	// in flight (it holds mu through its retries).
	lastSeen atomic.Uint64
	broken   error // set once an append is fenced or its outcome unknown
	// readThrough: the highest sequence a Replay or Tail of this
	// Changelog has read and, when it completed a write-set, applied.
	readThrough atomic.Uint64

	// rec, when not nil, keeps every write-set appended (Record).
	rec *Recording

	// Test hooks, nil in production.
	dropAck    func(attempt int) bool      // true: discard this attempt's ack as if lost
	beforePart func(part, parts int) error // non-nil error: stop before publishing this part
}

// Open creates the partition's stream if it does not exist (or updates its
// replica count and duplicate window if it does) and reads its last
// sequence, the expectation the first Append is fenced on. Call it only
// after winning ownership of the partition (see the package doc); a
// standby may call it to Replay and Tail and must not Append.
func Open(ctx context.Context, js jetstream.JetStream, cfg Config) (*Changelog, error) {
	cfg, err := cfg.withDefaults(js.Conn().MaxPayload())
	if err != nil {
		return nil, err
	}
	sc := jetstream.StreamConfig{
		Name:        cfg.StreamName(),
		Description: fmt.Sprintf("telha changelog of partition %d", cfg.Partition),
		Subjects:    []string{cfg.Subject()},
		Retention:   jetstream.LimitsPolicy,
		Storage:     jetstream.FileStorage,
		Replicas:    cfg.Replicas,
		MaxMsgs:     -1,
		MaxBytes:    -1,
		MaxAge:      0, // never aged out: purged explicitly below the oldest checkpoint
		Duplicates:  cfg.DuplicateWindow,
		// No interior deletes: a reader treats a gap in sequences as data
		// loss, so only prefix purges (PurgeBelow) may remove messages.
		DenyDelete:  true,
		AllowDirect: true,
	}
	stream, err := js.CreateOrUpdateStream(ctx, sc)
	if err != nil {
		return nil, fmt.Errorf("partition %d: create changelog stream %s: %w", cfg.Partition, sc.Name, err)
	}
	info, err := stream.Info(ctx)
	if err != nil {
		return nil, fmt.Errorf("partition %d: changelog info: %w", cfg.Partition, err)
	}
	var id [8]byte
	if _, err := rand.Read(id[:]); err != nil {
		return nil, fmt.Errorf("partition: writer id: %w", err)
	}
	c := &Changelog{js: js, stream: stream, cfg: cfg, writer: hex.EncodeToString(id[:]), last: info.State.LastSeq}
	c.lastSeen.Store(c.last)
	return c, nil
}

// Config returns the configuration with defaults filled in.
func (c *Changelog) Config() Config { return c.cfg }

// Last returns the last sequence this writer has appended or read at Open.
// It is where a new owner's replay ends and its next write-set begins.
func (c *Changelog) Last() uint64 {
	return c.lastSeen.Load()
}

// Append makes writeSet durable in the changelog (acknowledged by the
// stream's replicas) and returns the sequence of its last message: the
// applied sequence to store with it (MarkApplied) and to resume after.
//
// A write-set larger than MaxPartBytes is split into consecutive messages,
// each fenced on the previous one; readers apply it only once its last part
// is read. A crash between parts leaves a torn write-set that readers skip
// (see replay.go).
//
// An error is terminal for this Changelog: ErrFenced means another writer
// owns the partition, ErrUnknownOutcome (or any other error) that the
// write-set may or may not be in the log. In both cases the caller must not
// apply the write-set locally, must stop answering for the partition, and
// must leave recovery to the next Open (which replays what the log holds).
// An empty write-set is refused without breaking the Changelog.
func (c *Changelog) Append(ctx context.Context, writeSet []byte) (uint64, error) {
	if len(writeSet) == 0 {
		return 0, fmt.Errorf("partition %d: empty write-set", c.cfg.Partition)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.broken != nil {
		return 0, c.broken
	}
	n := (len(writeSet) + c.cfg.MaxPartBytes - 1) / c.cfg.MaxPartBytes
	if n > maxParts {
		return 0, fmt.Errorf("partition %d: write-set of %d bytes needs %d parts, more than %d", c.cfg.Partition, len(writeSet), n, maxParts)
	}
	first := c.last + 1
	for i := 1; i <= n; i++ {
		lo := (i - 1) * c.cfg.MaxPartBytes
		hi := min(lo+c.cfg.MaxPartBytes, len(writeSet))
		m := nats.NewMsg(c.cfg.Subject())
		m.Data = writeSet[lo:hi]
		if n > 1 {
			m.Header.Set(PartHeader, FormatPart(i, n, first))
		}
		if c.beforePart != nil {
			if err := c.beforePart(i, n); err != nil {
				c.broken = fmt.Errorf("%w: partition %d: stopped before part %d/%d: %w", ErrUnknownOutcome, c.cfg.Partition, i, n, err)
				return 0, c.broken
			}
		}
		seq, err := c.publish(ctx, m, c.last)
		if err != nil {
			c.broken = err
			return 0, err
		}
		c.last = seq
		c.lastSeen.Store(seq)
	}
	if r := c.rec; r != nil && !r.over {
		if r.bytes += len(writeSet); r.bytes > r.max {
			r.over, r.entries = true, nil
		} else {
			r.entries = append(r.entries, TailEntry{Seq: c.last, WriteSet: bytes.Clone(writeSet)})
		}
	}
	return c.last, nil
}

// Recording keeps the write-sets one writer appends from the moment it
// began (Record), so that a caller holding the writer can store what
// committed since a checkpoint without reading it back from the stream
// (an erase's tail checkpoint, tail.go).
type Recording struct {
	from    uint64 // the log's last sequence when it began
	max     int
	bytes   int
	over    bool
	entries []TailEntry
}

// From is the last sequence before the recording began: it holds every
// write-set appended after it.
func (r *Recording) From() uint64 { return r.from }

// Record begins a recording of every write-set this writer appends, up to
// maxBytes of them (past that it keeps nothing: Recorded says so). One
// recording at a time: a new one replaces the last. StopRecording ends it.
func (c *Changelog) Record(maxBytes int) *Recording {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.rec = &Recording{from: c.last, max: maxBytes}
	return c.rec
}

// Trim drops what r recorded at or below seq (a checkpoint holds it), so
// that only what is above counts against its bound.
func (c *Changelog) Trim(r *Recording, seq uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	i := 0
	for i < len(r.entries) && r.entries[i].Seq <= seq {
		r.bytes -= len(r.entries[i].WriteSet)
		i++
	}
	r.entries = slices.Delete(r.entries, 0, i)
}

// StopRecording ends r, if it is still the recording.
func (c *Changelog) StopRecording(r *Recording) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.rec == r {
		c.rec = nil
	}
}

// Recorded returns the write-sets r recorded, in order, and false when it
// outgrew its bound or was replaced (some were not kept).
func (c *Changelog) Recorded(r *Recording) ([]TailEntry, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if r.over || c.rec != r {
		return nil, false
	}
	return slices.Clone(r.entries), true
}

// msgID is the Nats-Msg-Id of the message a writer publishes after
// sequence expected. It names the writer as well as the position because
// a clustered stream checks message ids BEFORE the expected last sequence:
// with ids of position alone, a zombie publishing at the position a new
// owner just wrote would be answered "duplicate" with the new owner's
// sequence, and would believe its write-set stored.
func (c *Changelog) msgID(expected uint64) string {
	return fmt.Sprintf("%d.%d.%s", c.cfg.Partition, expected, c.writer)
}

// publish stores m as the message after sequence expected, retrying an
// ambiguous attempt (timeout, no responders, lost connection) with the same
// message id until it is confirmed, refused, or ctx ends.
//
// A retry of a message that did land is answered either as a duplicate (a
// clustered stream checks ids first) or as a wrong last sequence (a single
// server checks the expected sequence first, or the duplicate window has
// passed); in the second case the message at expected+1 is read and, if it
// carries our id, it is ours and the append succeeded.
func (c *Changelog) publish(ctx context.Context, m *nats.Msg, expected uint64) (uint64, error) {
	id := c.msgID(expected)
	delay := 10 * time.Millisecond
	var lastErr error
	for attempt := 0; ; attempt++ {
		actx, cancel := context.WithTimeout(ctx, c.cfg.AttemptTimeout)
		ack, err := c.js.PublishMsg(actx, m, jetstream.WithMsgID(id), jetstream.WithExpectLastSequence(expected))
		cancel()
		if c.dropAck != nil && c.dropAck(attempt) {
			ack, err = nil, errors.New("ack lost (test hook)")
		}
		switch {
		case err == nil:
			if ack.Sequence != expected+1 {
				return 0, fmt.Errorf("%w: partition %d: ack for %s at sequence %d (duplicate=%t), expected %d",
					ErrUnknownOutcome, c.cfg.Partition, id, ack.Sequence, ack.Duplicate, expected+1)
			}
			return ack.Sequence, nil
		case IsWrongLastSequence(err):
			mine, lerr := c.landed(ctx, expected+1, id)
			if lerr != nil {
				return 0, fmt.Errorf("%w: partition %d: refused at %d and the message after it cannot be read: %w",
					ErrUnknownOutcome, c.cfg.Partition, expected, errors.Join(err, lerr))
			}
			if mine {
				return expected + 1, nil
			}
			return 0, fmt.Errorf("%w: partition %d expected last sequence %d: %w", ErrFenced, c.cfg.Partition, expected, err)
		case isPermanent(err):
			return 0, fmt.Errorf("partition %d: append refused: %w", c.cfg.Partition, err)
		}
		lastErr = err
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return 0, fmt.Errorf("%w: partition %d: message %s after %d attempts: %w",
				ErrUnknownOutcome, c.cfg.Partition, id, attempt+1, errors.Join(ctx.Err(), lastErr))
		case <-t.C:
		}
		delay = min(2*delay, time.Second)
	}
}

// apiContext bounds one JetStream API call. A request the server drops
// (one sent while the stream's leader changes) is never answered: without
// a bound it would wait for the whole of ctx (a checkpoint's ten minutes),
// and every later checkpoint with it.
func (c *Changelog) apiContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, 6*c.cfg.AttemptTimeout)
}

// landed reports whether the message at seq carries message id id.
func (c *Changelog) landed(ctx context.Context, seq uint64, id string) (bool, error) {
	ctx, cancel := c.apiContext(ctx)
	defer cancel()
	msg, err := c.stream.GetMsg(ctx, seq)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return msg.Header.Get(jetstream.MsgIDHeader) == id, nil
}

// Owned reports whether this writer still owns the partition: nil when no
// other writer has appended since this one's last append, an error
// wrapping ErrFenced when one has, any other error when the stream cannot
// say now (the caller asks again later).
//
// The stream's last sequence comes from its info. At or below this
// writer's own last append, it says nothing of another writer: a replica
// answers the info while the group has no leader, with what it applied,
// so an answer below this writer's acknowledged append is stale, not a
// fence, and one from a leaderless group is not trusted either way. Above
// it, the sequence is this writer's own append whose ack was on its way
// (its appends are contiguous: Last, read again, covers it) or another
// writer's; the message is then read by its sequence (a message at a
// sequence never changes, so whichever replica answers, it cannot answer
// another message) and its id says whose it is.
//
// The answer holds when the stream gave it: a caller that acts on it
// afterwards (the change feed, publishing from this writer's copy)
// narrows a zombie's window to that gap, it does not close it. Only
// Append is fenced by the stream itself.
func (c *Changelog) Owned(ctx context.Context) error {
	ctx, cancel := c.apiContext(ctx)
	defer cancel()
	// This writer's last append, read before the stream's: an append
	// acknowledged after this read is in the stream's answer, above it
	// (read after, it could be above an answer that predates it).
	mine := c.Last()
	info, err := c.stream.Info(ctx)
	if err != nil {
		return fmt.Errorf("partition %d: changelog info: %w", c.cfg.Partition, err)
	}
	if info.Cluster != nil && info.Cluster.Leader == "" {
		return fmt.Errorf("partition %d: the changelog's group has no leader: ownership unknown", c.cfg.Partition)
	}
	last := info.State.LastSeq
	switch {
	case last == mine:
		return nil
	case last < mine:
		return fmt.Errorf("partition %d: the changelog's info ends at %d, before this writer's acknowledged append %d (a stale answer): ownership unknown",
			c.cfg.Partition, last, mine)
	case c.Last() >= last:
		return nil // this writer's own append, acknowledged since
	}
	msg, err := c.stream.GetMsg(ctx, last)
	if err != nil {
		// Most often this writer's own append, acknowledged by the leader
		// and not applied yet by the replica that answered: its ack is on
		// its way.
		if c.ackedWithin(ctx, last, ownAckWait) {
			return nil
		}
		return fmt.Errorf("partition %d: read the changelog's last message %d: %w", c.cfg.Partition, last, err)
	}
	if id := msg.Header.Get(jetstream.MsgIDHeader); !strings.HasSuffix(id, "."+c.writer) {
		return fmt.Errorf("%w: partition %d: the changelog's last message (sequence %d, id %q) is another writer's",
			ErrFenced, c.cfg.Partition, last, id)
	}
	return nil
}

// ownAckWait bounds how long Owned waits for this writer's own ack of a
// message it could not read.
const ownAckWait = 200 * time.Millisecond

// ackedWithin reports whether this writer's appends reach seq within d.
func (c *Changelog) ackedWithin(ctx context.Context, seq uint64, d time.Duration) bool {
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	for c.Last() < seq {
		select {
		case <-ctx.Done():
			return false
		case <-deadline.C:
			return c.Last() >= seq
		case <-tick.C:
		}
	}
	return true
}

// IsWrongLastSequence reports whether err is JetStream's refusal of an
// expected last sequence (10071, or 10164 from some clustered paths),
// matched by error code, not by text.
func IsWrongLastSequence(err error) bool {
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) {
		return false
	}
	return apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
		apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant
}

// isPermanent reports errors a retry cannot fix: the server refused the
// message itself (too large, malformed).
func isPermanent(err error) bool {
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) {
		return false
	}
	switch apiErr.ErrorCode {
	case jetstream.JSErrCodeStreamMessageExceedsMaximum, jetstream.JSErrCodeBadRequest:
		return true
	}
	return false
}

// PurgeBelow removes every changelog message with a sequence below seq.
// Call it with PurgeFloor's answer, never with more: see the package doc's
// purge rule. It refuses a seq above Last()+1.
func (c *Changelog) PurgeBelow(ctx context.Context, seq uint64) error {
	if seq <= 1 {
		return nil
	}
	ictx, cancel := c.apiContext(ctx)
	info, err := c.stream.Info(ictx)
	cancel()
	if err != nil {
		return fmt.Errorf("partition %d: changelog info: %w", c.cfg.Partition, err)
	}
	if seq > info.State.LastSeq+1 {
		return fmt.Errorf("partition %d: purge below %d is above the log's end %d", c.cfg.Partition, seq, info.State.LastSeq)
	}
	pctx, cancel := c.apiContext(ctx)
	defer cancel()
	if err := c.stream.Purge(pctx, jetstream.WithPurgeSequence(seq)); err != nil {
		return fmt.Errorf("partition %d: purge below %d: %w", c.cfg.Partition, seq, err)
	}
	return nil
}

// PurgeFloor is the highest sequence the changelog may be purged below:
// the lowest of what the oldest kept checkpoint needs (Prune's answer: its
// sequence + 1) and what each standby needs (its applied sequence + 1).
func PurgeFloor(checkpointNeeds uint64, standbyApplied ...uint64) uint64 {
	floor := checkpointNeeds
	for _, a := range standbyApplied {
		floor = min(floor, a+1)
	}
	return floor
}

// FormatPart encodes a part header value: part i of n of the write-set
// whose first part is at sequence first.
func FormatPart(i, n int, first uint64) string {
	return strconv.Itoa(i) + "/" + strconv.Itoa(n) + "/" + strconv.FormatUint(first, 10)
}

// ParsePart decodes a part header value written by FormatPart, and
// refuses anything else: 1 <= i <= n <= 65536, first >= 1, plain decimals.
func ParsePart(v string) (i, n int, first uint64, err error) {
	fields := strings.Split(v, "/")
	if len(fields) != 3 {
		return 0, 0, 0, fmt.Errorf("%w: part header %q: want i/n/first", ErrCorrupt, v)
	}
	var nums [3]uint64
	for k, f := range fields {
		if f == "" || len(f) > 20 || (len(f) > 1 && f[0] == '0') {
			return 0, 0, 0, fmt.Errorf("%w: part header %q: bad number %q", ErrCorrupt, v, f)
		}
		for _, r := range f {
			if r < '0' || r > '9' {
				return 0, 0, 0, fmt.Errorf("%w: part header %q: bad number %q", ErrCorrupt, v, f)
			}
		}
		x, perr := strconv.ParseUint(f, 10, 64)
		if perr != nil {
			return 0, 0, 0, fmt.Errorf("%w: part header %q: %w", ErrCorrupt, v, perr)
		}
		nums[k] = x
	}
	if nums[0] < 1 || nums[1] > maxParts || nums[0] > nums[1] || nums[2] < 1 {
		return 0, 0, 0, fmt.Errorf("%w: part header %q out of range", ErrCorrupt, v)
	}
	return int(nums[0]), int(nums[1]), nums[2], nil
}

// ReadThrough returns the highest sequence a Replay or Tail of this
// Changelog has read: every whole write-set at or below it has been given
// to its ApplyFunc, which returned (a torn write-set's parts are read and
// dropped: they were never committed).
func (c *Changelog) ReadThrough() uint64 { return c.readThrough.Load() }

// End returns the stream's last sequence, as its leader knows it now (one
// request): what a reader must read through to have seen every write-set
// appended before the call.
func (c *Changelog) End(ctx context.Context) (uint64, error) {
	info, err := c.stream.Info(ctx)
	if err != nil {
		return 0, fmt.Errorf("partition %d: changelog info: %w", c.cfg.Partition, err)
	}
	return info.State.LastSeq, nil
}
