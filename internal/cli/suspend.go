package cli

import (
	"context"
	"fmt"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
)

func newSuspendCommand() *cobra.Command {
	return suspendCommand(true, &cobra.Command{
		Use:     "suspend STACK",
		Short:   "Stop every run of the Stack (plans, applies, drift checks) until it is resumed",
		Long:    "Sets spec.suspend. A run in progress finishes; no new run starts until `terrace resume`.",
		Example: "  terrace suspend web -n team",
		Args:    cobra.ExactArgs(1),
	})
}

func newResumeCommand() *cobra.Command {
	return suspendCommand(false, &cobra.Command{
		Use:     "resume STACK",
		Short:   "Let a suspended Stack run again",
		Long:    "Clears spec.suspend; the controller reconciles the Stack right away.",
		Example: "  terrace resume web -n team",
		Args:    cobra.ExactArgs(1),
	})
}

// suspendCommand patches spec.suspend to suspend.
func suspendCommand(suspend bool, cmd *cobra.Command) *cobra.Command {
	verb := map[bool]string{true: "suspended", false: "resumed"}[suspend]
	return stackVerb(cmd, "", nil, func(ctx context.Context, k *kube, s streams, stack *terracev1.Stack, _ string) error {
		if stack.Spec.Suspend == suspend {
			state := map[bool]string{true: "already suspended", false: "not suspended"}[suspend]
			fmt.Fprintf(s.out, "Stack %s/%s is %s\n", stack.Namespace, stack.Name, state)
			return nil
		}
		// false is the field's absence (omitempty): remove it rather than write false.
		value := "null"
		if suspend {
			value = "true"
		}
		patch := []byte(`{"spec":{"suspend":` + value + `}}`)
		if err := k.client.Patch(ctx, stack, client.RawPatch(types.MergePatchType, patch)); err != nil {
			return describeAPIError(err, "Stack "+stack.Namespace+"/"+stack.Name, stack.Namespace)
		}
		fmt.Fprintf(s.out, "Stack %s/%s %s\n", stack.Namespace, stack.Name, verb)
		return nil
	})
}
