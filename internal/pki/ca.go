package pki

// One certificate authority: its certificate, key and validity.

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"time"
)

// CA is one certificate authority: a self-signed ECDSA P-256 certificate and its key.
type CA struct {
	cert    *x509.Certificate
	key     *ecdsa.PrivateKey
	certPEM []byte
	keyPEM  []byte
}

// GenerateCA creates a new CA valid from now for validity.
func GenerateCA(validity time.Duration, now time.Time) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("failed to generate CA key: %w", err)
	}
	serial, err := randomSerial()
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{Organization: []string{"terrace"}, CommonName: "terrace-ca-" + now.UTC().Format("20060102T150405Z")},
		NotBefore:             now.Add(-clockSkew),
		NotAfter:              now.Add(validity),
		IsCA:                  true,
		BasicConstraintsValid: true,
		MaxPathLenZero:        true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("failed to create CA certificate: %w", err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("failed to encode CA key: %w", err)
	}
	return ParseCA(pemBlock("CERTIFICATE", der), pemBlock("EC PRIVATE KEY", keyDER))
}

// ParseCA reads a CA certificate and its key from PEM.
func ParseCA(certPEM, keyPEM []byte) (*CA, error) {
	cert, err := parseCertificatePEM(certPEM)
	if err != nil {
		return nil, fmt.Errorf("failed to parse CA certificate: %w", err)
	}
	if !cert.IsCA {
		return nil, errors.New("failed to parse CA certificate: it is not a CA")
	}
	block, _ := pem.Decode(keyPEM)
	if block == nil {
		return nil, errors.New("failed to parse CA key: no PEM block")
	}
	key, err := x509.ParseECPrivateKey(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("failed to parse CA key: %w", err)
	}
	if !key.PublicKey.Equal(cert.PublicKey) {
		return nil, errors.New("failed to parse CA: key does not match certificate")
	}
	return &CA{cert: cert, key: key, certPEM: certPEM, keyPEM: keyPEM}, nil
}

// Certificate is the CA's certificate.
func (c *CA) Certificate() *x509.Certificate { return c.cert }

// CertPEM is the CA's certificate in PEM.
func (c *CA) CertPEM() []byte { return c.certPEM }

// KeyPEM is the CA's private key in PEM.
func (c *CA) KeyPEM() []byte { return c.keyPEM }

// Created is when the CA was generated.
func (c *CA) Created() time.Time { return c.cert.NotBefore.Add(clockSkew) }

// Equal reports whether two CAs are the same certificate.
func (c *CA) Equal(o *CA) bool {
	if c == nil || o == nil {
		return c == o
	}
	return c.cert.Equal(o.cert)
}

func (c *CA) validAt(t time.Time) bool {
	return c != nil && !t.Before(c.cert.NotBefore) && !t.After(c.cert.NotAfter)
}
