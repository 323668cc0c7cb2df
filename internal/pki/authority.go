package pki

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"sync"
	"time"
)

const (
	// DefaultCAValidity is how long a new CA is valid.
	DefaultCAValidity = 365 * 24 * time.Hour
	// DefaultMaxLeafValidity bounds the lifetime of issued leaves.
	DefaultMaxLeafValidity = 24 * time.Hour
	// DefaultActivationDelay is how long a new CA is only trusted, not yet
	// issuing, so every replica and every live runner trusts it before any
	// peer presents a leaf it signed. It must exceed the longest leaf
	// lifetime (a runner only knows the CAs trusted when its leaf was issued)
	// plus the time replicas take to reload the CA Secret.
	DefaultActivationDelay = DefaultMaxLeafValidity + time.Hour

	// clockSkew backdates certificates so peers with slightly slow clocks accept them.
	clockSkew = 5 * time.Minute
)

// Options tune an Authority. Zero fields take the defaults above.
type Options struct {
	// CAValidity is the lifetime of CAs this authority generates.
	CAValidity time.Duration
	// MaxLeafValidity is the longest validity Issue accepts.
	MaxLeafValidity time.Duration
	// ActivationDelay is how long after its creation a CA starts issuing
	// while the CA it replaced is still valid. See DefaultActivationDelay.
	ActivationDelay time.Duration
	// Clock returns the current time; tests pass their own.
	Clock func() time.Time
}

// WithDefaults fills in the defaults of the zero fields.
func (o Options) WithDefaults() (Options, error) {
	if o.CAValidity == 0 {
		o.CAValidity = DefaultCAValidity
	}
	if o.MaxLeafValidity == 0 {
		o.MaxLeafValidity = DefaultMaxLeafValidity
	}
	if o.ActivationDelay == 0 {
		o.ActivationDelay = DefaultActivationDelay
	}
	if o.Clock == nil {
		o.Clock = time.Now
	}
	if o.CAValidity < 0 || o.MaxLeafValidity < 0 || o.ActivationDelay < 0 {
		return o, errors.New("CA validity, leaf validity and activation delay must be positive")
	}
	if o.ActivationDelay < o.MaxLeafValidity {
		return o, fmt.Errorf("activation delay %s must be at least the maximum leaf validity %s, or runners issued before a rotation would refuse the new CA", o.ActivationDelay, o.MaxLeafValidity)
	}
	if o.CAValidity <= o.ActivationDelay+o.MaxLeafValidity {
		return o, fmt.Errorf("CA validity %s must exceed activation delay plus maximum leaf validity", o.CAValidity)
	}
	return o, nil
}

// Authority is the controller's CAs: it issues with the current CA (once
// activated) and trusts the current and the previous CA, so leaves of both
// work during a rotation's overlap. Safe for concurrent use.
type Authority struct {
	opts Options

	mu       sync.RWMutex
	current  *CA
	previous *CA
}

// NewAuthority returns an authority with a freshly generated CA valid for caValidity.
func NewAuthority(caValidity time.Duration) (*Authority, error) {
	return NewAuthorityWithOptions(Options{CAValidity: caValidity})
}

// NewAuthorityWithOptions returns an authority with a freshly generated CA.
func NewAuthorityWithOptions(opts Options) (*Authority, error) {
	opts, err := opts.WithDefaults()
	if err != nil {
		return nil, err
	}
	ca, err := GenerateCA(opts.CAValidity, opts.Clock())
	if err != nil {
		return nil, err
	}
	return &Authority{opts: opts, current: ca}, nil
}

// NewAuthorityFromCAs returns an authority over existing CAs; previous may be nil.
func NewAuthorityFromCAs(opts Options, current, previous *CA) (*Authority, error) {
	opts, err := opts.WithDefaults()
	if err != nil {
		return nil, err
	}
	a := &Authority{opts: opts}
	if err := a.SetCAs(current, previous); err != nil {
		return nil, err
	}
	return a, nil
}

// Options returns the authority's options with defaults filled in.
func (a *Authority) Options() Options { return a.opts }

// CAs returns the current and the previous CA (nil when there is none).
func (a *Authority) CAs() (current, previous *CA) {
	a.mu.RLock()
	defer a.mu.RUnlock()
	return a.current, a.previous
}

// SetCAs replaces the CAs, e.g. after the CA Secret changed.
func (a *Authority) SetCAs(current, previous *CA) error {
	if current == nil {
		return errors.New("an authority needs a current CA")
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.current, a.previous = current, previous
	return nil
}

// trusted returns the CAs valid now, current first.
func (a *Authority) trusted(now time.Time) []*CA {
	a.mu.RLock()
	defer a.mu.RUnlock()
	var cas []*CA
	for _, ca := range []*CA{a.current, a.previous} {
		if ca.validAt(now) {
			cas = append(cas, ca)
		}
	}
	return cas
}

// issuer returns the CA that signs new leaves: the current one once it has
// been trusted for the activation delay, the previous one before that
// (while it remains valid long enough to matter).
func (a *Authority) issuer(now time.Time) (*CA, error) {
	a.mu.RLock()
	defer a.mu.RUnlock()
	if a.current == nil {
		return nil, errors.New("the authority has no CA")
	}
	activated := !now.Before(a.current.Created().Add(a.opts.ActivationDelay))
	if !activated && a.previous.validAt(now) && now.Add(a.opts.MaxLeafValidity).Before(a.previous.cert.NotAfter) {
		return a.previous, nil
	}
	if !a.current.validAt(now) {
		return nil, fmt.Errorf("the current CA is valid from %s to %s, not now: it must be rotated", a.current.cert.NotBefore.UTC().Format(time.RFC3339), a.current.cert.NotAfter.UTC().Format(time.RFC3339))
	}
	return a.current, nil
}

// TrustPool returns a pool of every CA trusted now.
func (a *Authority) TrustPool() *x509.CertPool {
	pool := x509.NewCertPool()
	for _, ca := range a.trusted(a.opts.Clock()) {
		pool.AddCert(ca.cert)
	}
	return pool
}

// CABundlePEM returns every CA trusted now, in PEM, current first.
func (a *Authority) CABundlePEM() []byte {
	var buf bytes.Buffer
	for _, ca := range a.trusted(a.opts.Clock()) {
		buf.Write(ca.certPEM)
	}
	return buf.Bytes()
}

// LeafRequest describes a leaf certificate to issue.
type LeafRequest struct {
	// Identity is the URI SAN that names the holder.
	Identity Identity
	// Validity is how long the leaf lives, e.g. a run's timeout plus margin.
	Validity time.Duration
	// DNSNames and IPAddresses are for clients that verify hostnames, such as
	// tofu's http backend; Terrace's own peers check Identity instead.
	DNSNames    []string
	IPAddresses []net.IP
	// PodUID, when set, binds the leaf to the one pod it is issued for (a
	// runner's): a pod created again under the same name has another UID,
	// and the leaf does not work for it (PodUIDFromCertificate).
	PodUID string
}

// Leaf is an issued certificate with its key and the CAs to trust, all in PEM.
type Leaf struct {
	CertPEM []byte
	KeyPEM  []byte
	// CABundlePEM is every CA trusted when the leaf was issued.
	CABundlePEM []byte
}

// TLSCertificate returns the leaf as a certificate for a tls.Config.
func (l *Leaf) TLSCertificate() (tls.Certificate, error) {
	cert, err := tls.X509KeyPair(l.CertPEM, l.KeyPEM)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("failed to load leaf key pair: %w", err)
	}
	return cert, nil
}

// Certificate parses the leaf's certificate.
func (l *Leaf) Certificate() (*x509.Certificate, error) { return parseCertificatePEM(l.CertPEM) }

// Issue signs a new leaf for req with a fresh ECDSA P-256 key. The leaf is
// good for both TLS client and server use, and never outlives its CA.
func (a *Authority) Issue(req LeafRequest) (*Leaf, error) {
	uri, err := req.Identity.url()
	if err != nil {
		return nil, fmt.Errorf("failed to issue a certificate: %w", err)
	}
	uris := []*url.URL{uri}
	if req.PodUID != "" {
		pod, err := podURI(req.PodUID)
		if err != nil {
			return nil, fmt.Errorf("failed to issue a certificate for %s: %w", req.Identity, err)
		}
		uris = append(uris, pod)
	}
	if req.Validity <= 0 || req.Validity > a.opts.MaxLeafValidity {
		return nil, fmt.Errorf("failed to issue a certificate for %s: validity %s is not within (0, %s]", req.Identity, req.Validity, a.opts.MaxLeafValidity)
	}
	now := a.opts.Clock()
	ca, err := a.issuer(now)
	if err != nil {
		return nil, fmt.Errorf("failed to issue a certificate for %s: %w", req.Identity, err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("failed to generate leaf key: %w", err)
	}
	serial, err := randomSerial()
	if err != nil {
		return nil, err
	}
	notAfter := now.Add(req.Validity)
	if notAfter.After(ca.cert.NotAfter) {
		notAfter = ca.cert.NotAfter
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{Organization: []string{"terrace"}, CommonName: commonName(req.Identity)},
		NotBefore:             now.Add(-clockSkew),
		NotAfter:              notAfter,
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		BasicConstraintsValid: true,
		URIs:                  uris,
		DNSNames:              req.DNSNames,
		IPAddresses:           req.IPAddresses,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		return nil, fmt.Errorf("failed to sign a certificate for %s: %w", req.Identity, err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("failed to encode leaf key: %w", err)
	}
	return &Leaf{
		CertPEM:     pemBlock("CERTIFICATE", der),
		KeyPEM:      pemBlock("EC PRIVATE KEY", keyDER),
		CABundlePEM: a.CABundlePEM(),
	}, nil
}

// commonName is a readable subject for logs and openssl; identity lives in the URI SAN.
func commonName(id Identity) string {
	const maxCommonName = 64 // RFC 5280 ub-common-name
	s := string(id)
	if len(s) > maxCommonName {
		s = s[:maxCommonName]
	}
	return s
}

// randomSerial returns a random positive 128-bit serial number.
func randomSerial() (*big.Int, error) {
	limit := new(big.Int).Lsh(big.NewInt(1), 128)
	for {
		n, err := rand.Int(rand.Reader, limit)
		if err != nil {
			return nil, fmt.Errorf("failed to generate serial number: %w", err)
		}
		if n.Sign() > 0 {
			return n, nil
		}
	}
}

func pemBlock(typ string, der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
}

func parseCertificatePEM(data []byte) (*x509.Certificate, error) {
	block, _ := pem.Decode(data)
	if block == nil || block.Type != "CERTIFICATE" {
		return nil, errors.New("no PEM certificate")
	}
	return x509.ParseCertificate(block.Bytes)
}

// parseCertificatesPEM parses every certificate in a PEM bundle.
func parseCertificatesPEM(data []byte) ([]*x509.Certificate, error) {
	var certs []*x509.Certificate
	for {
		var block *pem.Block
		block, data = pem.Decode(data)
		if block == nil {
			break
		}
		if block.Type != "CERTIFICATE" {
			continue
		}
		c, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, fmt.Errorf("failed to parse certificate: %w", err)
		}
		certs = append(certs, c)
	}
	if len(certs) == 0 {
		return nil, errors.New("no PEM certificate")
	}
	return certs, nil
}
