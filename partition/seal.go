package partition

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"maps"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/telha/telha-cascade/internal/sealed"
)

// Sealed tables (issue 29, DECISIONS 80): crypto-shredding of the
// checkpoints' tables.
//
// A table object is the bulk of what an erase must scrub from the bucket:
// a secure delete of an object overwrites each of its chunk messages, and
// the server rewrites the whole block file (up to 8 MB) that holds the
// chunk for each one (erase.go), so deleting a few tables wrote hundreds
// of megabytes on every NATS server. Instead, each table uploaded since
// this change is sealed with a data key of its own (AES-256-GCM, in
// segments), and the key is stored in a small KV bucket beside the
// checkpoints (KeysBucket). Deleting a sealed table destroys its key (a
// secure delete of one small message in a stream of small messages) and
// then deletes the object plainly: the ciphertext left in the object
// bucket's block files, or in a copy of the object bucket alone, is
// unreadable for good. (A NATS server that was down during the delete,
// and the Raft logs until their next snapshot, hold the key as long as
// they hold the ciphertext: docs/RELIABILITY.md, (d) and (e).)
//
// Invariant: a sealed object's key is stored before its first chunk is,
// and destroyed only by DeleteObject, which deletes the object after. So a
// listed table always has its key, and an object whose key is gone is one
// a delete was cut short on (the next collection finishes it).
//
// Tables stored before this change (no sealed.Meta in their metadata) restore
// as they are and are deleted securely, as before.

// KeysBucket is the KV bucket that holds the data keys of bucket's sealed
// tables, keyed by object name (the format: internal/sealed).
func KeysBucket(bucket string) string { return sealed.KeysBucket(bucket) }

// Bucket is the checkpoint bucket with the KV bucket of its data keys, as
// OpenCheckpoints returns it. It is a jetstream.ObjectStore; the functions
// of this package that take one seal what they upload when it is a
// *Bucket, and upload plainly otherwise.
type Bucket struct {
	jetstream.ObjectStore
	js   jetstream.JetStream
	keys jetstream.KeyValue
}

// openKeys creates (or binds) the KV bucket of bucket's data keys. Its
// stream is made here, shaped as the client's KV makes one but without
// DenyDelete (which the client sets and a stream can never drop again): a
// key is destroyed with a secure delete of its message.
func openKeys(ctx context.Context, js jetstream.JetStream, bucket string, replicas int) (jetstream.KeyValue, error) {
	name := KeysBucket(bucket)
	// Bound if it exists (a stream info, no round of the cluster's meta
	// group: every slot of a member opens it as it starts).
	if kv, err := js.KeyValue(ctx, name); err == nil {
		return kv, nil
	} else if !errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil, fmt.Errorf("partition: key bucket %s: %w", name, err)
	}
	_, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name:              "KV_" + name,
		Description:       "telha data keys of the sealed checkpoint tables of " + bucket + " (a key destroyed is a table erased)",
		Subjects:          []string{"$KV." + name + ".>"},
		MaxMsgsPerSubject: 1,
		Discard:           jetstream.DiscardNew,
		Storage:           jetstream.FileStorage,
		Replicas:          replicas,
		AllowRollup:       true,
		AllowDirect:       true,
		Duplicates:        2 * time.Minute,
	})
	if err != nil {
		return nil, fmt.Errorf("partition: key bucket %s: %w", name, err)
	}
	kv, err := js.KeyValue(ctx, name)
	if err != nil {
		return nil, fmt.Errorf("partition: key bucket %s: %w", name, err)
	}
	return kv, nil
}

// newKey stores a new data key for object name and returns it.
func (b *Bucket) newKey(ctx context.Context, name string) ([]byte, error) {
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		return nil, err
	}
	if _, err := b.keys.Put(ctx, name, key); err != nil {
		return nil, fmt.Errorf("partition: store the data key of %s: %w", name, err)
	}
	return key, nil
}

// destroyKey overwrites object name's data key in the key bucket's
// stream (a secure delete: the server rewrites the small block file that
// holds it) and removes it. A key already gone is not an error.
func destroyKey(ctx context.Context, js jetstream.JetStream, kv jetstream.KeyValue, bucket, name string) error {
	e, err := kv.Get(ctx, name)
	if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("partition: the data key of %s: %w", name, err)
	}
	s, err := js.Stream(ctx, "KV_"+KeysBucket(bucket))
	if err != nil {
		return fmt.Errorf("partition: key bucket of %s: %w", bucket, err)
	}
	if err := s.SecureDeleteMsg(ctx, e.Revision()); err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
		return fmt.Errorf("partition: destroy the data key of %s: %w", name, err)
	}
	return nil
}

// putObject stores r as object meta.Name of obs: sealed with a new data
// key when obs is a *Bucket (the key stored first, so a listed object
// always has its key), as it is otherwise. Every object this package
// stores goes through it: tables, table lists, checkpoint archives and
// tails, so that deleting any of them destroys a key instead of
// overwriting its chunks (DeleteObject).
func putObject(ctx context.Context, obs jetstream.ObjectStore, meta jetstream.ObjectMeta, r io.Reader) (*jetstream.ObjectInfo, error) {
	if b, ok := obs.(*Bucket); ok {
		key, err := b.newKey(ctx, meta.Name)
		if err != nil {
			return nil, err
		}
		if r, err = sealed.NewSealReader(r, key); err != nil {
			return nil, err
		}
		md := maps.Clone(meta.Metadata)
		if md == nil {
			md = map[string]string{}
		}
		md[sealed.Meta] = sealed.V1
		meta.Metadata = md
	}
	return obs.Put(ctx, meta, r)
}

// keysOf returns the key bucket of obs (bucket, in js).
func keysOf(ctx context.Context, js jetstream.JetStream, obs jetstream.ObjectStore, bucket string) (jetstream.KeyValue, error) {
	if b, ok := obs.(*Bucket); ok {
		return b.keys, nil
	}
	return js.KeyValue(ctx, KeysBucket(bucket))
}

// openObject opens object name of obs for reading its plaintext: as
// stored, or opened with its data key when it is sealed (an error wrapping
// sealed.ErrKeyDestroyed when that key is gone).
func openObject(ctx context.Context, obs jetstream.ObjectStore, name string) (io.ReadCloser, error) {
	res, err := obs.Get(ctx, name)
	if err != nil {
		return nil, err
	}
	info, err := res.Info()
	if err != nil {
		res.Close()
		return nil, err
	}
	format := info.Metadata[sealed.Meta]
	if format == "" {
		return res, nil
	}
	b, ok := obs.(*Bucket)
	if !ok {
		res.Close()
		return nil, fmt.Errorf("partition: %s is sealed, and its bucket was opened without its key bucket (use OpenCheckpoints)", name)
	}
	r, err := sealed.Open(ctx, b.keys, name, format, res)
	if err != nil {
		res.Close()
		return nil, err
	}
	return readCloser{r, res}, nil
}

type readCloser struct {
	io.Reader
	io.Closer
}

// ReadObject returns the plaintext of object name of obs (openObject).
func ReadObject(ctx context.Context, obs jetstream.ObjectStore, name string) ([]byte, error) {
	r, err := openObject(ctx, obs, name)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	return io.ReadAll(r)
}
