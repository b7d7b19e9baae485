package app

import (
	"flag"
	"fmt"

	"github.com/telha/telha-cascade/reaper"
	"github.com/telha/telha-cascade/slot"
)

// The flags of a slot's changelog (slot/changelog.go says what it does).

func registerChangelog(fs *flag.FlagSet, c *Config) {
	fs.StringVar(&c.Changelog, "changelog", slot.ChangelogOff, "off: the local Pebble is the only copy of this replica's data (every commit fsynced); "+
		"jetstream: every committed batch is first appended to a replicated JetStream stream (TELHA_LOG_STATIC<N>_<i>) and only then committed locally, "+
		"without fsync; checkpoints go to the Object Store bucket TELHA_CKPT_STATIC<N>; a replica that starts on an empty or lost disk restores "+
		"the newest checkpoint and replays the changelog before it serves. An erase reaches both before its result: the store is checkpointed (incrementally), "+
		"the changelog purged whole and every older checkpoint but the new one's base deleted (a sealed table by destroying its key), beside the writer")
	fs.IntVar(&c.ChangelogReplicas, "changelog-replicas", 0, "replicas of the changelog stream and the checkpoint bucket (0: --stream-replicas; 3 on a JetStream cluster)")
	fs.StringVar(&c.CheckpointSchedule, "checkpoint-schedule", "@every 10m", "cron spec of checkpoints with --changelog jetstream (5 fields, or a descriptor such as @every 10m); "+
		"a restore replays the changelog written since the newest one")
	fs.IntVar(&c.CheckpointsKeep, "checkpoints-keep", 2, "checkpoints kept with --changelog jetstream; the changelog is purged below the oldest one kept")
	c.CheckpointUploadRate = 16 << 20
	fs.Var((*byteSize)(&c.CheckpointUploadRate), "checkpoint-upload-rate", "bytes per second (or with a unit: 16MiB) at which a serving slot's checkpoints and erase scrubs upload their tables, "+
		"leaving NATS room for the slot's commits, but never stretching one save's upload past 2 s (faster when its bytes need it); 0: as fast as NATS takes them. "+
		"The seed checkpoint, and an erase's last save (which holds the writer), are not paced")
}

func (c *Config) validateChangelog() []error {
	var errs []error
	if c.Changelog != slot.ChangelogOff && c.Changelog != slot.ChangelogJetStream {
		errs = append(errs, fmt.Errorf("--changelog must be off or jetstream, got %q", c.Changelog))
	}
	if c.ChangelogReplicas < 0 || c.ChangelogReplicas > 5 {
		errs = append(errs, fmt.Errorf("--changelog-replicas must be between 0 (--stream-replicas) and 5, got %d", c.ChangelogReplicas))
	}
	if _, err := reaper.ParseSchedule(c.CheckpointSchedule); err != nil {
		errs = append(errs, fmt.Errorf("--checkpoint-schedule %q: %v", c.CheckpointSchedule, err))
	}
	if c.CheckpointsKeep < 1 {
		errs = append(errs, fmt.Errorf("--checkpoints-keep must be at least 1, got %d", c.CheckpointsKeep))
	}
	if c.CheckpointUploadRate < 0 {
		errs = append(errs, fmt.Errorf("--checkpoint-upload-rate must be 0 (unpaced) or more, got %d", c.CheckpointUploadRate))
	}
	return errs
}
