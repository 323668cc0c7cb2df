package cli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/clientcmd"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/terrace-dev/terrace/internal/state"
	"github.com/terrace-dev/terrace/internal/state/migrate"
	"github.com/terrace-dev/terrace/internal/state/postgres"
	"github.com/terrace-dev/terrace/internal/state/secrets"
)

// stateBackendFlags says how to reach the storage backends.
type stateBackendFlags struct {
	kubeconfig    string
	postgresURL   string
	encryptionKey string
	history       int
}

func (f *stateBackendFlags) bind(fs *pflag.FlagSet) {
	fs.StringVar(&f.kubeconfig, "kubeconfig", "", "kubeconfig to use (default: in-cluster config, then $KUBECONFIG and ~/.kube/config)")
	fs.StringVar(&f.postgresURL, "postgres-url", "", "PostgreSQL connection URL for the postgres backend (default: $TERRACE_POSTGRES_URL)")
	fs.StringVar(&f.encryptionKey, "encryption-key-secret", "", "namespace/name[:key] of the Secret holding the AES-256 key state and plans are encrypted with (both backends)")
	fs.IntVar(&f.history, "history", state.DefaultHistory, "state versions to keep per Stack in the destination")
}

// stateBackends opens backends by name, sharing one Kubernetes client.
type stateBackends struct {
	flags  stateBackendFlags
	client client.Client
	closes []func()
}

func (b *stateBackends) kube() (client.Client, error) {
	if b.client != nil {
		return b.client, nil
	}
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = b.flags.kubeconfig
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{}).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("failed to load the kubeconfig: %w", err)
	}
	// Uncached: a migration reads every Secret once.
	c, err := client.New(cfg, client.Options{Scheme: clientgoscheme.Scheme})
	if err != nil {
		return nil, fmt.Errorf("failed to create a Kubernetes client: %w", err)
	}
	b.client = c
	return c, nil
}

func (b *stateBackends) keys() (state.KeySource, error) {
	if b.flags.encryptionKey == "" {
		return nil, nil
	}
	ref, dataKey, _ := strings.Cut(b.flags.encryptionKey, ":")
	ns, name, ok := strings.Cut(ref, "/")
	if !ok || ns == "" || name == "" {
		return nil, fmt.Errorf("--encryption-key-secret must be namespace/name[:key], got %q", b.flags.encryptionKey)
	}
	c, err := b.kube()
	if err != nil {
		return nil, err
	}
	return secrets.KeyFromSecret(c, ns, name, dataKey), nil
}

func (b *stateBackends) open(ctx context.Context, name string) (migrate.Backend, error) {
	keys, err := b.keys()
	if err != nil {
		return migrate.Backend{}, err
	}
	switch name {
	case "secrets":
		c, err := b.kube()
		if err != nil {
			return migrate.Backend{}, err
		}
		s := secrets.New(c, secrets.Options{History: b.flags.history, Keys: keys})
		return migrate.Backend{Name: name, States: s, Plans: s, Releases: s}, nil
	case "postgres":
		url := b.flags.postgresURL
		if url == "" {
			url = os.Getenv("TERRACE_POSTGRES_URL")
		}
		if url == "" {
			return migrate.Backend{}, errors.New("the postgres backend needs --postgres-url or $TERRACE_POSTGRES_URL")
		}
		pg, err := postgres.Open(ctx, url, postgres.Options{History: b.flags.history, Keys: keys})
		if err != nil {
			return migrate.Backend{}, err
		}
		b.closes = append(b.closes, pg.Close)
		return migrate.Backend{Name: name, States: pg, Plans: pg, Releases: pg}, nil
	default:
		return migrate.Backend{}, fmt.Errorf("unknown backend %q: use secrets or postgres", name)
	}
}

func (b *stateBackends) close() {
	for _, c := range b.closes {
		c()
	}
}

func newStateCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "state",
		Short: "Move and adopt Terraform state between storage backends",
	}
	cmd.AddCommand(newStateMigrateCommand(), newStateAdoptCommand())
	return cmd
}

func newStateMigrateCommand() *cobra.Command {
	var backends stateBackends
	var from, to, namespace string
	cmd := &cobra.Command{
		Use:   "migrate --from secrets|postgres --to secrets|postgres",
		Short: "Copy every state (with history), plan and release to another backend, verified",
		Long: "Copies every state with its kept history, every saved plan and every release record from one\n" +
			"backend to the other, reads each copy back and compares digests, and only then marks the source\n" +
			"entry migrated (it is kept, and refuses writes). Re-running is safe; an interrupted run resumes.\n" +
			"A state locked by a running operation stops the migration: run it again when the run ends.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctrl.SetLogger(zap.New(zap.UseDevMode(true)))
			ctx, cancel := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer cancel()
			defer backends.close()
			src, err := backends.open(ctx, from)
			if err != nil {
				return err
			}
			dst, err := backends.open(ctx, to)
			if err != nil {
				return err
			}
			report, err := migrate.Migrate(ctx, src, dst, migrate.Options{Namespace: namespace, Log: ctrl.Log.WithName("migrate")})
			fmt.Fprintln(cmd.OutOrStdout(), report.String())
			if err != nil {
				return fmt.Errorf("%w (run the command again to resume)", err)
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&from, "from", "", "source backend: secrets or postgres")
	cmd.Flags().StringVar(&to, "to", "", "destination backend: secrets or postgres")
	cmd.Flags().StringVarP(&namespace, "namespace", "n", "", "migrate only this namespace (default: all)")
	_ = cmd.MarkFlagRequired("from")
	_ = cmd.MarkFlagRequired("to")
	backends.flags.bind(cmd.Flags())
	return cmd
}

func newStateAdoptCommand() *cobra.Command {
	var backends stateBackends
	var backend, namespace, secretName, stack, workspace string
	cmd := &cobra.Command{
		Use:   "adopt --secret tfstate-<workspace>-<name> --stack NAME",
		Short: "Import a tofu-controller (Terraform kubernetes backend) state Secret into a Stack's state",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, cancel := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer cancel()
			defer backends.close()
			dst, err := backends.open(ctx, backend)
			if err != nil {
				return err
			}
			c, err := backends.kube()
			if err != nil {
				return err
			}
			key := state.Key{Namespace: namespace, Stack: stack, Workspace: workspace}
			res, err := migrate.Adopt(ctx, c, namespace, secretName, dst.States, key)
			if err != nil {
				return err
			}
			verb := "adopted"
			if res.AlreadyAdopted {
				verb = "already adopted"
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s %s/%s as %s (serial %d, lineage %s, %s)\n", verb, namespace, secretName, key, res.Meta.Serial, res.Meta.Lineage, res.Meta.Digest)
			return nil
		},
	}
	cmd.Flags().StringVar(&backend, "backend", "secrets", "backend the Stack's state lives in: secrets or postgres")
	cmd.Flags().StringVarP(&namespace, "namespace", "n", "default", "namespace of the Secret and the Stack")
	cmd.Flags().StringVar(&secretName, "secret", "", "the kubernetes-backend state Secret, tfstate-<workspace>-<name>")
	cmd.Flags().StringVar(&stack, "stack", "", "the Stack that takes the state over")
	cmd.Flags().StringVar(&workspace, "workspace", state.DefaultWorkspace, "the Stack's workspace")
	_ = cmd.MarkFlagRequired("secret")
	_ = cmd.MarkFlagRequired("stack")
	backends.flags.bind(cmd.Flags())
	return cmd
}
