package queue

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/telha/telha-cascade/cascade"
	"github.com/telha/telha-cascade/internal/testnats"
	"github.com/telha/telha-cascade/partition"
	"github.com/telha/telha-cascade/storage"
)

// TestFeedOfAFencedCopyPublishesNothing: an owner whose slot moved (its
// changelog now has another writer's append) publishes nothing of its
// copy's feed, and its cursor stays; the changelog's current writer
// publishes the same change. Without the check (no Owned hook) the
// fenced copy publishes it: a zombie paused past its lease would put
// back on the feed a put whose props the new owner's erase deleted.
func TestFeedOfAFencedCopyPublishesNothing(t *testing.T) {
	ns := testnats.Start(t)
	nc := testnats.Connect(t, ns.ClientURL())
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{}.Defaults()
	s, err := js.CreateStream(ctx, ChangesStreamConfig(cfg))
	if err != nil {
		t.Fatal(err)
	}
	openStore := func() *storage.Store {
		st, err := storage.OpenStore(t.TempDir(), storage.Options{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = st.Close() })
		if _, err := cascade.New(st, cascade.Options{}).PutNode(ctx, storage.MustScope("acme"), storage.NodeWrite{ID: uuid.New(), ValidFrom: storage.NoTs, ValidTo: storage.NoTs,
			Props: []byte(`{"n":1}`), Prov: storage.Provenance{RequestID: "r1"}}); err != nil {
			t.Fatal(err)
		}
		return st
	}
	logData := func() []byte {
		b := make([]byte, 12, 12+16) // an empty Pebble batch repr, then one log-data record
		b[8] = 1                     // count
		b = append(b, 3, 4)          // kind LogData, length 4
		return append(b, "test"...)
	}
	zombie, err := partition.Open(ctx, js, partition.Config{Partition: 0})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := zombie.Append(ctx, logData()); err != nil {
		t.Fatal(err)
	}
	owner, err := partition.Open(ctx, js, partition.Config{Partition: 0})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := owner.Append(ctx, logData()); err != nil {
		t.Fatal(err)
	}

	stale := openStore()
	p, err := NewFeedPublisher(nil, nc, stale, cfg, nil, FeedHooks{Owned: zombie.Owned})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	_, err = p.Round(ctx)
	if !errors.Is(err, ErrNotOwned) || !errors.Is(err, partition.ErrFenced) {
		t.Fatalf("round of the fenced copy: %v, want ErrNotOwned wrapping partition.ErrFenced", err)
	}
	if info, err := s.Info(ctx); err != nil || info.State.Msgs != 0 {
		t.Fatalf("the fenced copy published: the feed holds %+v (%v)", info.State, err)
	}
	if pos, err := stale.FeedCursor(storage.MustScope("acme")); err != nil || pos != (storage.FeedPos{}) {
		t.Fatalf("the fenced copy's cursor moved: %+v (%v)", pos, err)
	}

	current := openStore()
	var fenced atomic.Bool
	p, err = NewFeedPublisher(nil, nc, current, cfg, nil, FeedHooks{Owned: func(ctx context.Context) error {
		if fenced.Load() {
			return zombie.Owned(ctx)
		}
		return owner.Owned(ctx)
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	if _, err := p.Round(ctx); err != nil {
		t.Fatalf("round of the current writer's copy: %v", err)
	}
	if info, err := s.Info(ctx); err != nil || info.State.Msgs != 1 {
		t.Fatalf("the current writer's copy: the feed holds %+v (%v), want its one put", info.State, err)
	}
	// The same copy fenced in turn: once the last yes is feedOwnedFor old
	// (a pause runs on the monotonic clock), the next round asks again and
	// publishes nothing.
	if _, err := cascade.New(current, cascade.Options{}).PutNode(ctx, storage.MustScope("acme"), storage.NodeWrite{ID: uuid.New(), ValidFrom: storage.NoTs, ValidTo: storage.NoTs,
		Props: []byte(`{"n":2}`), Prov: storage.Provenance{RequestID: "r2"}}); err != nil {
		t.Fatal(err)
	}
	fenced.Store(true)
	p.ownedAt = p.ownedAt.Add(-feedOwnedFor)
	if _, err := p.Round(ctx); !errors.Is(err, ErrNotOwned) {
		t.Fatalf("round after the copy was fenced and its last yes aged: %v, want ErrNotOwned", err)
	}
	if info, err := s.Info(ctx); err != nil || info.State.Msgs != 1 {
		t.Fatalf("the copy fenced in turn published: the feed holds %+v (%v)", info.State, err)
	}
}
