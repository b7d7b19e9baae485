package partition

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
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
// So the erase's copy scrub (app/changelog.go) purges the changelog whole,
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
	info, err := obs.GetInfo(ctx, name, jetstream.GetObjectInfoShowDeleted())
	if errors.Is(err, jetstream.ErrObjectNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("partition: checkpoint %s: %w", name, err)
	}
	if info.NUID != "" {
		stream := "OBJ_" + bucket
		subject := fmt.Sprintf("$O.%s.C.%s", bucket, info.NUID)
		seqs, err := sequencesOf(ctx, js, stream, subject)
		if err != nil {
			return fmt.Errorf("partition: object %s: list its chunks: %w", name, err)
		}
		s, err := js.Stream(ctx, stream)
		if err != nil {
			return fmt.Errorf("partition: checkpoint %s: %w", name, err)
		}
		for _, seq := range seqs {
			if err := s.SecureDeleteMsg(ctx, seq); err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
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
// read with an ordered consumer that delivers headers only.
func sequencesOf(ctx context.Context, js jetstream.JetStream, stream, subject string) ([]uint64, error) {
	cons, err := js.OrderedConsumer(ctx, stream, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{subject}, HeadersOnly: true, DeliverPolicy: jetstream.DeliverAllPolicy,
	})
	if err != nil {
		return nil, err
	}
	info, err := cons.Info(ctx)
	if err != nil {
		return nil, err
	}
	pending := info.NumPending
	var seqs []uint64
	for uint64(len(seqs)) < pending {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		batch, err := cons.Fetch(int(min(pending-uint64(len(seqs)), 256)), jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			return nil, err
		}
		got := 0
		for m := range batch.Messages() {
			md, err := m.Metadata()
			if err != nil {
				return nil, err
			}
			seqs = append(seqs, md.Sequence.Stream)
			got++
			if md.NumPending == 0 {
				pending = uint64(len(seqs))
			}
		}
		if err := batch.Error(); err != nil {
			return nil, err
		}
		if got == 0 {
			break // the rest went meanwhile (a concurrent delete)
		}
	}
	return seqs, nil
}
