package app

import (
	"regexp"
	"testing"
	"time"

	"github.com/telha/telha-cascade/internal/testnats"
)

// TestUIShortJournalIsListedFinished (issue 30): a journal that starts
// and finishes between two of the sampler's looks (a second apart; this
// one's 600 edges take milliseconds) is listed on /ui/journals, finished,
// with its outcome and edges: the reaper's hook records it
// (app.go's reaperHooks calls uiJournalFinished).
func TestUIShortJournalIsListedFinished(t *testing.T) {
	ns := testnats.Start(t)
	dir := t.TempDir()
	hub := buildHub(t, dir, "acme", 600)
	w := startWorker(t, ns, dir, Options{}, "--max-batch-ops", "100", "--journal-chunk-ops", "100")
	bus := newBus(t, ns)
	rid := bus.send("acme", tombNode(hub.String()))
	res := mustOK(t, bus.wait(rid))
	if !res.Journaled {
		t.Fatalf("the hub's delete was not journaled: %+v", res)
	}
	row := regexp.MustCompile(`(?s)<tr class="finished" data-request="` + regexp.QuoteMeta(rid) + `">.*?<td class="outcome">([^<]*)</td><td class="num">([^<]*)</td><td>([^<]*)</td>`)
	var m []string
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		_, body := httpGet(t, w.base+"/ui/journals")
		if m = row.FindStringSubmatch(body); m != nil || time.Now().After(deadline) {
			break
		}
	}
	if m == nil {
		t.Fatal("a journal shorter than the sampling interval is not listed as finished on /ui/journals: " +
			"is the reaper's Finished hook wired to a.uiJournalFinished (app.go, reaperHooks)?")
	}
	if m[1] != "ok" || m[2] != "600" {
		t.Fatalf("the finished journal: outcome %q, %s edges tombstoned; want ok and 600", m[1], m[2])
	}
	t.Logf("listed finished, took %s", m[3])
}

// TestUIOverviewSizes (issue 32 item 7.2): the overview shows the store's
// size and the disk's free space in B, KB, MB or GB: a new store is a
// few KB, not "0.0 MB"; 512 MB free is not "0.5 GB".
func TestUIOverviewSizes(t *testing.T) {
	ns := testnats.Start(t)
	w := startWorker(t, ns, t.TempDir(), Options{DiskFree: func() (uint64, error) { return 512_000_000, nil }})
	_, body := httpGet(t, w.base+"/ui/")
	if m := regexp.MustCompile(`id="disk-free">([^<]*)<`).FindStringSubmatch(body); m == nil || m[1] != "512 MB" {
		t.Fatalf("disk free %q, want 512 MB", m)
	}
	m := regexp.MustCompile(`id="store-size">Pebble ([^<]*)<`).FindStringSubmatch(body)
	if m == nil || !regexp.MustCompile(`^(\d{1,3} B|(\d\.\d\d|\d\d\.\d|\d{3}) (KB|MB))$`).MatchString(m[1]) {
		t.Fatalf("store size %q, want B, KB or MB with three significant digits", m)
	}
	t.Logf("a new store: %s", m[1])
}
