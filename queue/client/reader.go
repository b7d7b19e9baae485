package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Reader sends read-API requests to a group of members
// (--partition-owner dynamic/N), each to the member that owns its tenant's
// slot as the group's /v1/partitions last said, so a read costs what it
// costs at its owner: no hop between members (issue 30 item 8: a read
// forwarded by another member costs about twice as much). A read whose
// owner cannot be reached, answers 503 (moving, past its lease) or has not
// begun to answer within HedgeAfter (frozen) is sent to Base instead,
// which routes it itself (to a standby, while no owner answers), and the
// routes are read again. Against a static replica (no assignments in
// /v1/partitions) every read goes to Base.
//
// A Reader is safe for concurrent use; the zero value is not: set Base.
type Reader struct {
	// Base is any member (a Kubernetes Service): /v1/partitions is read
	// there, and a read goes there when its owner is not known or fails.
	Base string
	// HTTP is the client (nil: http.DefaultClient).
	HTTP *http.Client
	// Token, when set, is sent as "Authorization: Bearer <Token>".
	Token string
	// RefreshEvery is how old the routes may get (0: 5 s).
	RefreshEvery time.Duration
	// HedgeAfter: a read (without wait) whose owner has not begun to
	// answer this long is sent to Base instead (0: 500 ms), where a member
	// asks a standby.
	HedgeAfter time.Duration

	mu      sync.Mutex
	routes  *routes
	fetched time.Time
	// refreshing: one read of /v1/partitions at a time.
	refreshing bool
	// dirty: a read failed at its owner; the routes are read again a
	// second after the last read of them (not at once, and not by every
	// read behind it).
	dirty bool
	// avoid: owners that failed a read, until when their reads go to Base
	// straight away (a frozen owner stays in /v1/partitions until its
	// record expires).
	avoid map[string]time.Time

	atOwner, atBase, fellBack atomic.Uint64
}

// ReaderStats counts where a Reader's reads went.
type ReaderStats struct {
	// AtOwner: answered by the tenant's owner. AtBase: sent to Base (its
	// owner not known, avoided, or no tenant in the path). FellBack: sent
	// to Base after the owner failed, answered 503 or was slow (counted
	// in AtBase too).
	AtOwner, AtBase, FellBack uint64
}

// Stats says where the reads went so far.
func (r *Reader) Stats() ReaderStats {
	return ReaderStats{AtOwner: r.atOwner.Load(), AtBase: r.atBase.Load(), FellBack: r.fellBack.Load()}
}

// routes is the group as /v1/partitions said it.
type routes struct {
	partitions, slots int
	owner             []string // per slot, its owner's URL ("" unknown)
}

// Get reads path (for example /v1/tenants/acme/nodes/<id>?tx=...) at its
// tenant's owner, else at Base: when the owner cannot be reached, answers
// 503, or (a read without wait) has not begun to answer within
// HedgeAfter, the read is sent to Base, which routes it itself (to a
// standby while no owner answers). The caller closes the body.
func (r *Reader) Get(ctx context.Context, path string) (*http.Response, error) {
	if r.Base == "" {
		return nil, errors.New("client: Reader.Base is not set")
	}
	tenant, ok := tenantOf(path)
	if !ok {
		r.atBase.Add(1)
		return r.get(ctx, r.Base, path)
	}
	owner := r.ownerOf(ctx, tenant)
	if owner == "" {
		r.atBase.Add(1)
		return r.get(ctx, r.Base, path)
	}
	octx, ocancel := context.WithCancel(ctx)
	var slow *time.Timer
	if standbyMayAnswer(path) && !waits(path) {
		// An entity read: its owner answers at once, and while it does
		// not, a member's standby can. (A read with wait may wait at its
		// owner; a receipt or an erasure only the owner answers.)
		slow = time.AfterFunc(cmpDuration(r.HedgeAfter, 500*time.Millisecond), ocancel)
	}
	resp, err := r.get(octx, owner, path)
	if slow != nil && !slow.Stop() && err == nil {
		resp.Body.Close() // the owner began too late: its context is gone
		err = errors.New("client: the owner was slow")
	}
	if err == nil && resp.StatusCode == http.StatusServiceUnavailable {
		// Moving, or past its lease: Base routes it.
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<16))
		resp.Body.Close()
		err = errors.New("client: the owner answered 503")
	}
	if err == nil {
		r.atOwner.Add(1)
		resp.Body = cancelOnClose{resp.Body, ocancel}
		return resp, nil
	}
	ocancel()
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	r.failed(owner) // the slot moved, or its owner is gone or frozen
	r.atBase.Add(1)
	r.fellBack.Add(1)
	return r.get(ctx, r.Base, path)
}

// standbyMayAnswer: a read of an entity (a node or an edge, its edges, its
// history), which a member answers from a standby's copy while no owner
// does.
func standbyMayAnswer(path string) bool {
	rest, _ := strings.CutPrefix(path, "/v1/tenants/")
	_, rest, _ = strings.Cut(rest, "/")
	return strings.HasPrefix(rest, "nodes/") || strings.HasPrefix(rest, "edges/")
}

// waits reports whether a read-API path asks to wait (its wait parameter).
func waits(path string) bool {
	_, q, ok := strings.Cut(path, "?")
	if !ok || !strings.Contains(q, "wait") {
		return false
	}
	v, err := url.ParseQuery(q)
	return err != nil || v.Has("wait")
}

// cancelOnClose ends a winning read's context when its body is closed.
type cancelOnClose struct {
	io.ReadCloser
	cancel context.CancelFunc
}

func (c cancelOnClose) Close() error {
	err := c.ReadCloser.Close()
	c.cancel()
	return err
}

func (r *Reader) get(ctx context.Context, base, path string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(base, "/")+path, nil)
	if err != nil {
		return nil, err
	}
	if r.Token != "" {
		req.Header.Set("Authorization", "Bearer "+r.Token)
	}
	c := r.HTTP
	if c == nil {
		c = http.DefaultClient
	}
	return c.Do(req)
}

// tenantOf is the tenant of a read-API path, /v1/tenants/<t>/...
func tenantOf(path string) (string, bool) {
	rest, ok := strings.CutPrefix(path, "/v1/tenants/")
	if !ok {
		return "", false
	}
	t, _, ok := strings.Cut(rest, "/")
	if !ok || t == "" {
		return "", false
	}
	t, err := url.PathUnescape(t)
	return t, err == nil
}

// ownerOf is the URL of tenant's slot's owner ("" unknown, or avoided),
// reading the routes again when they are older than RefreshEvery, or a
// second old after a read failed at its owner.
func (r *Reader) ownerOf(ctx context.Context, tenant string) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	age := time.Since(r.fetched)
	if (r.routes == nil || age > cmpDuration(r.RefreshEvery, 5*time.Second) || (r.dirty && age > time.Second)) && !r.refreshing {
		r.refreshing, r.dirty = true, false
		r.mu.Unlock()
		// Not ended by this read's context: the routes serve every read.
		fresh, err := r.fetch(context.WithoutCancel(ctx))
		r.mu.Lock()
		r.refreshing = false
		if err == nil {
			r.routes = fresh
		}
		r.fetched = time.Now() // a failed read is not retried at once either
	}
	rt := r.routes
	if rt == nil || rt.partitions <= 0 || rt.slots <= 0 || len(rt.owner) != rt.slots {
		return ""
	}
	owner := rt.owner[Partition(tenant, rt.partitions)%rt.slots]
	if until, ok := r.avoid[owner]; ok {
		if time.Now().Before(until) {
			return ""
		}
		delete(r.avoid, owner)
	}
	return owner
}

// avoidFor is how long the reads of an owner that failed one go to Base
// straight away (about a member's TTL: by then the slot has moved, or the
// owner answers again).
const avoidFor = 5 * time.Second

// failed notes a read that failed at owner: its reads go to Base for
// avoidFor, and the routes are read again soon.
func (r *Reader) failed(owner string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.avoid == nil {
		r.avoid = map[string]time.Time{}
	}
	r.avoid[owner] = time.Now().Add(avoidFor)
	r.dirty = true
}

// fetch reads the routes from Base's /v1/partitions.
func (r *Reader) fetch(ctx context.Context) (*routes, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	resp, err := r.get(ctx, r.Base, "/v1/partitions")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("client: %s/v1/partitions: %s", r.Base, resp.Status)
	}
	var v struct {
		Partitions int `json:"partitions"`
		Slots      int `json:"slots"`
		Members    []struct {
			ID  string `json:"id"`
			URL string `json:"url"`
		} `json:"members"`
		Assignments []struct {
			Slot  int    `json:"slot"`
			Owner string `json:"owner"`
			Ready bool   `json:"owner_ready"`
		} `json:"assignments"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 8<<20)).Decode(&v); err != nil {
		return nil, fmt.Errorf("client: %s/v1/partitions: %w", r.Base, err)
	}
	rt := &routes{partitions: v.Partitions, slots: v.Slots, owner: make([]string, max(v.Slots, 0))}
	urls := map[string]string{}
	for _, m := range v.Members {
		urls[m.ID] = m.URL
	}
	for _, a := range v.Assignments {
		if a.Slot >= 0 && a.Slot < len(rt.owner) && a.Ready {
			rt.owner[a.Slot] = urls[a.Owner]
		}
	}
	return rt, nil
}

func cmpDuration(d, def time.Duration) time.Duration {
	if d > 0 {
		return d
	}
	return def
}
