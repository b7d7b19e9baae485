package app

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/telha/telha-cascade/api"
	"github.com/telha/telha-cascade/member"
	"github.com/telha/telha-cascade/metrics"
	"github.com/telha/telha-cascade/queue"
	"github.com/telha/telha-cascade/slot"
)

// A member's HTTP and where its reads go: at the slot in this
// process, forwarded to the owner's member (the route, the hedge to a
// standby when the owner is slow), or answered by a standby's copy.

// handler is the member's HTTP.
func (m *memberRun) handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok\n") })
	mux.HandleFunc("GET /readyz", m.readyz)
	mux.HandleFunc("GET /metrics", m.metricsHandler)
	mux.HandleFunc("GET /v1/partitions", m.admitted(m.partitions))
	mux.HandleFunc("GET /v1/journals", m.admitted(m.journals))
	mux.HandleFunc("GET /v1/tenants/{t}/", m.admitted(m.tenantRead))
	mux.HandleFunc("/", m.firstCore)
	return mux
}

// admitted checks the caller as the slots would (they check again;
// in loopback mode only this check can see the real client).
func (m *memberRun) admitted(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if _, ok, status, msg := m.auth.Principal(r); !ok {
			writeJSONError(w, status, msg)
			return
		}
		h(w, r)
	}
}

func writeJSONError(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]string{"error": msg})
}

// localOwner returns slot s, ready, when this member owns it; else nil.
func (m *memberRun) localOwner(s int) *slot.Slot {
	m.mu.Lock()
	defer m.mu.Unlock()
	if r := m.slots[s]; r != nil && r.role == roleOwner && !r.stopping.Load() {
		return r.app.Load()
	}
	return nil
}

// assignedHere: the assignment this member last read names it slot s's
// owner (the slot may still be starting).
func (m *memberRun) assignedHere(s int) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return s < len(m.assign) && m.assign[s].Owner == m.id
}

// ownerURL is the advertised URL of slot s's owner ("" unknown, or this
// member). m.mu held.
func (m *memberRun) ownerURL(s int) string {
	if s >= len(m.assign) || m.assign[s].Owner == "" || m.assign[s].Owner == m.id {
		return ""
	}
	for _, mm := range m.members {
		if mm.ID == m.assign[s].Owner {
			return mm.URL
		}
	}
	return ""
}

// slotRoute is where a slot's reads are forwarded: its owner's URL, and a
// context cancelled when that changes.
type slotRoute struct {
	url    string
	ctx    context.Context
	cancel context.CancelFunc
}

// ownerRoute returns the advertised URL of slot s's owner ("" unknown, or
// this member) and a context cancelled when the slot's owner changes or
// its record expires: a read forwarded to an owner that froze (SIGSTOP, a
// cut link whose port still accepts) ends with its route, not with the
// client's patience, and is routed again.
func (m *memberRun) ownerRoute(s int) (string, context.Context) {
	m.mu.Lock()
	defer m.mu.Unlock()
	url := m.ownerURL(s)
	if url == "" {
		return "", nil
	}
	rt := m.routes[s]
	if rt == nil || rt.url != url {
		if rt != nil {
			rt.cancel()
		}
		ctx, cancel := context.WithCancel(context.Background())
		rt = &slotRoute{url: url, ctx: ctx, cancel: cancel}
		m.routes[s] = rt
	}
	return url, rt.ctx
}

// reroute ends the forwards of every slot whose owner's URL changed with
// the assignment or the members just read (m.mu held).
func (m *memberRun) reroute() {
	for s, rt := range m.routes {
		if m.ownerURL(s) != rt.url {
			rt.cancel()
			delete(m.routes, s)
		}
	}
}

// tenantRead answers a read of tenant t: at t's slot on this member, or
// forwarded to its owner; while the slot has no serving owner (a move, a
// failover), it waits up to --forward-wait.
func (m *memberRun) tenantRead(w http.ResponseWriter, r *http.Request) {
	if lost := m.leaseLost(); lost != "" {
		// Not-owner too: a member that forwarded it routes again.
		w.Header().Set(hdrNotOwner, m.id)
		w.Header().Set("Retry-After", "1")
		writeJSONError(w, http.StatusServiceUnavailable, lost)
		return
	}
	s := queue.Partition(r.PathValue("t"), m.cfg.Partitions) % m.n
	forwarded := r.Header.Get(hdrForwarded) != ""
	arrived := time.Now()
	deadline := arrived.Add(m.cfg.Member.ForwardWait)
	// Between rounds: 50 ms, doubling to 400 ms, so the reads waiting for
	// a slot that takes seconds to start do not flood its member.
	pause := 50 * time.Millisecond
	for {
		asked := false // this round's hedge asked the standbys already
		if a := m.localOwner(s); a != nil {
			if a.ServeHosted(w, r) {
				return
			}
		} else if forwarded {
			// A standby copy here answers (asked for it: the owner did not
			// answer the member that forwarded the read, or was slow; or
			// this member was just given the slot, and its copy tails on
			// until the previous owner lets go).
			if m.standbyRead(w, r, s, arrived) {
				return
			}
			// Forwarded here, but the slot is not (or no longer) this
			// member's, or the slot is still starting: say so at once, so
			// the member that forwarded it asks a standby and routes
			// again, rather than waiting out --forward-wait here.
			w.Header().Set(hdrNotOwner, m.id)
			w.Header().Set("Retry-After", "1")
			why := fmt.Sprintf("slot %d is not owned by member %s", s, m.id)
			if m.assignedHere(s) {
				why = fmt.Sprintf("slot %d is starting on member %s", s, m.id)
			}
			writeJSONError(w, http.StatusServiceUnavailable, why)
			return
		} else if url, route := m.ownerRoute(s); url != "" {
			var answered bool
			if answered, asked = m.forwardToOwner(w, r, s, url, route, arrived); answered {
				return
			}
		}
		// No serving owner answered (a failover, a move): a standby copy
		// answers at once, at its applied position (a forwarded read only
		// this member's: it is never forwarded again).
		if m.localOwner(s) == nil {
			if forwarded && m.standbyRead(w, r, s, arrived) || !forwarded && !asked && m.standbyAnswer(w, r, s, arrived) {
				return
			}
		}
		if time.Now().After(deadline) {
			w.Header().Set("Retry-After", "1")
			writeJSONError(w, http.StatusServiceUnavailable, fmt.Sprintf("slot %d (of tenant %q) has no serving owner yet: it is moving or failing over; retry", s, r.PathValue("t")))
			return
		}
		select {
		case <-r.Context().Done():
			return
		case <-time.After(pause):
		}
		pause = min(2*pause, 400*time.Millisecond)
	}
}

// standbyAnswer answers a read from a standby copy of slot s: this
// member's, or another member's (forwarded, marked for its standby). It
// reports whether one answered.
func (m *memberRun) standbyAnswer(w http.ResponseWriter, r *http.Request, s int, arrived time.Time) bool {
	if m.standbyRead(w, r, s, arrived) {
		return true
	}
	if !standbyAnswers(r) {
		return false
	}
	for _, url := range m.standbyURLs(s) {
		// A copy answers at once (it waits at most for one log-end
		// request): a member that does not is frozen, and the next is
		// asked. Its answer is read whole within the bound, then written.
		ctx, cancel := context.WithTimeout(r.Context(), standbyForwardTimeout)
		sr := r.Clone(ctx)
		sr.Header.Set(hdrStandbyRead, "1")
		buf := &bufferedResponse{h: http.Header{}}
		ok := m.forwardIf(buf, sr, url, m.standbyAnswered)
		cancel()
		if ok {
			buf.writeTo(w)
			return true
		}
	}
	return false
}

// hedgeAfter: a read a standby may answer that its owner has not begun
// to answer this long after it was forwarded is asked of a standby too
// (forwardToOwner). An owner answers such a read without waiting, in
// milliseconds; one that does not is frozen or overloaded.
const hedgeAfter = 500 * time.Millisecond

// standbyForwardTimeout bounds a read forwarded to another member's
// standby.
const standbyForwardTimeout = 3 * time.Second

// forwardToOwner forwards r to slot s's owner at base. Until the owner's
// answer begins, the forward ends when route does (the slot's owner
// changed, or its record expired), and false says the caller routes
// again; once it has begun, it is relayed whole. A read a standby may
// answer (an entity read without wait: one with wait may wait at the
// owner for its tx) whose owner has not begun to answer within hedgeAfter
// is asked of a standby too, and the first answer is the read's;
// askedStandbys says so (the caller, routing again, does not ask them a
// second time in the same round).
func (m *memberRun) forwardToOwner(w http.ResponseWriter, r *http.Request, s int, base string, route context.Context, arrived time.Time) (answered, askedStandbys bool) {
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	unroute := context.AfterFunc(route, cancel)
	defer unroute()
	fr := r.WithContext(ctx)
	send := func() (*http.Response, error) {
		resp, err := m.send(fr, base)
		if err == nil && !unroute() { // begun: a route change no longer cuts it
			resp.Body.Close()
			return nil, context.Canceled // the route changed as it began
		}
		return resp, err
	}
	if !standbyAnswers(r) || r.URL.Query().Has("wait") || (m.localStandby(s) == nil && len(m.standbyURLs(s)) == 0) {
		resp, err := send()
		return m.relay(w, resp, err, passAll), false
	}
	type sent struct {
		resp *http.Response
		err  error
	}
	owner := make(chan sent, 1)
	go func() {
		resp, err := send()
		owner <- sent{resp, err}
	}()
	timer := time.NewTimer(hedgeAfter)
	defer timer.Stop()
	select {
	case res := <-owner:
		return m.relay(w, res.resp, res.err, passAll), false
	case <-timer.C:
	}
	// The owner is slow: a standby is asked beside it, into memory.
	sctx, scancel := context.WithCancel(r.Context())
	defer scancel()
	buf := &bufferedResponse{h: http.Header{}}
	standby := make(chan bool, 1)
	go func() { standby <- m.standbyAnswer(buf, r.WithContext(sctx), s, arrived) }()
	for {
		select {
		case res := <-owner:
			if res.err == nil && standby != nil && notOwner(res.resp) {
				// Refused (it owns the slot no more, or is past its lease):
				// as good as no answer while the standby may still give one.
				_, _ = io.Copy(io.Discard, io.LimitReader(res.resp.Body, 1<<16))
				res.resp.Body.Close()
				res = sent{err: errNotOwner}
			}
			if res.err == nil || standby == nil {
				if standby != nil {
					scancel()
					<-standby // buf is the standby's until it returns
				}
				answered := m.relay(w, res.resp, res.err, passAll)
				if answered {
					m.proms.SlowOwner(metrics.SlowOwnerOwner)
				} else {
					m.proms.SlowOwner(metrics.SlowOwnerNone)
				}
				return answered, true
			}
			owner = nil // the owner failed: the standby's answer decides
		case ok := <-standby:
			if ok {
				cancel()
				if owner != nil {
					go func() {
						if res := <-owner; res.resp != nil {
							res.resp.Body.Close()
						}
					}()
				}
				m.proms.SlowOwner(metrics.SlowOwnerStandby)
				buf.writeTo(w)
				return true, true
			}
			standby = nil
			if owner == nil {
				m.proms.SlowOwner(metrics.SlowOwnerNone)
				return false, true
			}
		}
	}
}

func passAll(int) bool { return true }

// hopByHop reports whether header h is one of a connection's own
// (RFC 9110 7.6.1), which a member does not pass on when it forwards.
func hopByHop(h string) bool {
	switch http.CanonicalHeaderKey(h) {
	case "Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization", "Proxy-Connection", "Te", "Trailer", "Transfer-Encoding", "Upgrade":
		return true
	}
	return false
}

// standbyAnswered: a status a standby's copy answers a read with (the
// read's answer, its bad request, and with tokens their refusal, which
// the owner would give too); any other (a loopback-mode refusal of a
// peer, a busy copy) is not passed on, and the read waits for the owner.
func (m *memberRun) standbyAnswered(status int) bool {
	switch status {
	case http.StatusOK, http.StatusNotFound, http.StatusBadRequest:
		return true
	case http.StatusUnauthorized, http.StatusForbidden:
		return m.auth.Mode() == api.AuthTokens
	}
	return false
}

// forwardIf sends r to the member at base and copies the answer when
// pass(status); false (nothing written) when that member could not be
// reached (gone), owns the slot no more, or pass refused the answer: the
// caller routes again.
func (m *memberRun) forwardIf(w http.ResponseWriter, r *http.Request, base string, pass func(status int) bool) bool {
	resp, err := m.send(r, base)
	return m.relay(w, resp, err, pass)
}

// send sends r to the member at base, marked forwarded by this member,
// without the connection's own headers.
func (m *memberRun) send(r *http.Request, base string) (*http.Response, error) {
	var body io.Reader
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		body = r.Body // the status page's POSTs (sign-in, dead letters, pause): sent once
	}
	req, err := http.NewRequestWithContext(r.Context(), r.Method, base+r.URL.RequestURI(), body)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errUnforwardable, err)
	}
	req.Header = r.Header.Clone()
	for h := range req.Header {
		if hopByHop(h) {
			req.Header.Del(h)
		}
	}
	req.ContentLength = r.ContentLength
	req.Header.Set(hdrForwarded, m.id)
	return m.client.Do(req)
}

// relay copies a forwarded read's answer to w when pass(status), and
// reports whether it did; false (nothing written) when the member could
// not be reached, owns the slot no more, or pass refused the answer.
func (m *memberRun) relay(w http.ResponseWriter, resp *http.Response, err error, pass func(status int) bool) bool {
	if errors.Is(err, errUnforwardable) {
		writeJSONError(w, http.StatusBadRequest, err.Error())
		return true
	}
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	if notOwner(resp) || !pass(resp.StatusCode) {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<16))
		return false // that member no longer owns the slot (or cannot answer): route again
	}
	for k, vs := range resp.Header {
		if hopByHop(k) {
			continue
		}
		for _, v := range vs {
			w.Header().Add(k, v)
		}
	}
	w.WriteHeader(resp.StatusCode)
	if _, err := io.Copy(w, resp.Body); err != nil {
		if b, ok := w.(*bufferedResponse); ok {
			b.reset() // a cut answer is no answer
			return false
		}
		// The status is out: the client must see a broken answer, not a
		// short one that looks whole.
		panic(http.ErrAbortHandler)
	}
	return true
}

// notOwner: the member answered that it does not own the slot (or is past
// its lease): the read is routed again.
func notOwner(resp *http.Response) bool {
	return resp.StatusCode == http.StatusServiceUnavailable && resp.Header.Get(hdrNotOwner) != ""
}

// errNotOwner stands for a notOwner answer already read.
var errNotOwner = errors.New("not the slot's owner")

// errUnforwardable: a read that cannot be made into a request to another
// member (400).
var errUnforwardable = errors.New("cannot forward the read")

// journals lists the journals of every slot this member owns and, unless
// forwarded, of every other member's (fetched from them), as a token may
// see them.
func (m *memberRun) journals(w http.ResponseWriter, r *http.Request) {
	if len(r.URL.Query()) > 0 {
		writeJSONError(w, http.StatusBadRequest, "unknown query parameters: /v1/journals takes none")
		return
	}
	p, _, _, _ := m.auth.Principal(r) // admitted: it is someone
	local := m.localOwners()
	m.mu.Lock()
	var peers []member.Member
	if r.Header.Get(hdrForwarded) == "" {
		for _, mm := range m.members {
			if mm.ID != m.id {
				peers = append(peers, mm)
			}
		}
	}
	m.mu.Unlock()
	all := []api.Journal{}
	for _, o := range local {
		for _, j := range o.app.Journals() {
			if p.Sees(j.Tenant) {
				all = append(all, j)
			}
		}
	}
	// Every other member at once, each for at most peerJournalsTimeout: one
	// that is frozen or gone (until its record expires) is named, not a
	// reason to list nothing.
	type peerAnswer struct {
		js  []api.Journal
		err error
	}
	answers := make([]peerAnswer, len(peers))
	var wg sync.WaitGroup
	for i, mm := range peers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(r.Context(), peerJournalsTimeout)
			defer cancel()
			answers[i].js, answers[i].err = m.peerJournals(ctx, r, mm.URL)
		}()
	}
	wg.Wait()
	type unreachable struct {
		Member string `json:"member"`
		Error  string `json:"error"`
	}
	body := map[string]any{}
	var missing []unreachable
	for i, a := range answers {
		if a.err != nil {
			missing = append(missing, unreachable{Member: peers[i].ID, Error: a.err.Error()})
			continue
		}
		all = append(all, a.js...)
	}
	if len(missing) > 0 {
		body["unreachable"] = missing
	}
	body["journals"] = all
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(body)
}

// peerJournalsTimeout bounds the journals asked of another member.
const peerJournalsTimeout = 2 * time.Second

// peerJournals is /v1/journals of the member at base, asked with r's
// credentials.
func (m *memberRun) peerJournals(ctx context.Context, r *http.Request, base string) ([]api.Journal, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/v1/journals", nil)
	if err != nil {
		return nil, err
	}
	if v := r.Header.Get("Authorization"); v != "" {
		req.Header.Set("Authorization", v)
	}
	req.Header.Set(hdrForwarded, m.id)
	resp, err := m.client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s: %s", base, resp.Status)
	}
	var body struct {
		Journals []api.Journal `json:"journals"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 64<<20)).Decode(&body); err != nil {
		return nil, fmt.Errorf("%s: %w", base, err)
	}
	return body.Journals, nil
}

// firstCore sends what is not routed by tenant (the status page, its
// assets) to the lowest slot this member owns, in process: the slot sees
// the real client and checks it as a worker would (loopback mode, tokens,
// sessions); a non-loopback client without tokens is refused here already.
func (m *memberRun) firstCore(w http.ResponseWriter, r *http.Request) {
	if m.auth.Mode() == api.AuthLoopback && !loopbackRemote(r.RemoteAddr) {
		writeJSONError(w, http.StatusForbidden, "this worker answers loopback clients only (no --auth-tokens-file)")
		return
	}
	owners := m.localOwners()
	if len(owners) == 0 {
		w.Header().Set("Retry-After", "1")
		writeJSONError(w, http.StatusServiceUnavailable, "this member owns no slot right now; ask another member")
		return
	}
	if !owners[0].app.ServeHosted(w, r) {
		w.Header().Set("Retry-After", "1")
		writeJSONError(w, http.StatusServiceUnavailable, "the slot is stopping; retry")
	}
}

// loopbackRemote reports whether a request's RemoteAddr is a loopback IP
// (loopbackHost, of --nats-listen, on its host part).
func loopbackRemote(remote string) bool {
	host, _, err := net.SplitHostPort(remote)
	return err == nil && loopbackHost(host)
}
