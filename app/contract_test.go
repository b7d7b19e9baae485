package app

import (
	"crypto/sha256"
	"encoding/hex"
	"io"
	"strconv"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/telha/telha-cascade/internal/testnats"
	"github.com/telha/telha-cascade/queue"
)

// The queue contract points of the issue "The queue and HTTP contracts in
// a new user's hands", each through the real worker and a real NATS server.

// TestE2EHugeInvalidMessageIsDeadLetteredTruncated: an invalid request just
// under the server's max payload cannot be copied whole with its Telha-*
// headers; the dead letter is stored with its body cut short and headers
// that say so (original size, SHA-256 of the whole body), the request is
// answered and terminated, and it never loops.
func TestE2EHugeInvalidMessageIsDeadLetteredTruncated(t *testing.T) {
	ns := testnats.Start(t)
	startWorker(t, ns, t.TempDir(), Options{})
	b := newBus(t, ns)
	max := int(b.nc.MaxPayload())
	body := []byte(`{"request_id":"huge-1","op":"put_node","tenant":"big","id":"` + uuid.NewString() + `","props":{"x":"` +
		strings.Repeat("a", max-300) + `"}}`)
	body = body[:max-200] // not even JSON any more: all the worse
	b.sendRaw("telha.req.big", body, "big.huge-1")
	r := b.wait("huge-1") // no readable request_id: answered under the Nats-Msg-Id, less its tenant prefix
	if r.Status != queue.StatusInvalid || r.RequestIDFrom != "nats_msg_id" {
		t.Fatalf("result %+v, want invalid under the message id", r)
	}
	var dl *dlqMsg
	for _, m := range b.deadLetters() {
		if m.Header.Get("Telha-Original-Msg-Id") == "big.huge-1" {
			dl = &m
		}
	}
	if dl == nil {
		t.Fatal("no dead letter")
	}
	sum := sha256.Sum256(body)
	if dl.Header.Get("Telha-Truncated") != "true" || dl.Header.Get("Telha-Original-Size") != strconv.Itoa(len(body)) ||
		dl.Header.Get("Telha-Original-Sha256") != hex.EncodeToString(sum[:]) || len(dl.Data) >= len(body) || !strings.HasPrefix(string(body), string(dl.Data)) {
		t.Fatalf("dead letter headers %v, %d of %d bytes", dl.Header, len(dl.Data), len(body))
	}
}

// TestE2ERequestIDReusedForAnotherRequestIsAConflict: dup-2 as a put_node of
// X, then dup-2 as a tombstone_node of Y: the second is answered conflict,
// dead-lettered (reason conflict), and Y stays alive; the same put_node of
// X again (a retry) still gets the first answer, same tx.
func TestE2ERequestIDReusedForAnotherRequestIsAConflict(t *testing.T) {
	ns := testnats.Start(t)
	w := startWorker(t, ns, t.TempDir(), Options{})
	b := newBus(t, ns)
	x, y := uuid.NewString(), uuid.NewString()
	mustOK(t, b.wait(b.send("cf", node(y))))
	first := mustOK(t, b.wait(b.send("cf", map[string]any{"request_id": "dup-2", "op": "put_node", "id": x})))
	b.sendRaw("telha.req.cf", []byte(`{"request_id":"dup-2","op":"tombstone_node","tenant":"cf","id":"`+y+`"}`), "cf.dup-2.second")
	rs := b.waitN("dup-2", 2)
	if rs[1].Status != queue.StatusConflict || !strings.Contains(rs[1].Error, "put_node") || rs[1].TxTime != "" {
		t.Fatalf("second request under dup-2: %+v, want conflict naming the first", rs[1])
	}
	if code := w.get("/v1/tenants/cf/nodes/"+y, nil); code != 200 {
		t.Fatalf("node Y after the conflicting tombstone: %d, want alive", code)
	}
	found := false
	for _, m := range b.deadLetters() {
		if m.Header.Get("Telha-Reason") == queue.ReasonConflict && strings.Contains(string(m.Data), y) {
			found = true
		}
	}
	if !found {
		t.Fatal("the conflict is not in TELHA_DLQ")
	}
	// A retry of the first request (same body, new message id) gets its answer.
	b.sendRaw("telha.req.cf", []byte(`{"request_id":"dup-2","op":"put_node","tenant":"cf","id":"`+x+`"}`), "cf.dup-2.retry")
	rs = b.waitN("dup-2", 3)
	if rs[2].Status != queue.StatusOK || rs[2].TxTime != first.TxTime {
		t.Fatalf("retry of the first request: %+v, want ok at %s", rs[2], first.TxTime)
	}
}

// TestE2EInvalidAtApplyTimeIsDeadLettered: a put_edge that would change an
// edge's endpoints is found invalid when applied (not when decoded); it is
// answered invalid and dead-lettered like any invalid request.
func TestE2EInvalidAtApplyTimeIsDeadLettered(t *testing.T) {
	ns := testnats.Start(t)
	startWorker(t, ns, t.TempDir(), Options{})
	b := newBus(t, ns)
	a, c, d := uuid.NewString(), uuid.NewString(), uuid.NewString()
	for _, n := range []string{a, c, d} {
		mustOK(t, b.wait(b.send("ai", node(n))))
	}
	e := uuid.NewString()
	mustOK(t, b.wait(b.send("ai", edge(e, a, c))))
	r := b.wait(b.send("ai", map[string]any{"request_id": "move-1", "op": "put_edge", "id": e, "src": a, "dst": d, "label": "rel"}))
	if r.Status != queue.StatusInvalid || !strings.Contains(r.Error, "immutable") {
		t.Fatalf("put_edge changing endpoints: %+v", r)
	}
	found := false
	for _, m := range b.deadLetters() {
		if m.Header.Get("Telha-Reason") == queue.ReasonInvalid && strings.Contains(string(m.Data), "move-1") {
			found = true
		}
	}
	if !found {
		t.Fatal("the invalid request is not in TELHA_DLQ")
	}
}

// TestE2EPartitionsAndConfigAnswers: /v1/partitions says what this replica
// owns and the rule; a TELHA_* variable that does not parse names itself
// and stops there; unknown TELHA_* variables are reported.
func TestE2EPartitionsAndConfigAnswers(t *testing.T) {
	ns := testnats.Start(t)
	w := startWorker(t, ns, t.TempDir(), Options{}, "--partitions", "4", "--partition-owner", "1/2")
	var p struct {
		Partitions, Replica, Replicas int
		Owned                         []int
		Rule                          string
	}
	if code := w.get("/v1/partitions", &p); code != 200 || p.Partitions != 4 || p.Replica != 1 || p.Replicas != 2 ||
		len(p.Owned) != 2 || p.Owned[0] != 1 || p.Owned[1] != 3 || !strings.Contains(p.Rule, "fnv1a32") {
		t.Fatalf("/v1/partitions: %d %+v", code, p)
	}
	_, err := ParseFlags(nil, func(k string) string {
		if k == "TELHA_PARTITIONS" {
			return "abc"
		}
		return ""
	}, io.Discard)
	if err == nil || !strings.Contains(err.Error(), `TELHA_PARTITIONS="abc" does not parse as --partitions`) || strings.Count(err.Error(), "\n") > 0 {
		t.Fatalf("a TELHA_ variable that does not parse: %v", err)
	}
	// A value that parses but is refused names the variable it came from.
	_, err = ParseFlags([]string{"--partitions", "2000"}, func(k string) string {
		if k == "TELHA_MAX_BATCH_OPS" {
			return "-3"
		}
		return ""
	}, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "--max-batch-ops must be positive, got -3 (set by TELHA_MAX_BATCH_OPS)") ||
		!strings.Contains(err.Error(), "--partitions must be between 1 and 1024, got 2000") || strings.Contains(err.Error(), "TELHA_PARTITIONS") {
		t.Fatalf("a TELHA_ variable refused: %v", err)
	}
	for _, c := range []struct {
		msg, name string
		want      bool
	}{
		{"--partition-owner: bad", "partition-owner", true},
		{"--max-batch-ops must be positive", "max-batch-ops", true},
		{"a, --dlq-max-per-tenant and b", "dlq-max-per-tenant", true},
		{"ends in --partitions", "partitions", true},
		{"--change-feed-max-age must be", "change-feed", false},
		{"--change-feed-max-age must be, --change-feed: x", "change-feed", true},
	} {
		if got := namesFlag(c.msg, c.name); got != c.want {
			t.Errorf("namesFlag(%q, %q) = %v, want %v", c.msg, c.name, got, c.want)
		}
	}
	if got := UnknownEnv([]string{"TELHA_MAX_BATCH_OPS=5", "TELHA_MAX_BATCH_OP=5", "PATH=/bin", "TELHA_TEST_LOG=1"}); len(got) != 1 || got[0] != "TELHA_MAX_BATCH_OP" {
		t.Fatalf("unknown TELHA_ variables: %v", got)
	}
}
