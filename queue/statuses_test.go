package queue

import (
	"testing"

	"github.com/telha/telha-cascade/queue/client"
	"github.com/telha/telha-cascade/storage"
)

// TestClientStatusesAreTheStoreStatuses: the client package (which must not
// import the store) spells the statuses itself; they must be storage's,
// every one of them.
func TestClientStatusesAreTheStoreStatuses(t *testing.T) {
	want := map[storage.Status]string{
		storage.StatusOK: client.StatusOK, storage.StatusNotFound: client.StatusNotFound,
		storage.StatusAlreadyTombstoned: client.StatusAlreadyTombstoned, storage.StatusEndpointDead: client.StatusEndpointDead,
		storage.StatusCascadeInFlight: client.StatusCascadeInFlight, storage.StatusInvalid: client.StatusInvalid,
		storage.StatusFailed: client.StatusFailed, storage.StatusConflict: client.StatusConflict,
	}
	if len(want) != len(storage.Statuses()) {
		t.Fatalf("the client names %d statuses, the store has %d", len(want), len(storage.Statuses()))
	}
	for _, s := range storage.Statuses() {
		if want[s] != s.String() {
			t.Errorf("status %d: store %q, client %q", s, s.String(), want[s])
		}
	}
}
