package storage

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
)

// TestAStoreOpenedOnAnEngineTakesItsLog: a Pebble opened by a standby's
// catch-up (its logger says role=standby) and handed to the store a
// promotion opens on it logs as the store's logger from then on, not as
// the standby that opened it.
func TestAStoreOpenedOnAnEngineTakesItsLog(t *testing.T) {
	var standby, owner bytes.Buffer
	dir := t.TempDir()
	pe, err := OpenPebble(dir, nil, slog.New(slog.NewTextHandler(&standby, nil)).With("role", "standby"), nil, nil, Sizes{CacheBytes: 8 << 20, MemTableBytes: 4 << 20})
	if err != nil {
		t.Fatal(err)
	}
	l := pebbleLogger{log: pe.log}
	l.Errorf("before the promotion")
	st, err := OpenStoreOn(pe, dir, Options{Logger: slog.New(slog.NewTextHandler(&owner, nil)).With("role", "owner")})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	l.Errorf("after the promotion")
	if !strings.Contains(standby.String(), "before the promotion") || strings.Contains(standby.String(), "after the promotion") {
		t.Errorf("the standby's log: %q, want the line before the promotion only", standby.String())
	}
	if !strings.Contains(owner.String(), "after the promotion") || !strings.Contains(owner.String(), "role=owner") {
		t.Errorf("the store's log: %q, want the line after the promotion, as the owner", owner.String())
	}
}
