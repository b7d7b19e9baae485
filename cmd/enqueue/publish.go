package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/telha/telha-cascade/queue/client"
)

// request is one message to publish.
type request struct {
	tenant, id string
	body       []byte
}

func connect(g *globals) (*nats.Conn, *client.Client, error) {
	opts := []nats.Option{nats.Name("telha-enqueue"), nats.MaxReconnects(10)}
	if g.creds != "" {
		opts = append(opts, nats.UserCredentials(g.creds))
	}
	if g.user != "" {
		opts = append(opts, nats.UserInfo(g.user, g.password))
	}
	if g.inbox != "" {
		opts = append(opts, nats.CustomInboxPrefix(g.inbox))
	}
	if g.tlsCA != "" || g.tlsCert != "" {
		tc := &tls.Config{MinVersion: tls.VersionTLS12}
		if g.tlsCA != "" {
			pem, err := os.ReadFile(g.tlsCA)
			if err != nil {
				return nil, nil, err
			}
			pool := x509.NewCertPool()
			pool.AppendCertsFromPEM(pem)
			tc.RootCAs = pool
		}
		if g.tlsCert != "" {
			c, err := tls.LoadX509KeyPair(g.tlsCert, g.tlsKey)
			if err != nil {
				return nil, nil, err
			}
			tc.Certificates = []tls.Certificate{c}
		}
		opts = append(opts, nats.Secure(tc))
	}
	nc, err := nats.Connect(g.natsURL, opts...)
	if err != nil {
		return nil, nil, fmt.Errorf("connect to %s: %w", g.natsURL, err)
	}
	c, err := client.New(nc, client.Config{Prefix: g.prefix}, jetstream.WithPublishAsyncMaxPending(g.maxInflight))
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	return nc, c, nil
}

// publishAll publishes reqs asynchronously (bounded in flight), and with
// wait collects and prints their results. It returns the results by id.
func publishAll(ctx context.Context, g *globals, c *client.Client, reqs []request, wait bool, stdout, stderr io.Writer, progress func(done int)) (map[string]client.Result, error) {
	since := time.Now().Add(-3 * time.Minute) // covers earlier copies of a retried request
	ids := map[string]bool{}
	tenants := []string{}
	seenT := map[string]bool{}
	for _, r := range reqs {
		if r.id != "" {
			ids[r.id] = true
		}
		if !seenT[r.tenant] {
			seenT[r.tenant] = true
			tenants = append(tenants, r.tenant)
		}
	}
	// Follow the results before publishing: one stored from now on is seen
	// the moment it is stored (queue/client Waiter).
	var w *client.Waiter
	if wait {
		var err error
		if w, err = c.Follow(ctx, tenants, since, ids); err != nil {
			return nil, err
		}
		defer w.Stop()
	}
	futs := make([]jetstream.PubAckFuture, 0, len(reqs))
	for i, r := range reqs {
		f, err := c.PublishAsync(r.tenant, r.id, r.body)
		for errors.Is(err, jetstream.ErrTooManyStalledMsgs) {
			// --max-inflight publishes await their acks (a slow or busy
			// server): the message was not sent. Wait for the acks in
			// flight, then send it.
			select {
			case <-c.JetStream().PublishAsyncComplete():
			case <-ctx.Done():
				return nil, ctx.Err()
			}
			f, err = c.PublishAsync(r.tenant, r.id, r.body)
		}
		if err != nil {
			return nil, fmt.Errorf("publish %q: %w", r.id, err)
		}
		futs = append(futs, f)
		if progress != nil && (i+1)%1000 == 0 {
			progress(i + 1)
		}
	}
	select {
	case <-c.JetStream().PublishAsyncComplete():
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	var perr []error
	for i, f := range futs {
		select {
		case ack := <-f.Ok():
			if ack.Duplicate {
				// Only a request stream provisioned with a duplicate window
				// (not this project's: CONTRACT §5) answers this.
				fmt.Fprintf(stderr, "request %q of tenant %q: the request stream dropped it as a duplicate of an earlier message id; its result is the first copy's\n",
					reqs[i].id, reqs[i].tenant)
			}
		case err := <-f.Err():
			perr = append(perr, fmt.Errorf("request %q not accepted by the request stream: %w", reqs[i].id, err))
		}
	}
	if len(perr) > 0 {
		return nil, errors.Join(perr...)
	}
	if !wait {
		fmt.Fprintf(stderr, "published %d requests\n", len(reqs))
		return nil, nil
	}
	wctx, cancel := context.WithTimeout(ctx, g.timeout)
	defer cancel()
	got, err := w.Wait(wctx)
	enc := json.NewEncoder(stdout)
	keys := make([]string, 0, len(got))
	for k := range got {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	if stdout != nil {
		for _, k := range keys {
			_ = enc.Encode(got[k])
		}
	}
	if len(got) < len(ids) {
		return got, fmt.Errorf("%d of %d results did not arrive within %s: %v", len(ids)-len(got), len(ids), g.timeout, err)
	}
	return got, nil
}

func notOK(got map[string]client.Result) error {
	bad := 0
	for _, r := range got {
		if r.Status != client.StatusOK {
			bad++
		}
	}
	if bad > 0 {
		return fmt.Errorf("%d of %d requests did not succeed", bad, len(got))
	}
	return nil
}

func runOne(ctx context.Context, g *globals, cmd string, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet(cmd, flag.ContinueOnError)
	fs.SetOutput(stderr)
	var tenant, id, src, dst, label, from, to, end, props, actor, reason, source, decided, reqID string
	fs.StringVar(&tenant, "tenant", "", "tenant (required)")
	fs.StringVar(&id, "id", "", "node or edge id (default: a new UUID for puts)")
	fs.StringVar(&reqID, "request-id", "", "request id (default: a new UUID)")
	if cmd == "put-edge" {
		fs.StringVar(&src, "src", "", "source node id (required)")
		fs.StringVar(&dst, "dst", "", "destination node id (required)")
		fs.StringVar(&label, "label", "", "edge label")
	}
	if cmd == "put-node" || cmd == "put-edge" {
		fs.StringVar(&from, "valid-from", "", "RFC 3339 (default: the request's tx time)")
		fs.StringVar(&to, "valid-to", "", "RFC 3339 (default: open)")
		fs.StringVar(&props, "props", "", "JSON object")
	} else {
		fs.StringVar(&end, "valid-end", "", "RFC 3339 (default: the request's tx time)")
	}
	fs.StringVar(&actor, "actor", os.Getenv("USER"), "provenance actor")
	if strings.HasPrefix(cmd, "erase-") {
		fs.StringVar(&reason, "reason", "", "provenance reason (required: why the payload is erased, e.g. a GDPR ticket)")
	} else {
		fs.StringVar(&reason, "reason", "", "provenance reason")
	}
	fs.StringVar(&source, "source", "enqueue", "provenance source")
	fs.StringVar(&decided, "decided-at", "", "provenance decided_at (RFC 3339)")
	pos, err := parseSub(fs, g, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usageError{fmt.Sprintf("unexpected arguments %q", pos)}
	}
	// Checked here, before anything is published: the worker would answer
	// invalid, but a bad tenant's answer goes to <prefix>.res._, where
	// --wait does not look.
	if tenant == "" {
		return usageError{"--tenant is required"}
	}
	if !client.ValidTenant(tenant) {
		return usageError{fmt.Sprintf("--tenant %q must match ^[a-z0-9][a-z0-9_-]{0,62}$ (lower case)", tenant)}
	}
	if id == "" {
		if !strings.HasPrefix(cmd, "put-") {
			return usageError{"--id is required"}
		}
		id = uuid.NewString()
	}
	for _, f := range []struct{ name, v string }{{"--id", id}, {"--src", src}, {"--dst", dst}} {
		if f.v != "" {
			if _, err := uuid.Parse(f.v); err != nil || len(f.v) != 36 {
				return usageError{fmt.Sprintf("%s %q is not a UUID (8-4-4-4-12 hex digits)", f.name, f.v)}
			}
		}
	}
	for _, f := range []struct{ name, v string }{{"--valid-from", from}, {"--valid-to", to}, {"--valid-end", end}, {"--decided-at", decided}} {
		if f.v != "" {
			if _, err := time.Parse(time.RFC3339Nano, f.v); err != nil {
				return usageError{fmt.Sprintf("%s %q is not an RFC 3339 time such as 2026-01-02T15:04:05Z", f.name, f.v)}
			}
		}
	}
	if reqID == "" {
		reqID = uuid.NewString()
	}
	if strings.HasPrefix(cmd, "erase-") && reason == "" {
		return usageError{cmd + " needs --reason (provenance.reason is required for an erase and kept in its erasure record)"}
	}
	ops := map[string]string{"put-node": "put_node", "put-edge": "put_edge", "tombstone-node": "tombstone_node", "tombstone-edge": "tombstone_edge",
		"erase-node": "erase_node", "erase-edge": "erase_edge"}
	body := map[string]any{"request_id": reqID, "op": ops[cmd], "tenant": tenant, "id": id}
	set := func(k, v string) {
		if v != "" {
			body[k] = v
		}
	}
	if cmd == "put-edge" {
		if src == "" || dst == "" {
			return usageError{"put-edge needs --src and --dst"}
		}
		set("src", src)
		set("dst", dst)
		set("label", label)
	}
	set("valid_from", from)
	set("valid_to", to)
	set("valid_end", end)
	if props != "" {
		if !json.Valid([]byte(props)) {
			return usageError{"--props is not valid JSON"}
		}
		body["props"] = json.RawMessage(props)
	}
	prov := map[string]string{}
	for k, v := range map[string]string{"actor": actor, "reason": reason, "source": source, "decided_at": decided} {
		if v != "" {
			prov[k] = v
		}
	}
	if len(prov) > 0 {
		body["provenance"] = prov
	}
	b, _ := client.Marshal(body)
	nc, c, err := connect(g)
	if err != nil {
		return err
	}
	defer nc.Close()
	got, err := publishAll(ctx, g, c, []request{{tenant: tenant, id: reqID, body: b}}, g.wait, stdout, stderr, nil)
	if err != nil {
		return err
	}
	if !g.wait {
		fmt.Fprintf(stdout, "{\"request_id\":%q,\"published\":true}\n", reqID)
		return nil
	}
	return notOK(got)
}

func runFile(ctx context.Context, g *globals, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("file", flag.ContinueOnError)
	fs.SetOutput(stderr)
	args, err := parseSub(fs, g, args)
	if err != nil {
		return err
	}
	if len(args) > 1 {
		return usageError{"file takes one PATH (or - for stdin)"}
	}
	var in io.Reader = os.Stdin
	if len(args) == 1 && args[0] != "-" {
		f, err := os.Open(args[0])
		if err != nil {
			return err
		}
		defer f.Close()
		in = f
	}
	var reqs []request
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 64<<10), client.MaxMessageBytes+1)
	line := 0
	for sc.Scan() {
		line++
		raw := sc.Bytes()
		if len(raw) == 0 {
			continue
		}
		var head struct {
			RequestID string `json:"request_id"`
			Tenant    string `json:"tenant"`
		}
		if err := json.Unmarshal(raw, &head); err != nil || head.Tenant == "" {
			return fmt.Errorf("line %d: not a request object with a tenant: %v", line, err)
		}
		if !client.ValidTenant(head.Tenant) {
			return fmt.Errorf("line %d: tenant %q must match ^[a-z0-9][a-z0-9_-]{0,62}$", line, head.Tenant)
		}
		reqs = append(reqs, request{tenant: head.Tenant, id: head.RequestID, body: append([]byte(nil), raw...)})
	}
	if err := sc.Err(); err != nil {
		return err
	}
	nc, c, err := connect(g)
	if err != nil {
		return err
	}
	defer nc.Close()
	got, err := publishAll(ctx, g, c, reqs, g.wait, stdout, stderr, nil)
	if err != nil {
		return err
	}
	if g.wait {
		return notOK(got)
	}
	return nil
}
