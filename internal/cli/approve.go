package cli

import (
	"context"
	"errors"
	"fmt"

	"github.com/spf13/cobra"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/stackview"
)

func newApproveCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "approve STACK [PLAN_ID]",
		Short: "Approve the Stack's pending plan (sets spec.approvePlan to its id)",
		Long: "Sets spec.approvePlan to the id of the Stack's pending plan, so the controller applies exactly\n" +
			"that plan. Given PLAN_ID must be the pending plan: an older id is refused, so you never approve a\n" +
			"plan you did not review. The patch is conditional on the Stack not changing in between.",
		Example: "  terrace plan web -n team\n  terrace approve web plan-7-3f9c2a -n team",
		Args:    cobra.RangeArgs(1, 2),
	}
	return userCommand(cmd, func(ctx context.Context, k *kube, s streams, args []string) error {
		var wanted string
		if len(args) == 2 {
			wanted = args[1]
		}
		get := func(ctx context.Context) (*terracev1.Stack, error) { return k.stack(ctx, args[0]) }
		approved, alreadyApproved, err := stackview.Approve(ctx, k.client, get, wanted)
		var notPending *stackview.NotPendingError
		switch {
		case errors.As(err, &notPending):
			return fmt.Errorf("%w; review it with `terrace plan %s -n %s` and approve that id", err, args[0], k.namespace)
		case apierrors.IsConflict(err):
			return fmt.Errorf("failed to approve: Stack %s/%s kept changing; run the command again: %w", k.namespace, args[0], err)
		case err != nil:
			return err
		}
		plan := approved.Status.Plan
		if alreadyApproved {
			fmt.Fprintf(s.out, "plan %s of Stack %s/%s is already approved; the controller applies it\n", plan.Pending, approved.Namespace, approved.Name)
			return nil
		}
		fmt.Fprintf(s.out, "approved plan %s of Stack %s/%s (%s); the controller applies it next: follow with `terrace get %s -n %s`\n",
			plan.Pending, approved.Namespace, approved.Name, stackview.PlanCounts(plan), approved.Name, approved.Namespace)
		return nil
	})
}
