package cli

import (
	"github.com/spf13/cobra"
	"k8s.io/client-go/tools/clientcmd"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/terrace-dev/terrace/internal/operator"
)

func newControllerCommand() *cobra.Command {
	opts := operator.DefaultOptions()
	var kubeconfig string
	var development bool
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
			return operator.Run(ctrl.SetupSignalHandler(), cfg, opts)
		},
	}
	opts.BindFlags(cmd.Flags())
	cmd.Flags().StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig to use outside a cluster (default: in-cluster config, then $KUBECONFIG and ~/.kube/config)")
	cmd.Flags().BoolVar(&development, "log-dev", false, "human-readable logs instead of JSON")
	return cmd
}
