package client

import (
	"encoding/json"
	"strings"
	"testing"
)

// TestMarshalKeepsHTMLCharacters: props full of <, > and & are published
// as written. With json.Marshal each became \u003c (six bytes): a probe's
// 50,000 '<' in props under the 64 KiB limit made a 300 KB body, refused
// as too_large, where the same body published raw was ok.
func TestMarshalKeepsHTMLCharacters(t *testing.T) {
	props := json.RawMessage(`{"s":"` + strings.Repeat("<>&", 1000) + `"}`)
	b, err := Marshal(&Request{Op: "put_node", Props: props})
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(b), `\u003c`) || !strings.Contains(string(b), strings.Repeat("<>&", 1000)) || strings.HasSuffix(string(b), "\n") {
		t.Fatalf("body %d bytes, escaped or with a newline: %.80s", len(b), b)
	}
	var back Request
	if err := json.Unmarshal(b, &back); err != nil || string(back.Props) != string(props) {
		t.Fatalf("round trip: %v %s", err, back.Props)
	}
}
