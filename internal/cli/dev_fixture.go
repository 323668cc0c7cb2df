package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	eventv1 "github.com/fluxcd/pkg/apis/event/v1"
	"github.com/spf13/cobra"
)

// newDevPodFixtureCommand is a hidden process for the dev cluster's
// end-to-end tests, run from the Terrace image: it serves /healthz (and the
// pod's environment, and a notification receiver) over HTTP until SIGTERM,
// tries one connection and
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
	f.StringVar(&listen, "listen", "", "HTTP address: /healthz, /env/NAME, and a notification receiver: POST /flux (Flux events), POST /webhook (any body), GET /received")
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
	var received notificationsReceived
	mux.HandleFunc("POST /flux", received.flux)
	mux.HandleFunc("POST /webhook", received.webhook)
	mux.HandleFunc("GET /received", received.list)
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

// notificationsReceived is what a notification-controller or a webhook
// receiver got: Flux events, decoded as Flux's own type (a body that is not
// one is refused, as the notification-controller refuses it), and webhook
// bodies as sent.
type notificationsReceived struct {
	mu       sync.Mutex
	Flux     []eventv1.Event   `json:"flux"`
	Webhooks []json.RawMessage `json:"webhooks"`
}

func (n *notificationsReceived) flux(w http.ResponseWriter, r *http.Request) {
	var e eventv1.Event
	if err := json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(&e); err != nil || e.InvolvedObject.Kind == "" || e.Severity == "" {
		http.Error(w, fmt.Sprintf("not a Flux event: %v", err), http.StatusBadRequest)
		return
	}
	n.mu.Lock()
	n.Flux = append(n.Flux, e)
	n.mu.Unlock()
	w.WriteHeader(http.StatusAccepted)
}

func (n *notificationsReceived) webhook(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	if err != nil || !json.Valid(body) {
		http.Error(w, "not JSON", http.StatusBadRequest)
		return
	}
	n.mu.Lock()
	n.Webhooks = append(n.Webhooks, body)
	n.mu.Unlock()
	w.WriteHeader(http.StatusOK)
}

func (n *notificationsReceived) list(w http.ResponseWriter, _ *http.Request) {
	n.mu.Lock()
	defer n.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(n)
}
