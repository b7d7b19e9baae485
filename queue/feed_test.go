package queue

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/telha/telha-cascade/queue/client"
	"github.com/telha/telha-cascade/storage"
)

// A put too large for the server with the rest of its change goes
// without its props, marked props_omitted; one that fits carries them;
// a tombstone never does.
func TestChangeMsgOmitsPropsTooLarge(t *testing.T) {
	sc := storage.MustScope("big")
	props := `{"blob":"` + strings.Repeat("x", 2000) + `"}`
	put := &storage.Change{Op: storage.FeedPut, V: storage.Version{Kind: storage.KindNode, ID: uuid.New(),
		Valid: storage.Open(5), Tx: storage.Open(5), Props: []byte(props), Prov: storage.Provenance{RequestID: "r1"}}}
	for _, tc := range []struct {
		max            int
		props, omitted bool
	}{{0, true, false}, {10_000, true, false}, {1_000, false, true}} {
		m := changeMsg(Config{}.Defaults(), sc, put, tc.max)
		var c client.Change
		if err := json.Unmarshal(m.Data, &c); err != nil {
			t.Fatal(err)
		}
		if (c.Props != nil) != tc.props || c.PropsOmitted != tc.omitted {
			t.Fatalf("max %d: props %d bytes, omitted %v; want props %v, omitted %v", tc.max, len(c.Props), c.PropsOmitted, tc.props, tc.omitted)
		}
		if tc.max > 0 && len(m.Data) > tc.max {
			t.Fatalf("max %d: the message holds %d bytes", tc.max, len(m.Data))
		}
		if m.Subject != "telha.chg.big.node.put" || m.Header.Get("Nats-Msg-Id") == "" {
			t.Fatalf("subject %s, msg id %q", m.Subject, m.Header.Get("Nats-Msg-Id"))
		}
	}
	tomb := *put
	tomb.Op, tomb.V.Tombstone = storage.FeedTombstone, true
	var c client.Change
	_ = json.Unmarshal(changeMsg(Config{}.Defaults(), sc, &tomb, 0).Data, &c)
	if c.Props != nil || c.Op != client.ChangeTombstone {
		t.Fatalf("tombstone change: %+v", c)
	}
}

// appendChange writes what encoding/json writes for a client.Change (read
// back, the same value), for any strings: quotes, control characters,
// invalid UTF-8, U+2028. Seeds run under plain go test.
func FuzzAppendChange(f *testing.F) {
	f.Add("r-1", "rel", `{"a":1}`, uint64(0), true)
	f.Add("quote\"back\\slash\n\x00\x1f", "\u2028\u2029<>&", `{}`, uint64(7), false)
	f.Add(string([]byte{0xff, 'a', 0xc3}), "é", `{"x":[1,"y",null]}`, uint64(1), true)
	f.Fuzz(func(t *testing.T, rid, label, props string, erased uint64, edge bool) {
		c := client.Change{Tenant: "t1", Kind: client.KindNode, Op: client.ChangePut, ID: uuid.NewString(), TxTime: "2026-12-05T00:00:00.000001Z",
			ValidFrom: "2026-12-05T00:00:00.000001Z", RequestID: rid}
		if edge {
			c.Kind, c.Src, c.Dst, c.Label, c.Cause = client.KindEdge, uuid.NewString(), uuid.NewString(), label, uuid.NewString()
		}
		if json.Valid([]byte(props)) {
			var buf strings.Builder
			_ = json.NewEncoder(&buf).Encode(json.RawMessage(props)) // compact, as stored
			c.Props = json.RawMessage(strings.TrimSpace(buf.String()))
		}
		if erased > 0 {
			c.VersionsErased, c.Erased, c.PropsOmitted = &erased, true, true
		}
		got := appendChange(nil, &c)
		if !json.Valid(got) {
			t.Fatalf("not JSON: %q", got)
		}
		var back, want client.Change
		if err := json.Unmarshal(got, &back); err != nil {
			t.Fatal(err)
		}
		std, _ := json.Marshal(&c)
		if err := json.Unmarshal(std, &want); err != nil {
			t.Fatal(err)
		}
		b1, _ := json.Marshal(&back)
		b2, _ := json.Marshal(&want)
		if string(b1) != string(b2) {
			t.Fatalf("appendChange %s\nencoding/json %s", got, std)
		}
	})
}
