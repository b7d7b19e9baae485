package storage

import (
	"errors"
	"reflect"
	"testing"

	"github.com/google/uuid"
)

func sampleVersions() []Version {
	id, a, b := uuid.New(), uuid.New(), uuid.New()
	return []Version{
		{Kind: KindNode, ID: id, Valid: Interval{-100, 200}, Tx: Open(5), Props: []byte(`{"k":1}`), Prov: Provenance{Actor: "x", Reason: "r", Source: "s", RequestID: "q", DecidedAt: -3}},
		{Kind: KindEdge, ID: id, Src: a, Dst: b, Label: "owns", Valid: Open(7), Tx: Open(9), Tombstone: true, Props: []byte("{}"), Prov: Provenance{DecidedAt: NoTs}},
	}
}

func TestVersionRoundTrip(t *testing.T) {
	for _, v := range sampleVersions() {
		b := EncodeVersion(&v)
		got, err := DecodeVersion(b)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, v) {
			t.Fatalf("round trip: got %+v, want %+v", got, v)
		}
		valid, tx, tomb, err := versionIntervals(b)
		if err != nil || valid != v.Valid || tx != v.Tx || tomb != v.Tombstone {
			t.Fatalf("versionIntervals: %v %v %v %v", valid, tx, tomb, err)
		}
		for i := 0; i < len(b); i++ {
			if _, err := DecodeVersion(b[:i]); !errors.Is(err, ErrDecode) {
				t.Fatalf("truncated to %d: err %v, want ErrDecode", i, err)
			}
		}
		if _, err := DecodeVersion(append(b, 0)); !errors.Is(err, ErrDecode) {
			t.Fatal("trailing byte accepted")
		}
		bad := append([]byte(nil), b...)
		bad[0] = 99
		if _, err := DecodeVersion(bad); !errors.Is(err, ErrDecode) {
			t.Fatal("unknown format version accepted")
		}
	}
}

func TestOtherRecordsRoundTrip(t *testing.T) {
	adj := AdjRow{Other: uuid.New(), Label: "l", Valid: Interval{-1, 1}, Tx: Open(3), Tombstone: true}
	if got, err := DecodeAdj(EncodeAdj(&adj)); err != nil || got != adj {
		t.Fatalf("adj: %+v %v", got, err)
	}
	rc := Receipt{Op: OpTombstoneNode, Status: StatusOK, ID: uuid.New(), Tx: 42, EdgesTombstoned: 1 << 40, Journaled: true}
	if got, err := DecodeReceipt(EncodeReceipt(&rc)); err != nil || got != rc {
		t.Fatalf("receipt: %+v %v", got, err)
	}
	j := Journal{NodeID: uuid.New(), ValidEnd: -9, Tx: 77, Edges: JournalPageSize + 1, PageCount: 2, Prov: Provenance{Actor: "a", RequestID: "r", DecidedAt: 5}, CreatedAt: 100}
	if got, err := DecodeJournal(EncodeJournal(&j)); err != nil || got != j {
		t.Fatalf("journal: %+v %v", got, err)
	}
	j.PageCount = 5
	if _, err := DecodeJournal(EncodeJournal(&j)); !errors.Is(err, ErrDecode) {
		t.Fatal("journal with inconsistent page count accepted")
	}
	ids := []uuid.UUID{uuid.New(), uuid.New()}
	if got, err := DecodeJournalPage(EncodeJournalPage(ids)); err != nil || !reflect.DeepEqual(got, ids) {
		t.Fatalf("page: %v %v", got, err)
	}
	o := Outbox{RequestID: "r1", Receipt: rc}
	if got, err := DecodeOutbox(EncodeOutbox(&o)); err != nil || got != o {
		t.Fatalf("outbox: %+v %v", got, err)
	}
}
