package stackview

import (
	"context"
	"fmt"

	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
)

// NoPendingPlanError is Approve's error for a Stack with no plan awaiting approval.
type NoPendingPlanError struct{ Stack *terracev1.Stack }

func (e *NoPendingPlanError) Error() string {
	return fmt.Sprintf("no plan is pending for Stack %s/%s: %s", e.Stack.Namespace, e.Stack.Name, WhyNoPendingPlan(e.Stack))
}

// NotPendingError is Approve's error when the plan asked for is not the pending one.
type NotPendingError struct {
	Stack  *terracev1.Stack
	Wanted string
}

func (e *NotPendingError) Error() string {
	return fmt.Sprintf("plan %s is not the pending plan of Stack %s/%s: %s is (%s)",
		e.Wanted, e.Stack.Namespace, e.Stack.Name, PendingPlan(e.Stack), PlanCounts(e.Stack.Status.Plan))
}

// Approve sets spec.approvePlan to the Stack's pending plan, when wanted is
// "" or that plan, so the controller applies exactly the plan reviewed. get
// reads the Stack; a conflict (the controller wrote in between) reads it
// again and checks again. It returns the approved Stack and whether it was
// approved already; a Stack still conflicting after the retries is an
// apierrors Conflict.
func Approve(ctx context.Context, c client.Client, get func(context.Context) (*terracev1.Stack, error), wanted string) (*terracev1.Stack, bool, error) {
	var approved *terracev1.Stack
	already := false
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		stack, err := get(ctx)
		if err != nil {
			return err
		}
		pending := PendingPlan(stack)
		if pending == "" {
			return &NoPendingPlanError{Stack: stack}
		}
		if wanted != "" && wanted != pending {
			return &NotPendingError{Stack: stack, Wanted: wanted}
		}
		approved = stack
		if stack.Spec.ApprovePlan == pending {
			already = true
			return nil
		}
		before := stack.DeepCopy()
		stack.Spec.ApprovePlan = pending
		// The resourceVersion in the patch makes it fail if the pending
		// plan changed since it was read.
		return c.Patch(ctx, stack, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{}))
	})
	if err != nil {
		return nil, false, err
	}
	return approved, already, nil
}
