package testenv

import (
	"crypto"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"math/big"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

// OIDCProvider is a small OpenID Connect provider over TLS for tests: it
// signs every sign-in in at once as Subject, checks the client's PKCE
// verifier at the token endpoint, and issues RS256 ID tokens a Kubernetes
// API server configured with AuthenticationConfig verifies against its
// JWKS.
type OIDCProvider struct {
	// URL is the issuer, https://127.0.0.1:<port>.
	URL string
	// ClientID is the only client it knows, and its tokens' audience.
	ClientID string
	// Subject is who signs in.
	Subject string
	// Client trusts the provider's certificate.
	Client *http.Client

	srv *httptest.Server
	key *rsa.PrivateKey

	mu         sync.Mutex
	challenges map[string]string // code → code_challenge
}

// OIDCUsernamePrefix prefixes the sub claim in Kubernetes usernames
// (AuthenticationConfig's claimMappings).
const OIDCUsernamePrefix = "oidc:"

// StartOIDCProvider starts the provider; Close stops it.
func StartOIDCProvider(clientID, subject string) (*OIDCProvider, error) {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return nil, err
	}
	p := &OIDCProvider{ClientID: clientID, Subject: subject, key: key, challenges: map[string]string{}}
	mux := http.NewServeMux()
	p.srv = httptest.NewTLSServer(mux)
	p.URL, p.Client = p.srv.URL, p.srv.Client()
	mux.HandleFunc("GET /.well-known/openid-configuration", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, map[string]any{"issuer": p.URL, "authorization_endpoint": p.URL + "/authorize", "token_endpoint": p.URL + "/token",
			"jwks_uri": p.URL + "/jwks", "id_token_signing_alg_values_supported": []string{"RS256"}, "response_types_supported": []string{"code"},
			"subject_types_supported": []string{"public"}})
	})
	mux.HandleFunc("GET /jwks", func(w http.ResponseWriter, _ *http.Request) {
		pub := &p.key.PublicKey
		writeJSON(w, map[string]any{"keys": []map[string]string{{"kty": "RSA", "kid": "test", "use": "sig", "alg": "RS256",
			"n": b64(pub.N.Bytes()), "e": b64(big.NewInt(int64(pub.E)).Bytes())}}})
	})
	mux.HandleFunc("GET /authorize", p.authorize)
	mux.HandleFunc("POST /token", p.token)
	return p, nil
}

// Certificate is the provider's serving certificate, to trust.
func (p *OIDCProvider) Certificate() *x509.Certificate { return p.srv.Certificate() }

// Close stops the provider.
func (p *OIDCProvider) Close() { p.srv.Close() }

func (p *OIDCProvider) authorize(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	back, err := url.Parse(q.Get("redirect_uri"))
	if err != nil {
		http.Error(w, "bad redirect_uri", http.StatusBadRequest)
		return
	}
	answer := url.Values{"state": {q.Get("state")}}
	if q.Get("client_id") != p.ClientID || q.Get("code_challenge_method") != "S256" || !strings.Contains(q.Get("scope"), "openid") {
		answer.Set("error", "invalid_request")
	} else {
		code := "code-" + q.Get("state")
		p.mu.Lock()
		p.challenges[code] = q.Get("code_challenge")
		p.mu.Unlock()
		answer.Set("code", code)
	}
	back.RawQuery = answer.Encode()
	http.Redirect(w, r, back.String(), http.StatusFound)
}

func (p *OIDCProvider) token(w http.ResponseWriter, r *http.Request) {
	_ = r.ParseForm()
	p.mu.Lock()
	challenge, ok := p.challenges[r.Form.Get("code")]
	delete(p.challenges, r.Form.Get("code"))
	p.mu.Unlock()
	sum := sha256.Sum256([]byte(r.Form.Get("code_verifier")))
	if !ok || b64(sum[:]) != challenge {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadRequest)
		_, _ = w.Write([]byte(`{"error":"invalid_grant"}`))
		return
	}
	idToken, err := p.IDToken(p.ClientID, time.Hour)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	writeJSON(w, map[string]any{"access_token": "not-for-kubernetes", "token_type": "Bearer", "id_token": idToken, "expires_in": 300})
}

// IDToken signs an ID token of Subject for audience, valid for ttl.
func (p *OIDCProvider) IDToken(audience string, ttl time.Duration) (string, error) {
	now := time.Now()
	header, _ := json.Marshal(map[string]string{"alg": "RS256", "typ": "JWT", "kid": "test"})
	claims, _ := json.Marshal(map[string]any{"iss": p.URL, "sub": p.Subject, "aud": audience, "iat": now.Unix(), "nbf": now.Unix(), "exp": now.Add(ttl).Unix()})
	signed := b64(header) + "." + b64(claims)
	digest := sha256.Sum256([]byte(signed))
	sig, err := rsa.SignPKCS1v15(rand.Reader, p.key, crypto.SHA256, digest[:])
	if err != nil {
		return "", err
	}
	return signed + "." + b64(sig), nil
}

// AuthenticationConfig writes a kube-apiserver --authentication-config file
// into dir that trusts the provider's ID tokens for ClientID, with
// usernames OIDCUsernamePrefix + sub, and returns its path.
func (p *OIDCProvider) AuthenticationConfig(dir string) (string, error) {
	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: p.srv.Certificate().Raw})
	cfg := map[string]any{
		"apiVersion": "apiserver.config.k8s.io/v1",
		"kind":       "AuthenticationConfiguration",
		"jwt": []map[string]any{{
			"issuer":        map[string]any{"url": p.URL, "audiences": []string{p.ClientID}, "certificateAuthority": string(ca)},
			"claimMappings": map[string]any{"username": map[string]string{"claim": "sub", "prefix": OIDCUsernamePrefix}},
		}},
	}
	data, err := json.Marshal(cfg)
	if err != nil {
		return "", err
	}
	path := filepath.Join(dir, "authentication-config.json")
	if err := os.WriteFile(path, data, 0o600); err != nil {
		return "", fmt.Errorf("failed to write the authentication config: %w", err)
	}
	return path, nil
}

func b64(b []byte) string { return base64.RawURLEncoding.EncodeToString(b) }

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}
