package queue

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/telha/telha-cascade/storage"
)

// Table tests of DecodeRequest: every validation rule of CONTRACT §5 and the
// per-op allowed and disallowed fields the code documents.

const (
	tID  = "6f1c1f0e-7f0b-4d7e-9a51-0c1b7b0f2a11"
	tSrc = "0b6f3c9a-2f0e-4b8e-9d3a-3f2b1c0d9e8f"
	tDst = "9a8b7c6d-5e4f-4a3b-8c2d-1e0f9a8b7c6d"
)

// body builds a request body: the base fields of op plus kv (a nil value
// deletes a base field; json.RawMessage values are written as given).
func body(op string, kv ...any) string {
	m := map[string]any{"request_id": "req-1", "op": op, "tenant": "acme", "id": tID}
	if op == "put_edge" {
		m["src"], m["dst"], m["label"] = tSrc, tDst, "knows"
	}
	for i := 0; i+1 < len(kv); i += 2 {
		k := kv[i].(string)
		if kv[i+1] == nil {
			delete(m, k)
			continue
		}
		m[k] = kv[i+1]
	}
	b, err := json.Marshal(m)
	if err != nil {
		panic(err)
	}
	return string(b)
}

func mustTs(t *testing.T, s string) storage.Ts {
	t.Helper()
	tm, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		t.Fatal(err)
	}
	return storage.TsFromTime(tm)
}

func TestDecodeRequestMinimalPerOp(t *testing.T) {
	for _, op := range []string{"put_node", "put_edge", "tombstone_node", "tombstone_edge"} {
		t.Run(op, func(t *testing.T) {
			r, rej := DecodeRequest([]byte(body(op)), "acme")
			if rej != nil {
				t.Fatalf("rejected: %v", rej)
			}
			if r.Op.String() != op || r.RequestID != "req-1" || r.Scope.Tenant() != "acme" || r.ID.String() != tID {
				t.Fatalf("decoded %+v", r)
			}
			// Omitted times take their defaults later (NoTs here).
			if r.ValidFrom != storage.NoTs || r.ValidTo != storage.NoTs || r.ValidEnd != storage.NoTs || r.Prov.DecidedAt != storage.NoTs {
				t.Fatalf("omitted times: from %v to %v end %v decided %v, want NoTs", r.ValidFrom, r.ValidTo, r.ValidEnd, r.Prov.DecidedAt)
			}
			if r.Props != nil {
				t.Fatalf("omitted props decoded as %q, want nil", r.Props)
			}
			if r.Prov != (storage.Provenance{DecidedAt: storage.NoTs}) {
				t.Fatalf("omitted provenance: %+v", r.Prov)
			}
			if op == "put_edge" {
				if r.Src.String() != tSrc || r.Dst.String() != tDst || r.Label != "knows" {
					t.Fatalf("edge fields %+v", r)
				}
			} else if r.Src != uuid.Nil || r.Dst != uuid.Nil || r.Label != "" {
				t.Fatalf("non-edge op carries edge fields %+v", r)
			}
		})
	}
}

func TestDecodeRequestAllFields(t *testing.T) {
	raw := `{
	  "request_id": "req-ü-✓",
	  "op": "put_edge",
	  "tenant": "acme",
	  "id": "` + strings.ToUpper(tID) + `",
	  "src": "` + tSrc + `", "dst": "` + tDst + `", "label": "owns",
	  "valid_from": "1969-07-20T20:17:40.5-05:00",
	  "valid_to": "2030-01-01T00:00:00.123456789Z",
	  "props": { "a" : [1, 2, {"b": null}], "s": "x y" },
	  "provenance": {"actor": "alice", "reason": "GDPR 7", "source": "crm", "decided_at": "2024-02-29T12:00:00+01:00"}
	}`
	r, rej := DecodeRequest([]byte(raw), "acme")
	if rej != nil {
		t.Fatalf("rejected: %v", rej)
	}
	if r.RequestID != "req-ü-✓" || r.ID.String() != tID || r.Label != "owns" {
		t.Fatalf("decoded %+v (the id is normalised to lower case)", r)
	}
	if want := mustTs(t, "1969-07-21T01:17:40.5Z"); r.ValidFrom != want || r.ValidFrom >= 0 {
		t.Fatalf("valid_from %v (%d), want %v: offsets apply, times before 1970 are negative", r.ValidFrom, r.ValidFrom, want)
	}
	if want := mustTs(t, "2030-01-01T00:00:00.123456Z"); r.ValidTo != want {
		t.Fatalf("valid_to %v, want %v (truncated to the microsecond)", r.ValidTo, want)
	}
	if string(r.Props) != `{"a":[1,2,{"b":null}],"s":"x y"}` {
		t.Fatalf("props %s, want compacted", r.Props)
	}
	wantProv := storage.Provenance{Actor: "alice", Reason: "GDPR 7", Source: "crm", DecidedAt: mustTs(t, "2024-02-29T11:00:00Z")}
	if r.Prov != wantProv {
		t.Fatalf("provenance %+v, want %+v (request_id is filled in by the cascade layer)", r.Prov, wantProv)
	}
	// A tombstone's valid_end.
	r, rej = DecodeRequest([]byte(body("tombstone_node", "valid_end", "0001-01-01T00:00:00Z")), "acme")
	if rej != nil || r.ValidEnd != mustTs(t, "0001-01-01T00:00:00Z") {
		t.Fatalf("valid_end far in the past: %+v %v (accepted, OQ-1)", r.ValidEnd, rej)
	}
}

func TestDecodeRequestRejects(t *testing.T) {
	long := func(n int, s string) string { return strings.Repeat(s, n) }
	deep := func(n int) json.RawMessage {
		return json.RawMessage(long(n, `{"a":`) + "1" + long(n, "}"))
	}
	cases := []struct {
		name    string
		subject string // subject tenant; default "acme"
		body    string
		reason  string // "" = accepted
		errHas  string
	}{
		// Whole-message shape.
		{"too large", "", `{"request_id":"x","props":{"p":"` + long(MaxMessageBytes, "a") + `"}}`, ReasonTooLarge, "over the limit"},
		{"too large even if garbage", "", long(MaxMessageBytes+1, "\xff"), ReasonTooLarge, ""},
		{"exactly the limit is fine", "", body("put_node") + long(MaxMessageBytes-len(body("put_node")), " "), "", ""},
		{"invalid utf-8", "", "{\"request_id\":\"a\xffb\",\"op\":\"put_node\",\"tenant\":\"acme\",\"id\":\"" + tID + "\"}", ReasonDecode, "UTF-8"},
		{"empty", "", ``, ReasonDecode, ""},
		{"whitespace", "", "  \n", ReasonDecode, ""},
		{"not json", "", `hello`, ReasonDecode, ""},
		{"null", "", `null`, ReasonDecode, ""},
		{"array", "", `[` + body("put_node") + `]`, ReasonDecode, ""},
		{"string", "", `"put_node"`, ReasonDecode, ""},
		{"number", "", `42`, ReasonDecode, ""},
		{"two objects", "", body("put_node") + body("put_node"), ReasonDecode, "after its JSON object"},
		{"trailing garbage", "", body("put_node") + ` x`, ReasonDecode, ""},
		{"truncated", "", body("put_node")[:20], ReasonDecode, ""},
		{"unknown field", "", body("tombstone_node", "valid_ned", "2020-01-01T00:00:00Z"), ReasonDecode, "valid_ned"},
		{"unknown provenance field", "", body("put_node", "provenance", map[string]any{"who": "x"}), ReasonDecode, "who"},
		{"id of the wrong type", "", body("put_node", "id", 42), ReasonDecode, ""},
		{"request_id of the wrong type", "", body("put_node", "request_id", 7), ReasonDecode, ""},
		{"op of the wrong type", "", body("put_node", "op", true), ReasonDecode, ""},
		{"provenance of the wrong type", "", body("put_node", "provenance", "alice"), ReasonDecode, ""},
		{"decided_at of the wrong type", "", body("put_node", "provenance", map[string]any{"decided_at": 1}), ReasonDecode, ""},
		{"label of the wrong type", "", body("put_edge", "label", []int{1}), ReasonDecode, ""},

		// request_id.
		{"request_id missing", "", body("put_node", "request_id", nil), ReasonInvalid, "request_id is required"},
		{"request_id null", "", body("put_node", "request_id", json.RawMessage("null")), ReasonInvalid, "request_id is required"},
		{"request_id empty", "", body("put_node", "request_id", ""), ReasonInvalid, "request_id"},
		{"request_id 128 runes", "", body("put_node", "request_id", long(128, "é")), "", ""},
		{"request_id 128 emoji", "", body("put_node", "request_id", long(128, "🦀")), "", ""},
		{"request_id 129 runes", "", body("put_node", "request_id", long(129, "a")), ReasonInvalid, "request_id"},
		{"request_id with NUL", "", body("put_node", "request_id", "a\x00b"), ReasonInvalid, "control"},
		{"request_id with newline", "", body("put_node", "request_id", "a\nb"), ReasonInvalid, "control"},
		{"request_id with DEL", "", body("put_node", "request_id", "a\x7fb"), ReasonInvalid, "control"},
		{"request_id with C1 control", "", body("put_node", "request_id", "a\u0085b"), ReasonInvalid, "control"},
		{"request_id with spaces and dots", "", body("put_node", "request_id", "order 42.v1 *>"), "", ""},

		// op.
		{"op missing", "", body("put_node", "op", nil), ReasonInvalid, "op is required"},
		{"op unknown", "", body("drop_table"), ReasonInvalid, "unknown op"},
		{"op in upper case", "", body("PUT_NODE"), ReasonInvalid, "unknown op"},
		{"op empty", "", body(""), ReasonInvalid, "unknown op"},

		// tenant.
		{"tenant missing", "", body("put_node", "tenant", nil), ReasonInvalid, "tenant is required"},
		{"tenant mismatch", "", body("put_node", "tenant", "other"), ReasonTenantMismatch, "does not match"},
		{"tenant mismatch by case", "", body("put_node", "tenant", "ACME"), ReasonTenantMismatch, ""},
		{"tenant prefix of the subject's", "", body("put_node", "tenant", "acm"), ReasonTenantMismatch, ""},
		{"tenant empty on an empty subject token", "-", body("put_node", "tenant", ""), ReasonInvalid, "must match"},
		{"tenant upper case on both sides", "BAD", body("put_node", "tenant", "BAD"), ReasonInvalid, "must match"},
		{"tenant wildcard on both sides", "*", body("put_node", "tenant", "*"), ReasonInvalid, "must match"},
		{"tenant full wildcard on both sides", ">", body("put_node", "tenant", ">"), ReasonInvalid, "must match"},
		{"tenant with a dot on both sides", "a.b", body("put_node", "tenant", "a.b"), ReasonInvalid, "must match"},
		{"tenant with a space on both sides", "a b", body("put_node", "tenant", "a b"), ReasonInvalid, "must match"},
		{"tenant starting with a dash", "-a", body("put_node", "tenant", "-a"), ReasonInvalid, "must match"},
		{"tenant 63 chars", long(63, "a"), body("put_node", "tenant", long(63, "a")), "", ""},
		{"tenant 64 chars", long(64, "a"), body("put_node", "tenant", long(64, "a")), ReasonInvalid, "must match"},
		{"tenant with - and _", "a-b_c", body("put_node", "tenant", "a-b_c"), "", ""},

		// id.
		{"id missing", "", body("put_node", "id", nil), ReasonInvalid, "id is required"},
		{"id not a uuid", "", body("put_node", "id", "not-a-uuid"), ReasonInvalid, "not a UUID"},
		{"id without dashes", "", body("put_node", "id", strings.ReplaceAll(tID, "-", "")), ReasonInvalid, "not a UUID"},
		{"id in braces", "", body("put_node", "id", "{"+tID+"}"), ReasonInvalid, "not a UUID"},
		{"id as urn", "", body("put_node", "id", "urn:uuid:"+tID), ReasonInvalid, "not a UUID"},
		{"id 36 chars, not hex", "", body("put_node", "id", "zf1c1f0e-7f0b-4d7e-9a51-0c1b7b0f2a11"), ReasonInvalid, "not a UUID"},
		{"id dashes misplaced", "", body("put_node", "id", "6f1c1f0e7-f0b-4d7e-9a51-0c1b7b0f2a11"), ReasonInvalid, "not a UUID"},

		// put_edge endpoints and label.
		{"put_edge without src", "", body("put_edge", "src", nil), ReasonInvalid, "needs src and dst"},
		{"put_edge without dst", "", body("put_edge", "dst", nil), ReasonInvalid, "needs src and dst"},
		{"put_edge bad src", "", body("put_edge", "src", "x"), ReasonInvalid, "src"},
		{"put_edge bad dst", "", body("put_edge", "dst", "x"), ReasonInvalid, "dst"},
		{"put_edge self-loop", "", body("put_edge", "dst", tSrc), "", ""},
		{"put_edge without label", "", body("put_edge", "label", nil), "", ""},
		{"put_edge label 256 bytes", "", body("put_edge", "label", long(128, "é")), "", ""},
		{"put_edge label 257 bytes", "", body("put_edge", "label", long(257, "l")), ReasonInvalid, "label"},

		// Fields that do not belong to the op.
		{"src on put_node", "", body("put_node", "src", tSrc), ReasonInvalid, "src is not allowed"},
		{"dst on tombstone_node", "", body("tombstone_node", "dst", tDst), ReasonInvalid, "dst is not allowed"},
		{"label on tombstone_edge", "", body("tombstone_edge", "label", "x"), ReasonInvalid, "label is not allowed"},
		{"valid_from on tombstone_node", "", body("tombstone_node", "valid_from", "2020-01-01T00:00:00Z"), ReasonInvalid, "valid_from is not allowed"},
		{"valid_to on tombstone_edge", "", body("tombstone_edge", "valid_to", "2020-01-01T00:00:00Z"), ReasonInvalid, "valid_to is not allowed"},
		{"valid_end on put_node", "", body("put_node", "valid_end", "2020-01-01T00:00:00Z"), ReasonInvalid, "valid_end is not allowed"},
		{"valid_end on put_edge", "", body("put_edge", "valid_end", "2020-01-01T00:00:00Z"), ReasonInvalid, "valid_end is not allowed"},
		{"props on tombstone_node", "", body("tombstone_node", "props", map[string]any{}), ReasonInvalid, "props is not allowed"},
		{"props on tombstone_edge", "", body("tombstone_edge", "props", map[string]any{"a": 1}), ReasonInvalid, "props is not allowed"},
		// null is the same as absent, for every op.
		{"null props on tombstone_node", "", body("tombstone_node", "props", json.RawMessage("null")), "", ""},
		{"null src on put_node", "", body("put_node", "src", json.RawMessage("null")), "", ""},
		{"null valid_end on put_node", "", body("put_node", "valid_end", json.RawMessage("null")), "", ""},
		{"null provenance", "", body("put_node", "provenance", json.RawMessage("null")), "", ""},

		// Times.
		{"valid_from not RFC 3339", "", body("put_node", "valid_from", "yesterday"), ReasonInvalid, "valid_from"},
		{"valid_from without zone", "", body("put_node", "valid_from", "2020-01-01T00:00:00"), ReasonInvalid, "valid_from"},
		{"valid_from with a space", "", body("put_node", "valid_from", "2020-01-01 00:00:00Z"), ReasonInvalid, "valid_from"},
		{"valid_from empty", "", body("put_node", "valid_from", ""), ReasonInvalid, "valid_from"},
		{"valid_from month 13", "", body("put_node", "valid_from", "2020-13-01T00:00:00Z"), ReasonInvalid, "valid_from"},
		{"valid_from Feb 30", "", body("put_node", "valid_from", "2021-02-30T00:00:00Z"), ReasonInvalid, "valid_from"},
		// RFC 3339's offsets stop at 23:59; Go's parser takes +24:00 and
		// +23:60, a day away from what the sender meant.
		{"valid_from offset +24:00", "", body("put_node", "valid_from", "2020-01-01T00:00:00+24:00"), ReasonInvalid, "valid_from"},
		{"valid_from offset +23:60", "", body("put_node", "valid_from", "2020-01-01T00:00:00+23:60"), ReasonInvalid, "valid_from"},
		{"valid_from offset -00:60", "", body("put_node", "valid_from", "2020-01-01T00:00:00-00:60"), ReasonInvalid, "valid_from"},
		{"valid_from offset -23:59", "", body("put_node", "valid_from", "2020-01-01T00:00:00-23:59"), "", ""},
		{"valid_from lower-case t and z (RFC 3339 §5.6)", "", body("put_node", "valid_from", "2020-01-01t00:00:00.5z"), "", ""},
		{"valid_from unix seconds", "", body("put_node", "valid_from", "1700000000"), ReasonInvalid, "valid_from"},
		{"valid_to year 10000", "", body("put_node", "valid_to", "10000-01-01T00:00:00Z"), ReasonInvalid, "valid_to"},
		{"valid_end year 10000", "", body("tombstone_node", "valid_end", "10000-01-01T00:00:00Z"), ReasonInvalid, "valid_end"},
		{"valid_end year 9999", "", body("tombstone_node", "valid_end", "9999-12-31T23:59:59.999999Z"), "", ""},
		{"valid_end year 0000", "", body("tombstone_node", "valid_end", "0000-01-01T00:00:00Z"), "", ""},
		{"valid_from equals valid_to", "", body("put_node", "valid_from", "2020-01-01T00:00:00Z", "valid_to", "2020-01-01T01:00:00+01:00"), ReasonInvalid, "before valid_to"},
		{"valid_from after valid_to", "", body("put_node", "valid_from", "2021-01-01T00:00:00Z", "valid_to", "2020-01-01T00:00:00Z"), ReasonInvalid, "before valid_to"},
		{"valid_from one microsecond before valid_to", "", body("put_edge", "valid_from", "2020-01-01T00:00:00.000001Z", "valid_to", "2020-01-01T00:00:00.000002Z"), "", ""},
		{"sub-microsecond interval collapses", "", body("put_node", "valid_from", "2020-01-01T00:00:00.0000001Z", "valid_to", "2020-01-01T00:00:00.0000009Z"), ReasonInvalid, "to the microsecond, as stored: 2020-01-01T00:00:00.000000Z and 2020-01-01T00:00:00.000000Z"},
		{"decided_at not RFC 3339", "", body("put_node", "provenance", map[string]any{"decided_at": "now"}), ReasonInvalid, "decided_at"},

		// props.
		{"props an array", "", body("put_node", "props", []int{1}), ReasonInvalid, "must be a JSON object"},
		{"props a string", "", body("put_node", "props", "x"), ReasonInvalid, "must be a JSON object"},
		{"props a number", "", body("put_edge", "props", 1), ReasonInvalid, "must be a JSON object"},
		{"props true", "", body("put_edge", "props", true), ReasonInvalid, "must be a JSON object"},
		{"props at the size limit", "", body("put_node", "props", json.RawMessage(`{"p":"`+long(MaxPropsBytes-8, "a")+`"}`)), "", ""},
		{"props over the size limit", "", body("put_node", "props", json.RawMessage(`{"p":"`+long(MaxPropsBytes-7, "a")+`"}`)), ReasonInvalid, "over the limit"},
		{"props 32 deep", "", body("put_node", "props", deep(MaxPropsDepth)), "", ""},
		{"props 33 deep", "", body("put_node", "props", deep(MaxPropsDepth+1)), ReasonInvalid, "nested"},
		{"props deep in arrays", "", body("put_node", "props", json.RawMessage(`{"a":`+long(MaxPropsDepth, "[")+long(MaxPropsDepth, "]")+`}`)), ReasonInvalid, "nested"},
		{"props braces inside strings do not count", "", body("put_node", "props", map[string]any{"s": long(100, "{[") + `\"`}), "", ""},
		{"props with duplicate keys are kept as sent", "", body("put_node", "props", json.RawMessage(`{"a":1,"a":2}`)), "", ""},

		// provenance limits.
		{"actor at the limit", "", body("put_node", "provenance", map[string]any{"actor": long(MaxProvFieldBytes, "a")}), "", ""},
		{"actor over the limit", "", body("put_node", "provenance", map[string]any{"actor": long(MaxProvFieldBytes+1, "a")}), ReasonInvalid, "provenance.actor"},
		{"reason over the limit", "", body("put_node", "provenance", map[string]any{"reason": long(MaxProvFieldBytes+1, "a")}), ReasonInvalid, "provenance.reason"},
		{"source over the limit", "", body("put_node", "provenance", map[string]any{"source": long(MaxProvFieldBytes+1, "a")}), ReasonInvalid, "provenance.source"},

		// Precedence: the first failing rule wins.
		{"request_id before op", "", body("drop", "request_id", ""), ReasonInvalid, "request_id"},
		{"op before tenant", "", body("drop", "tenant", "other"), ReasonInvalid, "unknown op"},
		{"tenant before id", "", body("put_node", "tenant", "other", "id", "x"), ReasonTenantMismatch, ""},
		{"id before op fields", "", body("tombstone_node", "id", "x", "src", tSrc), ReasonInvalid, "not a UUID"},
		{"too large before utf-8", "", long(MaxMessageBytes+1, "\xff"), ReasonTooLarge, ""},
		{"utf-8 before shape", "", "\xff", ReasonDecode, "UTF-8"},
	}
	valid := map[string]bool{}
	for _, r := range DeadLetterReasons() {
		valid[r] = true
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			subj := c.subject
			switch subj {
			case "":
				subj = "acme"
			case "-":
				subj = ""
			}
			r, rej := DecodeRequest([]byte(c.body), subj)
			if c.reason == "" {
				if rej != nil {
					t.Fatalf("rejected (%s): %s", rej.Reason, rej.Err)
				}
				if r.Scope.Tenant() != subj {
					t.Fatalf("tenant %q, want %q", r.Scope.Tenant(), subj)
				}
				return
			}
			if rej == nil {
				t.Fatalf("accepted %+v, want %s", r, c.reason)
			}
			if rej.Reason != c.reason || !strings.Contains(rej.Err, c.errHas) {
				t.Fatalf("rejected %s: %q, want %s containing %q", rej.Reason, rej.Err, c.reason, c.errHas)
			}
			if !valid[rej.Reason] || rej.Err == "" || rej.Error() != rej.Reason+": "+rej.Err {
				t.Fatalf("reject %+v", rej)
			}
			if rej.RequestID != "" && !validRequestID(rej.RequestID) {
				t.Fatalf("reject carries an unusable request id %q", rej.RequestID)
			}
		})
	}
}

// TestDecodeRequestRejectCarriesWhatItRead: a request that decodes but
// fails validation reports its request_id, op and id (for its invalid
// result), except an unusable request_id.
func TestDecodeRequestRejectCarriesWhatItRead(t *testing.T) {
	_, rej := DecodeRequest([]byte(body("drop_table", "request_id", "r-7", "id", "nope")), "acme")
	if rej == nil || rej.RequestID != "r-7" || rej.Op != "drop_table" || rej.ID != "nope" {
		t.Fatalf("reject %+v", rej)
	}
	_, rej = DecodeRequest([]byte(body("put_node", "request_id", "a\x00b", "tenant", "x")), "acme")
	if rej == nil || rej.RequestID != "" || rej.Op != "put_node" || rej.ID != tID {
		t.Fatalf("reject with a control character in its request id: %+v", rej)
	}
	_, rej = DecodeRequest([]byte(body("put_node", "request_id", strings.Repeat("x", 129), "tenant", "x")), "acme")
	if rej == nil || rej.RequestID != "" {
		t.Fatalf("reject with an over-long request id: %+v", rej)
	}
	// Not valid UTF-8: the decoder would read "h-\uFFFD", which is not the
	// id sent; the answer falls back to the message id.
	_, rej = DecodeRequest([]byte(`{"op":"put_node","request_id":"h-`+"\xff"+`","tenant":"acme","id":"`+tID+`"}`), "acme")
	if rej == nil || rej.Reason != ReasonDecode || rej.RequestID != "" {
		t.Fatalf("reject with a request id that is not UTF-8: %+v", rej)
	}
	// A lone surrogate escape decodes to U+FFFD: "x\ud800" and "x\udc00"
	// would be one id, so neither is taken.
	for _, id := range []string{`x\ud800`, `x\udc00`, "x\uFFFD"} {
		_, rej = DecodeRequest([]byte(`{"op":"put_node","request_id":"`+id+`","tenant":"acme","id":"`+tID+`"}`), "acme")
		if rej == nil || rej.Reason != ReasonInvalid || rej.RequestID != "" || !strings.Contains(rej.Err, "request_id") {
			t.Fatalf("request id %s: %+v, want invalid", id, rej)
		}
	}
	_, rej = DecodeRequest([]byte(body("put_node", "tenant", "other")), "acme")
	if rej == nil || rej.Reason != ReasonTenantMismatch || rej.RequestID != "req-1" {
		t.Fatalf("tenant mismatch: %+v", rej)
	}
}

// TestDecodeRequestDecodeRejectKeepsRequestID: a request that is
// well-formed JSON but fails the wire shape (the motivating case of
// DisallowUnknownFields: a mistyped "valid_end") is answered with its
// request_id, so the publisher waiting for the result of its request id
// sees it.
func TestDecodeRequestDecodeRejectKeepsRequestID(t *testing.T) {
	_, rej := DecodeRequest([]byte(body("tombstone_node", "request_id", "typo-1", "valid_ned", "2020-01-01T00:00:00Z")), "acme")
	if rej == nil || rej.Reason != ReasonDecode {
		t.Fatalf("reject %+v", rej)
	}
	if id, _, _ := peekRequest([]byte(body("tombstone_node", "request_id", "typo-1", "valid_ned", "x"))); id != "typo-1" {
		t.Fatalf("peekRequest read %q", id)
	}
	if rej.RequestID != "typo-1" {
		t.Fatalf("decode reject %+v: the invalid result cannot be matched to request typo-1", rej)
	}
}

// TestDecodeRequestKeyCaseAndDuplicates: encoding/json alone matches keys
// case-insensitively and lets the last duplicate win, so
// {"op":"put_node","OP":"tombstone_node"} would be a tombstone_node, while
// a gateway or audit log using another JSON parser (first wins, or exact
// keys) reads a put_node. CONTRACT §5 fixes the field names; the decoder
// refuses keys that are not exactly them, and duplicates.
func TestDecodeRequestKeyCaseAndDuplicates(t *testing.T) {
	dup := `{"request_id":"r","op":"put_node","tenant":"acme","id":"` + tID + `","OP":"tombstone_node"}`
	r, rej := DecodeRequest([]byte(dup), "acme")
	caseOnly := `{"Request_ID":"r","OP":"put_node","Tenant":"acme","ID":"` + tID + `"}`
	_, rej2 := DecodeRequest([]byte(caseOnly), "acme")
	sameKey := `{"request_id":"r","op":"put_node","tenant":"acme","id":"` + tID + `","id":"` + tSrc + `"}`
	_, rej3 := DecodeRequest([]byte(sameKey), "acme")
	if rej == nil || rej2 == nil || rej3 == nil {
		t.Fatalf("accepted: duplicate op key -> %v (%v); case-folded keys -> %v; duplicate id -> %v", r.Op, rej, rej2, rej3)
	}
}

// TestDecodeRequestTimesOutsideRFC3339Years: every time the service writes
// must be RFC 3339 (years 0000-9999, CONTRACT §6) and parse back with the
// same parser. An input offset can move a time accepted in 0000 or 9999
// out of that range once normalised to UTC: the store then holds a time the
// read API prints as "10000-..." or "-0001-..." and cannot be queried at.
func TestDecodeRequestTimesOutsideRFC3339Years(t *testing.T) {
	for _, s := range []string{"9999-12-31T23:59:59-23:59", "0000-01-01T00:00:00+00:01"} {
		r, rej := DecodeRequest([]byte(body("put_node", "valid_from", s)), "acme")
		if rej != nil {
			continue // refused: fine
		}
		out := r.ValidFrom.Time().Format(storage.TimeLayout)
		if _, err := storage.ParseTs(out); err != nil {
			t.Fatalf("valid_from %q decoded to %s, which is not RFC 3339: %v", s, out, err)
		}
	}
}

func TestDecodeRequestNeverReportsServerSideReasons(t *testing.T) {
	// wrong_partition and retries_exhausted come from the worker, never
	// from decoding.
	for _, b := range []string{``, `{}`, body("x"), body("put_node", "tenant", "zz")} {
		_, rej := DecodeRequest([]byte(b), "acme")
		if rej == nil || slices.Contains([]string{ReasonWrongPartition, ReasonRetriesExhausted}, rej.Reason) {
			t.Fatalf("%q: %+v", b, rej)
		}
	}
}

func TestParseSubject(t *testing.T) {
	for _, c := range []struct {
		subject string
		p       int
		tenant  string
		part    int
		bad     bool
	}{
		{"telha.req.acme", 7, "acme", Partition("acme", 7), false},
		{"telha.req.3.acme", 7, "acme", 3, false},
		{"telha.req.03.acme", 7, "acme", -1, true},
		{"telha.req.x.acme", 7, "acme", -1, true},
		{"telha.req.-1.acme", 7, "acme", -1, false},
		{"telha.req.1.2.acme", 7, "", 0, true},
		{"telha.res.acme", 7, "", 0, true},
		{"telha.reqx.acme", 7, "", 0, true},
	} {
		tn, p, err := parseSubject("telha", c.subject, c.p)
		if (err != nil) != c.bad || tn != c.tenant || (!c.bad && p != c.part) {
			t.Errorf("parseSubject(%q) = %q, %d, %v; want %q, %d, error %v", c.subject, tn, p, err, c.tenant, c.part, c.bad)
		}
	}
}
