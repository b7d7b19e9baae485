package queue

import (
	"bytes"
	"encoding/json"
	"reflect"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/telha/telha-cascade/cascade"
	"github.com/telha/telha-cascade/storage"
)

// FuzzDecodeRequest: DecodeRequest never panics; whatever it accepts
// respects every limit of request.go and CONTRACT §5; whatever it refuses
// carries a dead-letter reason. Seeds (testdata/fuzz/FuzzDecodeRequest and
// the f.Add calls below) run under plain `go test`.
func FuzzDecodeRequest(f *testing.F) {
	for _, op := range []string{"put_node", "put_edge", "tombstone_node", "tombstone_edge"} {
		f.Add([]byte(body(op)), "acme")
	}
	f.Add([]byte(body("put_edge", "valid_from", "1900-01-01T00:00:00Z", "valid_to", "2100-01-01T00:00:00.5+02:00",
		"props", map[string]any{"k": []any{1, "x", nil}}, "provenance", map[string]any{"actor": "a", "decided_at": "2020-02-29T00:00:00Z"})), "acme")
	f.Add([]byte(`{"request_id":"r","op":"put_node","tenant":"a","id":"`+tID+`","props":`+strings.Repeat("[", 40)+strings.Repeat("]", 40)+`}`), "a")
	f.Add([]byte(`{"request_id":"r","op":"tombstone_node","tenant":"*","id":"`+tID+`"}`), "*")
	f.Add([]byte(`{"Request_Id":"r","OP":"tombstone_node","tenant":"a","id":"`+tID+`","op":"put_node"}`), "a")
	// Issue 20: the nil UUID, and numbers a double cannot hold.
	f.Add([]byte(body("put_edge", "src", uuid.Nil.String())), "acme")
	f.Add([]byte(body("put_node", "props", json.RawMessage(`{"a":1e400,"b":[-123456789012345678901234567890,1.5e-7]}`))), "acme")
	f.Add([]byte(body("put_node", "props", json.RawMessage(`{"a":9007199254740991,"b":"1e400","c":-0.0}`))), "acme")
	f.Fuzz(func(t *testing.T, data []byte, subjectTenant string) {
		req, rej := DecodeRequest(data, subjectTenant)
		if rej != nil {
			checkReject(t, rej)
			if req.Op != 0 || req.RequestID != "" || !req.Scope.IsZero() {
				t.Fatalf("a reject also returned a request %+v", req)
			}
			return
		}
		checkRequest(t, data, subjectTenant, &req)
		// Decoding is a function of the request's meaning: the canonical
		// re-encoding of what was decoded decodes to the same request.
		if !timesRoundTrip(&req) {
			return // known bug: see TestDecodeRequestTimesOutsideRFC3339Years
		}
		enc := encodeRequest(&req)
		if len(enc) > MaxMessageBytes {
			return // escaping grew it over the limit
		}
		again, rej := DecodeRequest(enc, subjectTenant)
		if rej != nil {
			t.Fatalf("re-encoding of %+v rejected: %v", req, rej)
		}
		if !reflect.DeepEqual(normalise(again), normalise(req)) {
			t.Fatalf("re-decoded %+v\n != %+v", again, req)
		}
	})
}

func checkReject(t *testing.T, rej *Reject) {
	t.Helper()
	if rej.Reason == "" || !slices.Contains(DeadLetterReasons(), rej.Reason) {
		t.Fatalf("reject reason %q is not a dead-letter reason", rej.Reason)
	}
	if rej.Reason == ReasonWrongPartition || rej.Reason == ReasonRetriesExhausted {
		t.Fatalf("decoding reported the worker-side reason %q", rej.Reason)
	}
	if rej.Err == "" {
		t.Fatalf("reject %q without an error text", rej.Reason)
	}
	if rej.RequestID != "" && !validRequestID(rej.RequestID) {
		t.Fatalf("reject carries the unusable request id %q", rej.RequestID)
	}
	if !utf8.ValidString(rej.RequestID) {
		t.Fatalf("reject request id %q is not UTF-8", rej.RequestID)
	}
}

func checkRequest(t *testing.T, data []byte, subjectTenant string, r *cascade.Request) {
	t.Helper()
	if r.ID == uuid.Nil || (r.Op == storage.OpPutEdge && (r.Src == uuid.Nil || r.Dst == uuid.Nil)) {
		t.Fatalf("accepted the nil UUID: %+v", r)
	}
	if len(data) > MaxMessageBytes || !utf8.Valid(data) {
		t.Fatalf("accepted a message of %d bytes (valid UTF-8: %v)", len(data), utf8.Valid(data))
	}
	if n := utf8.RuneCountInString(r.RequestID); n < 1 || n > MaxRequestIDRunes || !validRequestID(r.RequestID) {
		t.Fatalf("accepted request id %q (%d runes)", r.RequestID, n)
	}
	if r.Scope.Tenant() != subjectTenant || !storage.ValidTenant(r.Scope.Tenant()) {
		t.Fatalf("accepted tenant %q for subject tenant %q", r.Scope.Tenant(), subjectTenant)
	}
	if !slices.Contains(storage.Ops(), r.Op) {
		t.Fatalf("accepted op %v", r.Op)
	}
	isPut := r.Op == storage.OpPutNode || r.Op == storage.OpPutEdge
	if r.Op != storage.OpPutEdge && (r.Src != uuid.Nil || r.Dst != uuid.Nil || r.Label != "") {
		t.Fatalf("%v carries edge fields %+v", r.Op, r)
	}
	if len(r.Label) > MaxLabelBytes {
		t.Fatalf("label of %d bytes", len(r.Label))
	}
	if isPut {
		if r.ValidEnd != storage.NoTs {
			t.Fatalf("%v carries valid_end %v", r.Op, r.ValidEnd)
		}
		if r.ValidFrom != storage.NoTs && r.ValidTo != storage.NoTs && r.ValidFrom >= r.ValidTo {
			t.Fatalf("empty valid interval [%v, %v)", r.ValidFrom, r.ValidTo)
		}
	} else if r.ValidFrom != storage.NoTs || r.ValidTo != storage.NoTs || r.Props != nil {
		t.Fatalf("%v carries put fields %+v", r.Op, r)
	}
	for _, ts := range []storage.Ts{r.ValidFrom, r.ValidTo, r.ValidEnd, r.Prov.DecidedAt} {
		if ts == storage.OpenEnd {
			t.Fatalf("a request time decoded to OpenEnd: %+v", r)
		}
	}
	if r.Props != nil {
		if len(r.Props) > MaxPropsBytes || len(r.Props) == 0 || r.Props[0] != '{' || !json.Valid(r.Props) {
			t.Fatalf("props %q", r.Props)
		}
		var m map[string]json.RawMessage
		if err := json.Unmarshal(r.Props, &m); err != nil || m == nil {
			t.Fatalf("props %q are not an object: %v", r.Props, err)
		}
		var c bytes.Buffer
		if err := json.Compact(&c, r.Props); err != nil || !bytes.Equal(c.Bytes(), r.Props) {
			t.Fatalf("props %q are not compact", r.Props)
		}
		if d := jsonDepth(r.Props); d > MaxPropsDepth {
			t.Fatalf("props nested %d deep", d)
		}
	}
	for _, s := range []string{r.Prov.Actor, r.Prov.Reason, r.Prov.Source} {
		if len(s) > MaxProvFieldBytes {
			t.Fatalf("provenance field of %d bytes", len(s))
		}
	}
	if r.Prov.RequestID != "" {
		t.Fatalf("provenance.request_id %q set by decoding", r.Prov.RequestID)
	}
}

// jsonDepth is the nesting depth of valid JSON, by a real tokenizer.
func jsonDepth(b []byte) int {
	dec := json.NewDecoder(bytes.NewReader(b))
	depth, most := 0, 0
	for {
		tok, err := dec.Token()
		if err != nil {
			return most
		}
		switch tok {
		case json.Delim('{'), json.Delim('['):
			depth++
			most = max(most, depth)
		case json.Delim('}'), json.Delim(']'):
			depth--
		}
	}
}

func timesRoundTrip(r *cascade.Request) bool {
	for _, ts := range []storage.Ts{r.ValidFrom, r.ValidTo, r.ValidEnd, r.Prov.DecidedAt} {
		if ts == storage.NoTs {
			continue
		}
		if y := ts.Time().Year(); y < 0 || y > 9999 {
			return false
		}
	}
	return true
}

// encodeRequest writes the canonical wire form of a decoded request.
func encodeRequest(r *cascade.Request) []byte {
	m := map[string]any{"request_id": r.RequestID, "op": r.Op.String(), "tenant": r.Scope.Tenant(), "id": r.ID.String()}
	tm := func(k string, ts storage.Ts) {
		if ts != storage.NoTs {
			m[k] = ts.Time().Format(storage.TimeLayout)
		}
	}
	if r.Op == storage.OpPutEdge {
		m["src"], m["dst"], m["label"] = r.Src.String(), r.Dst.String(), r.Label
	}
	tm("valid_from", r.ValidFrom)
	tm("valid_to", r.ValidTo)
	tm("valid_end", r.ValidEnd)
	if r.Props != nil {
		m["props"] = json.RawMessage(r.Props)
	}
	p := map[string]any{"actor": r.Prov.Actor, "reason": r.Prov.Reason, "source": r.Prov.Source}
	if r.Prov.DecidedAt != storage.NoTs {
		p["decided_at"] = r.Prov.DecidedAt.Time().Format(storage.TimeLayout)
	}
	m["provenance"] = p
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(m); err != nil {
		panic(err)
	}
	return b.Bytes()
}

// normalise makes props comparable (json.Marshal re-escapes strings).
func normalise(r cascade.Request) cascade.Request {
	if r.Props != nil {
		var v any
		_ = json.Unmarshal(r.Props, &v)
		r.Props, _ = json.Marshal(v)
	}
	return r
}
