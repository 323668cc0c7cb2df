package cli

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/backend"
	"github.com/terrace-dev/terrace/internal/scheme"
	"github.com/terrace-dev/terrace/internal/settings"
)

// defaultOperatorNamespace holds the cluster-default TerraceConfig unless told otherwise.
const defaultOperatorNamespace = "terrace-system"

// kubeFlags are the connection flags every user verb shares.
type kubeFlags struct {
	kubeconfig        string
	context           string
	namespace         string
	operatorNamespace string
}

func (f *kubeFlags) bind(fs *pflag.FlagSet) {
	fs.StringVar(&f.kubeconfig, "kubeconfig", "", "kubeconfig to use (default: $KUBECONFIG, then ~/.kube/config, then in-cluster)")
	fs.StringVar(&f.context, "context", "", "kubeconfig context to use (default: the current context)")
	fs.StringVarP(&f.namespace, "namespace", "n", "", "namespace of the Stack (default: the context's namespace, else default)")
	fs.StringVar(&f.operatorNamespace, "operator-namespace", defaultOperatorNamespace, "namespace of the cluster-default TerraceConfig, read to open the state, plan and release stores")
}

// kube is a connection to the cluster for one command.
type kube struct {
	flags     kubeFlags
	config    *rest.Config
	client    client.Client
	namespace string
}

// connect loads the kubeconfig, resolves the namespace and builds an
// uncached client: a CLI reads each object once.
func (f kubeFlags) connect() (*kube, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = f.kubeconfig
	loader := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{CurrentContext: f.context})
	cfg, err := loader.ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("failed to load the kubeconfig: %w", err)
	}
	namespace := f.namespace
	if namespace == "" {
		// "default" when the context names none.
		if namespace, _, err = loader.Namespace(); err != nil {
			return nil, fmt.Errorf("failed to read the namespace of the kubeconfig context: %w", err)
		}
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme.New()})
	if err != nil {
		return nil, fmt.Errorf("failed to create a Kubernetes client: %w", err)
	}
	return &kube{flags: f, config: cfg, client: c, namespace: namespace}, nil
}

// clientset returns a client-go clientset, for the pod log API.
func (k *kube) clientset() (kubernetes.Interface, error) {
	cs, err := kubernetes.NewForConfig(k.config)
	if err != nil {
		return nil, fmt.Errorf("failed to create a Kubernetes clientset: %w", err)
	}
	return cs, nil
}

// stack reads the named Stack of the namespace, with an error that says
// what is missing.
func (k *kube) stack(ctx context.Context, name string) (*terracev1.Stack, error) {
	stack := &terracev1.Stack{}
	err := k.client.Get(ctx, client.ObjectKey{Namespace: k.namespace, Name: name}, stack)
	if err != nil {
		return nil, describeAPIError(err, fmt.Sprintf("Stack %s/%s", k.namespace, name), k.namespace)
	}
	return stack, nil
}

// describeAPIError turns the API errors a user meets most into sentences
// that say what to do.
func describeAPIError(err error, what, namespace string) error {
	switch {
	case apierrors.IsNotFound(err):
		return fmt.Errorf("%s not found in namespace %s (list them with `terrace get -n %s`)", what, namespace, namespace)
	case meta.IsNoMatchError(err):
		return fmt.Errorf("the Stack API (terrace.dev/v1alpha1) is not installed in this cluster: install Terrace's CRDs first")
	case apierrors.IsForbidden(err):
		return fmt.Errorf("not allowed to read %s: %w", what, err)
	}
	return fmt.Errorf("failed to read %s: %w", what, err)
}

// backends opens the state, plan and release stores of namespaces as their
// effective TerraceConfig says (Secrets or PostgreSQL). Close it when done.
func (k *kube) backends() *backend.Backends {
	return backend.New(k.client, k.resolver().ResolveNamespace)
}

// resolver reads the TerraceConfigs of a namespace and the operator's.
func (k *kube) resolver() *settings.Resolver {
	return &settings.Resolver{Reader: k.client, OperatorNamespace: k.flags.operatorNamespace, Builtin: settings.BuiltinDefaults("")}
}

// stores opens the stores of the kube's namespace.
func (k *kube) stores(ctx context.Context) (*backend.Set, func(), error) {
	b := k.backends()
	set, err := b.For(ctx, k.namespace)
	if err != nil {
		b.Close()
		return nil, nil, fmt.Errorf("failed to open the stores of namespace %s: %w", k.namespace, err)
	}
	return set, b.Close, nil
}

// commandContext ends on Ctrl-C or SIGTERM, so a follow or a wait stops cleanly.
func commandContext(cmd *cobra.Command) (context.Context, context.CancelFunc) {
	return signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
}

// streams are where a verb writes: results to out, notes and progress to err.
type streams struct {
	out io.Writer
	err io.Writer
}

// userCommand builds a verb that connects to the cluster before run.
func userCommand(cmd *cobra.Command, run func(ctx context.Context, k *kube, s streams, args []string) error) *cobra.Command {
	var flags kubeFlags
	flags.bind(cmd.Flags())
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		ctx, cancel := commandContext(cmd)
		defer cancel()
		k, err := flags.connect()
		if err != nil {
			return err
		}
		return run(ctx, k, streams{out: cmd.OutOrStdout(), err: cmd.ErrOrStderr()}, args)
	}
	if strings.Contains(cmd.Use, "STACK") {
		cmd.ValidArgsFunction = func(cmd *cobra.Command, args []string, _ string) ([]cobra.Completion, cobra.ShellCompDirective) {
			if len(args) > 0 {
				return nil, cobra.ShellCompDirectiveNoFileComp
			}
			return stackNames(cmd.Context(), flags), cobra.ShellCompDirectiveNoFileComp
		}
	}
	return cmd
}

// stackNames completes a STACK argument with the namespace's Stacks;
// nothing when the cluster cannot be read.
func stackNames(ctx context.Context, flags kubeFlags) []cobra.Completion {
	k, err := flags.connect()
	if err != nil {
		return nil
	}
	list := &terracev1.StackList{}
	if err := k.client.List(ctx, list, client.InNamespace(k.namespace)); err != nil {
		return nil
	}
	names := make([]cobra.Completion, 0, len(list.Items))
	for _, st := range list.Items {
		names = append(names, st.Name)
	}
	return names
}

// stackRun is a verb's work on the Stack its first argument names; output
// is the -o value, already checked.
type stackRun func(ctx context.Context, k *kube, s streams, stack *terracev1.Stack, output string) error

// stackVerb builds a verb on one Stack: it reads the Stack (with a clear
// not-found error) before run. outputHelp adds -o with formats.
func stackVerb(cmd *cobra.Command, outputHelp string, formats []string, run stackRun) *cobra.Command {
	var output string
	if outputHelp != "" {
		cmd.Flags().StringVarP(&output, "output", "o", "", outputHelp)
	}
	return userCommand(cmd, func(ctx context.Context, k *kube, s streams, args []string) error {
		if err := checkOutputFormat(output, formats...); err != nil {
			return err
		}
		stack, err := k.stack(ctx, args[0])
		if err != nil {
			return err
		}
		return run(ctx, k, s, stack, output)
	})
}
