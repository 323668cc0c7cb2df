package cli

import (
	"context"
	"fmt"
	"net"
	"os"
	"strings"

	"github.com/spf13/cobra"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/apiserver"
	"github.com/terrace-dev/terrace/internal/backend"
	"github.com/terrace-dev/terrace/internal/console"
	"github.com/terrace-dev/terrace/internal/settings"
)

func newAPICommand() *cobra.Command {
	var listen, certFile, keyFile, operatorState, clusters string
	var audiences []string
	var development bool
	cmd := &cobra.Command{
		Use:   "api",
		Short: "Serve the Installations API (gRPC, Connect and REST over HTTPS) for one namespace",
		Long: "Serves /v1/installations for the namespace of --namespace: create installations (a Stack with a\n" +
			"values Secret), list them, read plans, approve, read releases and outputs, replace values, delete.\n" +
			"Callers send a Kubernetes bearer token, and every Kubernetes request made for a call carries\n" +
			"that token: the cluster's RBAC decides and its audit log names the caller. The server's own\n" +
			"identity only reads its namespace's TerraceConfig. gRPC, gRPC-Web, Connect and REST on one port. See docs/api.md.",
		Example: "  terrace api --namespace team --tls-cert-file tls.crt --tls-key-file tls.key",
		Args:    cobra.NoArgs,
	}
	cmd.Flags().StringVar(&listen, "listen", ":8443", "address to serve HTTPS on (an IPv6 address may be given without brackets, as $(POD_IP):8443 expands)")
	cmd.Flags().StringVar(&operatorState, "operator-state", "", "JSON of the spec.state of the operator namespace's TerraceConfig ({} for none), used instead of reading that config; the controller sets it, so the server needs no right outside its namespace (default: read it)")
	cmd.Flags().StringVar(&clusters, "clusters", "", "JSON of the operator namespace's TerraceConfig spec.api.clusters ([] for none): the other clusters a call may name, and where callers' tokens for them are sent; the controller sets it (default: read that config at start, which needs get on it)")
	cmd.Flags().StringVar(&certFile, "tls-cert-file", "", "PEM serving certificate (reloaded when it changes)")
	cmd.Flags().StringVar(&keyFile, "tls-key-file", "", "PEM private key of the serving certificate")
	cmd.Flags().StringSliceVar(&audiences, "token-audiences", nil, "audiences one of which a caller's token must also be issued for (its aud claim; the Kubernetes API server must accept the token too); default: any token it accepts")
	cmd.Flags().BoolVar(&development, "log-dev", false, "human-readable logs instead of JSON")
	var oidc console.OIDC
	cmd.Flags().StringVar(&oidc.IssuerURL, "oidc-issuer-url", "", "offer sign-in to the web console with this OpenID Connect provider (authorization code flow); the Kubernetes API server must accept its ID tokens")
	cmd.Flags().StringVar(&oidc.ClientID, "oidc-client-id", "", "the console's OIDC client ID")
	cmd.Flags().StringVar(&oidc.ClientSecret, "oidc-client-secret", "", "the console's OIDC client secret (empty for a public client, PKCE alone); --oidc-client-secret-file keeps it off the command line")
	var oidcSecretFile string
	cmd.Flags().StringVar(&oidcSecretFile, "oidc-client-secret-file", "", "a file holding the console's OIDC client secret")
	cmd.Flags().StringVar(&oidc.RedirectURL, "oidc-redirect-url", "", "the console's callback URL as the provider knows it: https://<host>/oidc/callback")
	cmd.Flags().StringSliceVar(&oidc.Scopes, "oidc-scopes", nil, "scopes to ask for beyond openid (e.g. email,groups)")
	var oidcCAFile string
	cmd.Flags().StringVar(&oidcCAFile, "oidc-ca-file", "", "PEM certificates to trust for the OIDC provider beside the system's roots (a provider with a private CA)")
	return userCommand(cmd, func(ctx context.Context, k *kube, _ streams, _ []string) error {
		if certFile == "" || keyFile == "" {
			return fmt.Errorf("--tls-cert-file and --tls-key-file are required: the API carries bearer tokens and is served over TLS only")
		}
		log := zap.New(zap.UseDevMode(development)).WithName("api")
		ctrl.SetLogger(log)
		caller, err := apiserver.CallerClient(k.config, k.client.Scheme())
		if err != nil {
			return err
		}
		// Plans and releases are Secrets: read as the caller; the TerraceConfig
		// that says where they are, with the server's own identity.
		// Another namespace's TerraceConfig, for a call naming a Stack there, as the caller.
		resolver := k.resolver()
		resolver.Reader = apiserver.ConfigReader(k.client, caller, k.namespace, k.flags.operatorNamespace)
		if operatorState != "" {
			state, err := apiserver.ParseOperatorState(operatorState)
			if err != nil {
				return err
			}
			resolver.Reader = apiserver.SettingsReader(resolver.Reader, k.flags.operatorNamespace, state)
		}
		registered, err := registeredClusters(ctx, k, clusters)
		if err != nil {
			return err
		}
		stores := backend.New(caller, resolver.ResolveNamespace)
		defer stores.Close()
		ln, err := net.Listen("tcp", listenAddress(listen))
		if err != nil {
			return fmt.Errorf("failed to listen on %s: %w", listen, err)
		}
		podLogs, err := apiserver.CallerPodLogs(k.config)
		if err != nil {
			return err
		}
		consoleOptions := console.Options{Namespace: k.namespace}
		if oidcSecretFile != "" {
			secret, err := os.ReadFile(oidcSecretFile)
			if err != nil {
				return fmt.Errorf("failed to read --oidc-client-secret-file: %w", err)
			}
			oidc.ClientSecret = strings.TrimSpace(string(secret))
		}
		if oidcCAFile != "" {
			if err := oidc.TrustCAFile(oidcCAFile); err != nil {
				return err
			}
		}
		if oidc.IssuerURL != "" {
			consoleOptions.OIDC = &oidc
		}
		web, err := console.Handler(consoleOptions)
		if err != nil {
			return fmt.Errorf("failed to set up the web console: %w", err)
		}
		srv := &apiserver.Server{Namespace: k.namespace, Client: k.client, Caller: caller, TokenAudiences: audiences, Stores: stores, Log: log, Clusters: registered,
			// In a registered cluster the TerraceConfigs are read as the caller too.
			StoresFor: func(c client.Client) apiserver.StoreOpener {
				resolver := &settings.Resolver{Reader: c, OperatorNamespace: k.flags.operatorNamespace, Builtin: settings.BuiltinDefaults("")}
				return backend.New(c, resolver.ResolveNamespace)
			},
		}
		srv.PodLogs, srv.Console = podLogs, web
		return srv.Serve(ctx, ln, apiserver.TLSFiles{CertFile: certFile, KeyFile: keyFile})
	})
}

// registeredClusters are the clusters of --clusters, else those of the
// operator namespace's TerraceConfig, read once with the server's identity.
func registeredClusters(ctx context.Context, k *kube, flag string) ([]terracev1.APICluster, error) {
	if flag != "" {
		return apiserver.ParseClusters(flag)
	}
	return apiserver.OperatorClusters(ctx, k.client, k.flags.operatorNamespace)
}

// listenAddress brackets an IPv6 host written without brackets
// ("fd00::5:8443", as $(POD_IP):8443 expands for an IPv6 pod), so that
// net.Listen accepts it; any other address is returned as it is.
func listenAddress(addr string) string {
	if _, _, err := net.SplitHostPort(addr); err == nil {
		return addr
	}
	i := strings.LastIndex(addr, ":")
	if i < 0 {
		return addr
	}
	if ip := net.ParseIP(addr[:i]); ip != nil && ip.To4() == nil {
		return net.JoinHostPort(addr[:i], addr[i+1:])
	}
	return addr
}
