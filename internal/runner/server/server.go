// Package server is the runner's gRPC service (terrace.runner.v1) around
// internal/tf: what runs in the runner pod. It speaks only mutual TLS and
// accepts only the controller's identity. The controller's side is the
// client in the parent package, which this package shares its protocol
// constants and error reasons with.
package server

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"

	"github.com/terrace-dev/terrace/internal/pki"
	"github.com/terrace-dev/terrace/internal/runner"
	"github.com/terrace-dev/terrace/internal/runphase"
	"github.com/terrace-dev/terrace/internal/tf"
	runnerv1 "github.com/terrace-dev/terrace/proto/terrace/runner/v1"
)

// Config configures a Server.
type Config struct {
	// Executor runs tofu in the runner's work directory.
	Executor *tf.Executor
	// Certificate is the runner's own leaf (its runner identity), used as
	// the gRPC server certificate, as the client certificate of Fetch and
	// of the http backend.
	Certificate pki.CertificateSource
	// Trust holds the CAs that issued the controller's certificate.
	Trust pki.TrustSource
	// BackendLeaf returns the runner's leaf as PEM for tofu's http backend;
	// nil refuses http backends.
	BackendLeaf func() (*pki.Leaf, error)
	// Warm marks a runner started ahead of demand with a runner-class
	// Certificate: it refuses every operation until a run claims it
	// (Claim), then presents the run's credentials instead of its own.
	Warm bool
	// MaxArchiveBytes bounds an uploaded or fetched tar.gz.
	MaxArchiveBytes int64
	// MaxPlanFileBytes bounds an uploaded plan file.
	MaxPlanFileBytes int64
	// MaxCloneBytes bounds a Clone (DefaultMaxCloneBytes when zero): the
	// bytes read from the server and the objects kept, uncompressed.
	MaxCloneBytes int64
	// CloneTimeout bounds a Clone (DefaultCloneTimeout when zero).
	CloneTimeout time.Duration
	// Log receives one line per operation; never values.
	Log logr.Logger
	// EchoLogs, when set, also receives every (redacted) tofu output line,
	// e.g. os.Stdout so the pod's log shows the run.
	EchoLogs io.Writer
}

// Server implements runnerv1.RunnerServiceServer.
type Server struct {
	runnerv1.UnimplementedRunnerServiceServer

	cfg    Config
	exec   *tf.Executor
	health *health.Server
	fetch  *http.Client

	// claim holds a warm runner's run credentials once claimed.
	claim claim

	// busy admits one operation at a time.
	busy sync.Mutex
	echo sync.Mutex
}

// New checks cfg and returns a server.
func New(cfg Config) (*Server, error) {
	if cfg.Executor == nil || cfg.Certificate == nil || cfg.Trust == nil {
		return nil, errors.New("a runner server needs an executor, a certificate and a trust source")
	}
	if cfg.MaxArchiveBytes <= 0 {
		cfg.MaxArchiveBytes = runner.DefaultMaxArchiveBytes
	}
	if cfg.MaxPlanFileBytes <= 0 {
		cfg.MaxPlanFileBytes = runner.DefaultMaxPlanFileBytes
	}
	s := &Server{cfg: cfg, exec: cfg.Executor, health: health.NewServer()}
	transport := &http.Transport{
		TLSClientConfig:     pki.ClientTLSConfig(pki.CertificateFunc(s.clientCertificate), cfg.Trust, pki.ControllerIdentity),
		TLSHandshakeTimeout: 30 * time.Second,
		ForceAttemptHTTP2:   false,
		Proxy:               http.ProxyFromEnvironment,
	}
	s.fetch = &http.Client{Transport: transport, Timeout: 10 * time.Minute}
	s.health.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	s.health.SetServingStatus(runner.ServiceName, healthpb.HealthCheckResponse_SERVING)
	return s, nil
}

// TLSConfig is the server side of mutual TLS: the runner's certificate,
// clients must present a certificate chaining to Trust that names the
// controller.
func (s *Server) TLSConfig() *tls.Config {
	return pki.ServerTLSConfig(s.cfg.Certificate, s.cfg.Trust, pki.RequireIdentity(pki.ControllerIdentity))
}

// GRPCServer returns a gRPC server with the runner and health services,
// serving mutual TLS only. Stop waits for running operations, which are
// cancelled (tofu gets SIGINT and may release its lock).
func (s *Server) GRPCServer(opts ...grpc.ServerOption) *grpc.Server {
	opts = append([]grpc.ServerOption{
		grpc.Creds(credentials.NewTLS(s.TLSConfig())),
		grpc.WaitForHandlers(true),
		// A controller that vanished mid-run is noticed within a minute, so
		// its operation is cancelled and tofu releases the state lock.
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: 30 * time.Second, Timeout: 20 * time.Second}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
	}, opts...)
	g := grpc.NewServer(opts...)
	runnerv1.RegisterRunnerServiceServer(g, s)
	healthpb.RegisterHealthServer(g, s.health)
	return g
}

// Health is the health service, for a plain-text probe endpoint too.
func (s *Server) Health() *health.Server { return s.health }

// Serve serves on lis until ctx ends, then stops: running operations are
// cancelled and waited for.
func (s *Server) Serve(ctx context.Context, lis net.Listener) error {
	g := s.GRPCServer()
	errc := make(chan error, 1)
	go func() { errc <- g.Serve(lis) }()
	select {
	case <-ctx.Done():
		s.health.Shutdown()
		g.Stop()
		<-errc
		return nil
	case err := <-errc:
		return err
	}
}

// acquire admits one operation; a second one gets FailedPrecondition. The
// release it returns may be called more than once: handlers call it before
// sending their final message, so a client that goes on as soon as it has
// the result never finds the runner still busy.
func (s *Server) acquire(op string) (func(), error) {
	if !s.claimed() {
		return nil, statusError(codes.FailedPrecondition, runner.ReasonNotClaimed, "this warm runner has not been claimed by a run: "+op+" refused")
	}
	if !s.busy.TryLock() {
		return nil, busyError(op)
	}
	start := time.Now()
	log := s.cfg.Log.WithValues("op", op)
	if p, ok := opPhases[op]; ok {
		log = log.WithValues("phase", p)
	}
	log.Info("operation started")
	var once sync.Once
	return func() {
		once.Do(func() {
			log.Info("operation finished", "duration", time.Since(start).Round(time.Millisecond).String())
			s.busy.Unlock()
		})
	}, nil
}

// opPhases names the run phase of the operations that are one, so the
// runner's log says where a run's time went in the words the controller's
// events and metrics use. (plan-and-apply logs its two phases itself.)
var opPhases = map[string]runphase.Phase{
	"upload": runphase.Fetch, "fetch": runphase.Fetch, "init": runphase.Init,
	"plan": runphase.Plan, "apply": runphase.Apply, "output": runphase.Outputs,
}

// timed runs one phase of an operation and logs its duration.
func timed[T any](s *Server, p runphase.Phase, f func() (T, error)) (T, error) {
	start := time.Now()
	v, err := f()
	s.logPhase(p, start, err != nil)
	return v, err
}

// logPhase logs that phase p, begun at start, is over.
func (s *Server) logPhase(p runphase.Phase, start time.Time, failed bool) {
	s.cfg.Log.Info("phase finished", "phase", p, "duration", time.Since(start).Round(time.Millisecond).String(), "failed", failed)
}

// logSender returns a tf.LogFunc that sends each line on a stream. tofu's
// stdout and stderr are read concurrently, and a gRPC stream must not be
// written concurrently, hence the lock. A failed send (client gone) is
// dropped: the cancelled context stops tofu.
func (s *Server) logSender(send func(*runnerv1.LogLine) error) (tf.LogFunc, *sync.Mutex) {
	var mu sync.Mutex
	return func(stream tf.Stream, line string) {
		ls := runnerv1.LogStream_LOG_STREAM_STDOUT
		if stream == tf.Stderr {
			ls = runnerv1.LogStream_LOG_STREAM_STDERR
		}
		if w := s.cfg.EchoLogs; w != nil {
			s.echo.Lock()
			_, _ = fmt.Fprintln(w, line)
			s.echo.Unlock()
		}
		mu.Lock()
		defer mu.Unlock()
		_ = send(&runnerv1.LogLine{Text: line, Stream: ls})
	}, &mu
}

// sendChunks cuts data into runner.ChunkSize pieces for send.
func sendChunks(data []byte, send func([]byte) error) error {
	for len(data) > 0 {
		n := min(len(data), runner.ChunkSize)
		if err := send(data[:n]); err != nil {
			return err
		}
		data = data[n:]
	}
	return nil
}
