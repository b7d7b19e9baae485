package storage

import (
	"bytes"
	"math"
	"math/rand/v2"
	"sort"
	"testing"

	"github.com/google/uuid"
)

func TestKeyRoundTrip(t *testing.T) {
	sc := MustScope("acme")
	id, other, job := uuid.New(), uuid.New(), uuid.New()
	cases := []struct {
		name string
		key  []byte
		want Key
	}{
		{"node", NodeKey(sc, id, 10, -5), Key{Space: ksNode, Tenant: "acme", ID: id, Kind: KindNode, Tx: 10, Valid: -5}},
		{"edge", EdgeKey(sc, id, math.MaxInt64-1, math.MinInt64+1), Key{Space: ksEdge, Tenant: "acme", ID: id, Kind: KindEdge, Tx: math.MaxInt64 - 1, Valid: math.MinInt64 + 1}},
		{"adj out", AdjKey(sc, true, other, id, 3, 4), Key{Space: ksAdjOut, Tenant: "acme", Node: other, ID: id, Kind: KindEdge, Tx: 3, Valid: 4}},
		{"adj in", AdjKey(sc, false, other, id, 3, 4), Key{Space: ksAdjIn, Tenant: "acme", Node: other, ID: id, Kind: KindEdge, Tx: 3, Valid: 4}},
		{"valid idx", ValidIdxKey(sc, -7, KindEdge, id, 9), Key{Space: ksValidIdx, Tenant: "acme", Kind: KindEdge, ID: id, Valid: -7, Tx: 9}},
		{"tx idx", TxIdxKey(sc, 9, KindNode, id, -7), Key{Space: ksTxIdx, Tenant: "acme", Kind: KindNode, ID: id, Valid: -7, Tx: 9}},
		{"job", JobKey(sc, CascadeJournalState, 2, 77, job), Key{Space: ksJobs, Tenant: "acme", State: CascadeJournalState, Priority: 2, CreatedAt: 77, JobID: job}},
		{"page", JournalPageKey(sc, 0, 77, job, 3), Key{Space: ksJobs, Tenant: "acme", State: JournalPageState, CreatedAt: 77, JobID: job, Page: 3, HasPage: true}},
		{"receipt", ReceiptKey(sc, "req-1"), Key{Space: ksMeta, Sub: metaReceipt, Tenant: "acme", RequestID: "req-1"}},
		{"tenant", TenantKey(sc), Key{Space: ksMeta, Sub: metaTenant, Tenant: "acme"}},
		{"format", formatKey(), Key{Space: ksMeta, Sub: metaFormat}},
	}
	for _, c := range cases {
		got, err := DecodeKey(c.key)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if got != c.want {
			t.Errorf("%s: got %+v, want %+v", c.name, got, c.want)
		}
		for i := 0; i < len(c.key); i++ {
			if _, err := DecodeKey(c.key[:i]); err == nil && c.name != "receipt" {
				t.Errorf("%s: truncated key of %d bytes decoded", c.name, i)
			}
		}
	}
}

type tup struct {
	id        uuid.UUID
	tx, valid Ts
}

func randTs(r *rand.Rand) Ts {
	switch r.IntN(4) {
	case 0:
		return Ts(r.Int64N(1000) - 500)
	case 1:
		return Ts(math.MinInt64 + 1 + r.Int64N(10))
	case 2:
		return Ts(math.MaxInt64 - r.Int64N(10))
	}
	return Ts(r.Int64() - math.MaxInt64/2)
}

// TestKeyOrdering: key order is (id, tx, valid) order with negative times
// first, for every keyspace that carries times.
func TestKeyOrdering(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	sc := MustScope("t1")
	ids := []uuid.UUID{uuid.New(), uuid.New(), uuid.New()}
	var ts []tup
	for i := 0; i < 2000; i++ {
		ts = append(ts, tup{ids[r.IntN(len(ids))], randTs(r), randTs(r)})
	}
	less := func(a, b tup) bool {
		if c := bytes.Compare(a.id[:], b.id[:]); c != 0 {
			return c < 0
		}
		if a.tx != b.tx {
			return a.tx < b.tx
		}
		return a.valid < b.valid
	}
	for name, mk := range map[string]func(tup) []byte{
		"node":    func(x tup) []byte { return NodeKey(sc, x.id, x.tx, x.valid) },
		"edge":    func(x tup) []byte { return EdgeKey(sc, x.id, x.tx, x.valid) },
		"adj out": func(x tup) []byte { return AdjKey(sc, true, ids[0], x.id, x.tx, x.valid) },
	} {
		s := append([]tup(nil), ts...)
		sort.Slice(s, func(i, j int) bool { return bytes.Compare(mk(s[i]), mk(s[j])) < 0 })
		for i := 1; i < len(s); i++ {
			if less(s[i], s[i-1]) {
				t.Fatalf("%s: key order disagrees with (id, tx, valid) order at %d: %+v before %+v", name, i, s[i-1], s[i])
			}
		}
	}
	// Index keys order by their leading time, negative first.
	var times []Ts
	for i := 0; i < 500; i++ {
		times = append(times, randTs(r))
	}
	sort.Slice(times, func(i, j int) bool {
		return bytes.Compare(ValidIdxKey(sc, times[i], KindNode, ids[0], 0), ValidIdxKey(sc, times[j], KindNode, ids[0], 0)) < 0
	})
	if !sort.SliceIsSorted(times, func(i, j int) bool { return times[i] < times[j] }) {
		t.Fatal("valid index keys do not sort by time")
	}
}

// TestTenantIsolationKeys: no key of tenant "a" falls inside a scan of "ab"
// and the reverse, in every keyspace.
func TestTenantIsolationKeys(t *testing.T) {
	a, ab := MustScope("a"), MustScope("ab")
	id := uuid.New()
	keysOf := func(sc Scope) [][]byte {
		return [][]byte{
			NodeKey(sc, id, 1, 1), EdgeKey(sc, id, 1, 1), AdjKey(sc, true, id, id, 1, 1),
			AdjKey(sc, false, id, id, 1, 1), ValidIdxKey(sc, 1, KindNode, id, 1), TxIdxKey(sc, 1, KindNode, id, 1),
			JobKey(sc, CascadeJournalState, 0, 1, id), ReceiptKey(sc, "r"), TenantKey(sc),
		}
	}
	for _, space := range []byte{ksNode, ksEdge, ksAdjOut, ksAdjIn, ksValidIdx, ksTxIdx, ksJobs} {
		for _, pair := range [][2]Scope{{a, ab}, {ab, a}} {
			lo, hi := TenantRange(space, pair[0])
			for _, k := range keysOf(pair[1]) {
				if bytes.Compare(k, lo) >= 0 && bytes.Compare(k, hi) < 0 {
					t.Errorf("key %x of %q lies in %q's range of keyspace %#x", k, pair[1], pair[0], space)
				}
			}
		}
	}
	lo, hi := JobsInState(a, CascadeJournalState)
	k := JobKey(ab, CascadeJournalState, 0, 1, id)
	if bytes.Compare(k, lo) >= 0 && bytes.Compare(k, hi) < 0 {
		t.Error("jobs_in_state(a) contains a job of ab")
	}
}

func TestPrefixEnd(t *testing.T) {
	for _, c := range []struct{ in, want []byte }{
		{[]byte{1, 2}, []byte{1, 3}},
		{[]byte{1, 0xff}, []byte{2}},
		{[]byte{0xff, 0xff}, nil},
	} {
		if got := PrefixEnd(c.in); !bytes.Equal(got, c.want) {
			t.Errorf("PrefixEnd(%x) = %x, want %x", c.in, got, c.want)
		}
	}
}

func TestScopeValidation(t *testing.T) {
	for _, ok := range []string{"a", "acme", "a-b_c", "0", "a" + string(bytes.Repeat([]byte("b"), 62))} {
		if _, err := NewScope(ok); err != nil {
			t.Errorf("%q rejected: %v", ok, err)
		}
	}
	for _, bad := range []string{"", "A", "-a", "_a", "a.b", "a*", "a>", "a b", "é", "a" + string(bytes.Repeat([]byte("b"), 63))} {
		if _, err := NewScope(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}
