package main

import (
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/google/uuid"
	"github.com/telha/telha-cascade/storage"
)

// graphWriter writes a graph straight into a fresh store's engine, version
// by version with storage.AppendVersion (the bytes Txn.PutNode/PutEdge would
// write for a live version with no props and no provenance), in unsynced
// batches, skipping the per-write reads and checks. It is only for building
// benchmark graphs fast; the store is closed at the end, so the next
// OpenStore rebuilds its tenant registry and clock from disk.
type graphWriter struct {
	st      *storage.Store
	eng     storage.Engine
	b       *pebble.Batch
	tx      storage.Ts
	tenants map[string]storage.Scope
	puts    int
	// props of every version written ("{}" when nil); the erase phase
	// gives them a payload to erase.
	props []byte
}

func newGraphWriter(dir string) (*graphWriter, error) {
	st, err := storage.OpenStore(dir, storage.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		return nil, err
	}
	g := &graphWriter{st: st, eng: st.Engine(), tenants: map[string]storage.Scope{}, tx: storage.TsFromTime(time.Now())}
	g.b = g.eng.NewBatch()
	return g, nil
}

func (g *graphWriter) scope(t string) storage.Scope {
	sc, ok := g.tenants[t]
	if !ok {
		sc = storage.MustScope(t)
		g.tenants[t] = sc
	}
	return sc
}

func (g *graphWriter) next() storage.Ts {
	g.tx++
	return g.tx
}

func (g *graphWriter) write(sc storage.Scope, v *storage.Version, puts int) error {
	storage.AppendVersion(g.b, sc, v)
	g.puts += puts
	if g.puts >= 50_000 {
		return g.flush()
	}
	return nil
}

func (g *graphWriter) flush() error {
	if g.puts == 0 {
		return nil
	}
	if err := g.b.Commit(pebble.NoSync); err != nil {
		return fmt.Errorf("graph build: %w", err)
	}
	g.b.Close()
	g.b = g.eng.NewBatch()
	g.puts = 0
	return nil
}

func (g *graphWriter) node(tenant string, id uuid.UUID) error {
	tx := g.next()
	v := storage.Version{Kind: storage.KindNode, ID: id, Valid: storage.Open(tx), Tx: storage.Open(tx), Props: g.payload(), Prov: storage.Provenance{DecidedAt: storage.NoTs}}
	return g.write(g.scope(tenant), &v, storage.OpsPerNodeVersion)
}

func (g *graphWriter) edge(tenant string, id, src, dst uuid.UUID) error {
	tx := g.next()
	v := storage.Version{Kind: storage.KindEdge, ID: id, Src: src, Dst: dst, Label: benchLabel, Valid: storage.Open(tx), Tx: storage.Open(tx), Props: g.payload(), Prov: storage.Provenance{DecidedAt: storage.NoTs}}
	return g.write(g.scope(tenant), &v, storage.OpsPerEdgeVersion)
}

func (g *graphWriter) payload() []byte {
	if g.props == nil {
		return []byte("{}")
	}
	return g.props
}

// close registers the tenants (their feed cursors at the last tx), syncs, lets compactions finish (the measured
// run must not pay the build's compaction debt) and closes the store.
func (g *graphWriter) close() error {
	for _, sc := range g.tenants {
		_ = g.b.Set(storage.TenantKey(sc), nil, nil)
		// As if the change feed had published the graph already: a store
		// that predates the feed publishes its history on its first start
		// with it, which is not what the phases measure.
		_ = g.b.Set(storage.FeedCursorKey(sc), storage.EncodeFeedPos(storage.FeedPos{Tx: g.tx}), nil)
		g.puts += 2
	}
	err := g.flush()
	if err == nil { // settle flushes the memtable: everything is in sstables
		if pe, ok := g.eng.(*storage.PebbleEngine); ok {
			err = settle(pe.DB)
		}
	}
	g.b.Close()
	if cerr := g.st.Close(); err == nil {
		err = cerr
	}
	return err
}
