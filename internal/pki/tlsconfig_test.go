package pki

import (
	"crypto/tls"
	"crypto/x509"
	"io"
	"net"
	"strings"
	"testing"
	"time"
)

// handshakeResult is what each side of one real TLS connection saw.
type handshakeResult struct {
	serverErr, clientErr   error
	serverPeer, clientPeer Identity
}

func (r handshakeResult) ok() bool { return r.serverErr == nil && r.clientErr == nil }

// handshake runs one TLS connection over a loopback listener: the server
// completes the handshake and writes a line, the client reads it. In TLS
// 1.3 a client learns that the server refused its certificate only when it
// reads, so both sides exchange data before the result counts.
func handshake(t *testing.T, server, client *tls.Config) handshakeResult {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("failed to listen: %v", err)
	}
	defer ln.Close()

	type serverSide struct {
		err  error
		peer Identity
	}
	done := make(chan serverSide, 1)
	go func() {
		raw, err := ln.Accept()
		if err != nil {
			done <- serverSide{err: err}
			return
		}
		conn := tls.Server(raw, server)
		defer conn.Close()
		_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
		if err := conn.Handshake(); err != nil {
			done <- serverSide{err: err}
			return
		}
		cs := conn.ConnectionState()
		peer, err := PeerIdentity(&cs)
		if err != nil {
			done <- serverSide{err: err}
			return
		}
		_, err = conn.Write([]byte("ok\n"))
		done <- serverSide{err: err, peer: peer}
	}()

	var res handshakeResult
	raw, err := net.DialTimeout("tcp", ln.Addr().String(), 10*time.Second)
	if err != nil {
		t.Fatalf("failed to dial: %v", err)
	}
	conn := tls.Client(raw, client)
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	res.clientErr = conn.Handshake()
	if res.clientErr == nil {
		buf := make([]byte, 3)
		if _, err := io.ReadFull(conn, buf); err != nil {
			res.clientErr = err
		} else {
			cs := conn.ConnectionState()
			res.clientPeer, res.clientErr = PeerIdentity(&cs)
		}
	}
	_ = conn.Close()
	s := <-done
	res.serverErr, res.serverPeer = s.err, s.peer
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
