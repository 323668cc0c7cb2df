package artifactserver

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/spf13/pflag"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/artifact"
	"github.com/terrace-dev/terrace/internal/pki"
)

func testScheme(tb testing.TB) *runtime.Scheme {
	s := runtime.NewScheme()
	if err := terracev1.AddToScheme(s); err != nil {
		tb.Fatal(err)
	}
	return s
}

func testProgram(namespace, name string, generation int64, files map[string]string) *terracev1.Program {
	p := &terracev1.Program{ObjectMeta: metav1.ObjectMeta{
		Namespace: namespace, Name: name, Generation: generation,
		UID: types.UID(fmt.Sprintf("uid-%s-%s", namespace, name)),
	}}
	p.Spec.Files = map[string]terracev1.ProgramFile{}
	for k, v := range files {
		p.Spec.Files[k] = terracev1.ProgramFile(v)
	}
	p.Status.Conditions = []metav1.Condition{{Type: terracev1.ReadyCondition, Status: metav1.ConditionTrue, Reason: terracev1.ArtifactReadyReason, ObservedGeneration: generation}}
	return p
}

// invalidProgram is testProgram as the controller leaves a generation it
// found invalid.
func invalidProgram(namespace, name string, generation int64, files map[string]string, why string) *terracev1.Program {
	p := testProgram(namespace, name, generation, files)
	p.Status.Conditions = []metav1.Condition{{Type: terracev1.ReadyCondition, Status: metav1.ConditionFalse, Reason: terracev1.InvalidProgramReason, Message: why, ObservedGeneration: generation}}
	return p
}

func readerWith(tb testing.TB, objs ...client.Object) client.Reader {
	return fake.NewClientBuilder().WithScheme(testScheme(tb)).WithObjects(objs...).Build()
}

// peers issues leaf certificates for identities, as the handshake would
// have verified them.
type peers struct {
	authority *pki.Authority
}

func newPeers(tb testing.TB) peers {
	a, err := pki.NewAuthority(time.Hour * 24 * 30)
	if err != nil {
		tb.Fatal(err)
	}
	return peers{authority: a}
}

// testPodUID is the runner pod every run's leaf of these tests is bound to.
const testPodUID = "3f2e1d0c-9b8a-4776-8554-433221100fed"

func (p peers) leaf(tb testing.TB, id pki.Identity) *pki.Leaf {
	req := pki.LeafRequest{Identity: id, Validity: time.Hour, IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}}
	if _, _, _, ok := id.Runner(); ok {
		req.PodUID = testPodUID
	}
	l, err := p.authority.Issue(req)
	if err != nil {
		tb.Fatal(err)
	}
	return l
}

func (p peers) connectionState(tb testing.TB, id pki.Identity) *tls.ConnectionState {
	cert, err := p.leaf(tb, id).Certificate()
	if err != nil {
		tb.Fatal(err)
	}
	return &tls.ConnectionState{HandshakeComplete: true, PeerCertificates: []*x509.Certificate{cert}}
}

func (p peers) server(tb testing.TB, opts ServerOptions, cached, live client.Reader) *Server {
	cert, err := p.leaf(tb, pki.ControllerIdentity).TLSCertificate()
	if err != nil {
		tb.Fatal(err)
	}
	return NewServer(opts, cached, live, pki.StaticCertificate(cert), p.authority)
}

func counterValue(tb testing.TB, code string) float64 {
	m := &dto.Metric{}
	if err := requestsTotal.WithLabelValues(code).Write(m); err != nil {
		tb.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

func TestServerAnswers(t *testing.T) {
	p := newPeers(t)
	current := testProgram("team-a", "net", 3, map[string]string{"main.tf": "locals {}\n", "modules/x/main.tf": "output \"a\" { value = 1 }\n"})
	invalid := invalidProgram("team-a", "broken", 2, map[string]string{"main.tf": "locals {\n"}, "main.tf:1:9: Unclosed configuration block")
	unjudged := testProgram("team-a", "new", 1, map[string]string{"main.tf": "locals {}\n"})
	unjudged.Status.Conditions = nil
	srv := p.server(t, ServerOptions{}, readerWith(t, current, invalid, unjudged), nil)
	handler := srv.Handler()
	data, digest, err := BuildProgram(current)
	if err != nil {
		t.Fatal(err)
	}

	runnerA := pki.RunnerIdentity("team-a", "stack", "run-1")
	runnerB := pki.RunnerIdentity("team-b", "stack", "run-1")
	for _, tc := range []struct {
		name, method, path, ifNoneMatch string
		identity                        pki.Identity
		wantCode                        int
		wantBody                        string
	}{
		{name: "runner of the namespace", path: "/programs/team-a/net/3.tar.gz", identity: runnerA, wantCode: 200, wantBody: string(data)},
		{name: "controller", path: "/programs/team-a/net/3.tar.gz", identity: pki.ControllerIdentity, wantCode: 200, wantBody: string(data)},
		{name: "head", method: http.MethodHead, path: "/programs/team-a/net/3.tar.gz", identity: runnerA, wantCode: 200},
		{name: "etag matches", path: "/programs/team-a/net/3.tar.gz", identity: runnerA, ifNoneMatch: `"` + digest + `"`, wantCode: 304},
		{name: "weak etag in a list matches", path: "/programs/team-a/net/3.tar.gz", identity: runnerA, ifNoneMatch: `"sha256:00", W/"` + digest + `"`, wantCode: 304},
		{name: "other etag", path: "/programs/team-a/net/3.tar.gz", identity: runnerA, ifNoneMatch: `"sha256:00"`, wantCode: 200, wantBody: string(data)},
		{name: "runner of another namespace", path: "/programs/team-a/net/3.tar.gz", identity: runnerB, wantCode: 403, wantBody: "may not read programs of namespace team-a"},
		{name: "superseded generation", path: "/programs/team-a/net/2.tar.gz", identity: runnerA, wantCode: 410, wantBody: "superseded by 3"},
		{name: "future generation", path: "/programs/team-a/net/4.tar.gz", identity: runnerA, wantCode: 404, wantBody: "no generation 4"},
		{name: "missing program", path: "/programs/team-a/nope/1.tar.gz", identity: runnerA, wantCode: 404, wantBody: "not found"},
		{name: "invalid generation", path: "/programs/team-a/broken/2.tar.gz", identity: runnerA, wantCode: 409, wantBody: "main.tf:1:9: Unclosed configuration block"},
		{name: "generation not yet checked", path: "/programs/team-a/new/1.tar.gz", identity: runnerA, wantCode: 503, wantBody: "not yet checked"},
		{name: "not a number", path: "/programs/team-a/net/x.tar.gz", identity: runnerA, wantCode: 404},
		{name: "leading zero", path: "/programs/team-a/net/03.tar.gz", identity: runnerA, wantCode: 404},
		{name: "generation zero", path: "/programs/team-a/net/0.tar.gz", identity: runnerA, wantCode: 404},
		{name: "other extension", path: "/programs/team-a/net/3.tgz", identity: runnerA, wantCode: 404},
		{name: "directory", path: "/programs/team-a/", identity: runnerA, wantCode: 404},
		{name: "other path", path: "/state/team-a/x", identity: runnerA, wantCode: 404},
		{name: "post", method: http.MethodPost, path: "/programs/team-a/net/3.tar.gz", identity: runnerA, wantCode: 405},
	} {
		t.Run(tc.name, func(t *testing.T) {
			method := tc.method
			if method == "" {
				method = http.MethodGet
			}
			req := httptest.NewRequest(method, tc.path, nil)
			req.TLS = p.connectionState(t, tc.identity)
			if tc.ifNoneMatch != "" {
				req.Header.Set("If-None-Match", tc.ifNoneMatch)
			}
			before := counterValue(t, fmt.Sprint(tc.wantCode))
			rec := httptest.NewRecorder()
			handler.ServeHTTP(rec, req)
			if rec.Code != tc.wantCode {
				t.Fatalf("code %d, want %d; body %q", rec.Code, tc.wantCode, rec.Body.String())
			}
			if !strings.Contains(rec.Body.String(), tc.wantBody) {
				t.Fatalf("body %q does not contain %q", rec.Body.String(), tc.wantBody)
			}
			if counterValue(t, fmt.Sprint(tc.wantCode))-before != 1 {
				t.Fatalf("terrace_artifact_requests_total{code=%d} did not count the request", tc.wantCode)
			}
			if tc.wantCode == 200 || tc.wantCode == 304 {
				if got := rec.Header().Get("ETag"); got != `"`+digest+`"` {
					t.Fatalf("ETag %q", got)
				}
			}
			if tc.wantCode == 200 {
				if rec.Header().Get("Content-Length") != fmt.Sprint(len(data)) || rec.Header().Get("Content-Type") != "application/gzip" {
					t.Fatalf("headers %v", rec.Header())
				}
				if tc.wantBody != "" && artifact.Digest(rec.Body.Bytes()) != digest {
					t.Fatal("served bytes do not have the advertised digest")
				}
			}
		})
	}
	if n := srv.programs.cache.len(); n != 1 {
		t.Fatalf("cache holds %d artifacts, want 1", n)
	}
}

func TestServerReadsLiveWhenTheCacheLags(t *testing.T) {
	p := newPeers(t)
	old := testProgram("ns", "p", 1, map[string]string{"main.tf": "locals { v = 1 }\n"})
	newer := testProgram("ns", "p", 2, map[string]string{"main.tf": "locals { v = 2 }\n"})
	created := testProgram("ns", "fresh", 1, map[string]string{"main.tf": "locals {}\n"})
	// The cache has generation 2 of "fixed" from before the controller
	// judged it; the API server has the verdict.
	fixedFiles := map[string]string{"main.tf": "locals { w = 2 }\n"}
	fixedCached := testProgram("ns", "fixed", 2, fixedFiles)
	fixedCached.Status.Conditions[0].ObservedGeneration = 1
	fixedLive := testProgram("ns", "fixed", 2, fixedFiles)
	srv := p.server(t, ServerOptions{}, readerWith(t, old, fixedCached), readerWith(t, newer, created, fixedLive))
	for path, want := range map[string]*terracev1.Program{"/programs/ns/p/2.tar.gz": newer, "/programs/ns/fresh/1.tar.gz": created, "/programs/ns/fixed/2.tar.gz": fixedLive} {
		req := httptest.NewRequest(http.MethodGet, path, nil)
		req.TLS = p.connectionState(t, pki.RunnerIdentity("ns", "s", "r"))
		rec := httptest.NewRecorder()
		srv.Handler().ServeHTTP(rec, req)
		_, digest, _ := BuildProgram(want)
		if rec.Code != 200 || artifact.Digest(rec.Body.Bytes()) != digest {
			t.Fatalf("%s: code %d, body %q", path, rec.Code, rec.Body.String())
		}
	}

	// A cached copy whose status predates the controller's verdict is not
	// served: the live copy says the generation is invalid.
	brokenFiles := map[string]string{"main.tf": "locals {\n"}
	brokenCached := testProgram("ns", "broken", 3, brokenFiles)
	brokenCached.Status.Conditions[0].ObservedGeneration = 2
	srv = p.server(t, ServerOptions{}, readerWith(t, brokenCached), readerWith(t, invalidProgram("ns", "broken", 3, brokenFiles, "main.tf:1:9: Unclosed")))
	req := httptest.NewRequest(http.MethodGet, "/programs/ns/broken/3.tar.gz", nil)
	req.TLS = p.connectionState(t, pki.RunnerIdentity("ns", "s", "r"))
	rec := httptest.NewRecorder()
	srv.Handler().ServeHTTP(rec, req)
	if rec.Code != http.StatusConflict || !strings.Contains(rec.Body.String(), "Unclosed") {
		t.Fatalf("a generation whose verdict the cache lacks: code %d, body %q", rec.Code, rec.Body.String())
	}
}

func TestLRUCacheEvictsTheLeastRecentlyUsed(t *testing.T) {
	c := newLRUCache(10)
	c.add("a", builtArtifact{data: make([]byte, 4)})
	c.add("b", builtArtifact{data: make([]byte, 4)})
	c.get("a")
	c.add("c", builtArtifact{data: make([]byte, 4)}) // evicts b
	if _, ok := c.get("b"); ok {
		t.Fatal("b survived")
	}
	if _, ok := c.get("a"); !ok {
		t.Fatal("a was evicted though recently used")
	}
	c.add("huge", builtArtifact{data: make([]byte, 11)})
	if _, ok := c.get("huge"); ok || c.len() != 2 {
		t.Fatalf("an entry larger than the cache was kept; len %d", c.len())
	}
	disabled := newLRUCache(-1)
	disabled.add("a", builtArtifact{data: make([]byte, 1)})
	if disabled.len() != 0 {
		t.Fatal("a disabled cache kept an entry")
	}
}

func TestAdvertisedBaseURL(t *testing.T) {
	if got, _ := (ServerOptions{ListenAddress: ":9443"}).AdvertisedBaseURL("terrace-system"); got != "https://terrace-controller.terrace-system.svc:9443" {
		t.Fatal(got)
	}
	if got, _ := (ServerOptions{BaseURL: "https://127.0.0.1:8443/"}).AdvertisedBaseURL(""); got != "https://127.0.0.1:8443" {
		t.Fatal(got)
	}
	if _, err := (ServerOptions{}).AdvertisedBaseURL(""); err == nil {
		t.Fatal("no namespace and no base URL accepted")
	}
	if got := ProgramURL("https://h:1/", "ns", "p", 7); got != "https://h:1/programs/ns/p/7.tar.gz" {
		t.Fatal(got)
	}
}

// startServer runs srv on a free loopback port until the test ends and
// returns its base URL.
func startServer(tb testing.TB, p peers, cached client.Reader, opts ServerOptions) (*Server, string) {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	opts.ListenAddress = addr
	srv := p.server(tb, opts, cached, nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Start(ctx) }()
	tb.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			tb.Errorf("server stopped with %v", err)
		}
	})
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			_ = c.Close()
			break
		}
		if time.Now().After(deadline) {
			tb.Fatalf("server did not listen on %s: %v", addr, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return srv, "https://" + addr
}

func (p peers) httpClient(tb testing.TB, id pki.Identity) *http.Client {
	var source pki.CertificateSource
	if id != "" {
		cert, err := p.leaf(tb, id).TLSCertificate()
		if err != nil {
			tb.Fatal(err)
		}
		source = pki.StaticCertificate(cert)
	}
	return &http.Client{
		Timeout:   10 * time.Second,
		Transport: &http.Transport{TLSClientConfig: pki.ClientTLSConfig(source, p.authority, pki.ControllerIdentity)},
	}
}

func TestServerOverTLS(t *testing.T) {
	p := newPeers(t)
	prog := testProgram("ns", "p", 1, map[string]string{"main.tf": "locals {}\n"})
	_, base := startServer(t, p, readerWith(t, prog), ServerOptions{})
	url := ProgramURL(base, "ns", "p", 1)
	_, digest, _ := BuildProgram(prog)

	data, err := artifact.Fetch(context.Background(), p.httpClient(t, pki.RunnerIdentity("ns", "s", "r")), url, digest, 1<<20)
	if err != nil || artifact.Digest(data) != digest {
		t.Fatalf("fetch: %v", err)
	}
	resp, err := p.httpClient(t, pki.RunnerIdentity("ns", "s", "r")).Get(url)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	if resp.ProtoMajor != 1 || resp.TLS == nil || resp.TLS.Version < tls.VersionTLS12 {
		t.Fatalf("protocol %s, TLS %v", resp.Proto, resp.TLS)
	}

	var status *artifact.FetchStatusError
	if _, err := artifact.Fetch(context.Background(), p.httpClient(t, pki.RunnerIdentity("other", "s", "r")), url, digest, 1<<20); !errors.As(err, &status) || status.StatusCode != http.StatusForbidden {
		t.Fatalf("want 403, got %v", err)
	}
	if _, err := p.httpClient(t, "").Get(url); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("a client without a certificate was not refused at the handshake: %v", err)
	}
	// A digest that does not match is refused by artifact.Fetch.
	if _, err := artifact.Fetch(context.Background(), p.httpClient(t, pki.ControllerIdentity), url, artifact.Digest([]byte("x")), 1<<20); err == nil || !strings.Contains(err.Error(), "digest mismatch") {
		t.Fatalf("want a digest mismatch, got %v", err)
	}
	if _, err := artifact.Fetch(context.Background(), p.httpClient(t, pki.ControllerIdentity), url, digest, 10); err == nil || !strings.Contains(err.Error(), "more than 10") {
		t.Fatalf("want a size error, got %v", err)
	}
}

func TestServerOptionsBindFlags(t *testing.T) {
	var o ServerOptions
	fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
	o.BindFlags(fs)
	if o.ListenAddress != DefaultListenAddress || o.CacheBytes != DefaultCacheBytes {
		t.Fatalf("defaults: %+v", o)
	}
	if err := fs.Parse([]string{"--artifact-bind-address=127.0.0.1:8443", "--artifact-base-url=https://127.0.0.1:8443"}); err != nil {
		t.Fatal(err)
	}
	if got, _ := o.AdvertisedBaseURL("ignored"); o.ListenAddress != "127.0.0.1:8443" || got != "https://127.0.0.1:8443" {
		t.Fatalf("after parse: %+v", o)
	}
}

// currentRuns is a RunChecker over a fixed set of current runs, each
// asked from the pod its certificate is bound to.
type currentRuns map[string]bool

func (c currentRuns) IsCurrentRun(_ context.Context, namespace, stack, runID, podUID string) (bool, error) {
	return c[namespace+"/"+stack+"/"+runID+"/"+podUID], nil
}

// The attack: a runner's certificate kept from a finished run fetches the
// namespace's Programs after the run. Only the current run may.
func TestServerRefusesRunnersOfFinishedRuns(t *testing.T) {
	p := newPeers(t)
	prog := testProgram("ns", "p", 1, map[string]string{"main.tf": "locals {}\n"})
	srv := p.server(t, ServerOptions{}, readerWith(t, prog), nil)
	srv.CheckRuns(currentRuns{"ns/s/run-2/" + testPodUID: true})
	handler := srv.Handler()
	for _, tc := range []struct {
		identity pki.Identity
		want     int
	}{
		{pki.RunnerIdentity("ns", "s", "run-2"), http.StatusOK},
		{pki.RunnerIdentity("ns", "s", "run-1"), http.StatusForbidden},
		{pki.ControllerIdentity, http.StatusOK},
	} {
		req := httptest.NewRequest(http.MethodGet, "/programs/ns/p/1.tar.gz", nil)
		req.TLS = p.connectionState(t, tc.identity)
		rec := httptest.NewRecorder()
		handler.ServeHTTP(rec, req)
		if rec.Code != tc.want {
			t.Fatalf("%s: %d %s, want %d", tc.identity, rec.Code, rec.Body, tc.want)
		}
	}
}
