package cli

import (
	"context"
	"crypto/x509"
	"fmt"
	"os"
	"strings"
	"text/tabwriter"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/terrace-dev/terrace/pkg/client"
	apiv1 "github.com/terrace-dev/terrace/proto/terrace/api/v1"
)

// The user verbs get, plan, approve, outputs and history talk to the
// Installations API instead of the Kubernetes API when given --api: for a
// tool or a person who has a token and the API's address but no kubectl
// access beyond it. They use pkg/client, as any other program would.

// apiFlags are the flags of a verb that can talk to the Installations API.
type apiFlags struct {
	url, caFile, token, tokenFile, cluster, protocol string
}

func (f *apiFlags) bind(cmd *cobra.Command) {
	fs := cmd.Flags()
	fs.StringVar(&f.url, "api", "", "talk to the Installations API at this https:// URL instead of the Kubernetes API (the API serves its own namespace: -n is not used)")
	fs.StringVar(&f.caFile, "api-ca-file", "", "with --api: PEM CA to trust for the API's certificate (default: the system's)")
	fs.StringVar(&f.token, "token", "", "with --api: the bearer token (default: $TERRACE_API_TOKEN, then the kubeconfig user's token)")
	fs.StringVar(&f.tokenFile, "token-file", "", "with --api: a file holding the bearer token")
	fs.StringVar(&f.cluster, "cluster", "", "with --api: the registered cluster to act in (default: the API server's own)")
	fs.StringVar(&f.protocol, "api-protocol", string(client.GRPC), "with --api: grpc, grpc-web, connect or connect-json")
}

// withAPI makes cmd run apiRun when --api is given, its own RunE otherwise.
func withAPI(cmd *cobra.Command, apiRun func(ctx context.Context, c *client.Client, f *apiFlags, s streams, args []string) error) *cobra.Command {
	var f apiFlags
	f.bind(cmd)
	kubeRun := cmd.RunE
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		if f.url == "" {
			return kubeRun(cmd, args)
		}
		ctx, cancel := commandContext(cmd)
		defer cancel()
		c, err := f.client(cmd)
		if err != nil {
			return err
		}
		return apiRun(ctx, c, &f, streams{out: cmd.OutOrStdout(), err: cmd.ErrOrStderr()}, args)
	}
	return cmd
}

func (f *apiFlags) client(cmd *cobra.Command) (*client.Client, error) {
	token, err := f.bearer(cmd)
	if err != nil {
		return nil, err
	}
	opts := client.Options{Token: client.StaticToken(token), Protocol: client.Protocol(f.protocol)}
	if f.caFile != "" {
		pem, err := os.ReadFile(f.caFile)
		if err != nil {
			return nil, fmt.Errorf("failed to read --api-ca-file: %w", err)
		}
		opts.RootCAs = x509.NewCertPool()
		if !opts.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--api-ca-file %s holds no PEM certificate", f.caFile)
		}
	}
	return client.New(f.url, opts)
}

// bearer finds the caller's token: the flags, the environment, then the
// kubeconfig's user (the API passes it on to the Kubernetes API).
func (f *apiFlags) bearer(cmd *cobra.Command) (string, error) {
	switch {
	case f.token != "":
		return f.token, nil
	case f.tokenFile != "":
		raw, err := os.ReadFile(f.tokenFile)
		if err != nil {
			return "", fmt.Errorf("failed to read --token-file: %w", err)
		}
		return strings.TrimSpace(string(raw)), nil
	case os.Getenv("TERRACE_API_TOKEN") != "":
		return os.Getenv("TERRACE_API_TOKEN"), nil
	}
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	if flag := cmd.Flags().Lookup("kubeconfig"); flag != nil {
		rules.ExplicitPath = flag.Value.String()
	}
	overrides := &clientcmd.ConfigOverrides{}
	if flag := cmd.Flags().Lookup("context"); flag != nil {
		overrides.CurrentContext = flag.Value.String()
	}
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, overrides).ClientConfig()
	if err == nil && cfg.BearerToken != "" {
		return cfg.BearerToken, nil
	}
	if err == nil && cfg.BearerTokenFile != "" {
		raw, err := os.ReadFile(cfg.BearerTokenFile)
		if err == nil {
			return strings.TrimSpace(string(raw)), nil
		}
	}
	return "", fmt.Errorf("--api needs a bearer token: give --token, --token-file or $TERRACE_API_TOKEN (e.g. `kubectl create token <serviceaccount>`); the kubeconfig's user has none")
}

func apiGet(ctx context.Context, c *client.Client, f *apiFlags, s streams, args []string) error {
	var items []*apiv1.Installation
	if len(args) == 1 {
		res, err := c.Get(ctx, connect.NewRequest(&apiv1.GetRequest{Cluster: f.cluster, Name: args[0]}))
		if err != nil {
			return err
		}
		items = append(items, res.Msg)
	} else {
		token := ""
		for {
			res, err := c.List(ctx, connect.NewRequest(&apiv1.ListRequest{Cluster: f.cluster, PageToken: token}))
			if err != nil {
				return err
			}
			items = append(items, res.Msg.Items...)
			if token = res.Msg.NextPageToken; token == "" {
				break
			}
		}
	}
	if len(items) == 0 {
		fmt.Fprintln(s.err, "no installations")
		return nil
	}
	w := tabwriter.NewWriter(s.out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "NAME\tPHASE\tREADY\tPLAN\tRELEASE\tMESSAGE")
	for _, in := range items {
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%d\t%s\n", in.Name, in.Phase, orDash(in.Status), orDash(in.PendingPlan), in.Release, in.Message)
	}
	return w.Flush()
}

func apiPlan(ctx context.Context, c *client.Client, f *apiFlags, s streams, args []string) error {
	res, err := c.GetPlan(ctx, connect.NewRequest(&apiv1.GetPlanRequest{Cluster: f.cluster, Name: args[0]}))
	if err != nil {
		return err
	}
	p := res.Msg
	fmt.Fprintf(s.out, "plan %s of %s: +%d ~%d -%d", p.Id, args[0], p.Add, p.Change, p.Destroy)
	if !p.Approvable {
		fmt.Fprint(s.out, " (not approvable)")
	}
	fmt.Fprintln(s.out)
	if p.Readable != "" {
		fmt.Fprint(s.out, p.Readable)
	} else if p.Note != "" {
		fmt.Fprintln(s.err, p.Note)
	}
	return nil
}

func apiApprove(ctx context.Context, c *client.Client, f *apiFlags, s streams, args []string) error {
	planID := ""
	if len(args) == 2 {
		planID = args[1]
	} else {
		res, err := c.GetPlan(ctx, connect.NewRequest(&apiv1.GetPlanRequest{Cluster: f.cluster, Name: args[0]}))
		if err != nil {
			return err
		}
		planID = res.Msg.Id
	}
	res, err := c.ApprovePlan(ctx, connect.NewRequest(&apiv1.ApprovePlanRequest{Cluster: f.cluster, Name: args[0], PlanId: planID}))
	if err != nil {
		return err
	}
	fmt.Fprintf(s.out, "approved plan %s of %s; the controller applies it next: follow with `terrace get %s --api %s`\n", planID, res.Msg.Name, res.Msg.Name, f.url)
	return nil
}

func apiOutputs(ctx context.Context, c *client.Client, f *apiFlags, s streams, args []string) error {
	res, err := c.GetOutputs(ctx, connect.NewRequest(&apiv1.GetOutputsRequest{Cluster: f.cluster, Name: args[0]}))
	if err != nil {
		return err
	}
	w := tabwriter.NewWriter(s.out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "NAME\tSENSITIVE\tVALUE")
	for _, o := range res.Msg.Items {
		value := o.GetValue()
		if o.Masked {
			value = "(masked)"
		}
		fmt.Fprintf(w, "%s\t%v\t%s\n", o.Name, o.Sensitive, value)
	}
	if res.Msg.Note != "" {
		fmt.Fprintln(s.err, res.Msg.Note)
	}
	return w.Flush()
}

func apiHistory(ctx context.Context, c *client.Client, f *apiFlags, s streams, args []string) error {
	res, err := c.ListReleases(ctx, connect.NewRequest(&apiv1.ListReleasesRequest{Cluster: f.cluster, Name: args[0]}))
	if err != nil {
		return err
	}
	w := tabwriter.NewWriter(s.out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "RELEASE\tSTATUS\tREVISION\tPLAN\tFINISHED")
	for _, r := range res.Msg.Items {
		fmt.Fprintf(w, "%d\t%s\t%s\t%s\t%s\n", r.Revision, r.Status, orDash(r.SourceRevision), orDash(r.PlanId), r.FinishedAt.AsTime().UTC().Format("2006-01-02T15:04:05Z"))
	}
	return w.Flush()
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
