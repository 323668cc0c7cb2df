package console

import (
	"encoding/pem"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestOIDCTrustsTheConfiguredCA: a provider whose certificate no system
// root issued is reached only once its CA bundle is trusted
// (--oidc-ca-file); a file without a certificate is refused at start.
func TestOIDCTrustsTheConfiguredCA(t *testing.T) {
	p := newProvider(t)
	login := func(o *OIDC) string {
		t.Helper()
		h, err := Handler(Options{Namespace: "team", OIDC: o})
		if err != nil {
			t.Fatal(err)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/oidc/login", nil))
		return rec.Header().Get("Location")
	}
	settings := func() *OIDC {
		return &OIDC{IssuerURL: p.srv.URL, ClientID: "console", RedirectURL: "https://console.example/oidc/callback"}
	}

	if loc := login(settings()); !strings.Contains(loc, "sign_in_error") {
		t.Fatalf("without the CA bundle the sign-in went to %q, want an error on the page", loc)
	}

	dir := t.TempDir()
	bundle := filepath.Join(dir, "ca.crt")
	if err := os.WriteFile(bundle, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: p.srv.Certificate().Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	trusting := settings()
	if err := trusting.TrustCAFile(bundle); err != nil {
		t.Fatal(err)
	}
	if loc := login(trusting); !strings.HasPrefix(loc, p.srv.URL+"/authorize?") {
		t.Fatalf("with the CA bundle the sign-in went to %q, want the provider's authorization endpoint", loc)
	}

	empty := filepath.Join(dir, "empty.crt")
	if err := os.WriteFile(empty, []byte("not a certificate\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := settings().TrustCAFile(empty); err == nil || !strings.Contains(err.Error(), "no PEM certificate") {
		t.Errorf("a bundle without a certificate: %v", err)
	}
}
