// Package runnercmd is the runner's command line: `terrace runner`, and the
// terrace-runner binary that runner pods start. It is kept apart from the
// rest of the CLI so that terrace-runner links only the runner, tofu's
// executor and the PKI: half the terrace binary's startup work and size,
// paid once per run.
package runnercmd

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"runtime/debug"
	"strconv"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"github.com/spf13/cobra"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/terrace-dev/terrace/internal/pki"
	"github.com/terrace-dev/terrace/internal/runner"
	"github.com/terrace-dev/terrace/internal/runner/server"
	"github.com/terrace-dev/terrace/internal/runnerbin"
	"github.com/terrace-dev/terrace/internal/tf"
)

// runnerOptions are the flags of `terrace runner`; each defaults to an
// environment variable so a pod spec can set either.
type runnerOptions struct {
	listen           string
	healthListen     string
	tlsDir           string
	workDir          string
	binary           string
	binaryPath       string
	providerMirror   string
	maxArchiveBytes  int64
	maxPlanFileBytes int64
	interruptGrace   time.Duration
	warm             bool
}

func envOr(key, def string) string {
	if v, ok := os.LookupEnv(key); ok && v != "" {
		return v
	}
	return def
}

func envInt64(key string, def int64) int64 {
	if v, err := strconv.ParseInt(os.Getenv(key), 10, 64); err == nil && v > 0 {
		return v
	}
	return def
}

func envDuration(key string, def time.Duration) time.Duration {
	if v, err := time.ParseDuration(os.Getenv(key)); err == nil && v > 0 {
		return v
	}
	return def
}

func (o *runnerOptions) bindFlags(cmd *cobra.Command) {
	f := cmd.Flags()
	f.StringVar(&o.listen, "listen", envOr("TERRACE_RUNNER_LISTEN", ":9090"), "gRPC (mutual TLS) listen address [TERRACE_RUNNER_LISTEN]")
	f.StringVar(&o.healthListen, "health-listen", envOr("TERRACE_RUNNER_HEALTH_LISTEN", ":9091"), "plain HTTP /healthz and /readyz listen address, empty to disable [TERRACE_RUNNER_HEALTH_LISTEN]")
	f.StringVar(&o.tlsDir, "tls-dir", envOr("TERRACE_RUNNER_TLS_DIR", "/etc/terrace/tls"), "directory with tls.crt, tls.key and ca.crt (the runner's leaf and the controller's CAs) [TERRACE_RUNNER_TLS_DIR]")
	f.StringVar(&o.workDir, "work-dir", envOr("TERRACE_RUNNER_WORK_DIR", os.TempDir()), "directory in which a private work directory is created and removed on exit [TERRACE_RUNNER_WORK_DIR]")
	f.StringVar(&o.binary, "binary", envOr("TERRACE_RUNNER_BINARY", tf.BinaryTofu), "tofu or terraform [TERRACE_RUNNER_BINARY]")
	f.StringVar(&o.binaryPath, "binary-path", envOr("TERRACE_RUNNER_BINARY_PATH", ""), "path of the binary (default: looked up on PATH) [TERRACE_RUNNER_BINARY_PATH]")
	f.StringVar(&o.providerMirror, "provider-mirror", envOr("TERRACE_PROVIDER_MIRROR", ""), "install providers only from this filesystem mirror [TERRACE_PROVIDER_MIRROR]")
	f.Int64Var(&o.maxArchiveBytes, "max-archive-bytes", envInt64("TERRACE_RUNNER_MAX_ARCHIVE_BYTES", runner.DefaultMaxArchiveBytes), "largest source tar.gz accepted [TERRACE_RUNNER_MAX_ARCHIVE_BYTES]")
	f.Int64Var(&o.maxPlanFileBytes, "max-plan-bytes", envInt64("TERRACE_RUNNER_MAX_PLAN_BYTES", runner.DefaultMaxPlanFileBytes), "largest plan file accepted by UploadPlan [TERRACE_RUNNER_MAX_PLAN_BYTES]")
	f.BoolVar(&o.warm, "warm", os.Getenv("TERRACE_RUNNER_WARM") == "true", "start as a warm runner: the certificate in --tls-dir names a runner class, and every operation waits for a run to claim the runner with its own credentials [TERRACE_RUNNER_WARM]")
	f.DurationVar(&o.interruptGrace, "interrupt-grace", envDuration("TERRACE_RUNNER_INTERRUPT_GRACE", 2*time.Minute), "how long tofu may take to stop after an interrupt before it is killed [TERRACE_RUNNER_INTERRUPT_GRACE]")
}

// NewRoot returns the runner command as the root of a binary: the lean
// terrace-runner, or terrace started under that name.
func NewRoot() *cobra.Command {
	cmd := NewCommand(runnerbin.Name)
	cmd.SilenceUsage, cmd.SilenceErrors = true, true
	return cmd
}

// NewCommand returns the runner command as use: "runner" under terrace,
// Name as a binary of its own.
func NewCommand(use string) *cobra.Command {
	var o runnerOptions
	cmd := &cobra.Command{
		Use:   use,
		Short: "Serve the runner gRPC service that runs tofu/terraform for the controller",
		Long: "The runner runs in a pod per run. It serves terrace.runner.v1 over mutual TLS, accepting\n" +
			"only the controller's identity, and keeps everything in a private work directory that it\n" +
			"removes on exit (SIGTERM interrupts a running tofu first so it can release its lock).",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return runRunner(ctx, o)
		},
	}
	o.bindFlags(cmd)
	return cmd
}

// runnerGCPercent is the runner process's own GOGC unless its environment
// sets one. A run allocates a few MB (gRPC frames, the module's files, tofu's
// JSON stream) on a heap that is small for most plans, and at the default of
// 100 the collector ran through it several times: a quarter of a runner's
// CPU in a profile of 100 runs. debug.SetGCPercent leaves the environment
// alone, so tofu and the providers it starts keep the default (their heaps
// are what a pod's memory limit is sized for).
const runnerGCPercent = 400

// runnerSoftMemoryLimit bounds what the higher GOGC may add: a large plan's
// JSON and its redacted copy are held whole (up to the controller's limits,
// tens of MiB), and 5x that would crowd tofu in the pod's memory limit.
// Near this size the collector works as hard as it must to stay under it.
const runnerSoftMemoryLimit = 256 << 20

// tuneGC sets the runner's GOGC and soft memory limit (see runnerGCPercent),
// unless the pod sets GOGC or GOMEMLIMIT itself.
func tuneGC() {
	if _, set := os.LookupEnv("GOGC"); set {
		return
	}
	debug.SetGCPercent(runnerGCPercent)
	if _, set := os.LookupEnv("GOMEMLIMIT"); !set {
		debug.SetMemoryLimit(runnerSoftMemoryLimit)
	}
}

func runRunner(ctx context.Context, o runnerOptions) error {
	tuneGC()
	log := funcr.New(func(prefix, args string) {
		fmt.Fprintln(os.Stderr, prefix, args)
	}, funcr.Options{LogTimestamp: true}).WithName("runner")

	certs, err := pki.NewFileSource(o.tlsDir)
	if err != nil {
		return fmt.Errorf("failed to load the runner certificate from %s: %w", o.tlsDir, err)
	}
	if err := os.MkdirAll(o.workDir, 0o700); err != nil {
		return fmt.Errorf("failed to create %s: %w", o.workDir, err)
	}
	workDir, err := os.MkdirTemp(o.workDir, "terrace-runner-")
	if err != nil {
		return fmt.Errorf("failed to create the work directory: %w", err)
	}
	defer func() {
		if err := os.RemoveAll(workDir); err != nil {
			log.Error(err, "failed to remove the work directory", "dir", workDir)
		}
	}()
	executor, err := tf.New(tf.Config{
		Binary: o.binary, BinaryPath: o.binaryPath, WorkDir: workDir,
		ProviderMirror: o.providerMirror, InterruptGrace: o.interruptGrace,
	})
	if err != nil {
		return err
	}
	srv, err := server.New(server.Config{
		Executor:         executor,
		Certificate:      certs,
		Trust:            certs,
		BackendLeaf:      func() (*pki.Leaf, error) { return pki.LoadLeafFiles(o.tlsDir) },
		Warm:             o.warm,
		MaxArchiveBytes:  o.maxArchiveBytes,
		MaxPlanFileBytes: o.maxPlanFileBytes,
		Log:              log,
		EchoLogs:         os.Stdout,
	})
	if err != nil {
		return err
	}
	lis, err := net.Listen("tcp", o.listen)
	if err != nil {
		return fmt.Errorf("failed to listen on %s: %w", o.listen, err)
	}
	if o.healthListen != "" {
		stopHealth, err := serveHealth(o.healthListen, srv, log)
		if err != nil {
			_ = lis.Close()
			return err
		}
		defer stopHealth()
	}
	log.Info("serving", "address", lis.Addr().String(), "binary", o.binary, "workDir", workDir, "warm", o.warm)
	return srv.Serve(ctx, lis)
}

// serveHealth answers plain HTTP probes: /healthz while the process lives,
// /readyz while the gRPC service is serving.
func serveHealth(addr string, srv *server.Server, log logr.Logger) (func(), error) {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, r *http.Request) {
		resp, err := srv.Health().Check(r.Context(), &healthpb.HealthCheckRequest{Service: runner.ServiceName})
		if err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			http.Error(w, "not serving", http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok\n"))
	})
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("failed to listen on %s for health probes: %w", addr, err)
	}
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := hs.Serve(lis); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error(err, "health server stopped")
		}
	}()
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = hs.Shutdown(ctx)
	}, nil
}
