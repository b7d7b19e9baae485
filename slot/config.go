package slot

import (
	"errors"
	"fmt"
	"time"

	"github.com/telha/telha-cascade/partition"
	"github.com/telha/telha-cascade/queue"
)

// Config is what one slot runs with: its data directory, its share of
// the caches, its queue (the consumer of the partitions it owns), its
// reaper and its changelog. The worker's flags fill it (package app,
// CONTRACT §7); a member gives each slot it hosts a copy with the slot's
// index and directory.
type Config struct {
	// DataDir holds the slot's Pebble (pebble/); checkpoints stage on its
	// filesystem.
	DataDir string
	// Partitions is the number of request partitions; Owner the slice of
	// them this slot consumes (slot i of N: the partitions p with
	// p % N == i).
	Partitions     int
	Owner          queue.Owner
	MaxBatchOps    int
	ChunkOps       int
	ReaperSchedule string
	GroupMax       int
	GroupWait      time.Duration
	MaxDeliver     int
	MaxDeaths      int
	AckWait        time.Duration
	ResultsMaxAge  time.Duration
	DLQMaxAge      time.Duration
	// Size limits of TELHA_RES and TELHA_DLQ (bytes; messages per tenant
	// subject, 0: none).
	ResultsMaxBytes, DLQMaxBytes         int64
	ResultsMaxPerTenant, DLQMaxPerTenant int64
	StreamReplicas                       int
	LeaseTTL                             time.Duration
	ShutdownGrace                        time.Duration
	MinFreeDiskMB                        int
	// SecureDeleteRequests: queue.Config.SecureDeleteAcked.
	SecureDeleteRequests bool
	// The change feed (queue/feed.go): ChangeFeedOff, ChangeFeedNoProps,
	// and the limits of TELHA_CHG.
	ChangeFeedOff, ChangeFeedNoProps bool
	ChangesMaxAge                    time.Duration
	ChangesMaxBytes                  int64
	ChangesMaxPerTenant              int64 // 0: no per-tenant limit
	ChangesMaxRate                   int   // 0: unbounded
	CacheMB                          int
	MemTableMB                       int
	// The changelog (issue 21, step A; changelog.go): --changelog off or
	// jetstream, its stream's replicas (0: --stream-replicas), the cron
	// spec of checkpoints and how many are kept.
	Changelog          string
	ChangelogReplicas  int
	CheckpointSchedule string
	CheckpointsKeep    int
	// CheckpointUploadRate paces the tables a serving slot's checkpoint or
	// erase scrub uploads (bytes per second; 0 unpaced).
	CheckpointUploadRate int64
	// Hosted: the slot is one of a member's (dynamic ownership): it binds
	// no port (the member's HTTP server calls ServeHosted), uses the
	// member's NATS connection, and logs as one slot among several.
	Hosted bool
}

// ErrUsage marks a configuration error: the process exits 2 with usage.
var ErrUsage = errors.New("usage")

// QueueConfig is the configuration of the slot's queue (streams,
// consumer), without its tracer.
func (c Config) QueueConfig() queue.Config {
	return queue.Config{
		Partitions: c.Partitions, Owner: c.Owner, MaxDeliver: c.MaxDeliver, MaxDeaths: c.MaxDeaths, AckWait: c.AckWait,
		GroupMax: c.GroupMax, GroupWait: c.GroupWait, ResultsMaxAge: c.ResultsMaxAge, DLQMaxAge: c.DLQMaxAge, StreamReplicas: c.StreamReplicas,
		SecureDeleteAcked: c.SecureDeleteRequests, ResultsMaxBytes: c.ResultsMaxBytes, DLQMaxBytes: c.DLQMaxBytes,
		ResultsMaxPerTenant: perTenant(c.ResultsMaxPerTenant), DLQMaxPerTenant: perTenant(c.DLQMaxPerTenant),
		ChangeFeedOff: c.ChangeFeedOff, ChangeFeedNoProps: c.ChangeFeedNoProps, ChangesMaxAge: c.ChangesMaxAge, ChangesMaxBytes: c.ChangesMaxBytes,
		ChangesMaxPerTenant: perTenant(c.ChangesMaxPerTenant),
		ChangesMaxRate:      unbounded(c.ChangesMaxRate),
	}
}

// unbounded is a rate flag as queue.Config takes it (0, no bound, is -1
// there).
func unbounded(n int) int {
	if n == 0 {
		return -1
	}
	return n
}

// perTenant is a per-tenant limit flag as queue.Config takes it (0, no
// limit, is -1 there).
func perTenant(n int64) int64 {
	if n == 0 {
		return -1
	}
	return n
}

// LogReplicas is --changelog-replicas, defaulted to --stream-replicas:
// the replicas of the changelog, its checkpoints and the member buckets.
func (c *Config) LogReplicas() int {
	if c.ChangelogReplicas > 0 {
		return c.ChangelogReplicas
	}
	return c.StreamReplicas
}

// ChangelogConfig names this slot's changelog (changelog.go).
func (c *Config) ChangelogConfig() partition.Config {
	return partition.Config{
		Partition:     c.Owner.Index,
		StreamPrefix:  fmt.Sprintf("TELHA_LOG_STATIC%d", c.Owner.Count),
		SubjectPrefix: fmt.Sprintf("telha.static%d", c.Owner.Count),
		Replicas:      c.LogReplicas(),
	}
}

// CheckpointConfig names this slot's checkpoint bucket.
func (c *Config) CheckpointConfig() partition.CheckpointConfig {
	return partition.CheckpointConfig{Bucket: fmt.Sprintf("TELHA_CKPT_STATIC%d", c.Owner.Count), Replicas: c.LogReplicas()}
}
