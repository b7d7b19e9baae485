package queue

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/telha/telha-cascade/internal/testnats"
)

func TestParseOwner(t *testing.T) {
	for _, c := range []struct {
		s, host string
		want    Owner
		errHas  string // "" = ok
	}{
		{"0/1", "", Owner{0, 1}, ""},
		{"2/3", "whatever", Owner{2, 3}, ""},
		{"0/1024", "", Owner{0, 1024}, ""},
		{"auto/3", "telha-cascade-2", Owner{2, 3}, ""},
		{"auto/3", "telha-cascade-0", Owner{0, 3}, ""},
		{"auto/1", "telha-cascade-0", Owner{0, 1}, ""},
		{"auto/12", "my-release-telha-cascade-11", Owner{11, 12}, ""},
		{"auto/3", "telha-cascade-3", Owner{}, "must be in [0, 3)"},
		{"auto/3", "telha-cascade", Owner{}, "no -<ordinal> suffix"},
		{"auto/3", "worker", Owner{}, "no -<ordinal> suffix"},
		{"auto/3", "", Owner{}, "no -<ordinal> suffix"},
		{"auto/3", "telha-cascade-", Owner{}, "no -<ordinal> suffix"},
		{"auto/3", "telha-cascade-x", Owner{}, "no -<ordinal> suffix"},
		{"auto/3", "telha-cascade--1", Owner{1, 3}, ""},
		{"3/3", "", Owner{}, "must be in [0, 3)"},
		{"-1/3", "", Owner{}, "must be an integer"},
		{"0/0", "", Owner{}, "positive integer"},
		{"0/-2", "", Owner{}, "positive integer"},
		{"0/x", "", Owner{}, "positive integer"},
		{"0/", "", Owner{}, "positive integer"},
		{"x/3", "", Owner{}, "integer or auto"},
		{"/3", "", Owner{}, "integer or auto"},
		{"AUTO/3", "telha-cascade-1", Owner{}, "integer or auto"},
		{"1", "", Owner{}, "want i/N"},
		{"", "", Owner{}, "want i/N"},
		{"1/2/3", "", Owner{}, "positive integer"},
		{" 1/3", "", Owner{}, "integer or auto"},
	} {
		got, err := ParseOwner(c.s, c.host)
		if c.errHas == "" {
			if err != nil || got != c.want {
				t.Errorf("ParseOwner(%q, %q) = %v, %v; want %v", c.s, c.host, got, err, c.want)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), c.errHas) {
			t.Errorf("ParseOwner(%q, %q) = %v, %v; want an error containing %q", c.s, c.host, got, err, c.errHas)
		}
	}
}

func TestOwnerPartitions(t *testing.T) {
	// The replicas of N cover every partition exactly once.
	for _, p := range []int{1, 2, 7, 16} {
		for n := 1; n <= p; n++ {
			seen := map[int]int{}
			for i := 0; i < n; i++ {
				o := Owner{i, n}
				for _, q := range o.Partitions(p) {
					if !o.Owns(q) {
						t.Fatalf("%v lists %d but does not own it", o, q)
					}
					seen[q]++
				}
			}
			for q := 0; q < p; q++ {
				if seen[q] != 1 {
					t.Fatalf("P=%d N=%d: partition %d owned %d times", p, n, q, seen[q])
				}
			}
		}
	}
	if (Owner{}).Owns(0) {
		t.Fatal("the zero Owner owns a partition")
	}
	if got := (Owner{2, 3}).String(); got != "2/3" {
		t.Fatalf("String %q", got)
	}
}

func TestPartitionFunction(t *testing.T) {
	// FNV-1a 32 of "" is the offset basis 2166136261; of "a" 0xe40c292c.
	if Partition("", 1000) != int(uint32(2166136261)%1000) || Partition("a", 1<<30) != int(uint32(0xe40c292c)%(1<<30)) {
		t.Fatalf("Partition is not FNV-1a 32: %d %d", Partition("", 1000), Partition("a", 1<<30))
	}
	for _, p := range []int{0, -3} {
		if Partition("acme", p) != 0 {
			t.Fatalf("Partition(acme, %d) = %d", p, Partition("acme", p))
		}
	}
	for i := 0; i < 200; i++ {
		tn := fmt.Sprintf("tenant-%d", i)
		if q := Partition(tn, 7); q < 0 || q >= 7 || q != Partition(tn, 7) {
			t.Fatalf("Partition(%s, 7) = %d", tn, q)
		}
	}
}

// TestPartitionMatchesServerTransform provisions TELHA_REQ with P=7 on a
// real server, publishes to telha.req.<tenant> for 50 tenants and checks
// that the partition token the server's {{partition(7,1)}} transform wrote
// into each stored subject is queue.Partition(tenant, 7).
func TestPartitionMatchesServerTransform(t *testing.T) {
	const P = 7
	ns := testnats.Start(t)
	nc := testnats.Connect(t, ns.ClientURL())
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cfg := Config{Partitions: P}
	if _, err := Provision(ctx, js, cfg); err != nil {
		t.Fatal(err)
	}
	tenants := []string{"a", "ab", "a-b", "a_b", "0", "z", "acme", "demo", strings.Repeat("x", 63)}
	for i := len(tenants); i < 50; i++ {
		tenants = append(tenants, fmt.Sprintf("t%d-%x", i, i*7919))
	}
	for _, tn := range tenants {
		if _, err := js.Publish(ctx, "telha.req."+tn, []byte(`{}`)); err != nil {
			t.Fatalf("publish for %s: %v", tn, err)
		}
	}
	s, err := js.Stream(ctx, "TELHA_REQ")
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != uint64(len(tenants)) {
		t.Fatalf("%d messages stored, want %d", info.State.Msgs, len(tenants))
	}
	used := map[int]bool{}
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq; seq++ {
		m, err := s.GetMsg(ctx, seq)
		if err != nil {
			t.Fatal(err)
		}
		tn := tenants[seq-info.State.FirstSeq]
		toks := strings.Split(m.Subject, ".")
		if len(toks) != 4 || toks[0] != "telha" || toks[1] != "req" || toks[3] != tn {
			t.Fatalf("stored subject %q for tenant %q", m.Subject, tn)
		}
		p, err := strconv.Atoi(toks[2])
		if err != nil {
			t.Fatalf("stored subject %q: %v", m.Subject, err)
		}
		if want := Partition(tn, P); p != want {
			t.Errorf("tenant %q: server partition %d, queue.Partition %d", tn, p, want)
		}
		// What the worker reads back from the stored subject.
		gotTn, gotP, err := parseSubject("telha", m.Subject, P)
		if err != nil || gotTn != tn || gotP != p {
			t.Errorf("parseSubject(%q) = %q, %d, %v", m.Subject, gotTn, gotP, err)
		}
		used[p] = true
	}
	if len(used) < P {
		t.Errorf("50 tenants landed in only %d of %d partitions", len(used), P)
	}
}

// TestProvisionReplicaFilters: the consumers of replicas 0..2 of 3 over
// P=7 get disjoint filters covering every partition (a work-queue stream
// refuses overlapping ones), and provisioning is idempotent.
func TestProvisionReplicaFilters(t *testing.T) {
	const P, N = 7, 3
	ns := testnats.Start(t)
	nc := testnats.Connect(t, ns.ClientURL())
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var all []string
	for round := 0; round < 2; round++ {
		all = all[:0]
		for i := 0; i < N; i++ {
			cons, err := Provision(ctx, js, Config{Partitions: P, Owner: Owner{i, N}})
			if err != nil {
				t.Fatalf("round %d replica %d: %v", round, i, err)
			}
			ci, err := cons.Info(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if ci.Name != fmt.Sprintf("telha-worker-%d", i) {
				t.Fatalf("consumer name %q", ci.Name)
			}
			for _, f := range ci.Config.FilterSubjects {
				if f == "telha.req.*" {
					// Replica 0 also takes what the transform could not map
					// (a literal telha.req.* or telha.req.>: issue 20 item 6).
					if i != 0 {
						t.Fatalf("replica %d has filter %q", i, f)
					}
					continue
				}
				p, err := strconv.Atoi(strings.TrimSuffix(strings.TrimPrefix(f, "telha.req."), ".*"))
				if err != nil || p%N != i {
					t.Fatalf("replica %d has filter %q", i, f)
				}
				all = append(all, f)
			}
		}
		slices.Sort(all)
		if len(all) != P || len(slices.Compact(slices.Clone(all))) != P {
			t.Fatalf("filters %v, want one per partition", all)
		}
	}
	// A replica of more replicas than partitions owns nothing: refused.
	if _, err := Provision(ctx, js, Config{Partitions: 2, Owner: Owner{2, 3}}); err == nil || !strings.Contains(err.Error(), "owns none") {
		t.Fatalf("replica owning no partition: %v", err)
	}
}

// TestProvisionKeepsInstalledPartitionCount: P is fixed at install (DESIGN
// §4: changing it moves tenants between partitions and needs a data move).
// A replica started with another --partitions must not silently rewrite the
// stream's transform under the other replicas.
func TestProvisionKeepsInstalledPartitionCount(t *testing.T) {
	ns := testnats.Start(t)
	nc := testnats.Connect(t, ns.ClientURL())
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := Provision(ctx, js, Config{Partitions: 7}); err != nil {
		t.Fatal(err)
	}
	_, perr := Provision(ctx, js, Config{Partitions: 4})
	s, err := js.Stream(ctx, "TELHA_REQ")
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	dest := info.Config.SubjectTransform.Destination
	if !strings.Contains(dest, "partition(7,1)") {
		t.Fatalf("after a worker with --partitions 4 provisioned (err %v), TELHA_REQ's transform is %q", perr, dest)
	}
	if perr == nil {
		t.Fatal("provisioning with another partition count than the installed one succeeded")
	}
}
