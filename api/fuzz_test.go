package api_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/telha/telha-cascade/api"
	"github.com/telha/telha-cascade/cascade"
	"github.com/telha/telha-cascade/storage"
)

// FuzzReadAPIParams drives the read API of a real store with fuzzed
// tenant, id, valid, tx and dir values (path segments and query values
// properly escaped). It never answers 5xx or panics; 400 and 404 carry
// {"error": non-empty}; 200 bodies are the documented JSON objects.
//
// route picks the endpoint (mod 6); flags bit 0 sends valid, bit 1 tx,
// bit 2 dir, bit 4 repeats valid, bit 5 sends the query raw (unescaped).
func FuzzReadAPIParams(f *testing.F) {
	st, err := storage.OpenStore(f.TempDir(), storage.Options{Logger: quiet})
	if err != nil {
		f.Fatal(err)
	}
	ops := cascade.New(st, cascade.Options{Logger: quiet})
	f.Cleanup(func() {
		_ = st.Close()
	})
	// A small graph in tenant "acme" (and "a", a prefix of it): a node with
	// an edge, a deleted node, pre-1970 and far-future valid times.
	n1 := uuid.MustParse("11111111-1111-4111-8111-111111111111")
	n2 := uuid.MustParse("22222222-2222-4222-8222-222222222222")
	e1 := uuid.MustParse("33333333-3333-4333-8333-333333333333")
	ctx := context.Background()
	past := storage.TsFromTime(time.Date(1900, 1, 1, 0, 0, 0, 0, time.UTC))
	future := storage.TsFromTime(time.Date(9999, 12, 31, 0, 0, 0, 0, time.UTC))
	for _, tn := range []string{"acme", "a"} {
		sc := storage.MustScope(tn)
		for _, n := range []uuid.UUID{n1, n2} {
			if _, err := ops.PutNode(ctx, sc, storage.NodeWrite{ID: n, ValidFrom: past, ValidTo: storage.NoTs, Props: []byte(`{"t":"` + tn + `"}`), Prov: storage.Provenance{DecidedAt: storage.NoTs}}); err != nil {
				f.Fatal(err)
			}
		}
		if _, err := ops.PutEdge(ctx, sc, storage.EdgeWrite{ID: e1, Src: n1, Dst: n2, Label: "l", ValidFrom: past, ValidTo: future, Prov: storage.Provenance{DecidedAt: storage.NoTs}}); err != nil {
			f.Fatal(err)
		}
	}
	if _, err := ops.TombstoneNode(ctx, storage.MustScope("a"), n2, storage.NoTs, storage.Provenance{DecidedAt: storage.NoTs}); err != nil {
		f.Fatal(err)
	}
	h := api.Handler(st, api.Options{ReadAPI: true, Health: true, Logger: quiet})

	f.Add(byte(0), "acme", n1.String(), "", "", "", byte(0))
	f.Add(byte(2), "a", n1.String(), "1950-01-01T00:00:00Z", "", "in", byte(5))
	f.Add(byte(1), "acme", e1.String(), "1899-12-31T23:59:59.999999Z", "2000-01-01T00:00:00+14:00", "", byte(3))
	f.Fuzz(func(t *testing.T, route byte, tenant, id, valid, tx, dir string, flags byte) {
		p := "/v1/tenants/" + url.PathEscape(tenant)
		var top string
		switch route % 6 {
		case 0:
			p += "/nodes/" + url.PathEscape(id)
		case 1:
			p += "/edges/" + url.PathEscape(id)
		case 2:
			p += "/nodes/" + url.PathEscape(id) + "/edges"
			top = "edges"
		case 3:
			p += "/nodes/" + url.PathEscape(id) + "/history"
			top = "versions"
		case 4:
			p += "/edges/" + url.PathEscape(id) + "/history"
			top = "versions"
		case 5:
			p = "/v1/journals"
			top = "journals"
		}
		qv := url.Values{}
		if flags&1 != 0 {
			qv.Add("valid", valid)
			if flags&0x10 != 0 {
				qv.Add("valid", tx)
			}
		}
		if flags&2 != 0 {
			qv.Add("tx", tx)
		}
		if flags&4 != 0 {
			qv.Add("dir", dir)
		}
		if len(qv) > 0 {
			if flags&0x20 != 0 {
				// Raw: whatever the query string holds, as long as it is a
				// valid request target.
				raw := "valid=" + valid + "&tx=" + tx + "&dir=" + dir
				if _, err := url.ParseQuery(raw); err != nil || strings.ContainsAny(raw, " #\x00\r\n\t") || !isPrintableASCII(raw) {
					raw = qv.Encode()
				}
				p += "?" + raw
			} else {
				p += "?" + qv.Encode()
			}
		}
		u, err := url.ParseRequestURI(p)
		if err != nil {
			t.Fatalf("built an unparsable target %q: %v", p, err)
		}
		req := &http.Request{Method: http.MethodGet, URL: u, RequestURI: p, Header: http.Header{}, Host: "example.com", Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req.WithContext(context.Background()))
		code, body := rec.Code, rec.Body.Bytes()
		if code >= 500 {
			t.Fatalf("GET %s: %d %s", p, code, body)
		}
		switch code {
		case 301, 307, 308:
			// ServeMux cleans paths with empty, "." or ".." segments by
			// redirecting; fine as long as it says where.
			if rec.Header().Get("Location") == "" {
				t.Fatalf("GET %s: %d without Location", p, code)
			}
			return
		case 200, 400, 404:
		default:
			t.Fatalf("GET %s: unexpected %d %s", p, code, body)
		}
		if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
			t.Fatalf("GET %s: %d with Content-Type %q", p, code, ct)
		}
		var m map[string]json.RawMessage
		if err := json.Unmarshal(body, &m); err != nil {
			t.Fatalf("GET %s: %d body %q is not a JSON object: %v", p, code, body, err)
		}
		if code != 200 {
			var msg string
			if err := json.Unmarshal(m["error"], &msg); err != nil || msg == "" {
				t.Fatalf("GET %s: %d body %s without an error message", p, code, body)
			}
			return
		}
		if top == "" {
			// A version: it must be one of the stored entities, in the
			// requested tenant.
			var v api.Version
			if err := json.Unmarshal(body, &v); err != nil || v.TxTo != nil || v.TxFrom == nil {
				t.Fatalf("GET %s: version %s: %v", p, body, err)
			}
			if v.ID != n1.String() && v.ID != n2.String() && v.ID != e1.String() {
				t.Fatalf("GET %s: unknown entity %s", p, body)
			}
			if route%6 == 0 && string(v.Props) != `{"t":"`+tenant+`"}` {
				t.Fatalf("GET %s: another tenant's version %s", p, body)
			}
			return
		}
		raw, ok := m[top]
		if !ok || len(raw) == 0 || raw[0] != '[' {
			t.Fatalf("GET %s: body %s has no %q list", p, body, top)
		}
	})
}

func isPrintableASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x21 || s[i] > 0x7e {
			return false
		}
	}
	return true
}
