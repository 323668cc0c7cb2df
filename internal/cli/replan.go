package cli

import (
	"context"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/stackview"
)

func newReplanCommand() *cobra.Command {
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "replan STACK",
		Short: "Discard the pending plan and plan again now",
		Long: "Asks the controller for a new plan now (terrace.dev/requestedAt), replacing the plan that awaits\n" +
			"approval, for instance when the world changed since it was made. Waits for the new plan and prints\n" +
			"it; an approval given to the old plan id does not apply the new one. With approvePlan: auto the new\n" +
			"plan is applied, as any plan is.",
		Example: "  terrace replan web -n team",
		Args:    cobra.ExactArgs(1),
	}
	cmd.Flags().DurationVar(&timeout, "timeout", 10*time.Minute, "how long to wait for the new plan")
	return stackVerb(cmd, "", nil, func(ctx context.Context, k *kube, s streams, stack *terracev1.Stack, _ string) error {
		old := stackview.PendingPlan(stack)
		handled, err := requestAndWait(ctx, k, s, stack, true, timeout)
		if err != nil {
			return err
		}
		switch now := stackview.PendingPlan(handled); {
		case old != "" && now != "" && now != old:
			fmt.Fprintf(s.out, "plan %s replaced by plan %s (%s)\n", old, now, stackview.PlanCounts(handled.Status.Plan))
		case old != "" && now == old:
			fmt.Fprintf(s.out, "plan %s is still pending: the controller did not make a new plan\n", old)
		case old != "":
			fmt.Fprintf(s.out, "plan %s discarded\n", old)
		}
		return reportReady(s, handled)
	})
}
