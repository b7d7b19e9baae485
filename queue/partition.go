package queue

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/telha/telha-cascade/queue/client"
)

// Partition returns the partition of a tenant among p partitions: FNV-1a
// (32 bit) of the tenant token, mod p. This is exactly what the server's
// {{partition(P,1)}} subject transform computes for telha.req.<tenant>.
func Partition(tenant string, p int) int { return client.Partition(tenant, p) }

// Owner is the partition ownership of one replica: replica Index of Count
// owns the partitions p with p % Count == Index.
type Owner struct {
	Index, Count int
}

// ParseOwner parses "i/N", or "auto/N" where i is the ordinal suffix of
// hostname ("telha-cascade-2" -> 2), as a StatefulSet pod name has.
func ParseOwner(s, hostname string) (Owner, error) {
	a, b, ok := strings.Cut(s, "/")
	if !ok {
		return Owner{}, fmt.Errorf("partition owner %q: want i/N or auto/N", s)
	}
	n, err := atoi(b)
	if err != nil || n < 1 {
		return Owner{}, fmt.Errorf("partition owner %q: N must be a positive integer", s)
	}
	var i int
	if a == "auto" {
		k := strings.LastIndexByte(hostname, '-')
		if k < 0 {
			return Owner{}, fmt.Errorf("partition owner auto/%d: hostname %q has no -<ordinal> suffix", n, hostname)
		}
		i, err = atoi(hostname[k+1:])
		if err != nil {
			return Owner{}, fmt.Errorf("partition owner auto/%d: hostname %q has no -<ordinal> suffix", n, hostname)
		}
	} else if i, err = atoi(a); err != nil {
		return Owner{}, fmt.Errorf("partition owner %q: i must be an integer or auto", s)
	}
	if i < 0 || i >= n {
		return Owner{}, fmt.Errorf("partition owner %d/%d: i must be in [0, %d)", i, n, n)
	}
	return Owner{Index: i, Count: n}, nil
}

// atoi accepts decimal digits only (no sign, no spaces).
func atoi(s string) (int, error) {
	if s == "" || strings.TrimLeft(s, "0123456789") != "" {
		return 0, fmt.Errorf("%q is not a number", s)
	}
	return strconv.Atoi(s)
}

// Owns reports whether the replica owns partition p.
func (o Owner) Owns(p int) bool { return o.Count > 0 && p%o.Count == o.Index }

// Partitions lists the partitions among p that the replica owns.
func (o Owner) Partitions(p int) []int {
	var out []int
	for i := 0; i < p; i++ {
		if o.Owns(i) {
			out = append(out, i)
		}
	}
	return out
}

func (o Owner) String() string { return fmt.Sprintf("%d/%d", o.Index, o.Count) }
