package pki

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/x509"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/terrace-dev/terrace/internal/pki/pkitest"
)

func TestRunnerIdentityRoundTrip(t *testing.T) {
	id := RunnerIdentity("team-a", "network.prod", "01hx3k")
	if id != "terrace://runner/team-a/network.prod/01hx3k" {
		t.Fatalf("unexpected identity %q", id)
	}
	ns, stack, run, ok := id.Runner()
	if !ok || ns != "team-a" || stack != "network.prod" || run != "01hx3k" {
		t.Fatalf("Runner() = %q %q %q %v", ns, stack, run, ok)
	}
	if err := id.Validate(); err != nil {
		t.Fatal(err)
	}
	if _, _, _, ok := ControllerIdentity.Runner(); ok {
		t.Fatal("the controller identity is not a runner identity")
	}
}

func TestIdentityValidate(t *testing.T) {
	for _, bad := range []Identity{
		"", "terrace://controller/", "terrace://runner/ns/stack", "terrace://runner/ns/stack/run/extra",
		"terrace://runner/ns//run", "terrace://runner/NS/stack/run", "terrace://runner/ns/st%61ck/run",
		"spiffe://runner/ns/stack/run", "terrace://admin",
	} {
		if err := bad.Validate(); err == nil {
			t.Errorf("%q validated", bad)
		}
	}
}

func TestIdentityFromCertificate(t *testing.T) {
	uri := func(s string) *url.URL {
		u, err := url.Parse(s)
		if err != nil {
			t.Fatal(err)
		}
		return u
	}
	cases := []struct {
		name    string
		uris    []*url.URL
		want    Identity
		wantErr string
	}{
		{name: "one identity", uris: []*url.URL{uri("terrace://controller")}, want: ControllerIdentity},
		{name: "other schemes ignored", uris: []*url.URL{uri("spiffe://cluster/x"), uri("terrace://controller")}, want: ControllerIdentity},
		{name: "none", uris: []*url.URL{uri("spiffe://cluster/x")}, wantErr: "no terrace identity"},
		{name: "two", uris: []*url.URL{uri("terrace://controller"), uri(string(testRunner))}, wantErr: "2 terrace identities"},
		{name: "invalid", uris: []*url.URL{uri("terrace://admin")}, wantErr: "not a terrace identity"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := IdentityFromCertificate(&x509.Certificate{URIs: tc.uris})
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("got %q, %v; want error %q", got, err, tc.wantErr)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("got %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}

// TestIssuedLeaf checks what peers and hostname-verifying clients rely on.
func TestIssuedLeaf(t *testing.T) {
	a := mustAuthority(t, Options{})
	leaf, err := a.Issue(LeafRequest{Identity: testRunner, Validity: 2 * time.Hour, DNSNames: []string{"state.terrace-system.svc"}, IPAddresses: []net.IP{net.ParseIP("127.0.0.9")}})
	if err != nil {
		t.Fatal(err)
	}
	c, err := leaf.Certificate()
	if err != nil {
		t.Fatal(err)
	}
	if id, err := IdentityFromCertificate(c); err != nil || id != testRunner {
		t.Fatalf("identity %q, %v", id, err)
	}
	if _, ok := c.PublicKey.(*ecdsa.PublicKey); !ok || c.PublicKey.(*ecdsa.PublicKey).Curve != elliptic.P256() {
		t.Fatalf("want an ECDSA P-256 key, got %T", c.PublicKey)
	}
	if c.SerialNumber.BitLen() < 64 || c.SerialNumber.BitLen() > 128 {
		t.Fatalf("serial %d bits, want a random 128-bit number", c.SerialNumber.BitLen())
	}
	if life := c.NotAfter.Sub(c.NotBefore); life > 2*time.Hour+clockSkew || life < 2*time.Hour {
		t.Fatalf("lifetime %s, want 2h plus the clock-skew backdate", life)
	}
	pool, err := leaf.TrustPool()
	if err != nil {
		t.Fatal(err)
	}
	// A client that checks hostnames (tofu's http backend) accepts the DNS and IP SANs.
	for _, name := range []string{"state.terrace-system.svc", "127.0.0.9"} {
		if _, err := c.Verify(x509.VerifyOptions{Roots: pool, DNSName: name}); err != nil {
			t.Fatalf("hostname %s: %v", name, err)
		}
	}
	if _, err := a.Issue(LeafRequest{Identity: testRunner, Validity: 48 * time.Hour}); err == nil {
		t.Fatal("issued a leaf longer than the maximum validity")
	}
	if _, err := a.Issue(LeafRequest{Identity: "terrace://admin", Validity: time.Hour}); err == nil {
		t.Fatal("issued a leaf for an invalid identity")
	}
	other, err := a.Issue(LeafRequest{Identity: testRunner, Validity: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	oc, _ := other.Certificate()
	if oc.SerialNumber.Cmp(c.SerialNumber) == 0 {
		t.Fatal("two leaves share a serial number")
	}
}

// TestIdentityFromRequest serves HTTP with ServerTLSConfig, as the state
// server does, and reads the caller's identity in the handler.
func TestIdentityFromRequest(t *testing.T) {
	a := mustAuthority(t, Options{})
	serverCert := NewIssuedCertificate(a, LeafRequest{Identity: ControllerIdentity, Validity: time.Hour})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{
		ReadHeaderTimeout: 5 * time.Second,
		TLSConfig:         ServerTLSConfig(serverCert, a, nil),
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			id, err := IdentityFromRequest(r)
			if err != nil {
				http.Error(w, err.Error(), http.StatusForbidden)
				return
			}
			_, _ = io.WriteString(w, string(id))
		}),
	}
	served := make(chan error, 1)
	go func() { served <- srv.ServeTLS(ln, "", "") }()
	defer func() {
		_ = srv.Close()
		if err := <-served; err != http.ErrServerClosed {
			t.Errorf("server: %v", err)
		}
	}()

	runnerCert := NewIssuedCertificate(a, LeafRequest{Identity: testRunner, Validity: time.Hour})
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: ClientTLSConfig(runnerCert, a, ControllerIdentity)}}
	defer client.CloseIdleConnections()
	resp, err := client.Get("https://" + ln.Addr().String() + "/state/team-a/network/default")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK || string(body) != string(testRunner) {
		t.Fatalf("got %d %q, want the runner identity", resp.StatusCode, body)
	}
}

func TestIssuedCertificateRenews(t *testing.T) {
	clock := pkitest.NewClock(time.Now())
	a := mustAuthority(t, Options{Clock: clock.Now})
	src := NewIssuedCertificate(a, LeafRequest{Identity: ControllerIdentity, Validity: 2 * time.Hour})
	first, err := src.Certificate()
	if err != nil {
		t.Fatal(err)
	}
	clock.Advance(30 * time.Minute)
	if again, _ := src.Certificate(); again != first {
		t.Fatal("reissued before half the lifetime passed")
	}
	clock.Advance(31 * time.Minute)
	renewed, _ := src.Certificate()
	if renewed == first {
		t.Fatal("not reissued after half the lifetime passed")
	}
	// A CA replaced outright (the Secret was deleted and recreated) makes the leaf untrusted: reissue at once.
	replacement, err := GenerateCA(DefaultCAValidity, clock.Now())
	if err != nil {
		t.Fatal(err)
	}
	if err := a.SetCAs(replacement, nil); err != nil {
		t.Fatal(err)
	}
	fresh, _ := src.Certificate()
	if fresh == renewed {
		t.Fatal("kept a leaf whose CA is no longer trusted")
	}
	if _, err := fresh.Leaf.Verify(x509.VerifyOptions{Roots: a.TrustPool(), CurrentTime: clock.Now()}); err != nil {
		t.Fatalf("reissued leaf does not chain to the new CA: %v", err)
	}
}

func TestAPIIdentity(t *testing.T) {
	id := APIIdentity("team-a")
	if err := id.Validate(); err != nil {
		t.Fatal(err)
	}
	if ns, ok := id.API(); !ok || ns != "team-a" {
		t.Errorf("API() = %q, %v", ns, ok)
	}
	if _, _, _, ok := id.Runner(); ok || id == ControllerIdentity {
		t.Error("an API identity passes for a runner or the controller")
	}
	for _, bad := range []Identity{"terrace://api/", "terrace://api/Team", "terrace://api/a/b", "terrace://api/a.b"} {
		if _, ok := bad.API(); ok {
			t.Errorf("%s accepted", bad)
		}
	}
}

// TestRunnerClassIdentityNamesNoStack: a warm runner's identity parses as
// a class identity and never as a run's, so nothing that admits runs of a
// Stack admits it.
func TestRunnerClassIdentityNamesNoStack(t *testing.T) {
	id := RunnerClassIdentity("team-a", "c0ffee", "terrace-warm-x1")
	if err := id.Validate(); err != nil {
		t.Fatalf("Validate(%s) = %v", id, err)
	}
	ns, class, pod, ok := id.RunnerClass()
	if !ok || ns != "team-a" || class != "c0ffee" || pod != "terrace-warm-x1" {
		t.Errorf("RunnerClass() = %q %q %q %v", ns, class, pod, ok)
	}
	if _, _, _, ok := id.Runner(); ok {
		t.Errorf("%s parses as a run identity", id)
	}
	if _, _, _, ok := RunnerIdentity("team-a", "class", "x").RunnerClass(); ok {
		t.Errorf("a run of a Stack named class parses as a class identity")
	}
}

func TestReadOnlyRunnerIdentityIsNoRunIdentity(t *testing.T) {
	id := ReadOnlyRunnerIdentity("team-a", "web", "pr-12-0a1b2c")
	if id != "terrace://runner/team-a/web/pr-12-0a1b2c/read-only" {
		t.Fatalf("unexpected identity %q", id)
	}
	if err := id.Validate(); err != nil {
		t.Fatalf("Validate(%s) = %v", id, err)
	}
	ns, stack, run, ok := id.ReadOnlyRunner()
	if !ok || ns != "team-a" || stack != "web" || run != "pr-12-0a1b2c" {
		t.Errorf("ReadOnlyRunner() = %q %q %q %v", ns, stack, run, ok)
	}
	// Every server that admits runs by Runner() refuses it: the artifact
	// server, the runner's claim, a run's own access to its state.
	if _, _, _, ok := id.Runner(); ok {
		t.Errorf("%s parses as a run identity", id)
	}
	if _, _, _, ok := RunnerIdentity("team-a", "web", "read-only").ReadOnlyRunner(); ok {
		t.Errorf("a run named read-only parses as a read-only identity")
	}
	for _, bad := range []Identity{"terrace://runner/team-a/web/run/x/read-only", "terrace://runner/team-a/WEB/run/read-only"} {
		if err := bad.Validate(); err == nil {
			t.Errorf("%q validated", bad)
		}
	}
}
