package webhook

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"
)

// DefaultListenAddress is --webhook-bind-address's default.
const DefaultListenAddress = ":9292"

// Server serves a Receiver on every replica (not only the leader): any
// replica may annotate a Stack, the leader's reconciler acts on it.
type Server struct {
	addr    string
	handler http.Handler
	// ready, when set, is closed once the listener is open (tests).
	ready chan<- net.Addr
}

// NewServer serves r at addr (host:port).
func NewServer(addr string, r *Receiver) *Server {
	mux := http.NewServeMux()
	r.Register(mux)
	return &Server{addr: addr, handler: mux}
}

// NeedLeaderElection: every replica serves webhooks.
func (s *Server) NeedLeaderElection() bool { return false }

// Start serves until ctx ends, then shuts down within five seconds. The
// forge is on the other end: headers, bodies and idle connections are
// bounded; Receiver bounds the body and the rate.
func (s *Server) Start(ctx context.Context) error {
	ln, err := net.Listen("tcp", s.addr)
	if err != nil {
		return fmt.Errorf("webhook receiver: failed to listen on %s: %w", s.addr, err)
	}
	if s.ready != nil {
		s.ready <- ln.Addr()
	}
	srv := &http.Server{
		Handler:           s.handler,
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       60 * time.Second,
		MaxHeaderBytes:    64 << 10,
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	select {
	case err := <-done:
		return fmt.Errorf("webhook receiver: %w", err)
	case <-ctx.Done():
	}
	shutdownCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	return nil
}
