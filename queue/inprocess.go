package queue

import (
	"errors"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// jsMsgIDInProcess: a stream's answer to a publish whose message id it
// holds as proposed and not yet stored ("duplicate message id is in
// process").
const jsMsgIDInProcess jetstream.ErrorCode = 10158

// inProcessIDs tells a message id a stream holds "in process" for a
// proposal that will never be stored from one that may still be.
//
// nats-server (2.15) stages a message id before proposing its message
// and, when a leader change drops the proposal, forgets the staged id
// only if no stored id came after it: otherwise the id is refused for
// the stream's whole duplicate window (2 minutes for the results, 10 for
// the change feed) though the message was never stored. Seen after a
// NATS server of three was paused 35 s (crashtest
// TestDynamicANATSServerPaused): 61 results of a slot refused so and
// answered up to 50 s late, and a tenant's feed refused for minutes, its
// erases unanswered.
//
// Proven dead: the id was first refused at t1, and a publish sent after
// t1 to the same stream was stored since. That publish was proposed
// after the refused one; Raft stores in the order proposed, so had the
// refused one been kept it would have been stored first, and its id
// would now be answered as a duplicate, not as in process.
type inProcessIDs struct {
	mu         sync.Mutex
	refusedAt  map[string]time.Time
	dead       map[string]bool
	storedSent time.Time // the latest send time of a publish stored
	forget     time.Duration
}

func newInProcessIDs(window time.Duration) *inProcessIDs {
	return &inProcessIDs{refusedAt: map[string]time.Time{}, dead: map[string]bool{}, forget: 2 * window}
}

// stored notes a publish sent at sent that the stream stored.
func (d *inProcessIDs) stored(sent time.Time) {
	d.mu.Lock()
	if sent.After(d.storedSent) {
		d.storedSent = sent
	}
	d.mu.Unlock()
}

// refused notes the stream's answer err to a publish of id, and reports
// whether it proves id's proposal dead.
func (d *inProcessIDs) refused(id string, err error) bool {
	var apiErr *jetstream.APIError
	if id == "" || !errors.As(err, &apiErr) || apiErr.ErrorCode != jsMsgIDInProcess {
		return false
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	now := time.Now()
	for old, at := range d.refusedAt { // refused past any window: forgotten
		if now.Sub(at) > d.forget {
			delete(d.refusedAt, old)
			delete(d.dead, old)
		}
	}
	t1, ok := d.refusedAt[id]
	if !ok {
		d.refusedAt[id] = now
		return false
	}
	if d.storedSent.After(t1) {
		d.dead[id] = true
	}
	return d.dead[id]
}

// live returns id, or when id was proven dead the first of id.1,
// id.1.1, ... that was not: the id to publish under.
func (d *inProcessIDs) live(id string) string {
	d.mu.Lock()
	defer d.mu.Unlock()
	for d.dead[id] {
		id += ".1"
	}
	return id
}
