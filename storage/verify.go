package storage

import (
	"errors"
	"fmt"

	"github.com/cockroachdb/pebble/v2"
)

// Verify checks the store's referential integrity, the property a crash in
// the middle of a write must never break: every version record has all of
// its puts (both index entries; for an edge both adjacency rows, with the
// same contents as the record), and every index entry and adjacency row
// belongs to a version record. It returns every problem it finds (at most
// 100), joined; nil means the store holds only whole write-sets.
func Verify(r pebble.Reader) error {
	var problems []error
	add := func(format string, args ...any) error {
		problems = append(problems, fmt.Errorf(format, args...))
		if len(problems) >= 100 {
			return errTooMany
		}
		return nil
	}
	exists := func(k []byte) (bool, error) {
		_, ok, err := getValue(r, k)
		return ok, err
	}
	err := scan(r, keyspaceStart(ksNode), keyspaceStart(ksJobs), func(k, v []byte) error {
		key, err := DecodeKey(k)
		if err != nil {
			return add("undecodable key %x: %v", k, err)
		}
		sc := key.Scope()
		switch k[0] {
		case ksNode, ksEdge:
			ver, err := DecodeVersion(v)
			if err != nil {
				return add("version %x: %v", k, err)
			}
			if ver.ID != key.ID || ver.Tx.Start != key.Tx || ver.Valid.Start != key.Valid || ver.Kind != key.Kind {
				return add("version %x does not match its key", k)
			}
			need := [][]byte{ValidIdxKey(sc, key.Valid, key.Kind, key.ID, key.Tx), TxIdxKey(sc, key.Tx, key.Kind, key.ID, key.Valid)}
			if key.Kind == KindEdge {
				for _, out := range []bool{true, false} {
					node, other := ver.Src, ver.Dst
					if !out {
						node, other = ver.Dst, ver.Src
					}
					ak := AdjKey(sc, out, node, key.ID, key.Tx, key.Valid)
					av, ok, err := getValue(r, ak)
					if err != nil {
						return err
					}
					if !ok {
						if err := add("edge version %x lacks its adjacency row %x", k, ak); err != nil {
							return err
						}
						continue
					}
					row, err := DecodeAdj(av)
					if err != nil || row.Other != other || row.Label != ver.Label || row.Valid != ver.Valid || row.Tx != ver.Tx || row.Tombstone != ver.Tombstone {
						if err := add("adjacency row %x disagrees with its version (%v)", ak, err); err != nil {
							return err
						}
					}
				}
			}
			for _, nk := range need {
				ok, err := exists(nk)
				if err != nil {
					return err
				}
				if !ok {
					if err := add("version %x lacks its index entry %x", k, nk); err != nil {
						return err
					}
				}
			}
		case ksAdjOut, ksAdjIn:
			ok, err := exists(EdgeKey(sc, key.ID, key.Tx, key.Valid))
			if err != nil {
				return err
			}
			if !ok {
				return add("adjacency row %x has no edge version", k)
			}
		case ksValidIdx, ksTxIdx:
			ok, err := exists(VersionKey(sc, key.Kind, key.ID, key.Tx, key.Valid))
			if err != nil {
				return err
			}
			if !ok {
				return add("index entry %x has no version", k)
			}
		}
		return nil
	})
	if err != nil && !errors.Is(err, errTooMany) {
		return err
	}
	return errors.Join(problems...)
}

var errTooMany = errors.New("too many problems")
