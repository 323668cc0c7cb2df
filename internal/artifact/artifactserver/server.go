// Package artifactserver serves Programs at their status.artifact.url as
// the tarballs that internal/artifact builds, over mutual TLS, to the
// controller and to runners, each runner only its own namespace's; the
// Stack controller uploads Programs to runs from the same tarball cache
// (Programs). It is apart from internal/artifact because it reads
// Programs through the Kubernetes client, which the runner does not link.
package artifactserver

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"github.com/spf13/pflag"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/pki"
)

// Defaults of the artifact server.
const (
	// DefaultServiceName is the Service in front of the controller replicas.
	DefaultServiceName   = "terrace-controller"
	DefaultListenAddress = ":9443"
	DefaultCacheBytes    = 64 << 20
)

// ServerOptions configure the artifact server.
type ServerOptions struct {
	// ListenAddress is host:port to listen on.
	ListenAddress string
	// BaseURL is the URL runners reach the server at, advertised in
	// status.artifact.url. Empty means the in-cluster Service,
	// https://terrace-controller.<namespace>.svc:<port>.
	BaseURL string
	// CacheBytes bounds the in-memory cache of built tarballs; negative
	// disables it.
	CacheBytes int64
	// ShutdownTimeout bounds how long in-flight requests may finish on stop.
	ShutdownTimeout time.Duration
}

// BindFlags binds the options to command-line flags; values already set
// are the flags' defaults.
func (o *ServerOptions) BindFlags(fs *pflag.FlagSet) {
	if o.ListenAddress == "" {
		o.ListenAddress = DefaultListenAddress
	}
	if o.CacheBytes == 0 {
		o.CacheBytes = DefaultCacheBytes
	}
	fs.StringVar(&o.ListenAddress, "artifact-bind-address", o.ListenAddress,
		"Address the artifact server (Program tarballs, mutual TLS) listens on.")
	fs.StringVar(&o.BaseURL, "artifact-base-url", o.BaseURL,
		"URL runners reach the artifact server at; default https://"+DefaultServiceName+".<namespace>.svc:<port of --artifact-bind-address>.")
	fs.Int64Var(&o.CacheBytes, "artifact-cache-bytes", o.CacheBytes,
		"Memory for built Program tarballs kept between requests; negative disables the cache.")
}

// AdvertisedBaseURL returns BaseURL, or the in-cluster Service URL in
// namespace (the controller's own) when BaseURL is empty.
func (o ServerOptions) AdvertisedBaseURL(namespace string) (string, error) {
	if o.BaseURL != "" {
		return strings.TrimSuffix(o.BaseURL, "/"), nil
	}
	addr := o.ListenAddress
	if addr == "" {
		addr = DefaultListenAddress
	}
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", fmt.Errorf("failed to read the port of --artifact-bind-address %q: %w", addr, err)
	}
	if namespace == "" {
		return "", errors.New("failed to derive the artifact base URL: the controller's namespace is unknown; set --artifact-base-url")
	}
	return "https://" + DefaultServiceName + "." + namespace + ".svc:" + port, nil
}

// Server serves Program tarballs at
// /programs/{namespace}/{name}/{generation}.tar.gz over mutual TLS. It runs
// on every controller replica as a manager Runnable.
type Server struct {
	opts     ServerOptions
	cached   client.Reader
	live     client.Reader
	tls      *tls.Config
	programs *Programs
	log      logr.Logger
	runs     RunChecker
}

// RunChecker says whether a run is its Stack's current run, asked from the
// runner pod with podUID, the one its certificate is bound to
// (launcher.StackRuns is the controller's).
type RunChecker interface {
	IsCurrentRun(ctx context.Context, namespace, stack, runID, podUID string) (bool, error)
}

// Programs is the server's cache of built tarballs, which the Stack
// controller shares to upload Programs to runners.
func (s *Server) Programs() *Programs { return s.programs }

// CheckRuns makes the server refuse a runner whose run is not its Stack's
// current run: a run's certificate ends with the run. Without it a runner
// is checked for its namespace only.
func (s *Server) CheckRuns(runs RunChecker) { s.runs = runs }

// NewServer returns a server that reads Programs through cached (the
// manager's cache) and, when the cache lags behind a requested generation
// or does not know the Program yet, through live (an uncached reader; nil
// to rely on the cache alone). cert is the server's certificate (the
// controller identity) and trust the CAs client certificates must chain to.
func NewServer(opts ServerOptions, cached, live client.Reader, cert pki.CertificateSource, trust pki.TrustSource) *Server {
	if opts.ListenAddress == "" {
		opts.ListenAddress = DefaultListenAddress
	}
	if opts.CacheBytes == 0 {
		opts.CacheBytes = DefaultCacheBytes
	}
	if opts.ShutdownTimeout <= 0 {
		opts.ShutdownTimeout = 10 * time.Second
	}
	tlsConfig := pki.ServerTLSConfig(cert, trust, authorizeClient)
	tlsConfig.NextProtos = []string{"http/1.1"}
	return &Server{
		opts:     opts,
		cached:   cached,
		live:     live,
		tls:      tlsConfig,
		programs: NewPrograms(opts.CacheBytes),
		log:      ctrllog.Log.WithName("artifact-server"),
	}
}

// authorizeClient admits, at the handshake, the identities that may read
// some Program; which Programs is decided per request.
func authorizeClient(id pki.Identity) error {
	if id == pki.ControllerIdentity {
		return nil
	}
	if _, _, _, ok := id.Runner(); ok {
		return nil
	}
	return fmt.Errorf("identity %s may not fetch artifacts", id)
}

// mayRead reports whether id may read the Programs of namespace: runners of
// that namespace and the controller.
func mayRead(id pki.Identity, namespace string) bool {
	if id == pki.ControllerIdentity {
		return true
	}
	ns, _, _, ok := id.Runner()
	return ok && ns == namespace
}

// NeedLeaderElection is false: every replica serves.
func (s *Server) NeedLeaderElection() bool { return false }

// Start listens and serves until ctx ends, then shuts down gracefully.
func (s *Server) Start(ctx context.Context) error {
	ln, err := net.Listen("tcp", s.opts.ListenAddress)
	if err != nil {
		return fmt.Errorf("failed to listen on %s for the artifact server: %w", s.opts.ListenAddress, err)
	}
	srv := &http.Server{
		Handler:           s.Handler(),
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      2 * time.Minute,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10,
		// A non-nil empty map turns HTTP/2 off.
		TLSNextProto: map[string]func(*http.Server, *tls.Conn, http.Handler){},
		ErrorLog:     log.New(logWriter{s.log.V(1)}, "", 0),
		BaseContext:  func(net.Listener) context.Context { return ctx },
	}
	errCh := make(chan error, 1)
	go func() { errCh <- srv.Serve(tls.NewListener(ln, s.tls)) }()
	s.log.Info("serving artifacts", "address", ln.Addr().String())
	select {
	case err := <-errCh:
		return fmt.Errorf("artifact server stopped: %w", err)
	case <-ctx.Done():
	}
	shutdownCtx, cancel := context.WithTimeout(context.Background(), s.opts.ShutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil {
		return fmt.Errorf("failed to shut down the artifact server: %w", err)
	}
	return nil
}

// logWriter sends net/http's own messages (TLS handshake errors) to logr.
type logWriter struct{ log logr.Logger }

func (w logWriter) Write(p []byte) (int, error) {
	w.log.Info(strings.TrimSpace(string(p)))
	return len(p), nil
}

// Handler returns the HTTP handler; Start serves it over TLS.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /programs/{namespace}/{name}/{file}", s.serveProgram)
	return s.instrument(mux)
}

// instrument counts and logs every answer, with names and codes only.
func (s *Server) instrument(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		rec := &responseRecorder{ResponseWriter: w, code: http.StatusOK}
		next.ServeHTTP(rec, r)
		countRequest(rec.code)
		bytesServed.Add(float64(rec.bytes))
		id, _ := pki.IdentityFromRequest(r)
		s.log.V(1).Info("request", "method", r.Method, "path", r.URL.Path, "code", rec.code,
			"bytes", rec.bytes, "identity", string(id), "duration", time.Since(start).String())
	})
}

type responseRecorder struct {
	http.ResponseWriter
	code  int
	bytes int64
}

func (r *responseRecorder) WriteHeader(code int) {
	r.code = code
	r.ResponseWriter.WriteHeader(code)
}

func (r *responseRecorder) Write(p []byte) (int, error) {
	n, err := r.ResponseWriter.Write(p)
	r.bytes += int64(n)
	return n, err
}

func (s *Server) serveProgram(w http.ResponseWriter, r *http.Request) {
	namespace, name := r.PathValue("namespace"), r.PathValue("name")
	genText, ok := strings.CutSuffix(r.PathValue("file"), ".tar.gz")
	generation, err := strconv.ParseInt(genText, 10, 64)
	if !ok || err != nil || generation < 1 || strconv.FormatInt(generation, 10) != genText {
		http.Error(w, "not found: want /programs/{namespace}/{name}/{generation}.tar.gz", http.StatusNotFound)
		return
	}
	id, err := pki.IdentityFromRequest(r)
	if err != nil || !mayRead(id, namespace) {
		http.Error(w, fmt.Sprintf("forbidden: %s may not read programs of namespace %s", id, namespace), http.StatusForbidden)
		return
	}
	if ns, stack, runID, isRunner := id.Runner(); isRunner && s.runs != nil {
		current, err := s.runs.IsCurrentRun(r.Context(), ns, stack, runID, pki.PodUIDFromRequest(r))
		if err != nil {
			s.log.Error(err, "failed to check a runner's run", "identity", string(id))
			http.Error(w, "failed to check the runner's run; retry later", http.StatusServiceUnavailable)
			return
		}
		if !current {
			http.Error(w, fmt.Sprintf("forbidden: run %s is not the current run of Stack %s/%s", runID, ns, stack), http.StatusForbidden)
			return
		}
	}

	program, err := s.getProgram(r.Context(), types.NamespacedName{Namespace: namespace, Name: name}, generation)
	switch {
	case apierrors.IsNotFound(err):
		http.Error(w, fmt.Sprintf("program %s/%s not found", namespace, name), http.StatusNotFound)
		return
	case err != nil:
		s.log.Error(err, "failed to read program", "program", namespace+"/"+name)
		http.Error(w, "failed to read the program; retry later", http.StatusServiceUnavailable)
		return
	case generation > program.Generation:
		http.Error(w, fmt.Sprintf("program %s/%s has no generation %d yet (current: %d)", namespace, name, generation, program.Generation), http.StatusNotFound)
		return
	case generation < program.Generation:
		http.Error(w, fmt.Sprintf("generation %d of program %s/%s is superseded by %d: read status.artifact again", generation, namespace, name, program.Generation), http.StatusGone)
		return
	}
	if msg, invalid := invalidGeneration(program); invalid {
		http.Error(w, fmt.Sprintf("generation %d of program %s/%s is invalid: %s", generation, namespace, name, msg), http.StatusConflict)
		return
	}
	if !judged(program) {
		// Runs learn the URL from status.artifact, which the controller
		// writes with its verdict; a URL made up ahead of it waits.
		http.Error(w, fmt.Sprintf("generation %d of program %s/%s is not yet checked by the controller; retry later", generation, namespace, name), http.StatusServiceUnavailable)
		return
	}

	data, digest, err := s.programs.Artifact(program)
	if err != nil {
		s.log.Error(err, "failed to build program artifact", "program", namespace+"/"+name, "generation", generation)
		http.Error(w, "failed to build the artifact", http.StatusInternalServerError)
		return
	}
	etag := `"` + digest + `"`
	h := w.Header()
	h.Set("ETag", etag)
	h.Set("Cache-Control", "private, no-cache")
	h.Set("X-Content-Type-Options", "nosniff")
	if etagMatches(r.Header.Get("If-None-Match"), etag) {
		w.WriteHeader(http.StatusNotModified)
		return
	}
	h.Set("Content-Type", "application/gzip")
	h.Set("Content-Length", strconv.Itoa(len(data)))
	w.WriteHeader(http.StatusOK)
	if r.Method == http.MethodHead {
		return
	}
	_, _ = w.Write(data)
}

// getProgram reads the Program from the cache and, when the cache cannot
// answer for the generation asked for, from the API server. Another
// replica's controller may be ahead of this replica's cache in two ways: a
// newer generation the cache has not seen, or the right generation whose
// status the cache holds from before the controller judged it. Serving the
// latter would hand out a generation the controller found invalid.
func (s *Server) getProgram(ctx context.Context, key types.NamespacedName, generation int64) (*terracev1.Program, error) {
	p := &terracev1.Program{}
	err := s.cached.Get(ctx, key, p)
	cacheAnswers := err == nil && (p.Generation > generation || (p.Generation == generation && judged(p)))
	if s.live == nil || cacheAnswers || (err != nil && !apierrors.IsNotFound(err)) {
		return p, err
	}
	p = &terracev1.Program{}
	return p, s.live.Get(ctx, key, p)
}

// judged reports whether the Program's controller has written its verdict on
// the current generation: a Ready condition that observed it.
func judged(p *terracev1.Program) bool {
	return verdict(p) != nil
}

// verdict is the Ready condition when it observed the current generation.
func verdict(p *terracev1.Program) *metav1.Condition {
	if ready := meta.FindStatusCondition(p.Status.Conditions, terracev1.ReadyCondition); ready != nil && ready.ObservedGeneration == p.Generation {
		return ready
	}
	return nil
}

// invalidGeneration reports whether the controller found the Program's
// current generation invalid, with the Ready message saying why.
func invalidGeneration(p *terracev1.Program) (string, bool) {
	if ready := verdict(p); ready != nil && ready.Reason == terracev1.InvalidProgramReason {
		return ready.Message, true
	}
	return "", false
}

// etagMatches implements If-None-Match for a strong ETag: a list of tags,
// weak or strong, or "*".
func etagMatches(header, etag string) bool {
	for _, tag := range strings.Split(header, ",") {
		tag = strings.TrimSpace(tag)
		if tag == "*" || strings.TrimPrefix(tag, "W/") == etag {
			return true
		}
	}
	return false
}
