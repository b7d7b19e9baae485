package queue

import (
	"encoding/json"
	"strings"
	"testing"
)

// TestDecodeRequestNilUUID (issue 20 item 23): the nil UUID is no node's
// or edge's id, and is refused with a clear reason wherever a UUID goes.
func TestDecodeRequestNilUUID(t *testing.T) {
	const nilID = "00000000-0000-0000-0000-000000000000"
	for name, b := range map[string]string{
		"id":   body("put_node", "id", nilID),
		"tomb": body("tombstone_node", "id", nilID),
		"src":  body("put_edge", "src", nilID),
		"dst":  body("put_edge", "dst", nilID),
	} {
		_, rej := DecodeRequest([]byte(b), "acme")
		if rej == nil || rej.Reason != ReasonInvalid || !strings.Contains(rej.Err, "nil UUID") {
			t.Errorf("%s: %+v, want invalid (the nil UUID)", name, rej)
		}
	}
}

// TestDecodeRequestPropsNumbers (issue 20 item 23): props are I-JSON
// (RFC 7493): a number a double cannot hold (out of range, an integer
// beyond ±(2^53-1), more significant digits than a double keeps) is
// refused, so every reader parses the stored props to the same values.
func TestDecodeRequestPropsNumbers(t *testing.T) {
	for lit, ok := range map[string]bool{
		"0": true, "-0": true, "1": true, "-1": true, "1.5": true, "0.1": true, "1e300": true, "-1.7976931348623157e308": true,
		"9007199254740991": true, "-9007199254740991": true, "1.0e2": true, "0.30000000000000004": true,
		"1.50000000000000000000": true, "2.2250738585072014e-308": true, "5e-324": true, "0e0": true, "0.000": true,
		"1e400": false, "-1e400": false, "1E309": false, "1e-400": false,
		"9007199254740992": false, "123456789012345678901234567890": false, "-123456789012345678901234567890": false,
		"1.00000000000000000000001": false, "3.141592653589793238462643": false,
	} {
		raw := json.RawMessage(`{"n":` + lit + `,"deep":[{"m":` + lit + `}]}`)
		r, rej := DecodeRequest([]byte(body("put_node", "props", raw)), "acme")
		if ok != (rej == nil) {
			t.Errorf("props number %s: accepted %v (%v), want %v", lit, rej == nil, rej, ok)
			continue
		}
		if ok {
			var m map[string]any
			if err := json.Unmarshal(r.Props, &m); err != nil {
				t.Errorf("accepted props %s do not decode: %v", r.Props, err)
			}
		} else if rej.Reason != ReasonInvalid || !strings.Contains(rej.Err, "props") || !strings.Contains(rej.Err, "number") {
			t.Errorf("props number %s: %+v", lit, rej)
		}
	}
	// Numbers inside strings and keys are text.
	if _, rej := DecodeRequest([]byte(body("put_node", "props", json.RawMessage(`{"1e400":"123456789012345678901234567890"}`))), "acme"); rej != nil {
		t.Errorf("numbers in strings refused: %v", rej)
	}
}
