package cli

import (
	"context"
	"fmt"
	"net"

	"github.com/spf13/cobra"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/terrace-dev/terrace/internal/apiserver"
)

func newAPICommand() *cobra.Command {
	var listen, certFile, keyFile string
	var audiences []string
	var development bool
	cmd := &cobra.Command{
		Use:   "api",
		Short: "Serve the Installations API (REST over HTTPS) for one namespace",
		Long: "Serves /v1/installations for the namespace of --namespace: create installations (a Stack with a\n" +
			"values Secret), list them, read plans, approve, read releases and outputs, replace values, delete.\n" +
			"Callers send a Kubernetes bearer token; each request is checked with a TokenReview and a\n" +
			"SubjectAccessReview, then done with this server's own identity. See docs/api.md.",
		Example: "  terrace api --namespace team --tls-cert-file tls.crt --tls-key-file tls.key",
		Args:    cobra.NoArgs,
	}
	cmd.Flags().StringVar(&listen, "listen", ":8443", "address to serve HTTPS on")
	cmd.Flags().StringVar(&certFile, "tls-cert-file", "", "PEM serving certificate (reloaded when it changes)")
	cmd.Flags().StringVar(&keyFile, "tls-key-file", "", "PEM private key of the serving certificate")
	cmd.Flags().StringSliceVar(&audiences, "token-audiences", nil, "audiences a caller's token must be issued for (checked by TokenReview); default: the Kubernetes API server's own")
	cmd.Flags().BoolVar(&development, "log-dev", false, "human-readable logs instead of JSON")
	return userCommand(cmd, func(ctx context.Context, k *kube, _ streams, _ []string) error {
		if certFile == "" || keyFile == "" {
			return fmt.Errorf("--tls-cert-file and --tls-key-file are required: the API carries bearer tokens and is served over TLS only")
		}
		log := zap.New(zap.UseDevMode(development)).WithName("api")
		ctrl.SetLogger(log)
		reviews, err := k.clientset()
		if err != nil {
			return err
		}
		stores := k.backends()
		defer stores.Close()
		ln, err := net.Listen("tcp", listen)
		if err != nil {
			return fmt.Errorf("failed to listen on %s: %w", listen, err)
		}
		srv := &apiserver.Server{Namespace: k.namespace, Client: k.client, Reviews: reviews, TokenAudiences: audiences, Stores: stores, Log: log}
		return srv.Serve(ctx, ln, apiserver.TLSFiles{CertFile: certFile, KeyFile: keyFile})
	})
}
