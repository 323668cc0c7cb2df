package stackview

import (
	"context"
	"errors"
	"fmt"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/state"
)

// ReadableFormat is the Stack's storeReadablePlan, "" when none is stored.
func ReadableFormat(stack *terracev1.Stack) string {
	if f := stack.Spec.StoreReadablePlan; f != terracev1.ReadablePlanNone {
		return string(f)
	}
	return ""
}

// NoReadablePlanStored is ReadStoredPlan's note for a Stack that stores none.
const NoReadablePlanStored = "(no readable plan is stored: set spec.storeReadablePlan to human or json to see the changes here)"

// StoredPlanView is what the plan store keeps with a plan, as the CLI and
// the API show it: the policies' decision and the readable rendering, or a
// note (in parentheses, ready to print) saying why there is none.
type StoredPlanView struct {
	Policy   *state.PlanPolicy
	Readable []byte
	Note     string
}

// ReadStoredPlan reads the plan from plans once: the whole plan when the
// Stack stores a readable rendering, else only its record.
func ReadStoredPlan(ctx context.Context, plans state.PlanStore, stack *terracev1.Stack, planID string) StoredPlanView {
	if ReadableFormat(stack) == "" {
		view := StoredPlanView{Note: NoReadablePlanStored}
		if meta, _ := StoredPlan(ctx, plans, stack, planID); meta != nil {
			view.Policy = meta.Policy
		}
		return view
	}
	plan, err := plans.GetPlan(ctx, state.PlanKey{Namespace: stack.Namespace, Stack: stack.Name, ID: planID})
	switch {
	case errors.Is(err, state.ErrNotFound):
		return StoredPlanView{Note: fmt.Sprintf("(plan %s is not in the plan store: it was replaced or discarded; a new plan follows the next change or `terrace reconcile %s`)", planID, stack.Name)}
	case err != nil:
		return StoredPlanView{Note: fmt.Sprintf("(the readable plan could not be read: %v)", err)}
	case len(plan.Readable) == 0:
		return StoredPlanView{Policy: plan.Policy, Note: fmt.Sprintf("(plan %s was stored without a readable rendering: storeReadablePlan was set after it was made)", planID)}
	}
	return StoredPlanView{Policy: plan.Policy, Readable: plan.Readable}
}

// StoredPlan reads the plan's record (without its bytes) from plans: what
// the store keeps with the plan, the policies' decision included. Nil with
// a note (in parentheses, ready to print) when it cannot.
func StoredPlan(ctx context.Context, plans state.PlanStore, stack *terracev1.Stack, planID string) (*state.PlanMeta, string) {
	metas, err := plans.ListPlans(ctx, stack.Namespace, stack.Name)
	if err != nil {
		return nil, fmt.Sprintf("(the plan store could not be read: %v)", err)
	}
	for i := range metas {
		if metas[i].Key.ID == planID {
			return &metas[i], ""
		}
	}
	return nil, fmt.Sprintf("(plan %s is not in the plan store)", planID)
}

// StatusPolicy is the decision status.plan.policy records, in the plan
// store's shape.
func StatusPolicy(d *terracev1.PlanPolicyStatus) *state.PlanPolicy {
	if d == nil {
		return nil
	}
	return &state.PlanPolicy{Decision: d.Decision, Violations: d.Violations, Warnings: d.Warnings, PoliciesDigest: d.PoliciesDigest}
}

// PolicyLines are a policy decision as a few lines of text: the decision
// and its policies, then one line per violation and warning.
func PolicyLines(d *state.PlanPolicy) []string {
	if d == nil {
		return nil
	}
	lines := []string{fmt.Sprintf("%s (policies %s)", d.Decision, d.PoliciesDigest)}
	for _, v := range d.Violations {
		lines = append(lines, "deny: "+v)
	}
	for _, w := range d.Warnings {
		lines = append(lines, "warn: "+w)
	}
	return lines
}

// PlanCounts is "+a ~c -d", with a note for a plan destroying everything.
func PlanCounts(p *terracev1.PlanStatus) string {
	if p == nil {
		return "no counts"
	}
	text := fmt.Sprintf("+%d ~%d -%d", p.Add, p.Change, p.Destroy)
	if p.DestroyPlan {
		text += ", destroys the whole Stack"
	}
	return text
}
