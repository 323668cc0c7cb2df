package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

// newDevPodFixtureCommand is a hidden process for devnode's end-to-end
// tests: it serves what a pod sees (files, environment, identity) over HTTP
// and gRPC health, or prints lines and exits with a chosen code.
func newDevPodFixtureCommand() *cobra.Command {
	var (
		listen, grpcListen string
		files              []string
		say                []string
		dial               string
		exitCode           int
		whoami, ignoreTerm bool
	)
	cmd := &cobra.Command{
		Use:    "pod-fixture",
		Short:  "Test process for devnode (serves its files and environment)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			for _, line := range say {
				fmt.Fprintln(cmd.OutOrStdout(), line)
			}
			if dial != "" {
				// A connection attempt, for NetworkPolicy tests: exit 0 when
				// it connects, 3 when it does not within 3 s.
				conn, err := net.DialTimeout("tcp", dial, 3*time.Second)
				if err != nil {
					fmt.Fprintf(cmd.OutOrStdout(), "cannot reach %s: %v\n", dial, err)
					os.Exit(3)
				}
				_ = conn.Close()
				fmt.Fprintf(cmd.OutOrStdout(), "connected to %s\n", dial)
				return nil
			}
			if listen == "" {
				if exitCode != 0 {
					os.Exit(exitCode)
				}
				return nil
			}
			identity := ""
			if whoami {
				user, err := reviewSelf(cmd.Context())
				if err != nil {
					return err
				}
				identity = user
				fmt.Fprintln(cmd.OutOrStdout(), "authenticated as", user)
			}
			ctx := cmd.Context()
			if ignoreTerm {
				// Only SIGKILL ends it: for testing grace periods.
				signal.Ignore(os.Interrupt, syscall.SIGTERM)
				fmt.Fprintln(cmd.OutOrStdout(), "ignoring SIGTERM")
			} else {
				var stop context.CancelFunc
				ctx, stop = signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
				defer stop()
			}
			return serveFixture(ctx, cmd.OutOrStdout(), listen, grpcListen, files, identity)
		},
	}
	f := cmd.Flags()
	f.StringVar(&listen, "listen", "", "HTTP address: /healthz, /env/NAME, /file/NAME, /whoami")
	f.StringVar(&grpcListen, "grpc-listen", "", "gRPC health address")
	f.StringArrayVar(&files, "file", nil, "NAME=PATH served at /file/NAME")
	f.StringArrayVar(&say, "say", nil, "line to print first")
	f.IntVar(&exitCode, "exit", 0, "exit with this code after printing (without --listen)")
	f.StringVar(&dial, "dial", "", "connect to HOST:PORT once and exit: 0 if it connected, 3 if not")
	f.BoolVar(&whoami, "whoami", false, "ask the API server who this pod is (KUBECONFIG) before serving")
	f.BoolVar(&ignoreTerm, "ignore-sigterm", false, "keep serving after SIGTERM")
	return cmd
}

func reviewSelf(ctx context.Context) (string, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", os.Getenv("KUBECONFIG"))
	if err != nil {
		return "", fmt.Errorf("failed to load KUBECONFIG: %w", err)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return "", err
	}
	review, err := cs.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("failed to review self: %w", err)
	}
	return review.Status.UserInfo.Username, nil
}

func serveFixture(ctx context.Context, out io.Writer, listen, grpcListen string, files []string, identity string) error {
	paths := map[string]string{}
	for _, f := range files {
		name, path, ok := strings.Cut(f, "=")
		if !ok {
			return fmt.Errorf("--file %q: want NAME=PATH", f)
		}
		paths[name] = path
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok\n") })
	mux.HandleFunc("GET /env/{name}", func(w http.ResponseWriter, r *http.Request) {
		v, ok := os.LookupEnv(r.PathValue("name"))
		if !ok {
			http.NotFound(w, r)
			return
		}
		_, _ = io.WriteString(w, v)
	})
	mux.HandleFunc("GET /file/{name}", func(w http.ResponseWriter, r *http.Request) {
		data, err := os.ReadFile(paths[r.PathValue("name")])
		if err != nil {
			http.Error(w, err.Error(), http.StatusNotFound)
			return
		}
		_, _ = w.Write(data)
	})
	mux.HandleFunc("GET /whoami", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, identity) })
	lis, err := net.Listen("tcp", listen)
	if err != nil {
		return fmt.Errorf("failed to listen on %s: %w", listen, err)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	errs := make(chan error, 2)
	go func() { errs <- srv.Serve(lis) }()
	if grpcListen != "" {
		glis, err := net.Listen("tcp", grpcListen)
		if err != nil {
			return fmt.Errorf("failed to listen on %s: %w", grpcListen, err)
		}
		gs := grpc.NewServer()
		healthpb.RegisterHealthServer(gs, health.NewServer())
		go func() { errs <- gs.Serve(glis) }()
		defer gs.Stop()
	}
	fmt.Fprintln(out, "serving on", lis.Addr().String())
	select {
	case <-ctx.Done():
		fmt.Fprintln(out, "terminating")
	case err := <-errs:
		if !errors.Is(err, http.ErrServerClosed) {
			return err
		}
	}
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return srv.Shutdown(shutdownCtx)
}
