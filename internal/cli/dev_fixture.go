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
	"syscall"
	"time"

	"github.com/spf13/cobra"
)

// newDevPodFixtureCommand is a hidden process for the dev cluster's
// end-to-end tests, run from the Terrace image: it serves /healthz (and the
// pod's environment) over HTTP until SIGTERM, tries one connection and
// says whether it got through, or holds for a while (the image has no
// shell: a test module's local-exec waits with it, as with `sleep`).
func newDevPodFixtureCommand() *cobra.Command {
	var listen, dial string
	var hold time.Duration
	cmd := &cobra.Command{
		Use:    "pod-fixture",
		Short:  "Test process for the dev cluster (serves /healthz, or dials an address once)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if hold > 0 {
				// A wait, not a poll: the caller wants the time to pass.
				time.Sleep(hold)
				return nil
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
				return errors.New("pod-fixture needs --listen or --dial")
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return serveFixture(ctx, cmd.OutOrStdout(), listen)
		},
	}
	f := cmd.Flags()
	f.StringVar(&listen, "listen", "", "HTTP address: /healthz, /env/NAME")
	f.StringVar(&dial, "dial", "", "connect to HOST:PORT once and exit: 0 if it connected, 3 if not")
	f.DurationVar(&hold, "hold", 0, "stay for this long and exit 0")
	return cmd
}

func serveFixture(ctx context.Context, out io.Writer, listen string) error {
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
	lis, err := net.Listen("tcp", listen)
	if err != nil {
		return fmt.Errorf("failed to listen on %s: %w", listen, err)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	errs := make(chan error, 1)
	go func() { errs <- srv.Serve(lis) }()
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
