package api_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/telha/telha-cascade/api"
)

// TestReadyzNotes (issue 23 item 12): a ready worker with a note (its
// consumer paused) answers 200 with the note; not ready, 503 with reasons.
func TestReadyzNotes(t *testing.T) {
	ok, why := true, []string{"consumer telha-worker-0: paused until resumed"}
	h := api.Handler(nil, api.Options{Health: true, Ready: func() (bool, []string) { return ok, why }})
	get := func() (int, map[string]any) {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/readyz", nil))
		var body map[string]any
		if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
			t.Fatalf("/readyz body %q: %v", rec.Body.String(), err)
		}
		return rec.Code, body
	}
	code, body := get()
	if notes, _ := body["notes"].([]any); code != 200 || body["status"] != "ready" || len(notes) != 1 || notes[0] != why[0] {
		t.Fatalf("ready with a note: %d %v", code, body)
	}
	ok, why = false, []string{"nats: not connected"}
	if code, body := get(); code != 503 || body["reasons"] == nil {
		t.Fatalf("not ready: %d %v", code, body)
	}
	ok, why = true, nil
	if code, body := get(); code != 200 || body["notes"] != nil {
		t.Fatalf("ready: %d %v", code, body)
	}
}
