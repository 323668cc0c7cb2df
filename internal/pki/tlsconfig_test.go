package pki

import (
	"crypto/tls"
	"crypto/x509"
	"strings"
	"testing"
	"time"

	"github.com/terrace-dev/terrace/internal/pki/pkitest"
)

// handshakeResult is what each side of one real TLS connection saw.
type handshakeResult struct {
	serverErr, clientErr   error
	serverPeer, clientPeer Identity
}

func (r handshakeResult) ok() bool { return r.serverErr == nil && r.clientErr == nil }

// handshake runs one real TLS connection (pkitest.Connect) and names each
// side's peer.
func handshake(t *testing.T, server, client *tls.Config) handshakeResult {
	t.Helper()
	h := pkitest.Connect(t, server, client)
	res := handshakeResult{serverErr: h.ServerErr, clientErr: h.ClientErr}
	if res.serverErr == nil {
		res.serverPeer, res.serverErr = PeerIdentity(&h.ServerState)
	}
	if res.clientErr == nil {
		res.clientPeer, res.clientErr = PeerIdentity(&h.ClientState)
	}
	return res
}

func mustAuthority(t *testing.T, opts Options) *Authority {
	t.Helper()
	a, err := NewAuthorityWithOptions(opts)
	if err != nil {
		t.Fatalf("failed to create authority: %v", err)
	}
	return a
}

func mustIssue(t *testing.T, a *Authority, id Identity) tls.Certificate {
	t.Helper()
	leaf, err := a.Issue(LeafRequest{Identity: id, Validity: time.Hour})
	if err != nil {
		t.Fatalf("failed to issue %s: %v", id, err)
	}
	cert, err := leaf.TLSCertificate()
	if err != nil {
		t.Fatal(err)
	}
	return cert
}

func issue(t *testing.T, a *Authority, id Identity, validity time.Duration) *Leaf {
	t.Helper()
	l, err := a.Issue(LeafRequest{Identity: id, Validity: validity})
	if err != nil {
		t.Fatalf("failed to issue %s: %v", id, err)
	}
	return l
}

var testRunner = RunnerIdentity("team-a", "network", "run-1")

// runnerServer is a runner's gRPC side: it accepts only the controller.
func runnerServer(cert tls.Certificate, trust TrustSource) *tls.Config {
	return ServerTLSConfig(StaticCertificate(cert), trust, RequireIdentity(ControllerIdentity))
}

// controllerClient is the controller dialling one run's runner.
func controllerClient(cert *tls.Certificate, trust TrustSource, runner Identity) *tls.Config {
	var src CertificateSource
	if cert != nil {
		src = StaticCertificate(*cert)
	}
	return ClientTLSConfig(src, trust, runner)
}

func TestHandshakeAcceptsExpectedIdentities(t *testing.T) {
	a := mustAuthority(t, Options{})
	controller := mustIssue(t, a, ControllerIdentity)
	for _, version := range []uint16{tls.VersionTLS12, tls.VersionTLS13} {
		client := controllerClient(&controller, a, testRunner)
		client.MaxVersion = version
		res := handshake(t, runnerServer(mustIssue(t, a, testRunner), a), client)
		if !res.ok() {
			t.Fatalf("version %x: handshake failed: server %v, client %v", version, res.serverErr, res.clientErr)
		}
		if res.serverPeer != ControllerIdentity || res.clientPeer != testRunner {
			t.Fatalf("version %x: server saw %q, client saw %q", version, res.serverPeer, res.clientPeer)
		}
	}
}

func TestHandshakeRefusals(t *testing.T) {
	a := mustAuthority(t, Options{})
	foreign := mustAuthority(t, Options{})
	controller := mustIssue(t, a, ControllerIdentity)
	foreignController := mustIssue(t, foreign, ControllerIdentity)
	otherRunner := mustIssue(t, a, RunnerIdentity("team-a", "network", "run-2"))
	runner := mustIssue(t, a, testRunner)

	past := time.Now().Add(-48 * time.Hour)
	expiredAuthority := mustAuthority(t, Options{Clock: func() time.Time { return past }})
	expiredController := mustIssue(t, expiredAuthority, ControllerIdentity)

	tls11 := controllerClient(&controller, a, testRunner)
	tls11.MinVersion, tls11.MaxVersion = tls.VersionTLS10, tls.VersionTLS11

	cases := []struct {
		name      string
		server    *tls.Config
		client    *tls.Config
		serverErr string // what the refusing side reports
		clientErr string
	}{
		{
			name:      "client without a certificate",
			server:    runnerServer(runner, a),
			client:    controllerClient(nil, a, testRunner),
			serverErr: "client didn't provide a certificate",
		},
		{
			name:      "client certificate from another CA",
			server:    runnerServer(runner, a),
			client:    controllerClient(&foreignController, a, testRunner),
			serverErr: "certificate signed by unknown authority",
		},
		{
			name:      "client with a runner identity where the controller is required",
			server:    runnerServer(runner, a),
			client:    controllerClient(&otherRunner, a, testRunner),
			serverErr: "is not terrace://controller",
		},
		{
			name:      "expired client certificate",
			server:    runnerServer(runner, trustAll(a, expiredAuthority)),
			client:    controllerClient(&expiredController, a, testRunner),
			serverErr: "expired",
		},
		{
			name:      "server with another run's identity",
			server:    runnerServer(otherRunner, a),
			client:    controllerClient(&controller, a, testRunner),
			clientErr: "is not the expected " + string(testRunner),
		},
		{
			name:      "server certificate from another CA",
			server:    runnerServer(mustIssue(t, foreign, testRunner), a),
			client:    controllerClient(&controller, a, testRunner),
			clientErr: "certificate signed by unknown authority",
		},
		{
			name:      "TLS 1.1 client",
			server:    runnerServer(runner, a),
			client:    tls11,
			serverErr: "unsupported versions",
		},
	}
	for _, tc := range cases {
		for _, version := range []uint16{tls.VersionTLS12, tls.VersionTLS13} {
			if tc.client.MaxVersion != 0 && version == tls.VersionTLS13 {
				continue // the case pins its own version
			}
			client := tc.client.Clone()
			if client.MaxVersion == 0 {
				client.MaxVersion = version
			}
			t.Run(tc.name+"/"+tls.VersionName(client.MaxVersion), func(t *testing.T) {
				res := handshake(t, tc.server, client)
				if res.serverErr == nil || res.clientErr == nil {
					t.Fatalf("want both sides to fail, got server %v, client %v", res.serverErr, res.clientErr)
				}
				if tc.serverErr != "" && !strings.Contains(res.serverErr.Error(), tc.serverErr) {
					t.Fatalf("server error %q does not mention %q", res.serverErr, tc.serverErr)
				}
				if tc.clientErr != "" && !strings.Contains(res.clientErr.Error(), tc.clientErr) {
					t.Fatalf("client error %q does not mention %q", res.clientErr, tc.clientErr)
				}
			})
		}
	}
}

// trustAll trusts the current CAs of several authorities, so an expired
// leaf is refused for its expiry and not for an unknown CA.
func trustAll(as ...*Authority) TrustSource {
	return TrustFunc(func() *x509.CertPool {
		pool := x509.NewCertPool()
		for _, a := range as {
			cur, _ := a.CAs()
			pool.AddCert(cur.Certificate())
		}
		return pool
	})
}

// The attack: a runner pod is created again under a run's pod name with a
// copy of the first pod's TLS Secret. Its leaf is bound to the first pod's
// UID, and the controller, dialling the pod it knows by UID, refuses it;
// the pod it created is accepted.
func TestHandshakeRefusesACertificateOfAnotherPod(t *testing.T) {
	a := mustAuthority(t, Options{})
	controller := StaticCertificate(mustIssue(t, a, ControllerIdentity))
	const first, second = "0b4d6c3e-8f2a-4d3b-9c1e-5a6f7e8d9c0b", "7c1e2a3b-4d5e-4f60-8a9b-0c1d2e3f4a5b"
	leaf, err := a.Issue(LeafRequest{Identity: testRunner, Validity: time.Hour, PodUID: first})
	if err != nil {
		t.Fatal(err)
	}
	if x, _ := leaf.Certificate(); PodUIDFromCertificate(x) != first {
		t.Fatalf("the leaf is bound to pod %q, want %s", PodUIDFromCertificate(x), first)
	}
	cert, err := leaf.TLSCertificate()
	if err != nil {
		t.Fatal(err)
	}
	if res := handshake(t, runnerServer(cert, a), ClientTLSConfigForPod(controller, a, testRunner, first)); !res.ok() || res.clientPeer != testRunner {
		t.Fatalf("the pod the leaf was issued for: server %v, client %v", res.serverErr, res.clientErr)
	}
	res := handshake(t, runnerServer(cert, a), ClientTLSConfigForPod(controller, a, testRunner, second))
	if res.clientErr == nil || !strings.Contains(res.clientErr.Error(), "bound to pod") {
		t.Fatalf("a pod created again with the first one's leaf: client %v, want refused", res.clientErr)
	}
	unbound := mustIssue(t, a, testRunner)
	if res := handshake(t, runnerServer(unbound, a), ClientTLSConfigForPod(controller, a, testRunner, second)); res.clientErr == nil {
		t.Fatal("a leaf bound to no pod was accepted for a pod")
	}
	if _, err := a.Issue(LeafRequest{Identity: testRunner, Validity: time.Hour, PodUID: "../x"}); err == nil {
		t.Fatal("a leaf was issued for a pod UID that is none")
	}
}
