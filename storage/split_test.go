package storage

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/bloom"
	"github.com/google/uuid"
)

// randomKeys builds keys of every keyspace, for several tenants (lengths 1
// to 3, sharing leading bytes), with the key codec's own functions, plus
// truncations of them (malformed keys must split too).
func randomKeys(rng *rand.Rand, n int) [][]byte {
	tenants := []Scope{MustScope("a"), MustScope("ab"), MustScope("abc"), MustScope("b"), MustScope("ba")}
	ids := make([]uuid.UUID, 6)
	for i := range ids {
		ids[i][0], ids[i][15] = byte(i), byte(rng.IntN(3)) // shared leading bytes
	}
	ts := func() Ts { return Ts(rng.Int64N(1<<20) - 1<<19) }
	var out [][]byte
	for len(out) < n {
		sc := tenants[rng.IntN(len(tenants))]
		a, b := ids[rng.IntN(len(ids))], ids[rng.IntN(len(ids))]
		var k []byte
		switch rng.IntN(8) {
		case 0:
			k = NodeKey(sc, a, ts(), ts())
		case 1:
			k = EdgeKey(sc, a, ts(), ts())
		case 2:
			k = AdjKey(sc, true, a, b, ts(), ts())
		case 3:
			k = AdjKey(sc, false, a, b, ts(), ts())
		case 4:
			k = VersionPrefix(sc, KindNode, a)
		case 5:
			k = AdjPrefix(sc, rng.IntN(2) == 0, a)
		case 6:
			k = ReceiptKey(sc, "req-"+string(rune('a'+rng.IntN(26))))
		default:
			k = ValidIdxKey(sc, ts(), KindEdge, a, ts())
		}
		if rng.IntN(6) == 0 {
			k = k[:rng.IntN(len(k)+1)]
		}
		out = append(out, k)
	}
	return out
}

// Pebble's rules for a Split (pebble's base.Split): a key's prefix sorts
// before the key when it has a suffix, and ordering by prefix then suffix
// is the comparer's (bytewise) order.
func TestEntitySplitIsAValidSplit(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	keys := randomKeys(rng, 3000)
	prefix := func(k []byte) []byte { return k[:EntitySplit(k)] }
	for _, k := range keys {
		n := EntitySplit(k)
		if n < 0 || n > len(k) {
			t.Fatalf("Split(%x) = %d, out of range", k, n)
		}
		if n < len(k) && bytes.Compare(prefix(k), k) >= 0 {
			t.Fatalf("prefix %x of %x does not sort first", prefix(k), k)
		}
	}
	for i := 0; i < 200_000; i++ {
		a, b := keys[rng.IntN(len(keys))], keys[rng.IntN(len(keys))]
		c, cp := bytes.Compare(a, b), bytes.Compare(prefix(a), prefix(b))
		if cp < 0 && c >= 0 || c <= 0 && cp > 0 {
			t.Fatalf("order by prefix disagrees with the key order: %x (prefix %x) vs %x (prefix %x)", a, prefix(a), b, prefix(b))
		}
		if cp == 0 && c != bytes.Compare(a[EntitySplit(a):], b[EntitySplit(b):]) {
			t.Fatalf("equal prefixes, suffix order differs: %x vs %x", a, b)
		}
	}
	// The prefixes reads iterate by are whole prefixes.
	sc, id := MustScope("acme"), uuid.New()
	for _, p := range [][]byte{VersionPrefix(sc, KindNode, id), VersionPrefix(sc, KindEdge, id), AdjPrefix(sc, true, id), AdjPrefix(sc, false, id)} {
		if EntitySplit(p) != len(p) {
			t.Fatalf("EntitySplit(%x) = %d, want the whole prefix (%d)", p, EntitySplit(p), len(p))
		}
	}
}

// The builds before the entity split wrote whole-key bloom filters under
// Pebble's own policy name (and iterated no prefixes). A store whose
// tables carry those filters reads right here (its filters are not used:
// they hold other keys), and a store written here reads right with the old
// options and reads (ours are not used), in the tables of either build.
func TestStoreFiltersAcrossBuilds(t *testing.T) {
	oldOptions := func() *pebble.Options {
		o := &pebble.Options{Logger: quietPebble{}}
		for i := range o.Levels {
			o.Levels[i].FilterPolicy = bloom.FilterPolicy(10)
		}
		return o
	}
	ctx := context.Background()
	sc := MustScope("acme")
	dir := t.TempDir()
	var nodes, edges []Version
	write := func(s *Store, n int) {
		for i := 0; i < n; i++ {
			a, b := mustNode(t, s, sc, uuid.New()), mustNode(t, s, sc, uuid.New())
			e := mustEdge(t, s, sc, uuid.New(), a.ID, b.ID)
			if i%3 == 0 { // a second version of some
				e = tombstone(t, s, sc, KindEdge, e.ID, NoTs)
			}
			nodes, edges = append(nodes, a, b), append(edges, e)
		}
		if err := s.Engine().Flush(); err != nil {
			t.Fatal(err)
		}
	}
	// What this build reads: prefix iterations and point reads through its
	// filters.
	check := func(s *Store, when string) {
		t.Helper()
		r := s.DB()
		for _, v := range append(append([]Version(nil), nodes...), edges...) {
			got, ok, err := Latest(r, sc, v.Kind, v.ID)
			if err != nil || !ok || got.Tx.Start != v.Tx.Start {
				t.Fatalf("%s: latest of %s: found %v (tx %d, want %d), err %v", when, v.ID, ok, got.Tx.Start, v.Tx.Start, err)
			}
			_, closer, err := r.Get(VersionKey(sc, v.Kind, v.ID, v.Tx.Start, v.Valid.Start))
			if err != nil {
				t.Fatalf("%s: get %s: %v", when, v.ID, err)
			}
			_ = closer.Close()
		}
		for _, e := range edges {
			var n int
			if err := ScanAdjLatest(r, sc, false, e.Dst, func(AdjEdge) error { n++; return nil }); err != nil || n != 1 {
				t.Fatalf("%s: in edges of %s: %d, err %v", when, e.Dst, n, err)
			}
		}
	}
	// What an older build reads: point reads through its whole-key filters
	// and bounded range scans.
	checkOld := func(when string) {
		t.Helper()
		db, err := pebble.Open(dir, oldOptions())
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		for _, v := range append(append([]Version(nil), nodes...), edges...) {
			_, closer, err := db.Get(VersionKey(sc, v.Kind, v.ID, v.Tx.Start, v.Valid.Start))
			if err != nil {
				t.Fatalf("%s: old build's get of %s: %v", when, v.ID, err)
			}
			_ = closer.Close()
			p := VersionPrefix(sc, v.Kind, v.ID)
			it, _ := db.NewIter(&pebble.IterOptions{LowerBound: p, UpperBound: PrefixEnd(p)})
			if !it.Last() || !bytes.Equal(it.Key(), VersionKey(sc, v.Kind, v.ID, v.Tx.Start, v.Valid.Start)) {
				t.Fatalf("%s: old build's last version of %s is not the latest", when, v.ID)
			}
			_ = it.Close()
		}
	}
	// An older build rewrites every table: its filters only.
	rewriteOld := func() {
		db, err := pebble.Open(dir, oldOptions())
		if err != nil {
			t.Fatal(err)
		}
		if err := db.Compact(ctx, []byte{0}, []byte{0xff}, true); err != nil {
			t.Fatal(err)
		}
		if err := db.Close(); err != nil {
			t.Fatal(err)
		}
	}
	s := openTest(t, dir, nil)
	write(s, 60)
	check(s, "this build's tables")
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	checkOld("this build's tables")
	rewriteOld()
	s = openTest(t, dir, nil)
	check(s, "old tables")
	write(s, 60)
	check(s, "old and new tables")
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	checkOld("old and new tables")
}

type quietPebble struct{}

func (quietPebble) Infof(string, ...any)  {}
func (quietPebble) Errorf(string, ...any) {}
func (quietPebble) Fatalf(format string, args ...any) {
	panic(fmt.Sprintf(format, args...))
}
