package server

import (
	"bytes"
	"context"
	"crypto/tls"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"

	"github.com/terrace-dev/terrace/internal/artifact"
	"github.com/terrace-dev/terrace/internal/pki"
	"github.com/terrace-dev/terrace/internal/runner"
	"github.com/terrace-dev/terrace/internal/testenv"
	"github.com/terrace-dev/terrace/internal/tf"
)

var testRunnerIdentity = pki.RunnerIdentity("team-a", "web", "run-1")

// testRunner is a runner server on a loopback port with a controller client.
type testRunner struct {
	authority *pki.Authority
	server    *Server
	client    *runner.Client
	addr      string
	base      string // parent of the work dir: nothing may appear here
	workDir   string
	echo      *testenv.SyncBuffer
}

func newAuthority(t *testing.T) *pki.Authority {
	t.Helper()
	a, err := pki.NewAuthority(pki.DefaultCAValidity)
	if err != nil {
		t.Fatalf("failed to create authority: %v", err)
	}
	return a
}

func issue(t *testing.T, a *pki.Authority, id pki.Identity) *pki.Leaf {
	t.Helper()
	leaf, err := a.Issue(pki.LeafRequest{Identity: id, Validity: time.Hour, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, DNSNames: []string{"localhost"}})
	if err != nil {
		t.Fatalf("failed to issue %s: %v", id, err)
	}
	return leaf
}

func certSource(t *testing.T, leaf *pki.Leaf) pki.CertificateSource {
	t.Helper()
	c, err := leaf.TLSCertificate()
	if err != nil {
		t.Fatal(err)
	}
	return pki.StaticCertificate(c)
}

// startRunner starts a runner with real tofu. authority may be nil for a fresh one.
func startRunner(t *testing.T, authority *pki.Authority, mutate ...func(*Config)) *testRunner {
	t.Helper()
	return startRunnerWith(t, authority, nil, mutate...)
}

// startRunnerWith is startRunner with a change to the executor's config.
func startRunnerWith(t *testing.T, authority *pki.Authority, tfMutate func(*tf.Config), mutate ...func(*Config)) *testRunner {
	t.Helper()
	tofu := testenv.RequireTofu(t)
	if authority == nil {
		authority = newAuthority(t)
	}
	base := t.TempDir()
	workDir := filepath.Join(base, "work")
	tfConfig := tf.Config{BinaryPath: tofu, WorkDir: workDir, InterruptGrace: 30 * time.Second}
	if tfMutate != nil {
		tfMutate(&tfConfig)
	}
	executor, err := tf.New(tfConfig)
	if err != nil {
		t.Fatalf("failed to create executor: %v", err)
	}
	runnerLeaf := issue(t, authority, testRunnerIdentity)
	echo := &testenv.SyncBuffer{}
	cfg := Config{
		Executor:    executor,
		Certificate: certSource(t, runnerLeaf),
		Trust:       pki.TrustFunc(authority.TrustPool),
		BackendLeaf: func() (*pki.Leaf, error) { return runnerLeaf, nil },
		Log:         logr.Discard(),
		EchoLogs:    echo,
	}
	for _, m := range mutate {
		m(&cfg)
	}
	srv, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	g := srv.GRPCServer()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = g.Serve(lis) }()
	t.Cleanup(g.Stop)
	tr := &testRunner{authority: authority, server: srv, addr: lis.Addr().String(), base: base, workDir: workDir, echo: echo}
	// The runner is dialled as whoever its certificate names (a warm
	// runner's is a class identity).
	expect := testRunnerIdentity
	if c, err := cfg.Certificate.Certificate(); err == nil && c.Leaf != nil {
		if id, err := pki.IdentityFromCertificate(c.Leaf); err == nil {
			expect = id
		}
	}
	tr.client = tr.dial(t, runner.ClientTLSConfig(certSource(t, issue(t, authority, pki.ControllerIdentity)), pki.TrustFunc(authority.TrustPool), expect))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := tr.client.WaitReady(ctx); err != nil {
		t.Fatalf("runner not ready: %v", err)
	}
	return tr
}

func (tr *testRunner) dial(t *testing.T, cfg *tls.Config) *runner.Client {
	t.Helper()
	c, err := runner.Dial(context.Background(), tr.addr, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// upload builds a tar.gz of files and uploads it.
func (tr *testRunner) upload(t *testing.T, files map[string]string) {
	t.Helper()
	data, digest := buildArchive(t, files)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	info, err := tr.client.Upload(ctx, digest, bytes.NewReader(data))
	if err != nil {
		t.Fatalf("upload failed: %v", err)
	}
	if info.GetDigest() != digest || info.GetSize() != int64(len(data)) {
		t.Fatalf("upload answered %v, want digest %s size %d", info, digest, len(data))
	}
}

func buildArchive(t *testing.T, files map[string]string) ([]byte, string) {
	t.Helper()
	in := map[string][]byte{}
	for name, content := range files {
		in[name] = []byte(content)
	}
	data, digest, err := artifact.Build(in)
	if err != nil {
		t.Fatalf("failed to build archive: %v", err)
	}
	return data, digest
}

// serveTLS serves handler over TLS with cfg on a loopback port and returns
// its https URL. (httptest.Server would put its own certificate first.)
func serveTLS(t *testing.T, handler http.Handler, cfg *tls.Config) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: handler, TLSConfig: cfg, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(tls.NewListener(lis, cfg)) }()
	t.Cleanup(func() { _ = srv.Close() })
	return "https://" + lis.Addr().String()
}

// logCollector gathers log lines from every call.
type logCollector struct {
	mu    sync.Mutex
	lines []string
}

func (l *logCollector) log(line string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, line)
}

func (l *logCollector) text() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.lines, "\n")
}

// filesOutside lists every file under base that is not inside the work dir.
func (tr *testRunner) filesOutside(t *testing.T) []string {
	t.Helper()
	var out []string
	err := filepath.Walk(tr.base, func(p string, info os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		if p == tr.base || p == tr.workDir {
			return nil
		}
		if strings.HasPrefix(p, tr.workDir+string(filepath.Separator)) {
			return nil
		}
		out = append(out, p)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}
