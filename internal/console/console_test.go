package console

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestPageAndAssets: the page names the namespace, holds no script of its
// own (the CSP allows only this server's files) and is never cached; the
// assets are served from the binary; anything else is 404.
func TestPageAndAssets(t *testing.T) {
	h, err := Handler(Options{Namespace: "team-a"})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewTLSServer(h)
	defer srv.Close()
	get := func(path string) (*http.Response, string) {
		t.Helper()
		resp, err := srv.Client().Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = resp.Body.Close() }()
		body, _ := io.ReadAll(resp.Body)
		return resp, string(body)
	}
	resp, body := get("/")
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, `data-namespace="team-a"`) || !strings.Contains(body, `data-oidc="false"`) {
		t.Fatalf("page: %d %s", resp.StatusCode, body)
	}
	if csp := resp.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "script-src 'self'") || !strings.Contains(csp, "frame-ancestors 'none'") {
		t.Errorf("Content-Security-Policy: %q", csp)
	}
	if resp.Header.Get("Cache-Control") != "no-store" || strings.Contains(body, "<script>") {
		t.Errorf("the page is cacheable or has an inline script")
	}
	for path, kind := range map[string]string{"/assets/app.js": "javascript", "/assets/stack.js": "javascript", "/assets/app.css": "text/css"} {
		resp, body := get(path)
		if resp.StatusCode != http.StatusOK || !strings.Contains(resp.Header.Get("Content-Type"), kind) || len(body) < 1000 {
			t.Errorf("%s: %d %q, %d bytes", path, resp.StatusCode, resp.Header.Get("Content-Type"), len(body))
		}
	}
	for _, path := range []string{"/nothing", "/assets/missing.js", "/oidc/login"} {
		if resp, _ := get(path); resp.StatusCode != http.StatusNotFound {
			t.Errorf("%s: %d, want 404", path, resp.StatusCode)
		}
	}
	// The page's name escapes: a namespace is a DNS label, but the template guards anyway.
	h, _ = Handler(Options{Namespace: `"><script>x</script>`})
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
	if strings.Contains(rec.Body.String(), "<script>x") {
		t.Error("the namespace was not escaped")
	}
}
