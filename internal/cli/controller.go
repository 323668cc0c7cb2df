package cli

import (
	"github.com/spf13/cobra"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/terrace-dev/terrace/internal/operator"
)

func newControllerCommand() *cobra.Command {
	opts := operator.DefaultOptions()
	var kubeconfig string
	var development bool
	api := kubeAPIOptions{QPS: defaultKubeAPIQPS, Burst: defaultKubeAPIBurst}
	cmd := &cobra.Command{
		Use:   "controller",
		Short: "Run the Terrace controller: reconcilers, artifact and state servers",
		Long: "The controller reconciles Programs, Stacks and TerraceConfigs (on the elected leader) and\n" +
			"serves Program tarballs and Terraform state to runner pods over mutual TLS (on every replica).",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctrl.SetLogger(zap.New(zap.UseDevMode(development)))
			rules := clientcmd.NewDefaultClientConfigLoadingRules()
			rules.ExplicitPath = kubeconfig
			cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{}).ClientConfig()
			if err != nil {
				return err
			}
			api.apply(cfg)
			return operator.Run(ctrl.SetupSignalHandler(), cfg, opts)
		},
	}
	opts.BindFlags(cmd.Flags())
	cmd.Flags().StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig to use outside a cluster (default: in-cluster config, then $KUBECONFIG and ~/.kube/config)")
	cmd.Flags().BoolVar(&development, "log-dev", false, "human-readable logs instead of JSON")
	cmd.Flags().Float32Var(&api.QPS, "kube-api-qps", api.QPS, "requests per second the controller may send to the Kubernetes API server")
	cmd.Flags().IntVar(&api.Burst, "kube-api-burst", api.Burst, "requests the controller may send to the Kubernetes API server in a burst")
	return cmd
}

// The client-go defaults (5 requests a second, bursts of 10) throttle a
// controller that keeps state, plans, releases and per-run credentials in
// Secrets; Flux's controllers default to 50 and 300.
const (
	defaultKubeAPIQPS   = 50
	defaultKubeAPIBurst = 300
)

// kubeAPIOptions bound the controller's requests to the API server.
type kubeAPIOptions struct {
	QPS   float32
	Burst int
}

// apply sets the limits on cfg, which a kubeconfig or the in-cluster
// config leaves at zero (client-go's defaults).
func (o kubeAPIOptions) apply(cfg *rest.Config) {
	cfg.QPS, cfg.Burst = o.QPS, o.Burst
}
