package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/state"
)

func newPlanCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "plan STACK",
		Short: "Show the plan waiting for approval, with its readable rendering when the Stack stores one",
		Long: "Shows the Stack's pending plan: its id, counts and, when spec.storeReadablePlan is json or human,\n" +
			"the readable plan from the plan store. A planOnly Stack shows its latest plan. With nothing to\n" +
			"show it says why and exits 1.",
		Example: "  terrace plan web -n team\n  terrace plan web -o json",
		Args:    cobra.ExactArgs(1),
	}
	return stackVerb(cmd, "output format: json (status.plan with the readable plan)", []string{"json"}, func(ctx context.Context, k *kube, s streams, stack *terracev1.Stack, output string) error {
		p := stack.Status.Plan
		var planID string
		switch {
		case p != nil && p.Pending != "":
			planID = p.Pending
		case p != nil && p.ID != "" && stack.Spec.PlanOnly && stack.Status.LastPlannedRevision != "":
			planID = p.ID
		default:
			return noPendingPlanError(stack)
		}
		readable, note := readablePlan(ctx, k, stack, planID)
		if output == "json" {
			return writeFormatted(s.out, struct {
				Namespace      string                `json:"namespace"`
				Stack          string                `json:"stack"`
				Plan           *terracev1.PlanStatus `json:"plan"`
				Approvable     bool                  `json:"approvable"`
				ReadableFormat string                `json:"readableFormat,omitempty"`
				Readable       string                `json:"readable,omitempty"`
			}{stack.Namespace, stack.Name, p, p.Pending != "", readableFormat(stack), string(readable)}, "json")
		}
		printPlanSummary(s.out, stack, planID, time.Now())
		if note != "" {
			fmt.Fprintln(s.out, note)
		}
		if len(readable) == 0 {
			return nil
		}
		fmt.Fprintln(s.out)
		if _, err := s.out.Write(readable); err != nil {
			return err
		}
		if readable[len(readable)-1] != '\n' {
			fmt.Fprintln(s.out)
		}
		return nil
	})
}

func printPlanSummary(out io.Writer, stack *terracev1.Stack, planID string, now time.Time) {
	p := stack.Status.Plan
	if p.Pending == planID {
		fmt.Fprintf(out, "Stack %s/%s: plan %s awaits approval\n", stack.Namespace, stack.Name, planID)
	} else {
		fmt.Fprintf(out, "Stack %s/%s: latest plan %s (planOnly: it is never applied)\n", stack.Namespace, stack.Name, planID)
	}
	changes := fmt.Sprintf("+%d to add, ~%d to change, -%d to destroy", p.Add, p.Change, p.Destroy)
	if p.Drift > 0 {
		changes += fmt.Sprintf(" (%d changed outside Terrace)", p.Drift)
	}
	if p.DestroyPlan {
		changes += " — destroys the whole Stack"
	}
	fmt.Fprintf(out, "  changes:   %s\n", changes)
	if p.CreatedAt != nil {
		fmt.Fprintf(out, "  created:   %s (%s ago)\n", p.CreatedAt.UTC().Format(time.RFC3339), age(*p.CreatedAt, now))
	}
	if rev := stack.Status.LastPlannedRevision; rev != "" {
		fmt.Fprintf(out, "  revision:  %s\n", rev)
	}
	if applied := stack.Status.LastAppliedRevision; applied != "" {
		fmt.Fprintf(out, "  applied:   %s\n", applied)
	}
	if p.Pending == planID {
		fmt.Fprintf(out, "Approve it with: terrace approve %s %s -n %s\n", stack.Name, planID, stack.Namespace)
	}
}

func readableFormat(stack *terracev1.Stack) string {
	if f := stack.Spec.StoreReadablePlan; f != terracev1.ReadablePlanNone {
		return string(f)
	}
	return ""
}

// readablePlan reads the plan's readable rendering from the plan store, or
// says why there is none.
func readablePlan(ctx context.Context, k *kube, stack *terracev1.Stack, planID string) ([]byte, string) {
	if readableFormat(stack) == "" {
		return nil, "(no readable plan is stored: set spec.storeReadablePlan to human or json to see the changes here)"
	}
	set, closeStores, err := k.stores(ctx)
	if err != nil {
		return nil, fmt.Sprintf("(the readable plan could not be read: %v)", err)
	}
	defer closeStores()
	plan, err := set.Plans.GetPlan(ctx, state.PlanKey{Namespace: stack.Namespace, Stack: stack.Name, ID: planID})
	switch {
	case errors.Is(err, state.ErrNotFound):
		return nil, fmt.Sprintf("(plan %s is not in the plan store: it was replaced or discarded; a new plan follows the next change or `terrace reconcile %s`)", planID, stack.Name)
	case err != nil:
		return nil, fmt.Sprintf("(the readable plan could not be read: %v)", err)
	case len(plan.Readable) == 0:
		return nil, fmt.Sprintf("(plan %s was stored without a readable rendering: storeReadablePlan was set after it was made)", planID)
	}
	return plan.Readable, ""
}

// noPendingPlanError says why a Stack has no plan to show or approve.
func noPendingPlanError(stack *terracev1.Stack) error {
	return fmt.Errorf("no plan is pending for Stack %s/%s: %s", stack.Namespace, stack.Name, whyNoPendingPlan(stack))
}

func whyNoPendingPlan(stack *terracev1.Stack) string {
	st := &stack.Status
	ready := findCondition(stack, terracev1.ReadyCondition)
	reconciling := findCondition(stack, terracev1.ReconcilingCondition)
	stalled := findCondition(stack, terracev1.StalledCondition)
	var why string
	switch {
	case stack.Spec.Suspend:
		why = "it is suspended (resume it with `terrace resume " + stack.Name + "`)"
	case ready == nil && st.ObservedGeneration <= 0:
		why = "it has not been reconciled yet (is the Terrace controller running?)"
	case isTrue(reconciling):
		why = "a run is in progress: " + reconciling.Message
	case isTrue(stalled):
		why = "it is stalled: " + stalled.Message
	case st.ObservedGeneration < stack.Generation:
		why = fmt.Sprintf("the controller has not finished generation %d yet", stack.Generation)
	case isTrue(ready) && atRevision(stack) != "":
		why = "it is Ready" + atRevision(stack)
	case isTrue(ready):
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

func atRevision(stack *terracev1.Stack) string {
	switch {
	case stack.Status.Release != nil && stack.Status.Release.Revision > 0:
		return fmt.Sprintf(" at release %d (%s)", stack.Status.Release.Revision, stack.Status.LastAppliedRevision)
	case stack.Status.LastAppliedRevision != "":
		return " at revision " + stack.Status.LastAppliedRevision
	}
	return ""
}

func isTrue(c *metav1.Condition) bool { return c != nil && c.Status == metav1.ConditionTrue }
