package httpbackend

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/spf13/pflag"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	"github.com/terrace-dev/terrace/internal/state"
)

// Options configure the state server.
type Options struct {
	// ListenAddress is host:port to listen on.
	ListenAddress string
	// AdvertisedURL is the https URL runners reach the server at (e.g. the
	// controller Service); state addresses are built from it with Address.
	AdvertisedURL string
	// MaxStateBytes bounds a state upload.
	MaxStateBytes int64
	// MaxInflightBytes bounds the bytes of large states (over 1 MiB) the
	// server reads or sends at once; each is held in memory a few times
	// over while the store encodes it.
	MaxInflightBytes int64
	// MaxInflightBytesPerNamespace bounds one namespace's share of it.
	MaxInflightBytesPerNamespace int64
	// MaxSmallInflightBytes bounds the bytes of small states (up to 1 MiB)
	// and lock infos the server holds at once, counted as they arrive.
	MaxSmallInflightBytes int64
	// MaxSmallInflightBytesPerNamespace bounds one namespace's share of it.
	MaxSmallInflightBytesPerNamespace int64
	// AdmissionWait is how long a transfer waits for room before it is
	// answered 503 with Retry-After.
	AdmissionWait time.Duration
	// BodyTimeout is how long a request body up to 1 MiB may take to
	// arrive (a larger one gets a second more per MiB); a late one is
	// answered 408.
	BodyTimeout time.Duration
	// MaxConnections bounds the connections open at once; more wait to be
	// accepted.
	MaxConnections int
	// MaxConnectionsPerRun and MaxConnectionsPerNamespace bound those of
	// one runner identity and of one namespace (the controller's identity
	// is not bounded); a connection over either gets 429 and is closed.
	MaxConnectionsPerRun, MaxConnectionsPerNamespace int
	// ShutdownTimeout bounds the wait for requests in flight on shutdown.
	ShutdownTimeout time.Duration
}

// DefaultOptions are the flag defaults.
func DefaultOptions() Options {
	return Options{
		ListenAddress:                     ":9444",
		MaxStateBytes:                     DefaultMaxStateBytes,
		MaxInflightBytes:                  2 * DefaultMaxStateBytes,
		MaxInflightBytesPerNamespace:      DefaultMaxStateBytes,
		MaxSmallInflightBytes:             32 << 20,
		MaxSmallInflightBytesPerNamespace: 8 << 20,
		AdmissionWait:                     10 * time.Second,
		BodyTimeout:                       DefaultBodyTimeout,
		MaxConnections:                    1024,
		MaxConnectionsPerRun:              8,
		MaxConnectionsPerNamespace:        32,
		ShutdownTimeout:                   30 * time.Second,
	}
}

// BindFlags registers the options as --state-server-* flags.
func (o *Options) BindFlags(fs *pflag.FlagSet) {
	d := DefaultOptions()
	fs.StringVar(&o.ListenAddress, "state-server-bind-address", d.ListenAddress, "Address the Terraform http-backend state server listens on (mutual TLS).")
	fs.StringVar(&o.AdvertisedURL, "state-server-advertised-url", o.AdvertisedURL, "https URL runners reach the state server at, e.g. https://terrace-controller.terrace-system.svc:9444.")
	fs.Int64Var(&o.MaxStateBytes, "state-server-max-state-bytes", d.MaxStateBytes, "Largest state upload the state server accepts, in bytes; larger ones are refused with 413.")
	fs.Int64Var(&o.MaxInflightBytes, "state-server-max-inflight-bytes", d.MaxInflightBytes, "Bytes of large states (over 1 MiB) the state server reads or sends at once; more wait, then get 503 with Retry-After. Budget about 3x this in the controller's memory limit.")
	fs.Int64Var(&o.MaxInflightBytesPerNamespace, "state-server-max-inflight-bytes-per-namespace", d.MaxInflightBytesPerNamespace, "One namespace's share of --state-server-max-inflight-bytes, so one tenant cannot take it all.")
	fs.Int64Var(&o.MaxSmallInflightBytes, "state-server-max-small-inflight-bytes", d.MaxSmallInflightBytes, "Bytes of small states (up to 1 MiB) and lock infos the state server holds at once, counted as they arrive; more wait, then get 503 with Retry-After. Budget about 3x this in the controller's memory limit.")
	fs.Int64Var(&o.MaxSmallInflightBytesPerNamespace, "state-server-max-small-inflight-bytes-per-namespace", d.MaxSmallInflightBytesPerNamespace, "One namespace's share of --state-server-max-small-inflight-bytes.")
	fs.DurationVar(&o.AdmissionWait, "state-server-admission-wait", d.AdmissionWait, "How long a state transfer waits for room under --state-server-max-inflight-bytes or --state-server-max-small-inflight-bytes before it gets 503.")
	fs.DurationVar(&o.BodyTimeout, "state-server-body-timeout", d.BodyTimeout, "How long a request body up to 1 MiB may take to arrive at the state server, a second more per MiB beyond; a late one gets 408.")
	fs.IntVar(&o.MaxConnections, "state-server-max-connections", d.MaxConnections, "Connections the state server keeps open at once; more wait to be accepted. Each holds some 30-50 KiB.")
	fs.IntVar(&o.MaxConnectionsPerRun, "state-server-max-connections-per-run", d.MaxConnectionsPerRun, "Connections one run's certificate may keep open to the state server; more get 429 and are closed.")
	fs.IntVar(&o.MaxConnectionsPerNamespace, "state-server-max-connections-per-namespace", d.MaxConnectionsPerNamespace, "Connections the runs of one namespace may keep open to the state server; more get 429 and are closed.")
	fs.DurationVar(&o.ShutdownTimeout, "state-server-shutdown-timeout", d.ShutdownTimeout, "How long the state server waits for requests in flight on shutdown.")
}

// Server is the state server as a manager Runnable: every replica serves
// (NeedLeaderElection is false); the store does the concurrency control.
type Server struct {
	opts      Options
	handler   *Handler
	tlsConfig *tls.Config

	mu       sync.Mutex
	listener net.Listener
}

var (
	_ manager.Runnable               = (*Server)(nil)
	_ manager.LeaderElectionRunnable = (*Server)(nil)
)

// NewServer returns a state server for store. runs tells which runner
// certificates are current (nil: no runner is accepted). tlsConfig must
// require and verify client certificates (pki.ServerTLSConfig with a nil
// authorize: the handler authorizes per state).
func NewServer(opts Options, store state.Store, runs RunChecker, tlsConfig *tls.Config) *Server {
	d := DefaultOptions()
	if opts.ListenAddress == "" {
		opts.ListenAddress = d.ListenAddress
	}
	orDefault(&opts.MaxStateBytes, d.MaxStateBytes)
	orDefault(&opts.ShutdownTimeout, d.ShutdownTimeout)
	orDefault(&opts.MaxInflightBytes, d.MaxInflightBytes)
	orDefault(&opts.AdmissionWait, d.AdmissionWait)
	orDefault(&opts.MaxSmallInflightBytes, d.MaxSmallInflightBytes)
	orDefault(&opts.MaxSmallInflightBytesPerNamespace, min(d.MaxSmallInflightBytesPerNamespace, opts.MaxSmallInflightBytes))
	orDefault(&opts.BodyTimeout, d.BodyTimeout)
	orDefault(&opts.MaxConnections, d.MaxConnections)
	orDefault(&opts.MaxConnectionsPerRun, d.MaxConnectionsPerRun)
	orDefault(&opts.MaxConnectionsPerNamespace, d.MaxConnectionsPerNamespace)
	cfg := tlsConfig.Clone()
	if cfg.MinVersion < tls.VersionTLS12 {
		cfg.MinVersion = tls.VersionTLS12
	}
	cfg.NextProtos = []string{"http/1.1"}
	lim := newHandlerLimits(opts)
	lim.conns = newConnectionLimits(opts.MaxConnectionsPerRun, opts.MaxConnectionsPerNamespace)
	handler := &Handler{Store: store, Runs: runs, MaxStateBytes: opts.MaxStateBytes, lim: lim}
	return &Server{opts: opts, tlsConfig: cfg, handler: handler}
}

// orDefault sets an option left at zero (or below) to its default.
func orDefault[T int | int64 | time.Duration](v *T, d T) {
	if *v <= 0 {
		*v = d
	}
}

// NeedLeaderElection implements manager.LeaderElectionRunnable: every replica serves.
func (s *Server) NeedLeaderElection() bool { return false }

// Listen binds the listen address; Start calls it when it was not called.
func (s *Server) Listen() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.listener != nil {
		return nil
	}
	ln, err := net.Listen("tcp", s.opts.ListenAddress)
	if err != nil {
		return fmt.Errorf("failed to listen on %s for the state server: %w", s.opts.ListenAddress, err)
	}
	s.listener = ln
	return nil
}

// Addr is the bound address, nil before Listen.
func (s *Server) Addr() net.Addr {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.listener == nil {
		return nil
	}
	return s.listener.Addr()
}

// Start serves until ctx ends, then shuts down gracefully.
func (s *Server) Start(ctx context.Context) error {
	if err := s.Listen(); err != nil {
		return err
	}
	logger := logf.FromContext(ctx).WithName("state-server")
	s.handler.Log = logger
	conns := s.handler.limits().conns
	srv := &http.Server{
		Handler:           s.handler,
		TLSConfig:         s.tlsConfig,
		ReadHeaderTimeout: 10 * time.Second,
		// Large states over slow links: generous, but bounded.
		ReadTimeout:  5 * time.Minute,
		WriteTimeout: 5 * time.Minute,
		IdleTimeout:  2 * time.Minute,
		// A non-nil empty map turns HTTP/2 off.
		TLSNextProto:   map[string]func(*http.Server, *tls.Conn, http.Handler){},
		MaxHeaderBytes: 64 << 10,
		ErrorLog:       log.New(logWriter{logger}, "", 0),
		// Requests in flight finish during a graceful shutdown: their context
		// keeps the logger but not the cancellation.
		BaseContext: func(net.Listener) context.Context { return context.WithoutCancel(ctx) },
		// Connections count against their client's caps from their first
		// request until they close.
		ConnContext: conns.connContext,
		ConnState: func(c net.Conn, state http.ConnState) {
			if state == http.StateClosed || state == http.StateHijacked {
				conns.forget(c)
			}
		},
	}
	errc := make(chan error, 1)
	ln := newLimitListener(s.listener, s.opts.MaxConnections)
	go func() { errc <- srv.ServeTLS(ln, "", "") }()
	logger.Info("serving terraform state", "address", s.listener.Addr().String(), "advertisedURL", s.opts.AdvertisedURL)
	select {
	case err := <-errc:
		return fmt.Errorf("state server stopped: %w", err)
	case <-ctx.Done():
	}
	shutdownCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.opts.ShutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil {
		return fmt.Errorf("failed to shut the state server down: %w", err)
	}
	if err := <-errc; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// logWriter sends net/http's own messages (TLS handshake errors) to the logger.
type logWriter struct{ log logr.Logger }

func (w logWriter) Write(p []byte) (int, error) {
	w.log.V(1).Info("http server", "message", string(p))
	return len(p), nil
}
