package artifact

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
)

// recordingServer counts the connections made to it, so a test can show
// that a refused host was never contacted.
type recordingServer struct {
	*httptest.Server
	conns      atomic.Int64
	userAgents chan string
}

func newRecordingServer(t *testing.T, h http.HandlerFunc) *recordingServer {
	t.Helper()
	rs := &recordingServer{userAgents: make(chan string, 16)}
	rs.Server = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case rs.userAgents <- r.UserAgent():
		default:
		}
		h(w, r)
	}))
	rs.Config.ConnState = func(_ net.Conn, state http.ConnState) {
		if state == http.StateNew {
			rs.conns.Add(1)
		}
	}
	rs.Start()
	t.Cleanup(rs.Close)
	return rs
}

func (rs *recordingServer) hostPort() string { return strings.TrimPrefix(rs.URL, "http://") }

func mustAllow(t *testing.T, entries ...string) *HostAllowlist {
	t.Helper()
	a, err := ParseHostAllowlist(entries)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

const secretBody = "aws_secret_access_key=do-not-leak"

func TestHostAllowlist(t *testing.T) {
	a := mustAllow(t, "source-controller.flux-system.svc.cluster.local", "artifacts.example.com:8443", "[::1]:9000", " ")
	cases := []struct {
		url  string
		want bool
	}{
		{"http://source-controller.flux-system.svc.cluster.local./gitrepository/ns/repo/abc.tar.gz", true}, // Flux's own form, trailing dot
		{"http://Source-Controller.flux-system.svc.cluster.local:9090/x", true},                            // any port, any case
		{"https://artifacts.example.com:8443/x.tar.gz", true},
		{"https://artifacts.example.com/x.tar.gz", false}, // 443 is not 8443
		{"http://[::1]:9000/x", true},
		{"http://[::1]:9001/x", false},
		{"http://source-controller.flux-system.svc.cluster.local.evil.com/x", false},
		{"http://evil.com/source-controller.flux-system.svc.cluster.local/x", false},
		{"http://127.0.0.1:18999/creds", false},
		{"http://169.254.169.254/latest/meta-data/", false},
		{"file:///etc/passwd", false},
		{"ftp://source-controller.flux-system.svc.cluster.local/x", false},
	}
	for _, tc := range cases {
		u, err := url.Parse(tc.url)
		if err != nil {
			t.Fatal(err)
		}
		if got := a.Allows(u); got != tc.want {
			t.Errorf("Allows(%s) = %v, want %v", tc.url, got, tc.want)
		}
	}
	var none *HostAllowlist
	if none.Allows(&url.URL{Scheme: "http", Host: "localhost"}) || mustAllow(t).Allows(&url.URL{Scheme: "http", Host: "localhost"}) {
		t.Error("a nil or empty allowlist allowed a host")
	}
	if got := a.String(); got != "source-controller.flux-system.svc.cluster.local,artifacts.example.com:8443,[::1]:9000" {
		t.Errorf("String() = %q", got)
	}
}

func TestHostAllowlistRefusesMalformedEntries(t *testing.T) {
	for _, entry := range []string{"http://source-controller", "host/path", "user@host", "host:0", "host:99999", "host:http", ":80"} {
		if _, err := ParseHostAllowlist([]string{entry}); err == nil {
			t.Errorf("entry %q was accepted", entry)
		}
	}
}

func TestSourceClientRefusesAHostOffTheListWithoutConnecting(t *testing.T) {
	internal := newRecordingServer(t, func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte(secretBody)) })
	client := NewSourceClient(mustAllow(t, "source-controller.flux-system.svc"), "terrace-controller")
	_, err := Fetch(context.Background(), client, internal.URL+"/creds", Digest([]byte(secretBody)), 1<<20)
	var refused *HostNotAllowedError
	if !errors.As(err, &refused) || refused.Host != internal.hostPort() {
		t.Fatalf("want HostNotAllowedError naming %s, got %v", internal.hostPort(), err)
	}
	if errors.Is(err, ErrUnreachable) {
		t.Errorf("a refused host is reported as unreachable: %v", err)
	}
	if n := internal.conns.Load(); n != 0 {
		t.Fatalf("the refused host got %d connections", n)
	}
	if _, err := Fetch(context.Background(), NewSourceClient(nil, ""), internal.URL+"/creds", Digest([]byte(secretBody)), 1<<20); !errors.As(err, &refused) || internal.conns.Load() != 0 {
		t.Fatalf("a client without an allowlist fetched: %v", err)
	}
}

func TestSourceClientRefusesARedirectOffTheList(t *testing.T) {
	internal := newRecordingServer(t, func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte(secretBody)) })
	allowed := newRecordingServer(t, func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/away":
			http.Redirect(w, r, internal.URL+"/creds", http.StatusFound)
		case "/here":
			http.Redirect(w, r, "/artifact.tar.gz", http.StatusFound)
		default:
			_, _ = w.Write([]byte(secretBody))
		}
	})
	client := NewSourceClient(mustAllow(t, allowed.hostPort()), "terrace-controller")

	_, err := Fetch(context.Background(), client, allowed.URL+"/away", Digest([]byte(secretBody)), 1<<20)
	var refused *HostNotAllowedError
	if !errors.As(err, &refused) || refused.Host != internal.hostPort() {
		t.Fatalf("want the redirect refused naming %s, got %v", internal.hostPort(), err)
	}
	if n := internal.conns.Load(); n != 0 {
		t.Fatalf("the redirect target got %d connections", n)
	}
	// A redirect within the allowed host is followed.
	data, err := Fetch(context.Background(), client, allowed.URL+"/here", Digest([]byte(secretBody)), 1<<20)
	if err != nil || string(data) != secretBody {
		t.Fatalf("redirect within the allowed host: %v", err)
	}
	if ua := <-allowed.userAgents; ua != "terrace-controller" {
		t.Errorf("User-Agent = %q", ua)
	}
}

func TestFetchErrorsNeverQuoteTheAnswer(t *testing.T) {
	srv := newRecordingServer(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/missing" {
			w.WriteHeader(http.StatusNotFound)
		}
		_, _ = w.Write([]byte(secretBody))
	})
	client := NewExternalClient("terrace-runner")
	realDigest := Digest([]byte(secretBody))

	_, err := Fetch(context.Background(), client, srv.URL+"/missing?token=abc", realDigest, 1<<20)
	var status *FetchStatusError
	if !errors.As(err, &status) || status.StatusCode != http.StatusNotFound {
		t.Fatalf("want a 404, got %v", err)
	}
	if want := "HTTP 404 from " + srv.hostPort(); err.Error() != want {
		t.Errorf("404 message = %q, want %q", err, want)
	}

	wrong := Digest([]byte("something else"))
	_, err = Fetch(context.Background(), client, srv.URL+"/creds?token=abc", wrong, 1<<20)
	var mismatch *DigestMismatchError
	if !errors.As(err, &mismatch) || mismatch.Got != realDigest {
		t.Fatalf("want a digest mismatch, got %v", err)
	}
	for _, leak := range []string{secretBody, "do-not-leak", realDigest, strings.TrimPrefix(realDigest, "sha256:"), "token=abc"} {
		if strings.Contains(err.Error(), leak) {
			t.Errorf("mismatch message %q quotes %q", err, leak)
		}
	}
	if !strings.Contains(err.Error(), wrong) {
		t.Errorf("mismatch message %q does not name the expected digest", err)
	}

	_, err = Fetch(context.Background(), client, srv.URL+"/creds", realDigest, 8)
	if !errors.Is(err, ErrLimitExceeded) {
		t.Fatalf("want a size error, got %v", err)
	}
}

func TestFetchReportsAnUnreachableServer(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close() // nothing listens there now
	_, err = Fetch(context.Background(), NewExternalClient(""), "http://user:pw@"+addr+"/x.tar.gz", Digest(nil), 1<<20)
	if !errors.Is(err, ErrUnreachable) {
		t.Fatalf("want ErrUnreachable, got %v", err)
	}
	if strings.Contains(err.Error(), "pw") {
		t.Errorf("message %q quotes the URL's credentials", err)
	}
}
