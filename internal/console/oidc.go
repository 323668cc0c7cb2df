package console

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"golang.org/x/oauth2"
)

// OIDC is sign-in with an OpenID Connect provider by the authorization
// code flow (with PKCE). The ID token it ends with is handed to the page,
// which sends it as the bearer token: the Kubernetes API server must be
// configured to accept that provider's tokens, and it verifies them on
// every request. The console itself grants nothing.
type OIDC struct {
	// IssuerURL is the provider; its /.well-known/openid-configuration is read.
	IssuerURL string
	ClientID  string
	// ClientSecret is empty for a public client (PKCE alone).
	ClientSecret string
	// RedirectURL is this console's /oidc/callback as the provider knows it.
	RedirectURL string
	// Scopes beyond openid (e.g. email, groups).
	Scopes []string
	// HTTPClient talks to the provider; http.DefaultClient when nil.
	HTTPClient *http.Client

	key    []byte
	mu     sync.Mutex
	config *oauth2.Config
}

// loginCookie carries the state and PKCE verifier of a sign-in in flight,
// signed, for ten minutes.
const (
	loginCookie = "terrace-console-login"
	loginTTL    = 10 * time.Minute
)

func (o *OIDC) register(mux *http.ServeMux) error {
	if o.IssuerURL == "" || o.ClientID == "" || o.RedirectURL == "" {
		return errors.New("OIDC sign-in needs an issuer URL, a client ID and a redirect URL")
	}
	o.key = make([]byte, 32)
	if _, err := rand.Read(o.key); err != nil {
		return err
	}
	mux.HandleFunc("GET /oidc/login", o.login)
	mux.HandleFunc("GET /oidc/callback", o.callback)
	return nil
}

func (o *OIDC) client() *http.Client {
	if o.HTTPClient != nil {
		return o.HTTPClient
	}
	return http.DefaultClient
}

// endpoints reads the provider's discovery document (once it has worked).
func (o *OIDC) endpoints(ctx context.Context) (*oauth2.Config, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.config != nil {
		return o.config, nil
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(o.IssuerURL, "/")+"/.well-known/openid-configuration", nil)
	if err != nil {
		return nil, err
	}
	resp, err := o.client().Do(req)
	if err != nil {
		return nil, fmt.Errorf("failed to reach the OIDC provider: %w", err)
	}
	defer func() { _ = resp.Body.Close() }()
	var doc struct {
		Issuer        string `json:"issuer"`
		Authorization string `json:"authorization_endpoint"`
		Token         string `json:"token_endpoint"`
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("the OIDC provider's discovery document answered %s", resp.Status)
	}
	if err := json.NewDecoder(resp.Body).Decode(&doc); err != nil {
		return nil, fmt.Errorf("failed to read the OIDC provider's discovery document: %w", err)
	}
	if doc.Issuer != o.IssuerURL || doc.Authorization == "" || doc.Token == "" {
		return nil, fmt.Errorf("the OIDC provider's discovery document names issuer %q, want %q, with both endpoints", doc.Issuer, o.IssuerURL)
	}
	o.config = &oauth2.Config{
		ClientID: o.ClientID, ClientSecret: o.ClientSecret, RedirectURL: o.RedirectURL,
		Endpoint: oauth2.Endpoint{AuthURL: doc.Authorization, TokenURL: doc.Token},
		Scopes:   append([]string{"openid"}, o.Scopes...),
	}
	return o.config, nil
}

func (o *OIDC) login(w http.ResponseWriter, r *http.Request) {
	cfg, err := o.endpoints(r.Context())
	if err != nil {
		signInFailed(w, r, err.Error())
		return
	}
	state, verifier := rand.Text(), oauth2.GenerateVerifier()
	expires := time.Now().Add(loginTTL)
	http.SetCookie(w, &http.Cookie{
		Name: loginCookie, Value: o.sign(state + "." + verifier + "." + fmt.Sprint(expires.Unix())),
		Path: "/oidc/", Expires: expires, HttpOnly: true, Secure: true, SameSite: http.SameSiteLaxMode,
	})
	http.Redirect(w, r, cfg.AuthCodeURL(state, oauth2.S256ChallengeOption(verifier)), http.StatusFound)
}

// callback exchanges the code for tokens and hands the ID token to the
// page in the URL fragment, which never reaches a server; the page keeps
// it in sessionStorage and removes it from the address bar.
func (o *OIDC) callback(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	if e := q.Get("error"); e != "" {
		signInFailed(w, r, "the OIDC provider refused the sign-in: "+e+" "+q.Get("error_description"))
		return
	}
	cookie, err := r.Cookie(loginCookie)
	if err != nil {
		signInFailed(w, r, "the sign-in expired or was started elsewhere: sign in again")
		return
	}
	http.SetCookie(w, &http.Cookie{Name: loginCookie, Path: "/oidc/", MaxAge: -1, HttpOnly: true, Secure: true})
	state, verifier, ok := o.open(cookie.Value)
	if !ok || !hmac.Equal([]byte(state), []byte(q.Get("state"))) {
		signInFailed(w, r, "the sign-in's state does not match: sign in again")
		return
	}
	cfg, err := o.endpoints(r.Context())
	if err != nil {
		signInFailed(w, r, err.Error())
		return
	}
	ctx := context.WithValue(r.Context(), oauth2.HTTPClient, o.client())
	token, err := cfg.Exchange(ctx, q.Get("code"), oauth2.VerifierOption(verifier))
	if err != nil {
		signInFailed(w, r, "the OIDC provider did not exchange the code: "+err.Error())
		return
	}
	idToken, _ := token.Extra("id_token").(string)
	if idToken == "" {
		signInFailed(w, r, "the OIDC provider sent no ID token: is the openid scope allowed for this client?")
		return
	}
	w.Header().Set("Cache-Control", "no-store")
	http.Redirect(w, r, "/#id_token="+url.QueryEscape(idToken), http.StatusFound)
}

func signInFailed(w http.ResponseWriter, r *http.Request, message string) {
	w.Header().Set("Cache-Control", "no-store")
	http.Redirect(w, r, "/#sign_in_error="+url.QueryEscape(message), http.StatusFound)
}

func (o *OIDC) sign(value string) string {
	mac := hmac.New(sha256.New, o.key)
	mac.Write([]byte(value))
	return value + "." + base64.RawURLEncoding.EncodeToString(mac.Sum(nil))
}

// open checks a login cookie's signature and age.
func (o *OIDC) open(signed string) (state, verifier string, ok bool) {
	i := strings.LastIndex(signed, ".")
	if i < 0 || !hmac.Equal([]byte(o.sign(signed[:i])), []byte(signed)) {
		return "", "", false
	}
	parts := strings.Split(signed[:i], ".")
	if len(parts) != 3 {
		return "", "", false
	}
	var expires int64
	if _, err := fmt.Sscan(parts[2], &expires); err != nil || time.Now().Unix() > expires {
		return "", "", false
	}
	return parts[0], parts[1], true
}
