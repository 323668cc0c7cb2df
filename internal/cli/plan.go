package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/stackview"
	"github.com/terrace-dev/terrace/internal/state"
)

func newPlanCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "plan STACK",
		Short: "Show the plan waiting for approval, with its readable rendering when the Stack stores one",
		Long: "Shows the Stack's pending plan: its id, counts and, when spec.storeReadablePlan is json or human,\n" +
			"the readable plan from the plan store. A planOnly Stack shows its latest plan. With nothing to\n" +
			"show it says why and exits 1.",
		Example: "  terrace plan web -n team\n  terrace plan web -o json\n  terrace plan web -o yaml",
		Args:    cobra.ExactArgs(1),
	}
	return stackVerb(cmd, "output format: json or yaml (status.plan with the readable plan, redacted; a json readable plan is embedded as an object)", []string{"json", "yaml"}, func(ctx context.Context, k *kube, s streams, stack *terracev1.Stack, output string) error {
		p := stack.Status.Plan
		planID := stackview.ShownPlan(stack)
		if planID == "" {
			return &stackview.NoPendingPlanError{Stack: stack}
		}
		stored := readStoredPlan(ctx, k, stack, planID)
		readable, note := stored.Readable, stored.Note
		if output != "" {
			return writeFormatted(s.out, struct {
				Namespace      string                `json:"namespace"`
				Stack          string                `json:"stack"`
				Plan           *terracev1.PlanStatus `json:"plan"`
				Approvable     bool                  `json:"approvable"`
				StoredPolicy   *state.PlanPolicy     `json:"storedPolicy,omitempty"`
				ReadableFormat string                `json:"readableFormat,omitempty"`
				Readable       any                   `json:"readable,omitempty"`
				Note           string                `json:"note,omitempty"`
			}{stack.Namespace, stack.Name, p, p.Pending != "", stored.Policy, stackview.ReadableFormat(stack), machineReadable(readable), note}, output)
		}
		printPlanSummary(s.out, stack, planID, time.Now())
		for i, line := range stackview.PolicyLines(stored.Policy) {
			fmt.Fprintf(s.out, "  %s  %s\n", map[bool]string{true: "policy:  ", false: "         "}[i == 0], oneLine(line))
		}
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

// readStoredPlan reads the plan's record and readable rendering from the
// namespace's plan store.
func readStoredPlan(ctx context.Context, k *kube, stack *terracev1.Stack, planID string) stackview.StoredPlanView {
	set, closeStores, err := k.stores(ctx)
	if err != nil {
		return stackview.StoredPlanView{Note: fmt.Sprintf("(the plan store could not be read: %v)", err)}
	}
	defer closeStores()
	return stackview.ReadStoredPlan(ctx, set.Plans, stack, planID)
}

// machineReadable embeds a JSON rendering (storeReadablePlan: json) as an
// object, so `-o json | jq .readable.resource_changes` works; text stays a
// string. Both were redacted by the runner before they were stored.
func machineReadable(readable []byte) any {
	switch {
	case len(readable) == 0:
		return nil
	case json.Valid(readable):
		return json.RawMessage(readable)
	}
	return string(readable)
}
