// Package apiserver serves the Installations API: a REST façade over Stacks
// for tools and UIs that should not need kubectl. An installation is a Stack
// labelled terrace.dev/installation=true whose values live in a Secret
// <name>-values it reads through varsFrom; the Stack and its status stay the
// source of truth.
//
// Every request carries a bearer token. The server checks it with a
// TokenReview, asks a SubjectAccessReview whether that identity may do the
// matching verb on stacks.terrace.dev (and on secrets where values are
// read or written) in the server's namespace, and then acts with its own
// identity.
//
//	srv := &apiserver.Server{Namespace: ns, Client: c, Reviews: clientset, Stores: backends, Log: log}
//	err := srv.Serve(ctx, listener, apiserver.TLSFiles{CertFile: crt, KeyFile: key})
package apiserver

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/certwatcher"
	"sigs.k8s.io/controller-runtime/pkg/client"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/backend"
)

// InstallationLabel marks the Stacks the API serves (value "true").
const InstallationLabel = "terrace.dev/installation"

const (
	// maxBodyBytes bounds a request body; a values Secret cannot hold more anyway.
	maxBodyBytes = 1 << 20
	// requestTimeout bounds the work of one request against the Kubernetes API.
	requestTimeout = 30 * time.Second
	// shutdownTimeout is how long in-flight requests may finish on shutdown.
	shutdownTimeout = 10 * time.Second
)

// StoreOpener opens the plan and release stores of a namespace;
// *backend.Backends is one.
type StoreOpener interface {
	For(ctx context.Context, namespace string) (*backend.Set, error)
}

// Server is the Installations API of one namespace.
type Server struct {
	// Namespace is the only namespace served.
	Namespace string
	// Client acts with the server's own identity. It should not cache:
	// Secrets are read through it.
	Client client.Client
	// Reviews creates the TokenReviews and SubjectAccessReviews.
	Reviews kubernetes.Interface
	// TokenAudiences, when set, are the audiences a caller's token must be
	// issued for (TokenReview spec.audiences); a token for another audience
	// is refused with 401. Empty accepts the Kubernetes API server's own.
	TokenAudiences []string
	// Stores opens the namespace's plan and release stores, as the controller does.
	Stores StoreOpener
	// Log gets one line per request: never a token, never a value.
	Log logr.Logger
}

// TLSFiles are the PEM files of the serving certificate; they are reloaded
// when they change.
type TLSFiles struct {
	CertFile string
	KeyFile  string
}

// Serve serves the API over TLS on ln until ctx ends, then lets in-flight
// requests finish.
func (s *Server) Serve(ctx context.Context, ln net.Listener, files TLSFiles) error {
	watcher, err := certwatcher.New(files.CertFile, files.KeyFile)
	if err != nil {
		_ = ln.Close()
		return fmt.Errorf("failed to load the serving certificate: %w", err)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		if err := watcher.Start(ctx); err != nil {
			s.Log.Error(err, "serving certificate watcher stopped")
		}
	}()
	srv := &http.Server{
		Handler: s.Handler(),
		TLSConfig: &tls.Config{
			MinVersion:     tls.VersionTLS12,
			GetCertificate: watcher.GetCertificate,
			NextProtos:     []string{"http/1.1"},
		},
		// HTTP/2 stays off unless asked for.
		TLSNextProto:      map[string]func(*http.Server, *tls.Conn, http.Handler){},
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      requestTimeout + 15*time.Second,
		IdleTimeout:       120 * time.Second,
		MaxHeaderBytes:    64 << 10,
	}
	served := make(chan error, 1)
	go func() { served <- srv.ServeTLS(ln, "", "") }()
	s.Log.Info("serving the installations api", "address", ln.Addr().String(), "namespace", s.Namespace)
	select {
	case err := <-served:
		return fmt.Errorf("failed to serve the installations api: %w", err)
	case <-ctx.Done():
	}
	shutdownCtx, done := context.WithTimeout(context.Background(), shutdownTimeout)
	defer done()
	if err := srv.Shutdown(shutdownCtx); err != nil {
		return fmt.Errorf("failed to shut the installations api down: %w", err)
	}
	return nil
}

// Handler routes the API. /healthz and /readyz need no token: kubelet probes them.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { writeText(w, "ok") })
	mux.HandleFunc("GET /readyz", s.ready)
	stacks := func(verb string) access {
		return access{verb: verb, group: terracev1.GroupVersion.Group, resource: "stacks"}
	}
	secrets := func(verb, suffix string) access { return access{verb: verb, resource: "secrets", nameSuffix: suffix} }
	mux.Handle("POST /v1/installations", s.route(s.create, stacks("create"), secrets("create", "")))
	mux.Handle("GET /v1/installations", s.route(s.list, stacks("list")))
	mux.Handle("GET /v1/installations/{name}", s.route(s.get, stacks("get")))
	mux.Handle("DELETE /v1/installations/{name}", s.route(s.delete, stacks("delete")))
	mux.Handle("PUT /v1/installations/{name}/values", s.route(s.putValues, stacks("update"), secrets("update", valuesSuffix)))
	mux.Handle("GET /v1/installations/{name}/plan", s.route(s.plan, stacks("get")))
	mux.Handle("POST /v1/installations/{name}/approve", s.route(s.approve, stacks("update")))
	// Release records hold output values, so they need the right to read Secrets.
	mux.Handle("GET /v1/installations/{name}/releases", s.route(s.releases, stacks("get"), secrets("list", "")))
	mux.Handle("GET /v1/installations/{name}/outputs", s.route(s.outputs, stacks("get")))
	mux.HandleFunc("/", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusNotFound, Error{Code: http.StatusNotFound, Message: "no such endpoint: see /v1/installations"})
	})
	return mux
}

// ready answers once the server can read Stacks of its namespace.
func (s *Server) ready(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
	defer cancel()
	if err := s.Client.List(ctx, &terracev1.StackList{}, client.InNamespace(s.Namespace), client.Limit(1)); err != nil {
		s.Log.Error(err, "not ready: cannot list stacks")
		http.Error(w, "cannot list Stacks in namespace "+s.Namespace, http.StatusServiceUnavailable)
		return
	}
	writeText(w, "ok")
}

// call is one authenticated, authorized request.
type call struct {
	w      http.ResponseWriter
	r      *http.Request
	caller *caller
	// name is the {name} path value, validated; "" on collection routes.
	name string
}

// handler does a request's work: it writes the response, or returns an
// error that route turns into one.
type handler func(ctx context.Context, c *call) error

// route authenticates the caller, authorizes every access, bounds the body
// and the time, and logs the outcome.
func (s *Server) route(h handler, needs ...access) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		started := time.Now()
		rec := &statusRecorder{ResponseWriter: w}
		r.Body = http.MaxBytesReader(rec, r.Body, maxBodyBytes)
		ctx, cancel := context.WithTimeout(r.Context(), requestTimeout)
		defer cancel()
		c := &call{w: rec, r: r.WithContext(ctx), name: r.PathValue("name")}
		err := s.serve(ctx, c, h, needs)
		if err != nil {
			s.writeError(rec, err)
		}
		user := ""
		if c.caller != nil {
			user = c.caller.Username
		}
		s.Log.Info("request", "method", r.Method, "route", r.Pattern, "name", c.name, "user", user,
			"status", rec.status, "duration", time.Since(started).Round(time.Millisecond).String())
	})
}

func (s *Server) serve(ctx context.Context, c *call, h handler, needs []access) error {
	if c.name != "" {
		if err := validateName("installation name", c.name); err != nil {
			return badRequest(err.Error())
		}
	}
	caller, err := s.authenticate(ctx, c.r)
	if err != nil {
		return err
	}
	c.caller = caller
	for _, need := range needs {
		if err := s.authorize(ctx, caller, need.forName(c.name)); err != nil {
			return err
		}
	}
	return h(ctx, c)
}

// statusRecorder remembers the status written, for the request log.
type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (r *statusRecorder) WriteHeader(code int) {
	if r.status == 0 {
		r.status = code
	}
	r.ResponseWriter.WriteHeader(code)
}

func (r *statusRecorder) Write(b []byte) (int, error) {
	if r.status == 0 {
		r.status = http.StatusOK
	}
	return r.ResponseWriter.Write(b)
}

// apiError is an error with the HTTP status and message the caller sees.
type apiError struct {
	code    int
	message string
}

func (e *apiError) Error() string { return e.message }

func badRequest(message string) error {
	return &apiError{code: http.StatusBadRequest, message: message}
}
func notFound(message string) error { return &apiError{code: http.StatusNotFound, message: message} }
func conflict(message string) error { return &apiError{code: http.StatusConflict, message: message} }

// writeError answers with an apiError's status and message; any other error
// is logged and answered 500 without details.
func (s *Server) writeError(w http.ResponseWriter, err error) {
	var apiErr *apiError
	if !errors.As(err, &apiErr) {
		s.Log.Error(err, "request failed")
		apiErr = &apiError{code: http.StatusInternalServerError, message: "internal error: see the API server's log"}
	}
	if apiErr.code == http.StatusUnauthorized {
		w.Header().Set("WWW-Authenticate", `Bearer realm="terrace"`)
	}
	writeJSON(w, apiErr.code, Error{Code: apiErr.code, Message: apiErr.message})
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

func writeText(w http.ResponseWriter, text string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	_, _ = w.Write([]byte(text + "\n"))
}

// decodeBody reads a JSON body into v, refusing unknown fields, trailing
// data and bodies over maxBodyBytes.
func decodeBody(r *http.Request, v any) error {
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			return &apiError{code: http.StatusRequestEntityTooLarge, message: fmt.Sprintf("the request body is larger than %d bytes", maxBodyBytes)}
		}
		return badRequest("the request body is not valid JSON for this endpoint: " + err.Error())
	}
	if dec.More() {
		return badRequest("the request body holds more than one JSON value")
	}
	return nil
}
