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
