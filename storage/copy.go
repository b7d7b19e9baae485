package storage

import (
	"errors"
	"fmt"

	"github.com/cockroachdb/pebble/v2"
)

// A store over a copy: a standby's Pebble receives the owner's write-sets
// from the changelog (partition.ApplyTo), outside any Store. To answer
// reads from it, a Store is opened over that engine (OpenEngine) and never
// commits; Refresh then brings what a Store keeps in memory (the tenants,
// the journal fences, the committed tx) up to what the engine holds, as a
// reopen would.

// ErrEmptyCopy: OpenCopy found no store in the copy (nothing applied yet).
var ErrEmptyCopy = errors.New("the copy holds no store yet")

// borrowed is a copy's engine: its keeper closes it, not the Store.
type borrowed struct{ *PebbleEngine }

func (borrowed) Close() error { return nil }

// OpenCopy opens a store over db, a copy another writer keeps (a
// standby's). It never writes to db: a copy with nothing applied yet (no
// format key) is refused with ErrEmptyCopy, and the Store commits nothing.
// Its Close leaves db open.
func OpenCopy(db *pebble.DB, opts Options) (*Store, error) {
	if _, ok, err := getValue(db, formatKey()); err != nil {
		return nil, err
	} else if !ok {
		return nil, ErrEmptyCopy
	}
	return OpenEngine(borrowed{&PebbleEngine{DB: db}}, opts)
}

// Refresh brings a store opened over a copy that another writer keeps up
// to what its engine holds now: new tenants, the journals registered and
// removed since (a removed one's fence drops, Removed closes), and the
// committed tx (the largest tx any durable record carries, as at open). It
// never writes. Call it only on a store that commits nothing itself.
//
// Reads after it are safe like an owner's: a journaled cascade's head is
// in the copy before its chunks (the owner commits it first), so a read
// at a tx at or above the head's sees its fence and answers below it (or
// after its last chunk, once the head is gone).
func (s *Store) Refresh() error {
	s.refreshMu.Lock()
	defer s.refreshMu.Unlock()
	lo, hi := TenantRegistryRange()
	var added []string
	err := scan(s.eng, lo, hi, func(k, _ []byte) error {
		key, err := DecodeKey(k)
		if err != nil {
			return err
		}
		if !s.knownTenant(key.Tenant) {
			added = append(added, key.Tenant)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("refresh tenants: %w", err)
	}
	if len(added) > 0 {
		s.tenantsMu.Lock()
		for _, t := range added {
			s.tenants[t] = true
		}
		s.tenantsMu.Unlock()
	}
	// The committed tx first, the journals after: a journal head applied
	// after this read carries a tx above hwm (the owner's clock gave it
	// after every write-set before it), so a read at hwm needs no fence
	// of it; read the other way round, hwm could cover a head the scan
	// missed, and a read would see its cascade half applied.
	hwm, err := s.readHWM()
	if err != nil {
		return errors.Join(errors.New("refresh committed tx"), err)
	}
	present := map[string]bool{}
	for _, sc := range s.Tenants() {
		lo, hi := JobsInState(sc, CascadeJournalState)
		err := scan(s.eng, lo, hi, func(k, v []byte) error {
			present[string(k)] = true
			if s.journals.ByKey(k) != nil {
				return nil // its node and tx never change; its progress is not kept here
			}
			e, derr := journalEntry(sc, k, v)
			if derr != nil {
				s.journals.addPoison(&PoisonJournal{Scope: sc, HeadKey: append([]byte(nil), k...), Err: derr.Error(), Seen: s.clock.Wall().Now()})
				return nil
			}
			s.journals.add(e)
			return nil
		})
		if err != nil {
			return fmt.Errorf("refresh journals: %w", err)
		}
	}
	for _, e := range s.journals.List() {
		if !present[string(e.HeadKey)] {
			s.journals.remove(e)
			close(e.removed)
		}
	}
	s.committed.advance(hwm)
	return nil
}
