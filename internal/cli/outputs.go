package cli

import (
	"context"
	"fmt"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/stackview"
	"github.com/terrace-dev/terrace/internal/state/release"
)

func newOutputsCommand() *cobra.Command {
	var showSensitive bool
	cmd := &cobra.Command{
		Use:   "outputs STACK",
		Short: "Print the Stack's outputs from its outputs Secret (sensitive values masked)",
		Long: "Prints name=value for every output in the Secret named by spec.writeOutputsToSecret. Which outputs\n" +
			"are sensitive comes from the latest release record; an output whose sensitivity is unknown is\n" +
			"masked too. A Stack without an outputs Secret shows the names from its status and the non-sensitive\n" +
			"values its latest release recorded.",
		Example: "  terrace outputs web -n team\n  terrace outputs web --show-sensitive -o json",
		Args:    cobra.ExactArgs(1),
	}
	cmd.Flags().BoolVar(&showSensitive, "show-sensitive", false, "print sensitive values instead of masking them")
	return stackVerb(cmd, "output format: json or yaml (default: name=value lines)", []string{"json", "yaml"}, func(ctx context.Context, k *kube, s streams, stack *terracev1.Stack, output string) error {
		deployed, releaseErr := deployedRelease(ctx, k, stack)
		var shown []stackview.Output
		if spec := stack.Spec.WriteOutputsToSecret; spec != nil {
			secret := &corev1.Secret{}
			err := k.client.Get(ctx, client.ObjectKey{Namespace: stack.Namespace, Name: spec.Name}, secret)
			switch {
			case apierrors.IsNotFound(err):
				return fmt.Errorf("Stack %s/%s writes its outputs to Secret %s, which does not exist yet: no apply has finished (see `terrace get %s`)", stack.Namespace, stack.Name, spec.Name, stack.Name)
			case err != nil:
				return describeAPIError(err, "outputs Secret "+stack.Namespace+"/"+spec.Name, stack.Namespace)
			}
			shown = stackview.OutputsFromSecret(secret, deployed, showSensitive)
			if deployed == nil {
				fmt.Fprintf(s.err, "note: no release record says which outputs are sensitive (%s); every value is masked unless --show-sensitive\n", stackview.ReleaseProblem(releaseErr))
			}
		} else {
			shown = stackview.OutputsFromRelease(stack, deployed)
			where := fmt.Sprintf("Stack %s/%s has no outputs Secret (set spec.writeOutputsToSecret to keep every value in one); ", stack.Namespace, stack.Name)
			if deployed != nil {
				where += fmt.Sprintf("values below are from release %d, which never records sensitive ones", deployed.Revision)
			} else {
				where += "no release record holds values (" + stackview.ReleaseProblem(releaseErr) + ")"
			}
			fmt.Fprintln(s.err, "note: "+where)
		}
		if output != "" {
			return writeFormatted(s.out, shown, output)
		}
		if len(shown) == 0 {
			fmt.Fprintf(s.err, "Stack %s/%s has no outputs.\n", stack.Namespace, stack.Name)
		}
		for _, o := range shown {
			switch {
			case o.Value != nil:
				fmt.Fprintf(s.out, "%s=%s\n", o.Name, *o.Value)
			case o.Masked:
				fmt.Fprintf(s.out, "%s=%s\n", o.Name, stackview.MaskedValue)
			default:
				fmt.Fprintf(s.out, "%s=<not recorded>\n", o.Name)
			}
		}
		return nil
	})
}

// deployedRelease returns the Stack's deployed release, or nil with why not.
func deployedRelease(ctx context.Context, k *kube, stack *terracev1.Stack) (*release.Release, error) {
	set, closeStores, err := k.stores(ctx)
	if err != nil {
		return nil, err
	}
	defer closeStores()
	return set.History.Deployed(ctx, stack.Namespace, stack.Name)
}
