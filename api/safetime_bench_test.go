package api_test

import (
	"bytes"
	"context"
	"net/http"
	"testing"

	"github.com/telha/telha-cascade/cascade"
	"github.com/telha/telha-cascade/storage"
)

// BenchmarkReadSafeTime measures what safe time costs a read (CONTRACT
// §6): the same reads with no journal in flight ("idle") and while a
// 25k-edge hub's journaled cascade is committed but not applied
// ("inflight"), of a node with 100 edges that no journal fences ("plain":
// its reads take one committed-tx load and a fence lookup per node
// touched) and of the fenced hub itself ("hub": answered just below the
// journal's tx, with cascade_in_flight). Compare the pairs of one run:
//
//	go test -run '^$' -bench ReadSafeTime -benchtime 20000x ./api
func BenchmarkReadSafeTime(b *testing.B) {
	w := newSafeWorld(b)
	sc := storage.MustScope("acme")
	plain, plainEdges := w.hub(sc, 100)
	hub, hubEdges := w.hub(sc, 25_000)
	reads := []struct{ name, path string }{
		{"plain/node", "/v1/tenants/acme/nodes/" + plain.String()},
		{"plain/edge", "/v1/tenants/acme/edges/" + plainEdges[7].String()},
		{"plain/page100", "/v1/tenants/acme/nodes/" + plain.String() + "/edges?limit=100"},
		{"hub/node", "/v1/tenants/acme/nodes/" + hub.String()},
		{"hub/edge", "/v1/tenants/acme/edges/" + hubEdges[7].String()},
		{"hub/page100", "/v1/tenants/acme/nodes/" + hub.String() + "/edges?limit=100"},
	}
	run := func(phase string, wantInFlight bool) {
		for _, r := range reads {
			b.Run(phase+"/"+r.name, func(b *testing.B) {
				res := w.get(r.path)
				if res.code != http.StatusOK {
					b.Fatalf("GET %s: %d %s", r.path, res.code, res.body)
				}
				fenced := wantInFlight && r.name[:3] == "hub"
				if got := containsInFlight(res.body); got != fenced {
					b.Fatalf("GET %s (%s): cascade_in_flight %v, want %v", r.path, phase, got, fenced)
				}
				b.ReportAllocs()
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					w.get(r.path)
				}
			})
		}
	}
	run("idle", false)
	out, _, err := w.ops.Apply(context.Background(), []cascade.Request{{Scope: sc, Op: storage.OpTombstoneNode, ID: hub, RequestID: "del-hub",
		ValidFrom: storage.NoTs, ValidTo: storage.NoTs, ValidEnd: storage.NoTs, Prov: storage.Provenance{DecidedAt: storage.NoTs}}})
	if err != nil || out[0].Kind != cascade.Journaled {
		b.Fatalf("tombstone_node: %+v %v, want journaled", out[0], err)
	}
	run("inflight", true)
}

func containsInFlight(body []byte) bool { return bytes.Contains(body, []byte(`"cascade_in_flight"`)) }
