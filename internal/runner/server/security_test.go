package server

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/terrace-dev/terrace/internal/pki"
	"github.com/terrace-dev/terrace/internal/runner"
	runnerv1 "github.com/terrace-dev/terrace/proto/terrace/runner/v1"
)

func TestHandshakeRefusesAnyoneButTheController(t *testing.T) {
	tr := startRunner(t, nil)
	other := newAuthority(t)
	trust := pki.TrustFunc(tr.authority.TrustPool)
	cases := []struct {
		name string
		cert pki.CertificateSource
	}{
		{"no client certificate", nil},
		{"certificate from another CA", certSource(t, issue(t, other, pki.ControllerIdentity))},
		{"runner identity instead of the controller", certSource(t, issue(t, tr.authority, testRunnerIdentity))},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := tr.dial(t, runner.ClientTLSConfig(tc.cert, trust, testRunnerIdentity))
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			err := c.Health(ctx)
			if status.Code(err) != codes.Unavailable {
				t.Fatalf("health check answered %v, want Unavailable from a refused handshake", err)
			}
			_, err = c.Fetch(ctx, "https://127.0.0.1:1/x.tar.gz", "sha256:"+strings.Repeat("0", 64))
			if status.Code(err) != codes.Unavailable {
				t.Fatalf("fetch answered %v, want Unavailable", err)
			}
		})
	}
	t.Run("client refuses a runner with another identity", func(t *testing.T) {
		controller := certSource(t, issue(t, tr.authority, pki.ControllerIdentity))
		c := tr.dial(t, runner.ClientTLSConfig(controller, trust, pki.RunnerIdentity("team-a", "web", "run-2")))
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := c.Health(ctx); status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "run-2") {
			t.Fatalf("health check answered %v, want Unavailable naming the expected identity", err)
		}
	})
	t.Run("the controller is accepted", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := tr.client.Health(ctx); err != nil {
			t.Fatalf("controller health check failed: %v", err)
		}
	})
}

type tarEntry struct {
	name, linkname, body string
	typeflag             byte
}

func hostileArchive(t *testing.T, entries []tarEntry) ([]byte, string) {
	t.Helper()
	var buf bytes.Buffer
	gz := gzip.NewWriter(&buf)
	tw := tar.NewWriter(gz)
	for _, e := range entries {
		hdr := &tar.Header{Name: e.name, Linkname: e.linkname, Typeflag: e.typeflag, Mode: 0o644, Size: int64(len(e.body))}
		if e.typeflag != tar.TypeReg {
			hdr.Size = 0
		}
		if err := tw.WriteHeader(hdr); err != nil {
			t.Fatal(err)
		}
		if e.typeflag == tar.TypeReg {
			if _, err := tw.Write([]byte(e.body)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := gz.Close(); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(buf.Bytes())
	return buf.Bytes(), "sha256:" + hex.EncodeToString(sum[:])
}

func TestUploadRefusesUnsafeArchives(t *testing.T) {
	const maxArchive = 64 << 10
	tr := startRunner(t, nil, func(c *Config) { c.MaxArchiveBytes = maxArchive })
	good := `resource "terraform_data" "a" {}`
	random := make([]byte, 3*maxArchive)
	if _, err := rand.Read(random); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name    string
		entries []tarEntry
		digest  string // overrides the right digest
		reason  string
		mention string
	}{
		{name: "dot-dot entry", entries: []tarEntry{{name: "main.tf", body: good, typeflag: tar.TypeReg}, {name: "../evil.tf", body: "pwned", typeflag: tar.TypeReg}}, reason: runner.ReasonUnsafeArchive, mention: "../evil.tf"},
		{name: "absolute path", entries: []tarEntry{{name: "/tmp/evil-absolute.tf", body: "pwned", typeflag: tar.TypeReg}}, reason: runner.ReasonUnsafeArchive, mention: "/tmp/evil-absolute.tf"},
		{name: "symlink escaping the root", entries: []tarEntry{{name: "main.tf", body: good, typeflag: tar.TypeReg}, {name: "escape", linkname: "../../..", typeflag: tar.TypeSymlink}, {name: "escape/evil.tf", body: "pwned", typeflag: tar.TypeReg}}, reason: runner.ReasonUnsafeArchive, mention: "escape"},
		{name: "digest mismatch", entries: []tarEntry{{name: "main.tf", body: good, typeflag: tar.TypeReg}}, digest: "sha256:" + strings.Repeat("ab", 32), reason: runner.ReasonDigestMismatch, mention: "digest"},
		{name: "oversize archive", entries: []tarEntry{{name: "big.bin", body: string(random), typeflag: tar.TypeReg}}, reason: runner.ReasonTooLarge, mention: "larger than"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			data, digest := hostileArchive(t, tc.entries)
			if tc.digest != "" {
				digest = tc.digest
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			_, err := tr.client.Upload(ctx, digest, bytes.NewReader(data))
			if status.Code(err) != codes.InvalidArgument || runner.Reason(err) != tc.reason {
				t.Fatalf("upload answered %v (reason %q), want InvalidArgument %s", err, runner.Reason(err), tc.reason)
			}
			if !strings.Contains(status.Convert(err).Message(), tc.mention) {
				t.Errorf("error %q does not mention %q", status.Convert(err).Message(), tc.mention)
			}
			if outside := tr.filesOutside(t); len(outside) > 0 {
				t.Fatalf("files written outside the work dir: %v", outside)
			}
			// Nothing of a refused archive stays in the source either.
			if _, err := tr.client.Init(ctx, &runnerv1.InitRequest{}, nil); runner.Reason(err) != runner.ReasonNotReady {
				t.Fatalf("init after a refused upload answered %v, want %s", err, runner.ReasonNotReady)
			}
		})
	}
	// The runner still takes a good archive afterwards.
	tr.upload(t, map[string]string{"main.tf": good})
}

func TestFetchFromTheControllerOnly(t *testing.T) {
	tr := startRunner(t, nil)
	data, digest := buildArchive(t, map[string]string{"main.tf": `resource "terraform_data" "a" {}`})
	serve := func(t *testing.T, id pki.Identity) string {
		handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path != "/programs/team-a/web/1.tar.gz" {
				http.NotFound(w, r)
				return
			}
			_, _ = w.Write(data)
		})
		return serveTLS(t, handler, pki.ServerTLSConfig(certSource(t, issue(t, tr.authority, id)), pki.TrustFunc(tr.authority.TrustPool), nil))
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	controllerURL := serve(t, pki.ControllerIdentity)
	info, err := tr.client.Fetch(ctx, controllerURL+"/programs/team-a/web/1.tar.gz", digest)
	if err != nil {
		t.Fatalf("fetch failed: %v", err)
	}
	if info.GetDigest() != digest || info.GetSize() != int64(len(data)) {
		t.Errorf("fetch answered %v", info)
	}
	if _, err := tr.client.Init(ctx, &runnerv1.InitRequest{}, nil); err != nil {
		t.Fatalf("init of the fetched source failed: %v", err)
	}

	if _, err := tr.client.Fetch(ctx, controllerURL+"/programs/team-a/web/1.tar.gz", "sha256:"+strings.Repeat("cd", 32)); runner.Reason(err) != runner.ReasonDigestMismatch {
		t.Errorf("fetch with a wrong digest answered %v, want %s", err, runner.ReasonDigestMismatch)
	}
	if _, err := tr.client.Fetch(ctx, controllerURL+"/programs/team-a/web/2.tar.gz", digest); status.Code(err) != codes.NotFound {
		t.Errorf("fetch of a missing artifact answered %v, want NotFound", err)
	}
	impostorURL := serve(t, pki.RunnerIdentity("team-b", "other", "run-9"))
	if _, err := tr.client.Fetch(ctx, impostorURL+"/programs/team-a/web/1.tar.gz", digest); err == nil || !strings.Contains(err.Error(), "terrace://controller") {
		t.Errorf("fetch from a server that is not the controller answered %v, want a refusal", err)
	}
	if _, err := tr.client.Fetch(ctx, "http://127.0.0.1:1/x.tar.gz", digest); status.Code(err) != codes.InvalidArgument {
		t.Errorf("fetch over plain http answered %v, want InvalidArgument", err)
	}
}

// TestFetchExternalFromThePodItself: a Stack's spec.source.url is fetched
// by the runner, without its client certificate, and no answer's body or
// received digest comes back in an error.
func TestFetchExternalFromThePodItself(t *testing.T) {
	tr := startRunner(t, nil)
	data, digest := buildArchive(t, map[string]string{"main.tf": `resource "terraform_data" "a" {}`})
	const secret = "internal-credential-do-not-echo"
	userAgents := make(chan string, 8)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		userAgents <- r.UserAgent()
		switch r.URL.Path {
		case "/module.tar.gz":
			_, _ = w.Write(data)
		case "/creds":
			_, _ = w.Write([]byte(secret))
		default:
			w.WriteHeader(http.StatusNotFound)
			_, _ = w.Write([]byte(secret))
		}
	}))
	t.Cleanup(srv.Close)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	info, err := tr.client.FetchExternal(ctx, srv.URL+"/module.tar.gz", digest)
	if err != nil || info.GetDigest() != digest {
		t.Fatalf("external fetch: %v %v", info, err)
	}
	if ua := <-userAgents; ua != "terrace-runner" {
		t.Errorf("User-Agent %q, want terrace-runner", ua)
	}

	secretDigest := sha256.Sum256([]byte(secret))
	_, err = tr.client.FetchExternal(ctx, srv.URL+"/creds", digest)
	if runner.Reason(err) != runner.ReasonDigestMismatch {
		t.Fatalf("fetch of the wrong content answered %v, want %s", err, runner.ReasonDigestMismatch)
	}
	if msg := err.Error(); strings.Contains(msg, secret) || strings.Contains(msg, hex.EncodeToString(secretDigest[:])) || !strings.Contains(msg, digest) {
		t.Errorf("mismatch message quotes what was received, or not the digest expected: %s", msg)
	}
	_, err = tr.client.FetchExternal(ctx, srv.URL+"/missing", digest)
	if runner.Reason(err) != runner.ReasonFetchFailed || status.Code(err) != codes.NotFound {
		t.Fatalf("fetch of a missing URL answered %v, want NotFound %s", err, runner.ReasonFetchFailed)
	}
	if msg := status.Convert(err).Message(); strings.Contains(msg, secret) || !strings.Contains(msg, "HTTP 404 from "+strings.TrimPrefix(srv.URL, "http://")) {
		t.Errorf("404 message %q", msg)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := l.Addr().String()
	_ = l.Close()
	if _, err := tr.client.FetchExternal(ctx, "http://"+closed+"/x.tar.gz", digest); runner.Reason(err) != runner.ReasonFetchFailed || status.Code(err) != codes.Unavailable {
		t.Errorf("fetch from a closed port answered %v, want Unavailable %s", err, runner.ReasonFetchFailed)
	}
	if _, err := tr.client.FetchExternal(ctx, "file:///etc/passwd", digest); status.Code(err) != codes.InvalidArgument {
		t.Errorf("fetch of a file URL answered %v, want InvalidArgument", err)
	}
}
