package console

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
)

// provider is a small OpenID Connect provider: it signs everyone in at
// once and checks the client's PKCE verifier at the token endpoint.
type provider struct {
	srv     *httptest.Server
	idToken string
	// refuse makes the authorization endpoint answer access_denied.
	refuse bool

	mu         sync.Mutex
	challenges map[string]string // code → code_challenge
}

func newProvider(t *testing.T) *provider {
	p := &provider{idToken: "header.eyJzdWIiOiJhbGljZSJ9.signature", challenges: map[string]string{}}
	mux := http.NewServeMux()
	p.srv = httptest.NewTLSServer(mux)
	t.Cleanup(p.srv.Close)
	mux.HandleFunc("GET /.well-known/openid-configuration", func(w http.ResponseWriter, _ *http.Request) {
		_ = json.NewEncoder(w).Encode(map[string]string{"issuer": p.srv.URL, "authorization_endpoint": p.srv.URL + "/authorize", "token_endpoint": p.srv.URL + "/token"})
	})
	mux.HandleFunc("GET /authorize", func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		back, _ := url.Parse(q.Get("redirect_uri"))
		answer := url.Values{"state": {q.Get("state")}}
		switch {
		case p.refuse:
			answer.Set("error", "access_denied")
		case q.Get("client_id") != "console" || q.Get("code_challenge_method") != "S256" || !strings.Contains(q.Get("scope"), "openid"):
			answer.Set("error", "invalid_request")
		default:
			code := "code-" + q.Get("state")
			p.mu.Lock()
			p.challenges[code] = q.Get("code_challenge")
			p.mu.Unlock()
			answer.Set("code", code)
		}
		back.RawQuery = answer.Encode()
		http.Redirect(w, r, back.String(), http.StatusFound)
	})
	mux.HandleFunc("POST /token", func(w http.ResponseWriter, r *http.Request) {
		_ = r.ParseForm()
		p.mu.Lock()
		challenge, ok := p.challenges[r.Form.Get("code")]
		delete(p.challenges, r.Form.Get("code"))
		p.mu.Unlock()
		sum := sha256.Sum256([]byte(r.Form.Get("code_verifier")))
		if !ok || base64.RawURLEncoding.EncodeToString(sum[:]) != challenge {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusBadRequest)
			_, _ = w.Write([]byte(`{"error":"invalid_grant"}`))
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{"access_token": "at", "token_type": "Bearer", "id_token": p.idToken, "expires_in": 300})
	})
	return p
}

// signIn starts a sign-in at the console and returns the fragment of the
// page it ends on.
func signIn(t *testing.T, console *httptest.Server, client *http.Client) url.Values {
	t.Helper()
	var last *url.URL
	client.CheckRedirect = func(req *http.Request, _ []*http.Request) error { last = req.URL; return nil }
	resp, err := client.Get(console.URL + "/oidc/login")
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if last == nil || last.Path != "/" {
		t.Fatalf("the sign-in ended at %v", last)
	}
	fragment, err := url.ParseQuery(last.Fragment)
	if err != nil {
		t.Fatal(err)
	}
	return fragment
}

// TestOIDCSignIn: the authorization code flow with PKCE ends on the page
// with the provider's ID token in the fragment; a refusal, a forged state
// and a provider naming another issuer end with a message instead.
func TestOIDCSignIn(t *testing.T) {
	p := newProvider(t)
	var consoleURL string
	// The redirect URL is known once the console listens; it is read at the first sign-in.
	oidc := &OIDC{IssuerURL: p.srv.URL, ClientID: "console", RedirectURL: "https://unset/oidc/callback", HTTPClient: p.srv.Client()}
	h, err := Handler(Options{Namespace: "team", OIDC: oidc})
	if err != nil {
		t.Fatal(err)
	}
	console := httptest.NewTLSServer(h)
	defer console.Close()
	consoleURL = console.URL
	oidc.RedirectURL = consoleURL + "/oidc/callback"
	// One client trusting both servers' test certificates (the same one).
	newClient := func() *http.Client {
		jar, _ := cookiejar.New(nil)
		c := console.Client()
		return &http.Client{Transport: c.Transport, Jar: jar}
	}

	got := signIn(t, console, newClient())
	if got.Get("id_token") != p.idToken {
		t.Fatalf("fragment: %v, want the ID token", got)
	}

	p.refuse = true
	if got := signIn(t, console, newClient()); !strings.Contains(got.Get("sign_in_error"), "access_denied") {
		t.Errorf("refused sign-in: %v", got)
	}
	p.refuse = false

	// A callback with no sign-in of this browser behind it (a forged or replayed link).
	client := newClient()
	var last *url.URL
	client.CheckRedirect = func(req *http.Request, _ []*http.Request) error { last = req.URL; return nil }
	resp, err := client.Get(consoleURL + "/oidc/callback?code=code-x&state=x")
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if last == nil || !strings.Contains(last.Fragment, "sign_in_error") || strings.Contains(last.Fragment, "id_token") {
		t.Errorf("a forged callback ended at %v", last)
	}

	other := &OIDC{IssuerURL: p.srv.URL + "/other", ClientID: "console", RedirectURL: "https://x/oidc/callback", HTTPClient: p.srv.Client()}
	h, _ = Handler(Options{OIDC: other})
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/oidc/login", nil))
	if loc := rec.Header().Get("Location"); !strings.Contains(loc, "sign_in_error") {
		t.Errorf("a provider that is not the issuer: %d %s", rec.Code, loc)
	}
	if _, err := Handler(Options{OIDC: &OIDC{IssuerURL: p.srv.URL}}); err == nil {
		t.Error("an OIDC setting without a client ID was accepted")
	}
}
