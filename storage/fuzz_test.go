package storage

import (
	"bytes"
	"reflect"
	"testing"

	"github.com/google/uuid"
)

// Every decoder must turn any input into a value or an ErrDecode, never a
// panic; whatever decodes must re-encode to an input that decodes to the
// same value. Seeds run under plain `go test`.

func FuzzDecodeKey(f *testing.F) {
	sc := MustScope("acme")
	id := uuid.New()
	for _, k := range [][]byte{
		NodeKey(sc, id, 1, -1), EdgeKey(sc, id, 2, 3), AdjKey(sc, true, id, id, 4, 5), AdjKey(sc, false, id, id, 4, 5),
		ValidIdxKey(sc, 1, KindNode, id, 2), TxIdxKey(sc, 1, KindEdge, id, 2), JobKey(sc, CascadeJournalState, 0, 9, id),
		JournalPageKey(sc, 0, 9, id, 1), ReceiptKey(sc, "r"), TenantKey(sc), formatKey(), {}, {0xff},
		EraseJobKey(sc, 9, "r"), ErasureKey(sc, "r"),
	} {
		f.Add(k)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		k, err := DecodeKey(b)
		if err != nil {
			return
		}
		var re []byte
		sc := Scope{tenant: k.Tenant}
		switch k.Space {
		case ksNode:
			re = NodeKey(sc, k.ID, k.Tx, k.Valid)
		case ksEdge:
			re = EdgeKey(sc, k.ID, k.Tx, k.Valid)
		case ksAdjOut, ksAdjIn:
			re = AdjKey(sc, k.Space == ksAdjOut, k.Node, k.ID, k.Tx, k.Valid)
		case ksValidIdx:
			re = ValidIdxKey(sc, k.Valid, k.Kind, k.ID, k.Tx)
		case ksTxIdx:
			re = TxIdxKey(sc, k.Tx, k.Kind, k.ID, k.Valid)
		case ksJobs:
			if k.HasPage {
				re = JournalPageKey(sc, k.Priority, k.CreatedAt, k.JobID, k.Page)
			} else {
				re = JobKey(sc, k.State, k.Priority, k.CreatedAt, k.JobID)
			}
		default:
			return
		}
		if !bytes.Equal(re, b) {
			t.Fatalf("re-encoded %x != %x", re, b)
		}
	})
}

func FuzzDecodeVersion(f *testing.F) {
	for _, v := range sampleVersions() {
		f.Add(EncodeVersion(&v))
	}
	f.Add([]byte{})
	f.Add([]byte{FormatVersion, 2, 0xff})
	f.Fuzz(func(t *testing.T, b []byte) {
		v, err := DecodeVersion(b)
		if err != nil {
			return
		}
		v2, err := DecodeVersion(EncodeVersion(&v))
		if err != nil || !reflect.DeepEqual(v, v2) {
			t.Fatalf("unstable round trip: %+v vs %+v (%v)", v, v2, err)
		}
	})
}

func FuzzDecodeAdj(f *testing.F) {
	f.Add(EncodeAdj(&AdjRow{Other: uuid.New(), Label: "x", Valid: Open(1), Tx: Open(2)}))
	f.Add([]byte{FormatVersion})
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := DecodeAdj(b)
		if err != nil {
			return
		}
		if r2, err := DecodeAdj(EncodeAdj(&r)); err != nil || r2 != r {
			t.Fatalf("unstable round trip: %+v vs %+v", r, r2)
		}
	})
}

func FuzzDecodeReceipt(f *testing.F) {
	f.Add(EncodeReceipt(&Receipt{Op: OpPutEdge, Status: StatusOK, ID: uuid.New(), Tx: 5}))
	f.Add([]byte{FormatVersion, 1, 1, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := DecodeReceipt(b)
		if err != nil {
			return
		}
		if r2, err := DecodeReceipt(EncodeReceipt(&r)); err != nil || r2 != r {
			t.Fatalf("unstable round trip: %+v vs %+v", r, r2)
		}
	})
}

func FuzzDecodeJournal(f *testing.F) {
	f.Add(EncodeJournal(&Journal{NodeID: uuid.New(), Tx: 3, Edges: 5000, PageCount: 2, Prov: Provenance{DecidedAt: NoTs}}))
	f.Add(EncodeJournalPage([]uuid.UUID{uuid.New()}))
	f.Fuzz(func(t *testing.T, b []byte) {
		if j, err := DecodeJournal(b); err == nil {
			if j2, err := DecodeJournal(EncodeJournal(&j)); err != nil || j2 != j {
				t.Fatalf("unstable journal round trip: %+v vs %+v", j, j2)
			}
		}
		if ids, err := DecodeJournalPage(b); err == nil {
			if ids2, err := DecodeJournalPage(EncodeJournalPage(ids)); err != nil || !reflect.DeepEqual(ids, ids2) {
				t.Fatalf("unstable page round trip")
			}
		}
		if o, err := DecodeOutbox(b); err == nil {
			if o2, err := DecodeOutbox(EncodeOutbox(&o)); err != nil || o2 != o {
				t.Fatalf("unstable outbox round trip")
			}
		}
	})
}

func FuzzDecodeEraseJob(f *testing.F) {
	f.Add(EncodeEraseJob(&EraseJob{Op: OpEraseNode, ID: uuid.New(), Tx: 3, Prov: Provenance{Actor: "dpo", Reason: "art. 17", RequestID: "r", DecidedAt: NoTs}}))
	f.Add(EncodeEraseJob(&EraseJob{Op: OpEraseEdge, ID: uuid.New(), Tx: 3, Prov: Provenance{DecidedAt: 7}, Versions: 9, HashState: []byte("state")}))
	f.Add([]byte{FormatVersion, byte(OpEraseNode), 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		j, err := DecodeEraseJob(b)
		if err != nil {
			return
		}
		if j2, err := DecodeEraseJob(EncodeEraseJob(&j)); err != nil || !reflect.DeepEqual(j, j2) {
			t.Fatalf("unstable erase head round trip: %+v vs %+v (%v)", j, j2, err)
		}
	})
}

func FuzzDecodeEraseRecord(f *testing.F) {
	f.Add(EncodeEraseRecord(&EraseRecord{Op: OpEraseNode, ID: uuid.New(), RequestID: "r", Actor: "dpo", Reason: "art. 17", Tx: 4, Versions: 12, Digest: [32]byte{1}}))
	f.Add([]byte{FormatVersion, byte(OpEraseEdge)})
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := DecodeEraseRecord(b)
		if err != nil {
			return
		}
		if r2, err := DecodeEraseRecord(EncodeEraseRecord(&r)); err != nil || r2 != r {
			t.Fatalf("unstable erasure record round trip: %+v vs %+v (%v)", r, r2, err)
		}
	})
}

func FuzzDecodeFeedPos(f *testing.F) {
	f.Add(EncodeFeedPos(FeedPos{Tx: 7, Phase: feedInEdges, ID: uuid.New(), Valid: 3}))
	f.Add(EncodeFeedPos(FeedPos{}))
	f.Add([]byte{1, 2, 3})
	f.Fuzz(func(t *testing.T, b []byte) {
		p, err := DecodeFeedPos(b)
		if err != nil {
			return
		}
		if p2, err := DecodeFeedPos(EncodeFeedPos(p)); err != nil || p2 != p {
			t.Fatalf("unstable round trip: %+v vs %+v", p, p2)
		}
	})
}

func FuzzDecodeFeedErase(f *testing.F) {
	f.Add(encodeFeedErase(&feedErase{Op: OpEraseNode, Kind: KindNode, ID: uuid.New(), Tx: 9, RequestID: "r-1", Versions: 4}))
	f.Add(encodeFeedErase(&feedErase{Op: OpEraseEdge, Kind: KindEdge, ID: uuid.New(), Tx: 12, RequestID: "r-2", Versions: 1, Scrubbed: true}))
	f.Add([]byte{1, 0, 3})
	f.Add([]byte{3, 0, 3})
	f.Fuzz(func(t *testing.T, b []byte) {
		e, err := decodeFeedErase(b)
		if err != nil {
			return
		}
		if e2, err := decodeFeedErase(encodeFeedErase(&e)); err != nil || e2 != e {
			t.Fatalf("unstable round trip: %+v vs %+v", e, e2)
		}
	})
}
