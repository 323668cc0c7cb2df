package image

import (
	"bytes"
	"encoding/pem"

	"golang.org/x/crypto/x509roots/fallback/bundle"
)

// MozillaRoots is the PEM bundle of the Mozilla (NSS) trust store that Go
// ships as golang.org/x/crypto/x509roots/fallback. The module's version is
// pinned by go.sum, so the bundle, unlike the build host's
// /etc/ssl/certs/ca-certificates.crt, is the same on every machine and the
// image's digest stays reproducible. Roots with a distrust date cannot be
// expressed in a PEM file and are left out, as Debian's ca-certificates does.
func MozillaRoots() []byte {
	var buf bytes.Buffer
	for root := range bundle.Roots() {
		if root.Constraint != nil {
			continue
		}
		_ = pem.Encode(&buf, &pem.Block{Type: "CERTIFICATE", Bytes: root.Certificate})
	}
	return buf.Bytes()
}
