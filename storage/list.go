package storage

import (
	"fmt"

	"github.com/cockroachdb/pebble/v2"
	"github.com/google/uuid"
)

// LivePage lists a tenant's entities of kind k that read live at (v, t),
// by id, after the id after (uuid.Nil: from the first), at most limit of
// them, examining at most budget entities: the read API's listing, which
// a change-feed consumer resyncs from (CONTRACT §6). next is the id to
// continue after (nil: the listing is complete).
func LivePage(r pebble.Reader, sc Scope, k Kind, v, t Ts, after uuid.UUID, limit, budget int) (out []Version, next *uuid.UUID, err error) {
	space := versionSpace(k)
	lo, hi := TenantRange(space, sc)
	if after != uuid.Nil {
		lo = PrefixEnd(VersionPrefix(sc, k, after))
	}
	it, err := r.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: hi})
	if err != nil {
		return nil, nil, fmt.Errorf("%w: iterator: %w", ErrStorage, err)
	}
	defer it.Close()
	examined := 0
	for ok := it.First(); ok; {
		key, err := DecodeKey(it.Key())
		if err != nil {
			return nil, nil, err
		}
		id := key.ID
		if len(out) == limit || examined == budget {
			last := after // the last id examined
			return out, &last, nil
		}
		examined++
		after = id
		ver, live, err := AsOf(r, sc, k, id, v, t)
		if err != nil {
			return nil, nil, err
		}
		if live {
			out = append(out, ver)
		}
		ok = it.SeekGE(PrefixEnd(VersionPrefix(sc, k, id)))
	}
	if err := it.Error(); err != nil {
		return nil, nil, fmt.Errorf("%w: iterate: %w", ErrStorage, err)
	}
	return out, nil, nil
}
