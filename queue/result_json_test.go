package queue

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/telha/telha-cascade/storage"
)

// TestResultMessageTxTimeNullUnlessOK (issue 23 item 16): the result
// messages the worker publishes say "tx_time": null when the answer is not
// ok (they said ""), and the RFC 3339 time when it is; the answer's
// Nats-Msg-Id does not change with the spelling (a replay of an answer
// stored before is still the same answer).
func TestResultMessageTxTimeNullUnlessOK(t *testing.T) {
	id := uuid.New()
	notFound := ResultOfReceipt("acme", "r1", storage.Receipt{Op: storage.OpTombstoneNode, ID: id, Status: storage.StatusNotFound}, nil)
	m := resultMsg(Config{}, notFound)
	if !strings.Contains(string(m.Data), `"tx_time":null`) {
		t.Fatalf("not_found result body %s, want \"tx_time\":null", m.Data)
	}
	var back Result
	if err := json.Unmarshal(m.Data, &back); err != nil || back != notFound {
		t.Fatalf("round trip %+v, %v", back, err)
	}
	if ResultMsgID(back) != ResultMsgID(notFound) {
		t.Fatal("the answer's id changed through JSON")
	}
	ok := ResultOfReceipt("acme", "r2", storage.Receipt{Op: storage.OpPutNode, ID: id, Status: storage.StatusOK, Tx: storage.Ts(1_767_225_600_000_001)}, nil)
	if ok.TxTime == "" || !strings.Contains(string(resultMsg(Config{}, ok).Data), `"tx_time":"`+ok.TxTime+`"`) {
		t.Fatalf("ok result body %s", resultMsg(Config{}, ok).Data)
	}
}
