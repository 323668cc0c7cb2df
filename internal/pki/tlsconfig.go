package pki

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"sync"
	"time"
)

// CertificateSource supplies this side's certificate for each handshake, so
// it can be renewed or reloaded without rebuilding the tls.Config.
type CertificateSource interface {
	Certificate() (*tls.Certificate, error)
}

// TrustSource supplies the CAs a peer's certificate must chain to, read at
// each handshake so a rotated CA is picked up.
type TrustSource interface {
	TrustPool() *x509.CertPool
}

// CertificateFunc adapts a function to a CertificateSource.
type CertificateFunc func() (*tls.Certificate, error)

// Certificate calls f.
func (f CertificateFunc) Certificate() (*tls.Certificate, error) { return f() }

// TrustFunc adapts a function to a TrustSource.
type TrustFunc func() *x509.CertPool

// TrustPool calls f.
func (f TrustFunc) TrustPool() *x509.CertPool { return f() }

// StaticCertificate is a CertificateSource that always returns c.
func StaticCertificate(c tls.Certificate) CertificateSource {
	return CertificateFunc(func() (*tls.Certificate, error) { return &c, nil })
}

// RequireIdentity accepts exactly one identity; for ServerTLSConfig.
func RequireIdentity(want Identity) func(Identity) error {
	return func(got Identity) error {
		if got != want {
			return fmt.Errorf("identity %s is not %s", got, want)
		}
		return nil
	}
}

// ServerTLSConfig is the configuration of a Terrace TLS server: TLS 1.2+,
// a client certificate is required and must chain to trust, and the
// identity it carries must pass authorize (nil accepts any Terrace
// identity; handlers then decide with IdentityFromRequest). Clients are
// never checked by hostname.
//
// Peer certificates are checked at the config's Time (time.Now when nil).
func ServerTLSConfig(cert CertificateSource, trust TrustSource, authorize func(Identity) error) *tls.Config {
	cfg := &tls.Config{}
	*cfg = tls.Config{
		MinVersion: tls.VersionTLS12,
		// Chain verification happens in VerifyConnection against the pool of
		// the moment, so a rotated CA is trusted without a new config.
		ClientAuth: tls.RequireAnyClientCert,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			return cert.Certificate()
		},
		VerifyConnection: func(cs tls.ConnectionState) error {
			id, err := verifyPeer(cs, trust.TrustPool(), x509.ExtKeyUsageClientAuth, configTime(cfg))
			if err != nil {
				return fmt.Errorf("refused client certificate: %w", err)
			}
			if authorize != nil {
				if err := authorize(id); err != nil {
					return fmt.Errorf("refused client %s: %w", id, err)
				}
			}
			return nil
		},
	}
	return cfg
}

// ClientTLSConfig is the configuration of a Terrace TLS client: TLS 1.2+,
// it presents cert (nil presents none) and accepts only a server whose
// certificate chains to trust and carries expectServer. The server's
// hostname is not checked: the identity is what names it.
func ClientTLSConfig(cert CertificateSource, trust TrustSource, expectServer Identity) *tls.Config {
	return ClientTLSConfigForPod(cert, trust, expectServer, "")
}

// ClientTLSConfigForPod is ClientTLSConfig for a server that runs in the
// pod with podUID: its certificate must also be bound to that pod
// (LeafRequest.PodUID), so a pod created again under the same name with a
// copy of the first one's certificate is refused. An empty podUID checks
// no pod.
func ClientTLSConfigForPod(cert CertificateSource, trust TrustSource, expectServer Identity, podUID string) *tls.Config {
	cfg := &tls.Config{}
	*cfg = tls.Config{
		MinVersion: tls.VersionTLS12,
		// The standard verification checks hostnames; VerifyConnection below
		// does the chain and identity checks instead.
		InsecureSkipVerify: true,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			if cert == nil {
				return &tls.Certificate{}, nil
			}
			return cert.Certificate()
		},
		VerifyConnection: func(cs tls.ConnectionState) error {
			id, err := verifyPeer(cs, trust.TrustPool(), x509.ExtKeyUsageServerAuth, configTime(cfg))
			if err != nil {
				return fmt.Errorf("refused server certificate: %w", err)
			}
			if id != expectServer {
				return fmt.Errorf("refused server: identity %s is not the expected %s", id, expectServer)
			}
			if got := PodUIDFromCertificate(cs.PeerCertificates[0]); podUID != "" && got != podUID {
				return fmt.Errorf("refused server %s: its certificate is bound to pod %q, not to pod %s", id, got, podUID)
			}
			return nil
		},
	}
	return cfg
}

// configTime is the time a config verifies at; the closures read it at
// handshake time so a test clock set after construction applies.
func configTime(cfg *tls.Config) time.Time {
	if cfg.Time != nil {
		return cfg.Time()
	}
	return time.Now()
}

// verifyPeer checks that the peer's leaf chains to pool for usage and
// returns the identity it carries.
func verifyPeer(cs tls.ConnectionState, pool *x509.CertPool, usage x509.ExtKeyUsage, now time.Time) (Identity, error) {
	if len(cs.PeerCertificates) == 0 {
		return "", errors.New("no certificate presented")
	}
	leaf := cs.PeerCertificates[0]
	if leaf.IsCA {
		return "", errors.New("a CA certificate is not a peer certificate")
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{usage}, CurrentTime: now}); err != nil {
		return "", fmt.Errorf("failed to verify chain: %w", err)
	}
	return IdentityFromCertificate(leaf)
}

// IssuedCertificate is a CertificateSource for a process that holds the
// Authority (the controller): it issues a leaf for req and reissues it when
// half its lifetime has passed or when its CA is no longer trusted.
type IssuedCertificate struct {
	authority *Authority
	req       LeafRequest

	mu       sync.Mutex
	cert     *tls.Certificate
	renewAt  time.Time
	issuerID []byte
}

// NewIssuedCertificate returns a source of leaves for req issued by a. A
// zero req.Validity means the authority's MaxLeafValidity.
func NewIssuedCertificate(a *Authority, req LeafRequest) *IssuedCertificate {
	if req.Validity == 0 {
		req.Validity = a.opts.MaxLeafValidity
	}
	return &IssuedCertificate{authority: a, req: req}
}

// Certificate returns the current leaf, issuing a new one when due.
func (s *IssuedCertificate) Certificate() (*tls.Certificate, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.authority.opts.Clock()
	if s.cert != nil && now.Before(s.renewAt) && s.issuerTrusted(now) {
		return s.cert, nil
	}
	leaf, err := s.authority.Issue(s.req)
	if err != nil {
		return nil, err
	}
	cert, err := leaf.TLSCertificate()
	if err != nil {
		return nil, err
	}
	parsed, err := leaf.Certificate()
	if err != nil {
		return nil, fmt.Errorf("failed to parse issued certificate: %w", err)
	}
	cert.Leaf = parsed
	s.cert = &cert
	s.renewAt = now.Add(parsed.NotAfter.Sub(now) / 2)
	s.issuerID = parsed.AuthorityKeyId
	return s.cert, nil
}

func (s *IssuedCertificate) issuerTrusted(now time.Time) bool {
	for _, ca := range s.authority.trusted(now) {
		if string(ca.cert.SubjectKeyId) == string(s.issuerID) {
			return true
		}
	}
	return false
}
