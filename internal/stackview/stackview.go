// Package stackview reads a Stack the way its users see it: the pending
// plan and why there is none, its readable rendering, its outputs with
// sensitive values masked, and the approval of a plan. The CLI verbs and the
// Installations API both build on it, so they say the same things.
package stackview

import (
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
)

// Condition returns the Stack's condition of the given type, or nil.
func Condition(stack *terracev1.Stack, conditionType string) *metav1.Condition {
	for i := range stack.Status.Conditions {
		if stack.Status.Conditions[i].Type == conditionType {
			return &stack.Status.Conditions[i]
		}
	}
	return nil
}

// IsTrue reports whether c is set and True.
func IsTrue(c *metav1.Condition) bool { return c != nil && c.Status == metav1.ConditionTrue }

// PendingPlan returns the id of the plan awaiting approval, or "".
func PendingPlan(stack *terracev1.Stack) string {
	if stack.Status.Plan == nil {
		return ""
	}
	return stack.Status.Plan.Pending
}

// WhyNoPendingPlan says, in a sentence, why the Stack has no plan awaiting approval.
func WhyNoPendingPlan(stack *terracev1.Stack) string {
	st := &stack.Status
	ready := Condition(stack, terracev1.ReadyCondition)
	reconciling := Condition(stack, terracev1.ReconcilingCondition)
	stalled := Condition(stack, terracev1.StalledCondition)
	var why string
	switch {
	case stack.Spec.Suspend:
		why = "it is suspended (resume it with `terrace resume " + stack.Name + "`)"
	case ready == nil && st.ObservedGeneration <= 0:
		why = "it has not been reconciled yet (is the Terrace controller running?)"
	case IsTrue(reconciling):
		why = "a run is in progress: " + reconciling.Message
	case IsTrue(stalled):
		why = "it is stalled: " + stalled.Message
	case st.ObservedGeneration < stack.Generation:
		why = fmt.Sprintf("the controller has not finished generation %d yet", stack.Generation)
	case IsTrue(ready) && AtRevision(stack) != "":
		why = "it is Ready" + AtRevision(stack)
	case IsTrue(ready):
		why = "it is Ready: " + ready.Message
	case ready != nil:
		why = fmt.Sprintf("it is not Ready (%s): %s", ready.Reason, ready.Message)
	default:
		why = "the controller has not reported a plan"
	}
	if stack.Spec.ApprovePlan == terracev1.ApprovePlanAuto {
		why += "; approvePlan is auto, so plans are applied without approval"
	}
	if stack.Spec.PlanOnly {
		why += "; planOnly is set, so plans are never applied"
	}
	return why
}

// AtRevision is " at release N (rev)" or " at revision rev" for an applied
// Stack, "" before its first apply.
func AtRevision(stack *terracev1.Stack) string {
	switch {
	case stack.Status.Release != nil && stack.Status.Release.Revision > 0:
		return fmt.Sprintf(" at release %d (%s)", stack.Status.Release.Revision, stack.Status.LastAppliedRevision)
	case stack.Status.LastAppliedRevision != "":
		return " at revision " + stack.Status.LastAppliedRevision
	}
	return ""
}

// ShownPlan returns the id of the plan to show: the pending one, else the
// latest plan of a planOnly Stack; "" when there is none.
func ShownPlan(stack *terracev1.Stack) string {
	p := stack.Status.Plan
	switch {
	case p != nil && p.Pending != "":
		return p.Pending
	case p != nil && p.ID != "" && stack.Spec.PlanOnly && stack.Status.LastPlannedRevision != "":
		return p.ID
	}
	return ""
}
