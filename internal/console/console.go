// Package console is the web console of the Installations API: a page and
// a little JavaScript, embedded in the binary (no CDN: it works
// air-gapped), served by `terrace api` at / on the API's own port. The
// page calls the API's Connect JSON endpoints with the user's bearer
// token, kept in the browser's sessionStorage only, so the console can do
// nothing its user could not do through the API.
package console

import (
	"embed"
	"html/template"
	"io/fs"
	"net/http"
)

//go:embed assets
var assets embed.FS

var page = template.Must(template.ParseFS(assets, "assets/index.html"))

// Options configure the console.
type Options struct {
	// Namespace is the API server's namespace, where installations are made.
	Namespace string
	// OIDC, when set, offers sign-in with an OpenID Connect provider.
	OIDC *OIDC
}

// Handler serves the page at / and its assets under /assets/.
func Handler(opts Options) (http.Handler, error) {
	static, err := fs.Sub(assets, "assets")
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	files := http.FileServer(http.FS(static))
	mux.Handle("GET /assets/", http.StripPrefix("/assets/", files))
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		// The page holds no data: everything comes from the API, with the token.
		w.Header().Set("Cache-Control", "no-store")
		_ = page.Execute(w, struct {
			Namespace string
			OIDC      bool
		}{opts.Namespace, opts.OIDC != nil})
	})
	if opts.OIDC != nil {
		if err := opts.OIDC.register(mux); err != nil {
			return nil, err
		}
	}
	return secured(mux), nil
}

// secured adds the headers that keep the page to itself: scripts and
// styles only from this server, no framing, no referrer leaving it.
func secured(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("X-Frame-Options", "DENY")
		next.ServeHTTP(w, r)
	})
}
