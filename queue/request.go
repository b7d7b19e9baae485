package queue

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"reflect"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/telha/telha-cascade/cascade"
	"github.com/telha/telha-cascade/queue/client"
	"github.com/telha/telha-cascade/storage"
)

// Limits on request messages. Anything over them is dead-lettered as
// invalid (too_large for the whole message) and never applied.
const (
	MaxMessageBytes   = client.MaxMessageBytes // whole request body
	MaxPropsBytes     = 64 << 10               // the props object, as sent
	MaxPropsDepth     = 32                     // nesting depth inside props
	MaxRequestIDRunes = 128
	MaxLabelBytes     = 256
	MaxProvFieldBytes = 1024 // actor, reason, source
)

// Dead-letter reasons (also the reason label of telha_dead_letters_total).
const (
	ReasonDecode           = "decode"            // not a single JSON object of the wire shape
	ReasonInvalid          = "invalid"           // a field is missing, malformed or not allowed
	ReasonTenantMismatch   = "tenant_mismatch"   // body tenant differs from the subject's
	ReasonWrongPartition   = "wrong_partition"   // the message's partition is not this replica's
	ReasonTooLarge         = "too_large"         // the message is over MaxMessageBytes
	ReasonRetriesExhausted = "retries_exhausted" // transient failures on the final delivery
	ReasonCrashLoop        = "crash_loop"        // the worker died handling it, MaxDeaths times
	ReasonConflict         = "conflict"          // its request id was used before for another request
)

// DeadLetterReasons lists every reason, for metrics initialisation.
func DeadLetterReasons() []string {
	return []string{ReasonDecode, ReasonInvalid, ReasonTenantMismatch, ReasonWrongPartition, ReasonTooLarge, ReasonRetriesExhausted, ReasonCrashLoop, ReasonConflict}
}

// Reject is why a message can never be applied.
type Reject struct {
	Reason string
	Err    string
	// What could be read of the request, for the invalid result.
	RequestID string
	Op        string
	ID        string
}

func (r *Reject) Error() string { return r.Reason + ": " + r.Err }

// WireRequest is the request body of CONTRACT §5. Pointers tell an absent (or
// null) field from an empty one.
type WireRequest struct {
	RequestID  *string         `json:"request_id"`
	Op         *string         `json:"op"`
	Tenant     *string         `json:"tenant"`
	ID         *string         `json:"id"`
	Src        *string         `json:"src"`
	Dst        *string         `json:"dst"`
	Label      *string         `json:"label"`
	ValidFrom  *string         `json:"valid_from"`
	ValidTo    *string         `json:"valid_to"`
	ValidEnd   *string         `json:"valid_end"`
	Props      json.RawMessage `json:"props"`
	Provenance *WireProvenance `json:"provenance"`
}

// WireProvenance is the request's provenance object.
type WireProvenance struct {
	Actor     *string `json:"actor"`
	Reason    *string `json:"reason"`
	Source    *string `json:"source"`
	DecidedAt *string `json:"decided_at"`
}

// DecodeRequest turns a message body into a cascade.Request for the tenant
// of the subject. It never panics; anything that cannot apply is a Reject.
// Unknown fields are rejected (a mistyped "valid_end" must not silently
// become "now"), and so are fields that do not belong to the op.
func DecodeRequest(data []byte, subjectTenant string) (cascade.Request, *Reject) {
	rej := func(reason, format string, args ...any) *Reject {
		r := &Reject{Reason: reason, Err: fmt.Sprintf(format, args...)}
		r.RequestID, r.Op, r.ID = peekRequest(data)
		return r
	}
	if len(data) > MaxMessageBytes {
		return cascade.Request{}, rej(ReasonTooLarge, "request is %d bytes, over the limit of %d", len(data), MaxMessageBytes)
	}
	if !utf8.Valid(data) {
		return cascade.Request{}, rej(ReasonDecode, "request is not valid UTF-8")
	}
	var w WireRequest
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&w); err != nil {
		return cascade.Request{}, rej(ReasonDecode, "%s", jsonProblem(err))
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return cascade.Request{}, rej(ReasonDecode, "request has data after its JSON object")
	}
	if len(bytes.TrimSpace(data)) == 0 || bytes.TrimSpace(data)[0] != '{' {
		return cascade.Request{}, rej(ReasonDecode, "request is not a JSON object")
	}
	if err := checkKeys(data); err != nil {
		return cascade.Request{}, rej(ReasonDecode, "%v", err)
	}
	req, r := validate(&w, subjectTenant)
	if r != nil {
		r.RequestID, r.Op, r.ID = str(w.RequestID), str(w.Op), str(w.ID)
		if !validRequestID(r.RequestID) {
			r.RequestID = ""
		}
	}
	return req, r
}

// jsonProblem says what is wrong with a request body in a reader's words
// (a field and the form it wants), not encoding/json's (Go types).
func jsonProblem(err error) string {
	var te *json.UnmarshalTypeError
	var se *json.SyntaxError
	switch {
	case errors.As(err, &te) && te.Field != "":
		want := "a string"
		switch te.Type.Kind() {
		case reflect.Struct, reflect.Pointer, reflect.Map:
			want = "an object"
		}
		return fmt.Sprintf("field %s must be %s, not a JSON %s", storage.QuoteShort(te.Field), want, te.Value)
	case errors.As(err, &te):
		return fmt.Sprintf("the request must be a JSON object, not a JSON %s", te.Value)
	case errors.As(err, &se):
		return fmt.Sprintf("the request is not valid JSON (at byte %d)", se.Offset)
	case errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF):
		return "the request is empty or cut short"
	}
	if f, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
		return "unknown field " + clip(f, MaxEchoBytes) + " (see CONTRACT §5 for the request's fields)"
	}
	return "the request is not a JSON object of the request's shape"
}

var (
	wireKeys = map[string]bool{"request_id": true, "op": true, "tenant": true, "id": true, "src": true, "dst": true,
		"label": true, "valid_from": true, "valid_to": true, "valid_end": true, "props": true, "provenance": true}
	provKeys = map[string]bool{"actor": true, "reason": true, "source": true, "decided_at": true}
)

// checkKeys requires the request object (and its provenance object) to use
// exactly the wire names, each at most once. encoding/json alone would match
// keys case-insensitively and let a duplicate key win silently, so a
// gateway or audit log parsing the same bytes could read another request
// ({"op":"put_node","OP":"tombstone_node"}). Keys are compared as written:
// an escaped key ("\u006fp") is not a wire name. It is a small scanner
// (json.Decoder.Token was a
// tenth of a busy worker's CPU).
//
// Precondition: data is exactly one valid JSON value (DecodeRequest calls
// it after json.Decoder decoded the whole of data); the scanner does not
// check syntax again.
func checkKeys(data []byte) error {
	i := skipWS(data, 0)
	if i >= len(data) || data[i] != '{' {
		return fmt.Errorf("request is not a JSON object")
	}
	_, err := checkObject(data, i, wireKeys, "")
	return err
}

// checkObject checks the keys of the object starting at data[i] == '{' and
// returns the index after its closing brace.
func checkObject(data []byte, i int, allowed map[string]bool, where string) (int, error) {
	var seen [16]string
	n := 0
	i = skipWS(data, i+1)
	if data[i] == '}' {
		return i + 1, nil
	}
	for {
		end := skipString(data, i)
		key := string(data[i+1 : end-1])
		if !allowed[key] {
			return 0, fmt.Errorf("unknown field %s%s", storage.QuoteShort(key), where)
		}
		for _, k := range seen[:n] {
			if k == key {
				return 0, fmt.Errorf("field %s%s given twice", storage.QuoteShort(key), where)
			}
		}
		if n < len(seen) {
			seen[n] = key
			n++
		}
		i = skipWS(data, end)
		i = skipWS(data, i+1) // the ':'
		var err error
		if key == "provenance" && where == "" && data[i] == '{' {
			i, err = checkObject(data, i, provKeys, " in provenance")
			if err != nil {
				return 0, err
			}
		} else {
			i = skipValue(data, i)
		}
		i = skipWS(data, i)
		if data[i] == '}' {
			return i + 1, nil
		}
		i = skipWS(data, i+1) // the ','
	}
}

func skipWS(data []byte, i int) int {
	for i < len(data) && (data[i] == ' ' || data[i] == '\t' || data[i] == '\n' || data[i] == '\r') {
		i++
	}
	return i
}

// skipString returns the index after the string starting at data[i] == '"'.
func skipString(data []byte, i int) int {
	for j := i + 1; j < len(data); j++ {
		switch data[j] {
		case '\\':
			j++
		case '"':
			return j + 1
		}
	}
	return len(data)
}

// skipValue returns the index after the (valid) value starting at data[i].
func skipValue(data []byte, i int) int {
	switch data[i] {
	case '"':
		return skipString(data, i)
	case '{', '[':
		depth := 0
		for j := i; j < len(data); j++ {
			switch data[j] {
			case '"':
				j = skipString(data, j) - 1
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return j + 1
				}
			}
		}
		return len(data)
	}
	for j := i; j < len(data); j++ { // number, true, false, null
		switch data[j] {
		case ',', '}', ']', ' ', '\t', '\n', '\r':
			return j
		}
	}
	return len(data)
}

// peekRequest reads what it can of a request that will not be applied, for
// its invalid result (best effort; never fails).
func peekRequest(data []byte) (requestID, op, id string) {
	if len(data) > MaxMessageBytes {
		return "", "", ""
	}
	var head struct {
		RequestID any `json:"request_id"`
		Op        any `json:"op"`
		ID        any `json:"id"`
	}
	_ = json.Unmarshal(data, &head)
	s := func(v any) string {
		if x, ok := v.(string); ok {
			return x
		}
		return ""
	}
	requestID = s(head.RequestID)
	// validRequestID refuses U+FFFD, which is also what the decoder puts in
	// place of invalid bytes: an answer under that id would reach no one,
	// so it falls back to the message id.
	if !validRequestID(requestID) {
		requestID = ""
	}
	return requestID, s(head.Op), s(head.ID)
}

func str(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}

func validRequestID(s string) bool {
	n := utf8.RuneCountInString(s)
	if n < 1 || n > MaxRequestIDRunes {
		return false
	}
	for _, c := range s {
		// U+FFFD is what a lone surrogate escape ("\ud800") decodes to:
		// two different ids sent that way would share one receipt.
		if unicode.IsControl(c) || c == utf8.RuneError {
			return false
		}
	}
	return true
}

// ParseUUID accepts only the canonical 36-character form, and not the nil
// UUID.
func ParseUUID(field, s string) (uuid.UUID, error) {
	if len(s) != 36 {
		return uuid.Nil, fmt.Errorf("%s %s is not a UUID (want 8-4-4-4-12 hex digits)", field, storage.QuoteShort(s))
	}
	u, err := uuid.Parse(s)
	if err != nil {
		return uuid.Nil, fmt.Errorf("%s %s is not a UUID: %v", field, storage.QuoteShort(s), err)
	}
	if u == uuid.Nil {
		// The zero value of every id in the code: as an id it could only
		// ever mean "not set" (issue 20).
		return uuid.Nil, fmt.Errorf("%s is the nil UUID %s, which names nothing", field, s)
	}
	return u, nil
}

func validate(w *WireRequest, subjectTenant string) (cascade.Request, *Reject) {
	bad := func(format string, args ...any) (cascade.Request, *Reject) {
		return cascade.Request{}, &Reject{Reason: ReasonInvalid, Err: fmt.Sprintf(format, args...)}
	}
	var r cascade.Request
	if w.RequestID == nil {
		return bad("request_id is required")
	}
	if !validRequestID(*w.RequestID) {
		return bad("request_id must be 1 to %d characters without control characters or U+FFFD (a lone surrogate escape decodes to it)", MaxRequestIDRunes)
	}
	r.RequestID = *w.RequestID
	if w.Op == nil {
		return bad("op is required")
	}
	op, ok := storage.ParseOp(*w.Op)
	if !ok {
		return bad("unknown op %s (want put_node, put_edge, tombstone_node, tombstone_edge, erase_node or erase_edge)", storage.QuoteShort(*w.Op))
	}
	r.Op = op
	if w.Tenant == nil {
		return bad("tenant is required")
	}
	if *w.Tenant != subjectTenant {
		return cascade.Request{}, &Reject{Reason: ReasonTenantMismatch, Err: fmt.Sprintf("tenant %s does not match the subject's tenant %s", storage.QuoteShort(*w.Tenant), storage.QuoteShort(subjectTenant))}
	}
	sc, err := storage.NewScope(*w.Tenant)
	if err != nil {
		return bad("tenant %s must match ^[a-z0-9][a-z0-9_-]{0,62}$", storage.QuoteShort(*w.Tenant))
	}
	r.Scope = sc
	if w.ID == nil {
		return bad("id is required")
	}
	if r.ID, err = ParseUUID("id", *w.ID); err != nil {
		return bad("%v", err)
	}
	isPut := op == storage.OpPutNode || op == storage.OpPutEdge
	notFor := func(field string, present bool) error {
		if present {
			return fmt.Errorf("%s is not allowed for op %s", field, op)
		}
		return nil
	}
	for _, e := range []error{
		notFor("src", w.Src != nil && op != storage.OpPutEdge),
		notFor("dst", w.Dst != nil && op != storage.OpPutEdge),
		notFor("label", w.Label != nil && op != storage.OpPutEdge),
		notFor("valid_from", w.ValidFrom != nil && !isPut),
		notFor("valid_to", w.ValidTo != nil && !isPut),
		notFor("props", len(w.Props) > 0 && !isPut && string(w.Props) != "null"),
		notFor("valid_end", w.ValidEnd != nil && isPut),
	} {
		if e != nil {
			return bad("%v", e)
		}
	}
	if op == storage.OpPutEdge {
		if w.Src == nil || w.Dst == nil {
			return bad("put_edge needs src and dst")
		}
		if r.Src, err = ParseUUID("src", *w.Src); err != nil {
			return bad("%v", err)
		}
		if r.Dst, err = ParseUUID("dst", *w.Dst); err != nil {
			return bad("%v", err)
		}
		r.Label = str(w.Label)
		if len(r.Label) > MaxLabelBytes {
			return bad("label is %d bytes, over the limit of %d", len(r.Label), MaxLabelBytes)
		}
	}
	parseTime := func(field string, p *string) (storage.Ts, error) {
		if p == nil {
			return storage.NoTs, nil
		}
		t, err := storage.ParseTs(*p)
		if err != nil {
			return 0, fmt.Errorf("%s: %v", field, err)
		}
		return t, nil
	}
	if r.ValidFrom, err = parseTime("valid_from", w.ValidFrom); err != nil {
		return bad("%v", err)
	}
	if r.ValidTo, err = parseTime("valid_to", w.ValidTo); err != nil {
		return bad("%v", err)
	}
	if r.ValidEnd, err = parseTime("valid_end", w.ValidEnd); err != nil {
		return bad("%v", err)
	}
	if r.ValidFrom != storage.NoTs && r.ValidTo != storage.NoTs && r.ValidFrom >= r.ValidTo {
		// Times are kept to the microsecond: two that differ below it are
		// the same time, and the message says what they became.
		return bad("valid_from must be before valid_to (to the microsecond, as stored: %s and %s)", r.ValidFrom, r.ValidTo)
	}
	if isPut && len(w.Props) > 0 && string(w.Props) != "null" {
		p, err := checkProps(w.Props)
		if err != nil {
			return bad("props: %v", err)
		}
		r.Props = p
	}
	r.Prov = storage.Provenance{DecidedAt: storage.NoTs}
	if pv := w.Provenance; pv != nil {
		for _, f := range []struct {
			name string
			v    *string
			dst  *string
		}{{"actor", pv.Actor, &r.Prov.Actor}, {"reason", pv.Reason, &r.Prov.Reason}, {"source", pv.Source, &r.Prov.Source}} {
			if len(str(f.v)) > MaxProvFieldBytes {
				return bad("provenance.%s is over %d bytes", f.name, MaxProvFieldBytes)
			}
			*f.dst = str(f.v)
		}
		if r.Prov.DecidedAt, err = parseTime("provenance.decided_at", pv.DecidedAt); err != nil {
			return bad("%v", err)
		}
	}
	if (op == storage.OpEraseNode || op == storage.OpEraseEdge) && r.Prov.Reason == "" {
		return bad("%s needs provenance.reason (why the data must be erased; it is kept in the erasure record)", op)
	}
	return r, nil
}

// checkProps requires a JSON object within the size and depth limits and
// returns it compacted.
func checkProps(raw json.RawMessage) ([]byte, error) {
	if len(raw) > MaxPropsBytes {
		return nil, fmt.Errorf("%d bytes, over the limit of %d", len(raw), MaxPropsBytes)
	}
	t := bytes.TrimSpace(raw)
	if len(t) == 0 || t[0] != '{' {
		return nil, fmt.Errorf("must be a JSON object")
	}
	depth, maxDepth, inStr, esc := 0, 0, false, false
	var numErr error
	for i := 0; i < len(t); i++ {
		c := t[i]
		switch {
		case esc:
			esc = false
		case inStr && c == '\\':
			esc = true
		case c == '"':
			inStr = !inStr
		case inStr:
		case c == '{' || c == '[':
			depth++
			maxDepth = max(maxDepth, depth)
		case c == '}' || c == ']':
			depth--
		case c == '-' || (c >= '0' && c <= '9'):
			j := i + 1
			for j < len(t) && strings.IndexByte("0123456789.eE+-", t[j]) >= 0 {
				j++
			}
			if numErr == nil {
				numErr = checkNumber(string(t[i:j]))
			}
			i = j - 1
		}
	}
	if maxDepth > MaxPropsDepth {
		return nil, fmt.Errorf("nested %d deep, over the limit of %d", maxDepth, MaxPropsDepth)
	}
	if numErr != nil {
		return nil, numErr
	}
	var b bytes.Buffer
	if err := json.Compact(&b, t); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// MaxAnswerTokenBytes bounds the subject token results and dead letters are
// published under (see AnswerToken).
const MaxAnswerTokenBytes = 128

// AnswerToken is the token of <prefix>.res.<token> and <prefix>.dlq.<token>
// for a request that came on <prefix>.req.<tok>: tok itself, the subject
// its publisher used, when it is a plain subject token (not a wildcard; no
// dot, space or control character; valid UTF-8; at most
// MaxAnswerTokenBytes), else "_". A tenant name is always its own token;
// an unreadable one ("Acme") is answered where its publisher listens.
func AnswerToken(tok string) string {
	if tok == "" || tok == "*" || tok == ">" || len(tok) > MaxAnswerTokenBytes || !utf8.ValidString(tok) {
		return "_"
	}
	for _, c := range tok {
		if c == '.' || unicode.IsSpace(c) || unicode.IsControl(c) || c == utf8.RuneError {
			return "_"
		}
	}
	return tok
}

// originalSubject is the subject a request was published to: the stored
// <prefix>.req.<p>.<tok> less its partition token (a stored subject the
// transform did not map is the original).
func originalSubject(prefix, stored string) string {
	rest, ok := strings.CutPrefix(stored, prefix+".req.")
	if !ok {
		return stored
	}
	if p, tok, ok := strings.Cut(rest, "."); ok && p != "" && strings.Trim(p, "0123456789") == "" {
		return prefix + ".req." + tok
	}
	return stored
}

// maxSafeInteger is 2^53-1, the largest integer every reader of JSON
// numbers as doubles tells from its neighbours (RFC 7493 §2.2).
const maxSafeInteger = 1<<53 - 1

// checkNumber accepts a JSON number of props (a valid literal) only when a
// double holds it: I-JSON (RFC 7493 §2.2). Out of range (1e400) or
// rounding to zero (1e-400), an integer beyond ±(2^53-1), or more
// significant digits than a double keeps (17) is refused: readers that
// parse numbers as doubles (JavaScript, Go's any, most JSON libraries)
// would read another value than the one stored, or fail to read the props
// at all. A number that must be kept exactly goes in a string.
func checkNumber(lit string) error {
	f, err := strconv.ParseFloat(lit, 64)
	if err != nil || math.IsInf(f, 0) {
		return fmt.Errorf("number %s is outside the range of a double (put it in a string to keep it exactly)", storage.QuoteShort(lit))
	}
	mant, _, _ := strings.Cut(strings.TrimPrefix(lit, "-"), "e")
	mant, _, _ = strings.Cut(mant, "E")
	intPart, frac, hasFrac := strings.Cut(mant, ".")
	digits := strings.TrimLeft(intPart+frac, "0")
	if f == 0 && digits != "" {
		return fmt.Errorf("number %s is too small for a double: it would read as 0 (put it in a string to keep it exactly)", storage.QuoteShort(lit))
	}
	if !hasFrac && !strings.ContainsAny(lit, "eE") && math.Abs(f) > maxSafeInteger {
		return fmt.Errorf("number %s is an integer beyond ±(2^53-1), which a double cannot hold exactly (put it in a string to keep it exactly)", storage.QuoteShort(lit))
	}
	if hasFrac || strings.ContainsAny(lit, "eE") {
		digits = strings.TrimRight(digits, "0")
	}
	if len(digits) > 17 {
		return fmt.Errorf("number %s has %d significant digits, more than a double keeps (17; put it in a string to keep it exactly)", storage.QuoteShort(lit), len(digits))
	}
	return nil
}

// parseSubject extracts the tenant and partition from a request subject:
// telha.req.<p>.<tenant> after the stream's transform (or telha.req.<tenant>
// for a stream without one; the partition is then computed).
func parseSubject(prefix, subject string, partitions int) (tenant string, part int, err error) {
	rest, ok := strings.CutPrefix(subject, prefix+".req.")
	if !ok {
		return "", 0, fmt.Errorf("subject %s is not under %s.req", storage.QuoteShort(subject), prefix)
	}
	toks := strings.Split(rest, ".")
	switch len(toks) {
	case 1:
		return toks[0], Partition(toks[0], partitions), nil
	case 2:
		var p int
		if _, err := fmt.Sscanf(toks[0], "%d", &p); err != nil || fmt.Sprint(p) != toks[0] {
			return toks[1], -1, fmt.Errorf("subject %s: partition token %s is not a number", storage.QuoteShort(subject), storage.QuoteShort(toks[0]))
		}
		return toks[1], p, nil
	}
	return "", 0, fmt.Errorf("subject %s has %d tokens after %s.req", storage.QuoteShort(subject), len(toks), prefix)
}
