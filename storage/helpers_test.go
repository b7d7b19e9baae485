package storage

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/google/uuid"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

var quietLog = slog.New(slog.NewTextHandler(io.Discard, nil))

func openTest(t testing.TB, dir string, clock Clock) *Store {
	t.Helper()
	if dir == "" {
		dir = t.TempDir()
	}
	if clock == nil {
		clock = NewManualClock(t0)
	}
	s, err := OpenStore(dir, Options{Clock: clock, Logger: quietLog})
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func mustNode(t testing.TB, s *Store, sc Scope, id uuid.UUID) Version {
	t.Helper()
	v, err := s.PutNode(context.Background(), sc, NodeWrite{ID: id, ValidFrom: NoTs, ValidTo: NoTs})
	if err != nil {
		t.Fatalf("put node: %v", err)
	}
	return v
}

func mustEdge(t testing.TB, s *Store, sc Scope, id, src, dst uuid.UUID) Version {
	t.Helper()
	v, err := s.PutEdge(context.Background(), sc, EdgeWrite{ID: id, Src: src, Dst: dst, Label: "knows", ValidFrom: NoTs, ValidTo: NoTs})
	if err != nil {
		t.Fatalf("put edge: %v", err)
	}
	return v
}

// tombstone writes a raw tombstone version of an entity (the cascade package
// owns the real delete path; the store only has to read tombstones right).
func tombstone(t testing.TB, s *Store, sc Scope, k Kind, id uuid.UUID, validEnd Ts) Version {
	t.Helper()
	var out Version
	err := s.Update(context.Background(), func(tx *Txn) error {
		latest, ok, err := tx.Latest(sc, k, id)
		if err != nil || !ok {
			t.Fatalf("tombstone of missing %s: %v", id, err)
		}
		out = Version{Kind: k, ID: id, Src: latest.Src, Dst: latest.Dst, Label: latest.Label,
			Valid: Open(validEnd), Tx: Open(tx.NextTx()), Tombstone: true, Props: []byte("{}"), Prov: Provenance{DecidedAt: NoTs}}
		tx.WriteVersion(sc, &out)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}
