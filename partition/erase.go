package partition

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/telha/telha-cascade/internal/sealed"
)

// Erasure and the copies in JetStream (issue 21 item 6). What nats-server
// (v2.15) leaves on disk when messages go, read from its file store:
//
//   - Purging a stream below a sequence (PurgeBelow) removes every block
//     file wholly below it, but the block holding that sequence keeps the
//     purged messages' bytes (marked deleted) unless it is over 2 MB and
//     more than half deleted. Purging below the last sequence + 1 (the whole
//     stream) moves the stream's message directory aside and deletes it: no
//     block file of the purged messages is left (the server removes the
//     moved directory in the background, right after the purge returns).
//   - Deleting an object (Object Store) purges its chunk subject, which
//     removes each chunk message without overwriting it: the bytes stay in
//     every block file that still holds another message (another
//     checkpoint's chunks, a meta message). A secure delete of a message
//     (SecureDeleteMsg) overwrites its record in the block file with random
//     bytes first. (A server whose store is encrypted at rest ignores the
//     overwrite: its deleted records stay as ciphertext.)
//
// So the erase's copy scrub (slot/changelog.go) purges the changelog whole,
// holding the writer, right after a checkpoint of the scrubbed store, and
// every checkpoint is deleted with DeleteCheckpoint.

// DeleteCheckpoint deletes checkpoint name and its table list (format 2)
// with DeleteObject. The tables it held stay until CollectTables finds no
// checkpoint naming them.
func DeleteCheckpoint(ctx context.Context, js jetstream.JetStream, obs jetstream.ObjectStore, bucket, name string) error {
	if p, seq, ok := parseCheckpointName(name); ok {
		// Format 2: its table list goes first, so no list outlives its
		// checkpoint (the tables go with the next CollectTables).
		if err := DeleteObject(ctx, js, obs, bucket, TablesName(p, seq)); err != nil {
			return err
		}
	}
	return DeleteObject(ctx, js, obs, bucket, name)
}

// DeleteObject deletes object name from the bucket obs (of bucket name
// bucket, in js) so that no block file of the bucket's stream keeps its
// bytes: each of its chunk messages is overwritten in place by the server
// (secure delete), then the object is deleted (its meta message says
// deleted; it names the object, and holds no data). An object that is
// already gone is not an error. A crash between the two steps leaves an
// object whose chunks are gone: its read fails its digest check, and the
// next DeleteObject of it finishes the job.
//
// Cost: each overwrite rewrites the block file that holds the chunk (up
// to 8 MB on the server's default for a limits stream), so deleting an
// object of C bytes in chunks of K bytes writes up to C/K x 8 MB on the
// NATS server's disk (ChunkSizeFor keeps K large).
func DeleteObject(ctx context.Context, js jetstream.JetStream, obs jetstream.ObjectStore, bucket, name string) error {
	info, err := bounded(ctx, func(ctx context.Context) (*jetstream.ObjectInfo, error) {
		return obs.GetInfo(ctx, name, jetstream.GetObjectInfoShowDeleted())
	})
	if errors.Is(err, jetstream.ErrObjectNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("partition: checkpoint %s: %w", name, err)
	}
	if info.Metadata[sealed.Meta] != "" {
		// Sealed: destroying its key erases it; its chunks go plainly.
		kv, err := keysOf(ctx, js, obs, bucket)
		if err != nil {
			return fmt.Errorf("partition: checkpoint %s: %w", name, err)
		}
		if err := destroyKey(ctx, js, kv, bucket, name); err != nil {
			return err
		}
	} else if info.NUID != "" {
		stream := "OBJ_" + bucket
		subject := fmt.Sprintf("$O.%s.C.%s", bucket, info.NUID)
		s, err := bounded(ctx, func(ctx context.Context) (jetstream.Stream, error) { return js.Stream(ctx, stream) })
		if err != nil {
			return fmt.Errorf("partition: checkpoint %s: %w", name, err)
		}
		// How many chunks the subject holds now, from the stream's leader
		// (not the object's chunk count: a delete cut short has
		// overwritten some of them already).
		si, err := bounded(ctx, func(ctx context.Context) (*jetstream.StreamInfo, error) {
			return s.Info(ctx, jetstream.WithSubjectFilter(subject))
		})
		if err != nil {
			return fmt.Errorf("partition: object %s: count its chunks: %w", name, err)
		}
		seqs, err := sequencesOf(ctx, s, subject, int(si.State.Subjects[subject]))
		if err != nil {
			return fmt.Errorf("partition: object %s: list its chunks: %w", name, err)
		}
		for _, seq := range seqs {
			_, err := bounded(ctx, func(ctx context.Context) (struct{}, error) { return struct{}{}, s.SecureDeleteMsg(ctx, seq) })
			if err != nil && !gone(err) {
				return fmt.Errorf("partition: object %s: overwrite chunk at sequence %d: %w", name, seq, err)
			}
		}
	}
	if info.Deleted {
		return nil
	}
	if err := obs.Delete(ctx, name); err != nil && !errors.Is(err, jetstream.ErrObjectNotFound) {
		return fmt.Errorf("partition: delete object %s: %w", name, err)
	}
	return nil
}

// sequencesOf returns the stream sequences of every message on subject,
// each found with a get of the next message on the subject (a stream
// request, answered by any of the stream's servers). It reads each message
// whole, so listing an object of C bytes reads C bytes; the overwrite that
// follows writes more. It used an ordered consumer before: on a 3-server
// cluster its first request now and then met "no responders" (the new
// consumer not yet known where the request arrived), and an erase was
// retried for minutes (TestDynamicEraseLeavesNoCopy, CI at 7c11d4b).
// want is how many messages the subject holds (as the stream's leader
// counts them): a replica that has not yet stored the newest ones answers
// a direct get too, so a shorter list is read again.
func sequencesOf(ctx context.Context, s jetstream.Stream, subject string, want int) ([]uint64, error) {
	var seqs []uint64
	for attempt := 0; ; attempt++ {
		seqs = seqs[:0]
		next := uint64(1)
		for {
			m, err := bounded(ctx, func(ctx context.Context) (*jetstream.RawStreamMsg, error) {
				return s.GetMsg(ctx, next, jetstream.WithGetMsgSubject(subject))
			})
			if errors.Is(err, jetstream.ErrMsgNotFound) {
				break
			}
			if err != nil {
				return nil, err
			}
			seqs = append(seqs, m.Sequence)
			next = m.Sequence + 1
		}
		if len(seqs) >= want || attempt == 4 {
			if len(seqs) < want {
				return nil, fmt.Errorf("%d of its %d messages found after %d reads", len(seqs), want, attempt+1)
			}
			return seqs, nil
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(time.Duration(attempt+1) * 200 * time.Millisecond):
		}
	}
}
