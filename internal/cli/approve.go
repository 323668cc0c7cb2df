package cli

import (
	"context"
	"fmt"

	"github.com/spf13/cobra"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
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
		var approved *terracev1.Stack
		alreadyApproved := false
		// Retry when the controller wrote status in between: the check
		// below runs again on the fresh object.
		err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			stack, err := k.stack(ctx, args[0])
			if err != nil {
				return err
			}
			pending := pendingPlan(stack)
			if pending == "" {
				return noPendingPlanError(stack)
			}
			if wanted != "" && wanted != pending {
				return fmt.Errorf("plan %s is not the pending plan of Stack %s/%s: %s is (%s); review it with `terrace plan %s -n %s` and approve that id",
					wanted, stack.Namespace, stack.Name, pending, planCountsText(stack.Status.Plan), stack.Name, stack.Namespace)
			}
			approved = stack
			if stack.Spec.ApprovePlan == pending {
				alreadyApproved = true
				return nil
			}
			before := stack.DeepCopy()
			stack.Spec.ApprovePlan = pending
			// The resourceVersion in the patch makes it fail if the pending
			// plan changed since it was read.
			return k.client.Patch(ctx, stack, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{}))
		})
		if err != nil {
			if apierrors.IsConflict(err) {
				return fmt.Errorf("failed to approve: Stack %s/%s kept changing; run the command again: %w", k.namespace, args[0], err)
			}
			return err
		}
		plan := approved.Status.Plan
		if alreadyApproved {
			fmt.Fprintf(s.out, "plan %s of Stack %s/%s is already approved; the controller applies it\n", plan.Pending, approved.Namespace, approved.Name)
			return nil
		}
		fmt.Fprintf(s.out, "approved plan %s of Stack %s/%s (%s); the controller applies it next: follow with `terrace get %s -n %s`\n",
			plan.Pending, approved.Namespace, approved.Name, planCountsText(plan), approved.Name, approved.Namespace)
		return nil
	})
}

func planCountsText(p *terracev1.PlanStatus) string {
	if p == nil {
		return "no counts"
	}
	text := fmt.Sprintf("+%d ~%d -%d", p.Add, p.Change, p.Destroy)
	if p.DestroyPlan {
		text += ", destroys the whole Stack"
	}
	return text
}
