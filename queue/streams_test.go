package queue

import (
	"context"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/telha/telha-cascade/internal/testnats"
)

// oldRequestStream is TELHA_REQ as the worker provisioned it before issue
// 20: a two-minute duplicate window shared by every tenant.
func oldRequestStream(c Config) jetstream.StreamConfig {
	c = c.Defaults()
	return jetstream.StreamConfig{
		Name:     c.ReqStream,
		Subjects: []string{c.Prefix + ".req.*"},
		SubjectTransform: &jetstream.SubjectTransformConfig{
			Source:      c.Prefix + ".req.*",
			Destination: fmt.Sprintf("%s.req.{{partition(%d,1)}}.{{wildcard(1)}}", c.Prefix, c.Partitions),
		},
		Retention:  jetstream.WorkQueuePolicy,
		Storage:    jetstream.FileStorage,
		Duplicates: 2 * time.Minute,
		MaxMsgSize: 1 << 20,
		Replicas:   c.StreamReplicas,
	}
}

// checkNoDuplicateWindow provisions (twice: idempotent) and checks that
// TELHA_REQ keeps no duplicate window, its work-queue retention and its
// partition transform, and that the same Nats-Msg-Id on two tenants'
// subjects is stored twice.
func checkNoDuplicateWindow(t *testing.T, js jetstream.JetStream, c Config) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for i := 0; i < 2; i++ {
		if _, err := Provision(ctx, js, c); err != nil {
			t.Fatalf("provision %d: %v", i, err)
		}
	}
	s, err := js.Stream(ctx, "TELHA_REQ")
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	cfg := info.Config
	if cfg.Duplicates != 0 {
		t.Fatalf("TELHA_REQ duplicate window %s, want none", cfg.Duplicates)
	}
	if cfg.Retention != jetstream.WorkQueuePolicy || cfg.SubjectTransform == nil ||
		cfg.SubjectTransform.Destination != fmt.Sprintf("telha.req.{{partition(%d,1)}}.{{wildcard(1)}}", c.Defaults().Partitions) {
		t.Fatalf("TELHA_REQ config %+v (transform %+v)", cfg, cfg.SubjectTransform)
	}
	if cfg.Replicas != c.Defaults().StreamReplicas {
		t.Fatalf("TELHA_REQ replicas %d", cfg.Replicas)
	}
	pub := func(subject, id string) *jetstream.PubAck {
		m := nats.NewMsg(subject)
		m.Data = []byte(`{}`)
		m.Header.Set(jetstream.MsgIDHeader, id)
		ack, err := js.PublishMsg(ctx, m)
		if err != nil {
			t.Fatalf("publish %s: %v", subject, err)
		}
		return ack
	}
	id := "b.victim-" + time.Now().Format("150405.000000")
	pub("telha.req.a", id)
	if ack := pub("telha.req.b", id); ack.Duplicate {
		t.Fatal("tenant b's message was dropped as a duplicate of tenant a's")
	}
	// The sourced stream is sealed: nothing published to it is stored (so
	// nothing can reach TELHA_REQ through it).
	ns, err := js.Stream(ctx, "TELHA_REQ_NODEDUP")
	if err != nil {
		t.Fatal(err)
	}
	ni, err := ns.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !ni.Config.Sealed || ni.State.Msgs != 0 {
		t.Fatalf("TELHA_REQ_NODEDUP sealed %v with %d messages", ni.Config.Sealed, ni.State.Msgs)
	}
	if _, err := js.Publish(ctx, "TELHA_REQ_NODEDUP", []byte("x")); err == nil {
		t.Fatal("a message was stored in the sealed TELHA_REQ_NODEDUP")
	}
}

// TestProvisionRequestStreamHasNoDuplicateWindow (issue 20 item 1): a fresh
// install, and one upgraded from the stream the worker created before.
func TestProvisionRequestStreamHasNoDuplicateWindow(t *testing.T) {
	t.Run("fresh", func(t *testing.T) {
		ns := testnats.Start(t)
		js, err := jetstream.New(testnats.Connect(t, ns.ClientURL()))
		if err != nil {
			t.Fatal(err)
		}
		checkNoDuplicateWindow(t, js, Config{Partitions: 3})
	})
	t.Run("upgrade", func(t *testing.T) {
		ns := testnats.Start(t)
		js, err := jetstream.New(testnats.Connect(t, ns.ClientURL()))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		c := Config{Partitions: 3}
		if _, err := js.CreateStream(ctx, oldRequestStream(c)); err != nil {
			t.Fatal(err)
		}
		// A message the old window remembers.
		m := nats.NewMsg("telha.req.a")
		m.Header.Set(jetstream.MsgIDHeader, "b.before-upgrade")
		if _, err := js.PublishMsg(ctx, m); err != nil {
			t.Fatal(err)
		}
		// (The ids the old window held when it was updated are forgotten
		// within that window, 2 minutes: the server purges them on its
		// timer. New ids are never remembered.)
		checkNoDuplicateWindow(t, js, c)
	})
}

// TestProvisionNoDuplicateWindowReplicated: the same on a three-node
// JetStream cluster with --stream-replicas 3.
func TestProvisionNoDuplicateWindowReplicated(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a three-node cluster")
	}
	urls := startCluster(t, 3)
	js, err := jetstream.New(testnats.Connect(t, urls[0]))
	if err != nil {
		t.Fatal(err)
	}
	c := Config{Partitions: 2, StreamReplicas: 3}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// Upgrade from the old stream, as an installed cluster would be.
	var lastErr error
	testnats.Eventually(t, 30*time.Second, "the cluster accepts an R3 stream", func() bool {
		cctx, ccancel := context.WithTimeout(ctx, 2*time.Second)
		defer ccancel()
		_, lastErr = js.CreateStream(cctx, oldRequestStream(c))
		if lastErr != nil {
			t.Logf("create: %v", lastErr)
		}
		return lastErr == nil
	})
	checkNoDuplicateWindow(t, js, c)
}

// startCluster runs an n-node JetStream cluster on loopback and returns
// the nodes' client URLs.
func startCluster(t *testing.T, n int) []string {
	t.Helper()
	routes := make([]string, n)
	ports := make([]int, n)
	for i := range n {
		var err error
		u, err := url.Parse("nats://" + testnats.FreeAddr(t))
		if err != nil {
			t.Fatal(err)
		}
		routes[i] = u.String()
		fmt.Sscanf(u.Port(), "%d", &ports[i])
	}
	var urls []string
	var servers []*testnats.Server
	for i := range n {
		s := testnats.Start(t, func(o *server.Options) {
			o.ServerName = fmt.Sprintf("n%d", i)
			o.Cluster.Name = "telha-test"
			o.Cluster.Host = "127.0.0.1"
			o.Cluster.Port = ports[i]
			o.Routes = server.RoutesFromStr(joinRoutes(routes))
		})
		urls = append(urls, s.ClientURL())
		servers = append(servers, s)
	}
	testnats.Eventually(t, 30*time.Second, "the cluster's routes are up", func() bool {
		for _, s := range servers {
			if s.NumRoutes() < n-1 {
				return false
			}
		}
		return true
	})
	return urls
}

func joinRoutes(r []string) string {
	out := ""
	for i, u := range r {
		if i > 0 {
			out += ","
		}
		out += u
	}
	return out
}

func TestAnswerToken(t *testing.T) {
	for tok, want := range map[string]string{
		"acme": "acme", "Acme": "Acme", "ünï": "ünï", "a*b": "a*b", "_": "_",
		"": "_", "*": "_", ">": "_", "a.b": "_", "a b": "_", "a\tb": "_", "a\x00": "_", "\xff": "_",
		strings.Repeat("x", MaxAnswerTokenBytes):   strings.Repeat("x", MaxAnswerTokenBytes),
		strings.Repeat("x", MaxAnswerTokenBytes+1): "_",
	} {
		if got := AnswerToken(tok); got != want {
			t.Errorf("AnswerToken(%q) = %q, want %q", tok, got, want)
		}
	}
}

func TestOriginalSubject(t *testing.T) {
	for stored, want := range map[string]string{
		"telha.req.3.acme": "telha.req.acme",
		"telha.req.0.Acme": "telha.req.Acme",
		"telha.req.acme":   "telha.req.acme",
		"telha.req.*":      "telha.req.*",
		"telha.req.>":      "telha.req.>",
		"telha.req.x.acme": "telha.req.x.acme",
		"other.req.1.acme": "other.req.1.acme",
	} {
		if got := originalSubject("telha", stored); got != want {
			t.Errorf("originalSubject(%q) = %q, want %q", stored, got, want)
		}
	}
}

func TestClip(t *testing.T) {
	long := strings.Repeat("é", 50_000) // 100 KB
	got := clip(long, MaxHeaderBytes)
	if len(got) > MaxHeaderBytes || !utf8.ValidString(got) || !strings.HasSuffix(got, "…[cut: 100000 bytes]") {
		t.Fatalf("clip: %d bytes, valid %v, ends %q", len(got), utf8.ValidString(got), got[max(0, len(got)-30):])
	}
	if clip("short", 10) != "short" {
		t.Fatal("clip changed a short value")
	}
}
