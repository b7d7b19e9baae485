package partition

import (
	"errors"
	"fmt"

	"github.com/cockroachdb/pebble/v2"
)

// logIDKey is where a partition's Pebble records WHICH changelog its
// applied sequence counts in (the reserved keyspace, next to appliedKey).
//
// Invariant: an applied sequence means nothing without its log. A stream
// deleted and created again, a changelog of another layout (static i/N
// with another N, or a per-partition log), or another NATS cluster all
// number from 1; replaying one of them from a sequence recorded against
// another would skip or repeat write-sets silently. So a store records the
// identity of its log (its stream name and creation time) before it
// applies anything from it, and a start compares it with the log it is
// about to follow (slot/changelog.go decides what to do on a mismatch).
var logIDKey = []byte{0xF0, 0x02}

// LogID returns the changelog identity db records, and false when it
// records none (a store never attached to a changelog).
func LogID(db *pebble.DB) (string, bool, error) {
	v, closer, err := db.Get(logIDKey)
	if errors.Is(err, pebble.ErrNotFound) {
		return "", false, nil
	}
	if err != nil {
		return "", false, fmt.Errorf("partition: read log identity: %w", err)
	}
	defer closer.Close()
	return string(v), true, nil
}

// AttachLog records id as db's changelog and sets its applied sequence
// to applied (0: nothing of that log applied yet), in one synced batch. A
// store that follows a new log (a seed, a re-seed after the log was lost)
// starts at 0; the write-sets it already holds are carried by a checkpoint
// taken right after, at sequence 0.
func AttachLog(db *pebble.DB, id string, applied uint64) error {
	if id == "" {
		return errors.New("partition: empty log identity")
	}
	b := db.NewBatch()
	defer b.Close()
	if err := b.Set(logIDKey, []byte(id), nil); err != nil {
		return fmt.Errorf("partition: attach log: %w", err)
	}
	if applied == 0 {
		if err := b.Delete(appliedKey, nil); err != nil {
			return fmt.Errorf("partition: attach log: %w", err)
		}
	} else if err := MarkApplied(b, applied); err != nil {
		return err
	}
	if err := db.Apply(b, pebble.Sync); err != nil {
		return fmt.Errorf("partition: attach log: %w", err)
	}
	return nil
}
