package console

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/http"
	"os"
	"time"
)

// TrustCAFile makes sign-in talk to the provider trusting the PEM
// certificates in path as well as the system's roots: for a provider
// whose certificate a private CA issued. The file is read once, here.
func (o *OIDC) TrustCAFile(path string) error {
	pem, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("failed to read the OIDC provider's CA bundle: %w", err)
	}
	roots, err := x509.SystemCertPool()
	if err != nil {
		roots = x509.NewCertPool()
	}
	if !roots.AppendCertsFromPEM(pem) {
		return fmt.Errorf("the OIDC provider's CA bundle %s holds no PEM certificate", path)
	}
	transport := http.DefaultTransport.(*http.Transport).Clone()
	transport.TLSClientConfig = &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: roots}
	o.HTTPClient = &http.Client{Transport: transport, Timeout: 30 * time.Second}
	return nil
}
