package member

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/telha/telha-cascade/internal/attempt"
)

// MembersBucket is the KV bucket of member records.
const MembersBucket = "TELHA_MEMBERS"

// OwnersBucket names the assignment bucket of a layout of n slots: a
// change of n starts another (the slots of another n are other slots).
func OwnersBucket(n int) string { return fmt.Sprintf("TELHA_OWNERS_%d", n) }

// ErrConflict: a compare-and-set lost (another member wrote first).
var ErrConflict = errors.New("member: assignment changed meanwhile")

var idRE = regexp.MustCompile(`^[A-Za-z0-9_=-][A-Za-z0-9_=.-]{0,127}$`)

// ValidID reports whether id can name a member (a KV key: letters,
// digits, '-', '_', '=', '.', at most 128, not starting with '.').
func ValidID(id string) error {
	if !idRE.MatchString(id) || strings.HasSuffix(id, ".") || strings.Contains(id, "..") {
		return fmt.Errorf("member id %q: want 1-128 of [A-Za-z0-9_=.-], not starting or ending with '.'", id)
	}
	return nil
}

// Config opens a Registry.
type Config struct {
	Slots    int
	Replicas int
	// TTL: a member that has not renewed its record for this long is gone.
	TTL time.Duration
}

// Registry is the membership and assignment buckets.
type Registry struct {
	cfg     Config
	members jetstream.KeyValue
	owners  jetstream.KeyValue
	now     func() time.Time
	tries   attempt.Policy
}

// registryTries bounds each request of a round (a renewal, a read of
// the members, a read of the assignment), and a round has half a TTL
// (3 s by default). Before, a round also made a direct get per member and
// per slot, each a third of the time routed to a replica on a paused
// server when one of three was, and each unbounded: one such get failed
// the whole round, and every member's rounds failed for a whole 30 s
// pause: their leases lapsed and every read was refused (crashtest
// TestDynamicANATSServerPaused). A try that times out is sent again (to
// another replica, or to the leader elected meanwhile) with twice the
// time, so a slow server is still answered.
var registryTries = attempt.Policy{First: 250 * time.Millisecond, Max: 2 * time.Second}

// all reads every live entry of kv with one watcher (its latest value
// per key), its tries bounded: one consumer's deliveries, not a direct
// get per key, each of which may be routed to a paused server's replica.
func (r *Registry) all(ctx context.Context, kv jetstream.KeyValue) ([]jetstream.KeyValueEntry, error) {
	return attempt.Bounded(ctx, r.tries, func(ctx context.Context) ([]jetstream.KeyValueEntry, error) {
		w, err := kv.WatchAll(ctx, jetstream.IgnoreDeletes())
		if err != nil {
			return nil, err
		}
		defer func() {
			_ = w.Stop()
			// A try given up mid-read leaves entries the client is still
			// delivering: its handler blocks on a full channel (256) while
			// holding the lock the close needs. Read them until the close.
			go func() {
				for range w.Updates() {
				}
			}()
		}()
		// By key, the highest revision: an ordered consumer reset mid-read
		// delivers again from where it stood.
		latest := map[string]jetstream.KeyValueEntry{}
		for {
			select {
			case e, ok := <-w.Updates():
				if !ok {
					// Closed before every key's latest value was delivered
					// (the try's deadline, the connection): not a list.
					return nil, fmt.Errorf("the watcher of %s ended mid-read: %w", kv.Bucket(), cmp.Or(ctx.Err(), errWatchEnded))
				}
				if e == nil { // every key's latest value delivered
					out := make([]jetstream.KeyValueEntry, 0, len(latest))
					for _, e := range latest {
						out = append(out, e)
					}
					return out, nil
				}
				if prev, ok := latest[e.Key()]; !ok || e.Revision() > prev.Revision() {
					latest[e.Key()] = e
				}
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
	})
}

// errWatchEnded: a watcher's channel closed before its initial values
// were all delivered.
var errWatchEnded = errors.New("member: the watcher ended")

// get reads key from kv, its tries bounded.
func (r *Registry) get(ctx context.Context, kv jetstream.KeyValue, key string) (jetstream.KeyValueEntry, error) {
	return attempt.Bounded(ctx, r.tries, func(ctx context.Context) (jetstream.KeyValueEntry, error) { return kv.Get(ctx, key) })
}

// Open creates (or binds) both buckets.
func Open(ctx context.Context, js jetstream.JetStream, cfg Config) (*Registry, error) {
	if cfg.Slots < 1 || cfg.TTL <= 0 {
		return nil, fmt.Errorf("member: slots %d, ttl %s", cfg.Slots, cfg.TTL)
	}
	replicas := max(cfg.Replicas, 1)
	members, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket: MembersBucket, Description: "telha-cascade: worker processes, each renewing its record; an expired record is a member gone",
		TTL: cfg.TTL, History: 1, Replicas: replicas, Storage: jetstream.FileStorage,
	})
	if err != nil {
		return nil, fmt.Errorf("member: bucket %s: %w", MembersBucket, err)
	}
	owners, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket: OwnersBucket(cfg.Slots), Description: fmt.Sprintf("telha-cascade: the owner, epoch and standbys of each of %d slots (compare-and-set only)", cfg.Slots),
		History: 8, Replicas: replicas, Storage: jetstream.FileStorage,
	})
	if err != nil {
		return nil, fmt.Errorf("member: bucket %s: %w", OwnersBucket(cfg.Slots), err)
	}
	return &Registry{cfg: cfg, members: members, owners: owners, now: time.Now, tries: registryTries}, nil
}

// Renew writes m's record (and so restarts its TTL).
func (r *Registry) Renew(ctx context.Context, m Member) error {
	m.Renewed = r.now().UTC()
	b, err := json.Marshal(m)
	if err != nil {
		return fmt.Errorf("member: encode %s: %w", m.ID, err)
	}
	if _, err := attempt.Bounded(ctx, r.tries, func(ctx context.Context) (uint64, error) { return r.members.Put(ctx, m.ID, b) }); err != nil {
		return fmt.Errorf("member: renew %s: %w", m.ID, err)
	}
	return nil
}

// ErrDuplicateMember: another live process renews the record of this
// member id.
var ErrDuplicateMember = errors.New("member: another live process uses this member id")

// CheckDuplicate returns ErrDuplicateMember when id's record is renewed
// by another process (another incarnation) within watch; nil when there is
// no live record of id, or it is not renewed meanwhile (a previous process
// of this member that died: its record expires within the TTL). Call it
// before the first Renew; watch should span two of the others' renewals.
func (r *Registry) CheckDuplicate(ctx context.Context, id, incarnation string, watch time.Duration) error {
	first, err := r.get(ctx, r.members, id)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("member: get %s: %w", id, err)
	}
	deadline := r.now().Add(watch)
	for r.now().Before(deadline) {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
		e, err := r.get(ctx, r.members, id)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			return nil // expired or left
		}
		if err != nil {
			return fmt.Errorf("member: get %s: %w", id, err)
		}
		if e.Revision() == first.Revision() {
			continue
		}
		var m Member
		if json.Unmarshal(e.Value(), &m) == nil && m.Incarnation != incarnation {
			return fmt.Errorf("%w: %s (started %s, advertising %s) renewed its record %s ago", ErrDuplicateMember, id,
				m.Started.Format(time.RFC3339), m.URL, r.now().Sub(m.Renewed).Round(time.Millisecond))
		}
	}
	return nil
}

// Leave deletes id's record: its slots move at once, not after the TTL.
func (r *Registry) Leave(ctx context.Context, id string) error {
	if _, err := attempt.Bounded(ctx, r.tries, func(ctx context.Context) (struct{}, error) { return struct{}{}, r.members.Delete(ctx, id) }); err != nil {
		return fmt.Errorf("member: leave %s: %w", id, err)
	}
	return nil
}

// Members returns the live members, sorted by id: a record exists and was
// written within the TTL of the server's clock. The server's "now" is the
// time of self's own record (just renewed, the caller's first step), so a
// member whose clock is skewed against the server's judges the others as
// the server would; without a record of self, the local clock.
func (r *Registry) Members(ctx context.Context, self string) ([]Member, error) {
	entries, err := r.all(ctx, r.members)
	if err != nil {
		return nil, fmt.Errorf("member: list: %w", err)
	}
	now := r.now()
	for _, e := range entries {
		if e.Key() == self {
			now = e.Created()
		}
	}
	var out []Member
	for _, e := range entries {
		k := e.Key()
		if now.Sub(e.Created()) > r.cfg.TTL {
			continue // expired, not yet removed by the server
		}
		var m Member
		if err := json.Unmarshal(e.Value(), &m); err != nil || m.ID != k {
			continue // not ours: ignored, never trusted
		}
		out = append(out, m)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}

func slotKey(s int) string { return "slot-" + strconv.Itoa(s) }

// Assignments returns every slot's assignment (a zero Owner where none is
// written yet) and the revision to compare-and-set against (0: none).
func (r *Registry) Assignments(ctx context.Context) ([]Assignment, []uint64, error) {
	out := make([]Assignment, r.cfg.Slots)
	revs := make([]uint64, r.cfg.Slots)
	entries, err := r.all(ctx, r.owners)
	if err != nil {
		return nil, nil, fmt.Errorf("member: owners: %w", err)
	}
	byKey := map[string]jetstream.KeyValueEntry{}
	for _, e := range entries {
		byKey[e.Key()] = e
	}
	for s := range out {
		out[s].Slot = s
		e, ok := byKey[slotKey(s)]
		if !ok {
			continue
		}
		var a Assignment
		if err := json.Unmarshal(e.Value(), &a); err != nil || a.Slot != s {
			return nil, nil, fmt.Errorf("member: owner of slot %d: undecodable entry (revision %d)", s, e.Revision())
		}
		out[s], revs[s] = a, e.Revision()
	}
	return out, revs, nil
}

// Write stores a with compare-and-set on rev (0: the key must not exist).
// A lost race returns ErrConflict.
func (r *Registry) Write(ctx context.Context, a Assignment, rev uint64) error {
	b, err := json.Marshal(a)
	if err != nil {
		return fmt.Errorf("member: encode slot %d: %w", a.Slot, err)
	}
	// Tried again when unanswered: a try that did write loses the next
	// one's compare-and-set, a conflict the round re-reads.
	_, err = attempt.Bounded(ctx, r.tries, func(ctx context.Context) (uint64, error) {
		if rev == 0 {
			return r.owners.Create(ctx, slotKey(a.Slot), b)
		}
		return r.owners.Update(ctx, slotKey(a.Slot), b, rev)
	})
	var apiErr *jetstream.APIError
	if errors.Is(err, jetstream.ErrKeyExists) || (errors.As(err, &apiErr) && (apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence || apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant)) {
		return fmt.Errorf("%w: slot %d: %v", ErrConflict, a.Slot, err)
	}
	if err != nil {
		return fmt.Errorf("member: write slot %d: %w", a.Slot, err)
	}
	return nil
}

// Watch signals (without blocking) on every change of an assignment, until
// ctx ends.
func (r *Registry) Watch(ctx context.Context) (<-chan struct{}, error) {
	w, err := r.owners.WatchAll(ctx, jetstream.UpdatesOnly())
	if err != nil {
		return nil, fmt.Errorf("member: watch: %w", err)
	}
	ch := make(chan struct{}, 1)
	go func() {
		defer w.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case _, ok := <-w.Updates():
				if !ok {
					return
				}
				select {
				case ch <- struct{}{}:
				default:
				}
			}
		}
	}()
	return ch, nil
}

// Step is one round of the leader's work: if self is the lowest live
// member id and may lead, compute the plan and write every changed slot
// (compare-and-set). It returns the assignment as it now stands (the plan
// where it was written), the live members, and whether this member led.
//
// mayLead is false while the caller's own view of the registry is not to
// be trusted: it could not reach the registry within the last TTL (a NATS
// server lost, a leader election of the bucket). Every other member's
// record may be stale then for the same reason, not because it died; a
// leader judging them by it would move every slot of a healthy group.
func (r *Registry) Step(ctx context.Context, self string, pc PlanConfig, mayLead bool) ([]Assignment, []Member, bool, error) {
	members, err := r.Members(ctx, self)
	if err != nil {
		return nil, nil, false, err
	}
	cur, revs, err := r.Assignments(ctx)
	if err != nil {
		return nil, nil, false, err
	}
	if !mayLead || len(members) == 0 || members[0].ID != self {
		return cur, members, false, nil
	}
	next := Plan(pc, members, cur)
	for s := range next {
		if next[s].Equal(cur[s]) {
			continue
		}
		next[s].Changed = r.now().UTC()
		if err := r.Write(ctx, next[s], revs[s]); err != nil {
			if errors.Is(err, ErrConflict) {
				continue // re-read next round
			}
			return cur, members, true, err
		}
		cur[s] = next[s]
	}
	return cur, members, true, nil
}
