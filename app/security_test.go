package app

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
	"github.com/telha/telha-cascade/internal/testnats"
	"github.com/telha/telha-cascade/slot"
)

// Security of the worker's edges: NATS auth (user/password, creds file,
// mutual TLS), no secrets in logs, and the HTTP server's hardening.

// ---- helpers -------------------------------------------------------------

// logBuf is a goroutine-safe log sink that can wait for a line.
type logBuf struct {
	mu      sync.Mutex
	b       bytes.Buffer
	changed chan struct{}
}

func newLogBuf() *logBuf { return &logBuf{changed: make(chan struct{})} }

func (l *logBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	n, err := l.b.Write(p)
	close(l.changed)
	l.changed = make(chan struct{})
	if os.Getenv("TELHA_TEST_LOG") != "" {
		_, _ = os.Stderr.Write(p)
	}
	return n, err
}

func (l *logBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// waitFor waits until the log holds a line containing every one of subs
// (case-insensitive), or until done fires or the deadline passes.
func (l *logBuf) waitFor(within time.Duration, done <-chan struct{}, subs ...string) bool {
	deadline := time.After(within)
	for {
		l.mu.Lock()
		text, ch := strings.ToLower(l.b.String()), l.changed
		l.mu.Unlock()
		for _, line := range strings.Split(text, "\n") {
			all := true
			for _, s := range subs {
				all = all && strings.Contains(line, strings.ToLower(s))
			}
			if all {
				return true
			}
		}
		select {
		case <-ch:
		case <-done:
			return false
		case <-deadline:
			return false
		}
	}
}

func debugLogger(w io.Writer, format string) *slog.Logger {
	return NewLogger(Config{LogFormat: format, LogLevel: "debug"}, w)
}

// launched is a worker run with its own logger, whose readiness is not
// required (startWorker fails the test when the worker does not get ready).
type launched struct {
	t        *testing.T
	ready    chan *slot.Slot
	exited   chan struct{}
	err      error
	cancel   context.CancelFunc
	httpAddr string
}

func launch(t *testing.T, log *slog.Logger, dir string, flags ...string) *launched {
	t.Helper()
	l := &launched{t: t, ready: make(chan *slot.Slot, 1), exited: make(chan struct{}), httpAddr: testnats.FreeAddr(t)}
	args := append([]string{"--data-dir", dir, "--http-addr", l.httpAddr, "--reaper-schedule", "@every 1h"}, flags...)
	cfg, err := ParseFlags(args, func(string) string { return "" }, io.Discard)
	if err != nil {
		t.Fatalf("flags: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	l.cancel = cancel
	go func() {
		err := Run(ctx, cfg, log, Options{OnReady: func(a *slot.Slot) { l.ready <- a }})
		l.err = err
		close(l.exited)
	}()
	t.Cleanup(func() { _ = l.stop() })
	return l
}

// stop cancels the run and returns Run's error; it fails the test if Run
// does not return within 60s.
func (l *launched) stop() error {
	l.cancel()
	select {
	case <-l.exited:
		return l.err
	case <-time.After(60 * time.Second):
		l.t.Fatal("worker did not stop within 60s")
		return nil
	}
}

func (l *launched) waitReady() *slot.Slot {
	l.t.Helper()
	select {
	case a := <-l.ready:
		return a
	case <-l.exited:
		l.t.Fatalf("worker exited before ready: %v", l.err)
	case <-time.After(30 * time.Second):
		l.t.Fatal("worker not ready within 30s")
	}
	return nil
}

// httpGet fetches a URL and returns the status and body.
func httpGet(t *testing.T, u string) (int, string) {
	t.Helper()
	c := &http.Client{Timeout: 10 * time.Second}
	resp, err := c.Get(u)
	if err != nil {
		t.Fatalf("GET %s: %v", u, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// roundTrip sends a put_node through the worker and reads it back over HTTP.
func roundTrip(t *testing.T, b *bus, base string) {
	t.Helper()
	n := uuid.NewString()
	mustOK(t, b.wait(b.send("sec", node(n))))
	if code, body := httpGet(t, base+"/v1/tenants/sec/nodes/"+n); code != 200 {
		t.Fatalf("node after an ok put_node: %d %s", code, body)
	}
}

// assertNeverReady waits for evidence that the worker tried and failed to
// connect (a log line containing every one of evidence), then checks that
// /readyz reports NATS not connected and that the worker never got ready;
// finally it cancels and checks that Run returns.
func assertNeverReady(t *testing.T, l *launched, logs *logBuf, evidence ...string) {
	t.Helper()
	if !logs.waitFor(30*time.Second, l.exited, evidence...) {
		select {
		case <-l.exited:
			// Refusing to start is as good as never getting ready.
			if l.err == nil {
				t.Fatalf("worker exited cleanly without connecting; logs:\n%s", logs)
			}
			t.Logf("worker refused to start: %v", l.err)
			return
		default:
		}
		t.Fatalf("no log line with %q within 30s; logs:\n%s", evidence, logs)
	}
	code, body := httpGet(t, "http://"+l.httpAddr+"/readyz")
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "nats: not connected") {
		t.Fatalf("/readyz while NATS refuses the worker: %d %s", code, body)
	}
	if code, _ := httpGet(t, "http://"+l.httpAddr+"/healthz"); code != 200 {
		t.Fatalf("/healthz %d: the process is alive", code)
	}
	select {
	case <-l.ready:
		t.Fatal("the worker got ready without NATS")
	default:
	}
	if err := l.stop(); err != nil {
		t.Logf("Run returned %v after cancel", err)
	}
	select {
	case <-l.ready:
		t.Fatal("the worker got ready without NATS")
	default:
	}
}

func assertNoSecret(t *testing.T, what, text string, secrets ...string) {
	t.Helper()
	for _, s := range secrets {
		if s != "" && strings.Contains(text, s) {
			i := strings.Index(text, s)
			from, to := max(0, i-200), min(len(text), i+len(s)+50)
			t.Errorf("%s contains the secret %q: ...%s...", what, s, text[from:to])
		}
	}
}

// ---- 1a: user and password ----------------------------------------------

const (
	testUser     = "telha-worker"
	testPassword = "pw-9c3e7f0a-correct-horse-battery-staple"
	wrongPass    = "pw-WRONG-1b2d4f6a-tr0ub4dor"
)

func userPassServer(t *testing.T) *testnats.Server {
	return testnats.Start(t, func(o *server.Options) {
		o.Username, o.Password = testUser, testPassword
	})
}

func TestSecurityUserPassword(t *testing.T) {
	ns := userPassServer(t)
	// The server enforces auth: an anonymous client is refused.
	if nc, err := nats.Connect(ns.ClientURL()); err == nil {
		nc.Close()
		t.Fatal("anonymous connection accepted by a user/password server")
	}
	logs := newLogBuf()
	l := launch(t, debugLogger(logs, "text"), t.TempDir(), "--nats-url", ns.ClientURL(), "--nats-user", testUser, "--nats-password", testPassword)
	l.waitReady()
	b := newBusWith(t, ns.ClientURL(), nats.UserInfo(testUser, testPassword))
	roundTrip(t, b, "http://"+l.httpAddr)
	if err := l.stop(); err != nil {
		t.Fatalf("stop: %v", err)
	}
	assertNoSecret(t, "the worker's logs", logs.String(), testPassword)
}

func TestSecurityUserPasswordFromEnvironment(t *testing.T) {
	// The chart passes the password as TELHA_NATS_PASSWORD (never argv).
	ns := userPassServer(t)
	env := map[string]string{"TELHA_NATS_USER": testUser, "TELHA_NATS_PASSWORD": testPassword, "TELHA_NATS_URL": ns.ClientURL()}
	cfg, err := ParseFlags([]string{"--data-dir", t.TempDir()}, func(k string) string { return env[k] }, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.NATSUser != testUser || cfg.NATSPassword != testPassword || cfg.NATSURL != ns.ClientURL() {
		t.Fatalf("config from the environment: %+v", cfg)
	}
}

func TestSecurityWrongPasswordNeverReady(t *testing.T) {
	ns := userPassServer(t)
	logs := newLogBuf()
	l := launch(t, debugLogger(logs, "text"), t.TempDir(), "--nats-url", ns.ClientURL(), "--nats-user", testUser, "--nats-password", wrongPass)
	assertNeverReady(t, l, logs, "provisioning streams failed")
	assertNoSecret(t, "the worker's logs", logs.String(), wrongPass)
	if l.err != nil {
		assertNoSecret(t, "Run's error", l.err.Error(), wrongPass)
	}
}

// TestSecurityAuthFailureIsLogged: an operator must be able to tell from
// the logs why a worker is not ready. nats.go reports the server's
// "Authorization Violation" only to an error handler, which the worker
// installs; without it the log said only "nats: connection closed".
func TestSecurityAuthFailureIsLogged(t *testing.T) {
	ns := userPassServer(t)
	logs := newLogBuf()
	l := launch(t, debugLogger(logs, "text"), t.TempDir(), "--nats-url", ns.ClientURL(), "--nats-user", testUser, "--nats-password", wrongPass)
	if !logs.waitFor(30*time.Second, l.exited, "provisioning streams failed") {
		t.Fatalf("no provisioning failure logged:\n%s", logs)
	}
	if !strings.Contains(strings.ToLower(logs.String()), "authorization") {
		t.Fatalf("the refused login is not in the logs:\n%s", logs)
	}
}

// TestSecurityRecoversWhenCredentialsBecomeValid: the worker retries NATS
// forever (MaxReconnects(-1), RetryOnFailedConnect, the provisioning loop)
// so that it survives an external cluster that is not ready yet. A refused
// login is the same situation during a credential rotation (the worker's
// new password is deployed before the server's). nats.go closes the
// connection for good after an authorization error unless
// nats.IgnoreAuthErrorAbort() is set (the worker sets it): without it the
// worker would spin on a closed connection for ever, never ready, /healthz
// 200 (no restart), and not recover once the server accepts its
// credentials.
func TestSecurityRecoversWhenCredentialsBecomeValid(t *testing.T) {
	ns := userPassServer(t)
	logs := newLogBuf()
	l := launch(t, debugLogger(logs, "text"), t.TempDir(), "--nats-url", ns.ClientURL(), "--nats-user", testUser, "--nats-password", wrongPass)
	if !logs.waitFor(30*time.Second, l.exited, "provisioning streams failed") {
		t.Fatalf("no provisioning failure logged:\n%s", logs)
	}
	// The server now accepts the worker's password.
	o := ns.Opts.Clone()
	o.Password = wrongPass
	if err := ns.ReloadOptions(o); err != nil {
		t.Fatal(err)
	}
	if nc, err := nats.Connect(ns.ClientURL(), nats.UserInfo(testUser, wrongPass)); err != nil {
		t.Fatalf("the reloaded server refuses the new password: %v", err)
	} else {
		nc.Close()
	}
	const closedForGood = "after a refused NATS login the worker must not keep a closed nats.Conn for ever (nats.go aborts on auth errors without nats.IgnoreAuthErrorAbort)"
	select {
	case <-l.ready:
	case <-l.exited:
		// Exiting (so that Kubernetes restarts the pod) is also a recovery.
		if l.err == nil {
			t.Fatal("the worker exited cleanly without ever being ready")
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("not ready 30s after the server accepted the credentials (%s); logs:\n%s", closedForGood, logs)
	}
}

// ---- 1b: creds file (operator/JWT mode) -----------------------------------

type operatorSetup struct {
	opts      func(*server.Options)
	creds     string // .creds of a user of the JetStream-enabled account
	seed      string // that user's seed
	badCreds  string // .creds of a user of an account the server does not know
	badSeed   string
	accountPK string
}

func must[T any](t *testing.T) func(T, error) T {
	return func(v T, err error) T {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
}

func writeCreds(t *testing.T, dir, name string, account nkeys.KeyPair) (path, seed string) {
	t.Helper()
	ukp := must[nkeys.KeyPair](t)(nkeys.CreateUser())
	upub := must[string](t)(ukp.PublicKey())
	uc := jwt.NewUserClaims(upub)
	uc.Name = name
	ujwt := must[string](t)(uc.Encode(account))
	useed := must[[]byte](t)(ukp.Seed())
	creds := must[[]byte](t)(jwt.FormatUserConfig(ujwt, useed))
	path = filepath.Join(dir, name+".creds")
	if err := os.WriteFile(path, creds, 0o600); err != nil {
		t.Fatal(err)
	}
	return path, string(useed)
}

func newOperator(t *testing.T) operatorSetup {
	t.Helper()
	okp := must[nkeys.KeyPair](t)(nkeys.CreateOperator())
	opub := must[string](t)(okp.PublicKey())
	skp := must[nkeys.KeyPair](t)(nkeys.CreateAccount())
	spub := must[string](t)(skp.PublicKey())
	akp := must[nkeys.KeyPair](t)(nkeys.CreateAccount())
	apub := must[string](t)(akp.PublicKey())

	oc := jwt.NewOperatorClaims(opub)
	oc.Name = "telha-test-operator"
	oc.SystemAccount = spub
	ojwt := must[string](t)(oc.Encode(okp))
	trusted := must[*jwt.OperatorClaims](t)(jwt.DecodeOperatorClaims(ojwt))

	sc := jwt.NewAccountClaims(spub)
	sc.Name = "SYS"
	sjwt := must[string](t)(sc.Encode(okp))
	ac := jwt.NewAccountClaims(apub)
	ac.Name = "TELHA"
	ac.Limits.JetStreamLimits = jwt.JetStreamLimits{MemoryStorage: -1, DiskStorage: -1, Streams: -1, Consumer: -1}
	ajwt := must[string](t)(ac.Encode(okp))
	res := &server.MemAccResolver{}
	if err := res.Store(apub, ajwt); err != nil {
		t.Fatal(err)
	}
	if err := res.Store(spub, sjwt); err != nil {
		t.Fatal(err)
	}

	dir := t.TempDir()
	creds, seed := writeCreds(t, dir, "worker", akp)
	// An account signed by the operator but never registered with the
	// resolver: its users cannot log in.
	ukn := must[nkeys.KeyPair](t)(nkeys.CreateAccount())
	badCreds, badSeed := writeCreds(t, dir, "stranger", ukn)
	return operatorSetup{
		opts: func(o *server.Options) {
			o.TrustedOperators = []*jwt.OperatorClaims{trusted}
			o.AccountResolver = res
			o.SystemAccount = spub
		},
		creds: creds, seed: seed, badCreds: badCreds, badSeed: badSeed, accountPK: apub,
	}
}

func TestSecurityCredsFile(t *testing.T) {
	op := newOperator(t)
	ns := testnats.Start(t, op.opts)
	if nc, err := nats.Connect(ns.ClientURL()); err == nil {
		nc.Close()
		t.Fatal("anonymous connection accepted by an operator-mode server")
	}
	logs := newLogBuf()
	l := launch(t, debugLogger(logs, "json"), t.TempDir(), "--nats-url", ns.ClientURL(), "--nats-creds", op.creds)
	l.waitReady()
	b := newBusWith(t, ns.ClientURL(), nats.UserCredentials(op.creds))
	roundTrip(t, b, "http://"+l.httpAddr)
	// The streams live in the creds' account.
	acc, err := ns.LookupAccount(op.accountPK)
	if err != nil || !acc.JetStreamEnabled() {
		t.Fatalf("account %s: %v (JetStream enabled: %v)", op.accountPK, err, err == nil && acc.JetStreamEnabled())
	}
	if err := l.stop(); err != nil {
		t.Fatalf("stop: %v", err)
	}
	assertNoSecret(t, "the worker's logs", logs.String(), op.seed)
}

func TestSecurityCredsFileUnknownAccountNeverReady(t *testing.T) {
	op := newOperator(t)
	ns := testnats.Start(t, op.opts)
	logs := newLogBuf()
	l := launch(t, debugLogger(logs, "text"), t.TempDir(), "--nats-url", ns.ClientURL(), "--nats-creds", op.badCreds)
	assertNeverReady(t, l, logs, "provisioning streams failed")
	assertNoSecret(t, "the worker's logs", logs.String(), op.badSeed)
	if l.err != nil {
		assertNoSecret(t, "Run's error", l.err.Error(), op.badSeed)
	}
}

// TestSecurityCredsFileMissing: an unreadable creds file is a start-up
// error naming the file, not a hang.
func TestSecurityCredsFileMissing(t *testing.T) {
	ns := testnats.Start(t)
	missing := filepath.Join(t.TempDir(), "nope.creds")
	l := launch(t, testLog, t.TempDir(), "--nats-url", ns.ClientURL(), "--nats-creds", missing)
	select {
	case <-l.exited:
		if l.err == nil || !strings.Contains(l.err.Error(), "nope.creds") {
			t.Fatalf("a missing creds file: Run returned %v, want an error naming the file", l.err)
		}
	case <-l.ready:
		t.Fatal("ready with a missing creds file")
	case <-time.After(30 * time.Second):
		t.Fatal("Run neither failed nor got ready within 30s")
	}
}

// ---- 1c: mutual TLS -----------------------------------------------------

type pki struct {
	dir                       string
	ca, serverCert, serverKey string
	clientCert, clientKey     string
	otherCA                   string // a CA that signed nothing here
	clientKeyPEM              string
	caPool                    *x509.CertPool
	serverTLS, clientTLS      *tls.Config
	serial                    int64
}

func (p *pki) issue(t *testing.T, tmpl *x509.Certificate, parent *x509.Certificate, parentKey *ecdsa.PrivateKey) (*ecdsa.PrivateKey, []byte) {
	t.Helper()
	key := must[*ecdsa.PrivateKey](t)(ecdsa.GenerateKey(elliptic.P256(), rand.Reader))
	p.serial++
	tmpl.SerialNumber = big.NewInt(p.serial)
	tmpl.NotBefore = time.Now().Add(-time.Hour)
	tmpl.NotAfter = time.Now().Add(24 * time.Hour)
	if parent == nil {
		parent, parentKey = tmpl, key
	}
	der := must[[]byte](t)(x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, parentKey))
	return key, der
}

func (p *pki) write(t *testing.T, name, typ string, der []byte) string {
	t.Helper()
	path := filepath.Join(p.dir, name)
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func newPKI(t *testing.T) *pki {
	t.Helper()
	p := &pki{dir: t.TempDir()}
	caTmpl := &x509.Certificate{Subject: pkix.Name{CommonName: "telha test CA"}, IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
	caKey, caDER := p.issue(t, caTmpl, nil, nil)
	caCert := must[*x509.Certificate](t)(x509.ParseCertificate(caDER))
	p.ca = p.write(t, "ca.pem", "CERTIFICATE", caDER)

	srvKey, srvDER := p.issue(t, &x509.Certificate{Subject: pkix.Name{CommonName: "nats"}, IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}, caCert, caKey)
	p.serverCert = p.write(t, "server.pem", "CERTIFICATE", srvDER)
	p.serverKey = p.write(t, "server-key.pem", "EC PRIVATE KEY", must[[]byte](t)(x509.MarshalECPrivateKey(srvKey)))

	cliKey, cliDER := p.issue(t, &x509.Certificate{Subject: pkix.Name{CommonName: "telha-worker"},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}, caCert, caKey)
	p.clientCert = p.write(t, "client.pem", "CERTIFICATE", cliDER)
	p.clientKeyPEM = string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: must[[]byte](t)(x509.MarshalPKCS8PrivateKey(cliKey))}))
	p.clientKey = filepath.Join(p.dir, "client-key.pem")
	if err := os.WriteFile(p.clientKey, []byte(p.clientKeyPEM), 0o600); err != nil {
		t.Fatal(err)
	}

	_, otherDER := p.issue(t, &x509.Certificate{Subject: pkix.Name{CommonName: "another CA"}, IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign}, nil, nil)
	p.otherCA = p.write(t, "other-ca.pem", "CERTIFICATE", otherDER)

	p.caPool = x509.NewCertPool()
	p.caPool.AddCert(caCert)
	serverPair := must[tls.Certificate](t)(tls.LoadX509KeyPair(p.serverCert, p.serverKey))
	clientPair := must[tls.Certificate](t)(tls.LoadX509KeyPair(p.clientCert, p.clientKey))
	p.serverTLS = &tls.Config{Certificates: []tls.Certificate{serverPair}, ClientCAs: p.caPool,
		ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS12}
	p.clientTLS = &tls.Config{RootCAs: p.caPool, Certificates: []tls.Certificate{clientPair}, MinVersion: tls.VersionTLS12}
	return p
}

func tlsServer(t *testing.T, p *pki) *testnats.Server {
	return testnats.Start(t, func(o *server.Options) {
		o.TLS = true
		o.TLSVerify = true
		o.TLSConfig = p.serverTLS
		o.TLSTimeout = 10
	})
}

func TestSecurityMutualTLS(t *testing.T) {
	p := newPKI(t)
	ns := tlsServer(t, p)
	url := fmt.Sprintf("tls://127.0.0.1:%d", ns.Opts.Port)
	// The server requires a client certificate.
	if nc, err := nats.Connect(url, nats.Secure(&tls.Config{RootCAs: p.caPool, MinVersion: tls.VersionTLS12})); err == nil {
		nc.Close()
		t.Fatal("a client without a certificate was accepted")
	}
	logs := newLogBuf()
	l := launch(t, debugLogger(logs, "text"), t.TempDir(), "--nats-url", url,
		"--nats-tls-ca", p.ca, "--nats-tls-cert", p.clientCert, "--nats-tls-key", p.clientKey)
	l.waitReady()
	b := newBusWith(t, url, nats.Secure(p.clientTLS))
	roundTrip(t, b, "http://"+l.httpAddr)
	if err := l.stop(); err != nil {
		t.Fatalf("stop: %v", err)
	}
	assertNoSecret(t, "the worker's logs", logs.String(), strings.TrimSpace(strings.Split(p.clientKeyPEM, "\n")[1]))
}

func TestSecurityTLSRefusals(t *testing.T) {
	p := newPKI(t)
	ns := tlsServer(t, p)
	url := fmt.Sprintf("tls://127.0.0.1:%d", ns.Opts.Port)
	for _, c := range []struct {
		name  string
		flags []string
	}{
		{"no client certificate", []string{"--nats-tls-ca", p.ca}},
		{"server not trusted", []string{"--nats-tls-ca", p.otherCA, "--nats-tls-cert", p.clientCert, "--nats-tls-key", p.clientKey}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			logs := newLogBuf()
			l := launch(t, debugLogger(logs, "text"), t.TempDir(), append([]string{"--nats-url", url}, c.flags...)...)
			// The provisioning loop reports that it cannot reach JetStream.
			assertNeverReady(t, l, logs, "provisioning streams failed")
		})
	}
	// Unreadable TLS material is a start-up error, not a hang.
	for _, c := range []struct {
		name  string
		flags []string
	}{
		{"missing CA file", []string{"--nats-tls-ca", filepath.Join(p.dir, "nope.pem")}},
		{"CA file without PEM", []string{"--nats-tls-ca", p.clientKey + ".nothing"}},
		{"key does not match cert", []string{"--nats-tls-ca", p.ca, "--nats-tls-cert", p.clientCert, "--nats-tls-key", p.serverKey}},
	} {
		t.Run(c.name, func(t *testing.T) {
			if c.name == "CA file without PEM" {
				if err := os.WriteFile(p.clientKey+".nothing", []byte("not pem"), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			l := launch(t, testLog, t.TempDir(), append([]string{"--nats-url", url}, c.flags...)...)
			select {
			case <-l.exited:
				if l.err == nil || !strings.Contains(l.err.Error(), "--nats-tls") {
					t.Fatalf("Run returned %v, want an error naming the TLS flag", l.err)
				}
			case <-l.ready:
				t.Fatal("ready with broken TLS material")
			case <-time.After(30 * time.Second):
				t.Fatal("Run neither failed nor got ready within 30s")
			}
		})
	}
}

// ---- 1d: no secrets in logs ---------------------------------------------

// TestSecurityNoSecretsInLogs runs workers with secrets, in both log
// formats, connecting and failing to connect, and checks that neither the
// logs, Run's error, /readyz nor /metrics ever show a password or a seed.
func TestSecurityNoSecretsInLogs(t *testing.T) {
	ns := userPassServer(t)
	op := newOperator(t)
	ons := testnats.Start(t, op.opts)
	urlWithPW := fmt.Sprintf("nats://%s:%s@127.0.0.1:%d", testUser, testPassword, ns.Opts.Port)
	urlWithWrongPW := fmt.Sprintf("nats://%s:%s@127.0.0.1:%d", testUser, wrongPass, ns.Opts.Port)
	deadURL := fmt.Sprintf("nats://%s:%s@%s", testUser, testPassword, testnats.FreeAddr(t))
	secrets := []string{testPassword, wrongPass, op.seed, op.badSeed}
	for _, c := range []struct {
		name   string
		flags  []string
		ok     bool
		format string
	}{
		{"password ok", []string{"--nats-url", ns.ClientURL(), "--nats-user", testUser, "--nats-password", testPassword}, true, "json"},
		{"password wrong", []string{"--nats-url", ns.ClientURL(), "--nats-user", testUser, "--nats-password", wrongPass}, false, "json"},
		{"password in the URL ok", []string{"--nats-url", urlWithPW}, true, "text"},
		{"password in the URL wrong", []string{"--nats-url", urlWithWrongPW}, false, "text"},
		{"creds ok", []string{"--nats-url", ons.ClientURL(), "--nats-creds", op.creds}, true, "text"},
		{"creds refused", []string{"--nats-url", ons.ClientURL(), "--nats-creds", op.badCreds}, false, "json"},
		{"password in the URL, no server", []string{"--nats-url", deadURL}, false, "text"},
		{"password flag, no server", []string{"--nats-url", deadURL, "--nats-user", testUser, "--nats-password", testPassword}, false, "json"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			logs := newLogBuf()
			l := launch(t, debugLogger(logs, c.format), t.TempDir(), c.flags...)
			var pages []string
			if c.ok {
				l.waitReady()
				for _, p := range []string{"/readyz", "/metrics", "/healthz"} {
					_, body := httpGet(t, "http://"+l.httpAddr+p)
					pages = append(pages, body)
				}
				if err := l.stop(); err != nil {
					t.Fatalf("stop: %v", err)
				}
			} else {
				if !logs.waitFor(30*time.Second, l.exited, "provisioning streams failed") {
					select {
					case <-l.exited:
					default:
						t.Fatalf("no connection failure logged within 30s:\n%s", logs)
					}
				}
				select {
				case <-l.exited:
				default:
					for _, p := range []string{"/readyz", "/metrics"} {
						_, body := httpGet(t, "http://"+l.httpAddr+p)
						pages = append(pages, body)
					}
				}
				_ = l.stop()
			}
			assertNoSecret(t, "the logs", logs.String(), secrets...)
			if l.err != nil {
				assertNoSecret(t, "Run's error", l.err.Error(), secrets...)
			}
			for _, p := range pages {
				assertNoSecret(t, "an HTTP page", p, secrets...)
			}
			if logs.String() == "" {
				t.Fatal("nothing was logged")
			}
		})
	}
}

// TestSecurityNoSecretsInUsageErrors: a bad configuration is reported
// without echoing secrets given next to it.
func TestSecurityNoSecretsInUsageErrors(t *testing.T) {
	var usage bytes.Buffer
	env := map[string]string{"TELHA_NATS_PASSWORD": testPassword, "TELHA_PARTITIONS": "x"}
	_, err := ParseFlags([]string{"--nats-user", testUser}, func(k string) string { return env[k] }, &usage)
	if err == nil {
		t.Fatal("bad flags accepted")
	}
	assertNoSecret(t, "the usage error", err.Error(), testPassword)
	assertNoSecret(t, "the usage text", usage.String(), testPassword)
}

// ---- 1e: HTTP server hardening ------------------------------------------

func TestHTTPReadAPISeparateAddress(t *testing.T) {
	ns := testnats.Start(t)
	w := startWorker(t, ns, t.TempDir(), Options{}, "--api-addr", "127.0.0.1:0")
	api := "http://" + w.app.APIAddr()
	if w.app.APIAddr() == "" || w.app.APIAddr() == w.app.HTTPAddr() {
		t.Fatalf("api addr %q, http addr %q", w.app.APIAddr(), w.app.HTTPAddr())
	}
	b := newBus(t, ns)
	n := uuid.NewString()
	mustOK(t, b.wait(b.send("sep", node(n))))
	for _, p := range []string{"/v1/tenants/sep/nodes/" + n, "/v1/journals", "/v1/tenants/sep/nodes/" + n + "/history"} {
		if code, body := httpGet(t, api+p); code != 200 {
			t.Errorf("GET %s on --api-addr: %d %s", p, code, body)
		}
		if code, body := httpGet(t, w.base+p); code != 404 {
			t.Errorf("GET %s on --http-addr: %d %s, want 404 (the read API is elsewhere)", p, code, body)
		}
	}
	for _, p := range []string{"/metrics", "/healthz", "/readyz"} {
		if code, _ := httpGet(t, w.base+p); code != 200 {
			t.Errorf("GET %s on --http-addr: %d", p, code)
		}
		if code, _ := httpGet(t, api+p); code != 404 {
			t.Errorf("GET %s on --api-addr: %d, want 404", p, code)
		}
	}
}

func TestHTTPReadAPIOff(t *testing.T) {
	ns := testnats.Start(t)
	w := startWorker(t, ns, t.TempDir(), Options{}, "--api-addr", "off")
	if w.app.APIAddr() != "" {
		t.Fatalf("api addr %q with --api-addr off", w.app.APIAddr())
	}
	for _, p := range []string{"/v1/journals", "/v1/tenants/x/nodes/" + uuid.NewString()} {
		code, body := httpGet(t, w.base+p)
		var e struct{ Error string }
		if code != 404 || json.Unmarshal([]byte(body), &e) != nil || e.Error == "" {
			t.Errorf("GET %s with the read API off: %d %s, want 404 JSON", p, code, body)
		}
	}
	for _, p := range []string{"/metrics", "/healthz", "/readyz"} {
		if code, _ := httpGet(t, w.base+p); code != 200 {
			t.Errorf("GET %s: %d", p, code)
		}
	}
}

// rawStatus writes a raw request on a new connection and returns the
// response's status code.
func rawStatus(t *testing.T, addr string, req []byte) int {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(20 * time.Second))
	go func() { _, _ = c.Write(req) }() // the server may answer before reading it all
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("reading the response: %v", err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

func TestHTTPHugeHeader(t *testing.T) {
	ns := testnats.Start(t)
	w := startWorker(t, ns, t.TempDir(), Options{})
	addr := w.app.HTTPAddr()
	// Just under the limit answers; far over it gets 431.
	small := "GET /healthz HTTP/1.1\r\nHost: x\r\nX-Pad: " + strings.Repeat("a", 32<<10) + "\r\nConnection: close\r\n\r\n"
	if code := rawStatus(t, addr, []byte(small)); code != 200 {
		t.Fatalf("32 KiB of headers: %d, want 200", code)
	}
	for _, p := range []string{"/healthz", "/v1/journals"} {
		huge := "GET " + p + " HTTP/1.1\r\nHost: x\r\nX-Pad: " + strings.Repeat("a", 1<<20) + "\r\n\r\n"
		if code := rawStatus(t, addr, []byte(huge)); code != http.StatusRequestHeaderFieldsTooLarge {
			t.Fatalf("GET %s with a 1 MiB header: %d, want 431", p, code)
		}
	}
	many := "GET /healthz HTTP/1.1\r\nHost: x\r\n" + strings.Repeat("X-A: b\r\n", 20000) + "\r\n"
	if code := rawStatus(t, addr, []byte(many)); code != http.StatusRequestHeaderFieldsTooLarge {
		t.Fatalf("20000 headers: %d, want 431", code)
	}
}

func TestHTTPSlowClientCutOff(t *testing.T) {
	ns := testnats.Start(t)
	w := startWorker(t, ns, t.TempDir(), Options{}, "--api-addr", "127.0.0.1:0")
	for name, addr := range map[string]string{"http-addr": w.app.HTTPAddr(), "api-addr": w.app.APIAddr()} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			c, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			start := time.Now()
			// Headers started, never finished (a slowloris).
			if _, err := c.Write([]byte("GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: ")); err != nil {
				t.Fatal(err)
			}
			// ReadHeaderTimeout is 5s: the server closes the connection.
			// The read deadline is only the test's bound, not a sleep.
			_ = c.SetReadDeadline(start.Add(10 * time.Second))
			got, err := io.ReadAll(c)
			took := time.Since(start)
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				t.Fatalf("the connection is still open after %s (read %q)", took, got)
			}
			if took < 4*time.Second {
				t.Fatalf("connection closed after %s (%v, %q): before the header timeout?", took, err, got)
			}
			if len(got) > 0 && !bytes.HasPrefix(got, []byte("HTTP/1.1 4")) {
				t.Fatalf("the server answered %q", got)
			}
		})
	}
}
