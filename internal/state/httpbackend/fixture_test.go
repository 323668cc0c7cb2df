package httpbackend_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"io"
	"net"
	"net/http"
	"os"
	"testing"
	"time"

	"github.com/terrace-dev/terrace/internal/pki"
	"github.com/terrace-dev/terrace/internal/state"
	"github.com/terrace-dev/terrace/internal/state/httpbackend"
	"github.com/terrace-dev/terrace/internal/state/postgres"
	"github.com/terrace-dev/terrace/internal/state/postgres/pgtest"
)

var dbURL string

func TestMain(m *testing.M) {
	if dir := os.Getenv(attackDirEnv); dir != "" {
		os.Exit(uploadAttacker(dir))
	}
	pgtest.Main(func(url string) int { dbURL = url; return m.Run() })
}

// fixture is a running state server with mutual TLS over a real store.
type fixture struct {
	store     state.Store
	authority *pki.Authority
	runs      *runRegistry
	baseURL   string
}

func uniqueName(prefix string) string {
	b := make([]byte, 5)
	_, _ = rand.Read(b)
	return prefix + hex.EncodeToString(b)
}

func newFixture(t *testing.T, opts httpbackend.Options) *fixture {
	t.Helper()
	store, err := postgres.Open(context.Background(), dbURL, postgres.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(store.Close)
	return newFixtureWithStore(t, opts, store)
}

// newFixtureWithStore is newFixture over a store of the test's.
func newFixtureWithStore(t *testing.T, opts httpbackend.Options, store state.Store) *fixture {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	authority, err := pki.NewAuthority(pki.DefaultCAValidity)
	if err != nil {
		t.Fatal(err)
	}
	serverLeaf, err := authority.Issue(pki.LeafRequest{Identity: pki.ControllerIdentity, Validity: time.Hour, IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, DNSNames: []string{"localhost"}})
	if err != nil {
		t.Fatal(err)
	}
	serverCert, err := serverLeaf.TLSCertificate()
	if err != nil {
		t.Fatal(err)
	}
	opts.ListenAddress = "127.0.0.1:0"
	runs := newRunRegistry(t)
	srv := httpbackend.NewServer(opts, store, runs.checker, pki.ServerTLSConfig(pki.StaticCertificate(serverCert), authority, nil))
	if err := srv.Listen(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("state server: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Error("state server did not shut down")
		}
	})
	return &fixture{store: store, authority: authority, runs: runs, baseURL: "https://" + srv.Addr().String()}
}

// leaf issues a client certificate for id, bound to the runner pod of
// its run when id is a run's and the run has a pod, as the launcher does.
func (f *fixture) leaf(t *testing.T, id pki.Identity) *pki.Leaf {
	t.Helper()
	req := pki.LeafRequest{Identity: id, Validity: time.Hour}
	if ns, stack, runID, ok := id.Runner(); ok {
		req.PodUID = f.runs.podUID(t, ns, stack, runID)
	}
	if ns, stack, runID, ok := id.ReadOnlyRunner(); ok {
		req.PodUID = f.runs.podUID(t, ns, stack, runID)
	}
	leaf, err := f.authority.Issue(req)
	if err != nil {
		t.Fatal(err)
	}
	return leaf
}

// client is an HTTP client presenting id's certificate and trusting the
// CA the way tofu does (RootCAs, hostname check).
func (f *fixture) client(t *testing.T, id pki.Identity) *http.Client {
	t.Helper()
	return &http.Client{Timeout: time.Minute, Transport: &http.Transport{TLSClientConfig: f.tlsConfig(t, id), ForceAttemptHTTP2: true}}
}

// tlsConfig presents id's certificate and trusts the CA as tofu does.
func (f *fixture) tlsConfig(t *testing.T, id pki.Identity) *tls.Config {
	t.Helper()
	leaf := f.leaf(t, id)
	cert, err := leaf.TLSCertificate()
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(leaf.CABundlePEM)
	return &tls.Config{RootCAs: roots, Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
}

type response struct {
	code  int
	body  []byte
	proto string
}

func do(t *testing.T, c *http.Client, method, url string, body []byte) response {
	t.Helper()
	req, err := http.NewRequest(method, url, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return response{code: resp.StatusCode, body: data, proto: resp.Proto}
}
