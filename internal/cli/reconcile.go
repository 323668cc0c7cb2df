package cli

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/readiness"
	"github.com/terrace-dev/terrace/internal/stackview"
)

// reconcilePollInterval is how often --wait reads the Stack.
const reconcilePollInterval = 500 * time.Millisecond

// awaitingApprovalReason is the Ready reason of a Stack whose plan waits for a person.
const awaitingApprovalReason = "AwaitingApproval"

func newReconcileCommand() *cobra.Command {
	var waitFlag bool
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "reconcile STACK",
		Short: "Ask the controller to reconcile the Stack now, and wait for the outcome",
		Long: "Sets the terrace.dev/requestedAt annotation to the current time, which makes the controller run the\n" +
			"Stack now (a plan, and an apply when approved), and waits until status.lastHandledReconcileAt says\n" +
			"it handled this request. Exits 1 when the Stack ends up not Ready (a plan awaiting approval is not\n" +
			"a failure), stalls, or the timeout passes.",
		Example: "  terrace reconcile web -n team\n  terrace reconcile web --wait=false",
		Args:    cobra.ExactArgs(1),
	}
	cmd.Flags().BoolVar(&waitFlag, "wait", true, "wait until the controller handled the request and print the Ready condition")
	cmd.Flags().DurationVar(&timeout, "timeout", 10*time.Minute, "how long --wait waits")
	return stackVerb(cmd, "", nil, func(ctx context.Context, k *kube, s streams, stack *terracev1.Stack, _ string) error {
		handled, err := requestAndWait(ctx, k, s, stack, waitFlag, timeout)
		if err != nil || handled == nil {
			return err
		}
		return reportReady(s, handled)
	})
}

// requestAndWait sets terrace.dev/requestedAt and, when wait, returns the
// Stack once the controller handled that request (nil when not waiting).
func requestAndWait(ctx context.Context, k *kube, s streams, stack *terracev1.Stack, wait bool, timeout time.Duration) (*terracev1.Stack, error) {
	if stack.Spec.Suspend {
		return nil, fmt.Errorf("Stack %s/%s is suspended, so nothing runs: resume it with `terrace resume %s -n %s`", stack.Namespace, stack.Name, stack.Name, stack.Namespace)
	}
	requested := time.Now().UTC()
	value := requested.Format(time.RFC3339Nano)
	patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:%q}}}`, terracev1.ReconcileRequestAnnotation, value)
	if err := k.client.Patch(ctx, stack, client.RawPatch(types.MergePatchType, []byte(patch))); err != nil {
		return nil, describeAPIError(err, "Stack "+stack.Namespace+"/"+stack.Name, stack.Namespace)
	}
	fmt.Fprintf(s.err, "requested a reconcile of Stack %s/%s at %s\n", stack.Namespace, stack.Name, value)
	if !wait {
		return nil, nil
	}
	if stalled := stackview.Condition(stack, terracev1.StalledCondition); stackview.IsTrue(stalled) {
		fmt.Fprintf(s.err, "note: the Stack is stalled (%s); unless its inputs changed the run ends the same way\n", stalled.Message)
	}
	return waitHandled(ctx, k, stack.Name, value, requested, timeout, s)
}

// waitHandled polls until the controller echoes value in
// status.lastHandledReconcileAt, or stalls after the request. Reads use ctx
// itself, so the timeout never surfaces as a failed read.
func waitHandled(ctx context.Context, k *kube, name, value string, requested time.Time, timeout time.Duration, s streams) (*terracev1.Stack, error) {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	tick := time.NewTicker(reconcilePollInterval)
	defer tick.Stop()
	var lastReady *metav1.Condition
	for {
		stack, err := k.stack(ctx, name)
		if err != nil {
			return nil, err
		}
		if stack.Status.LastHandledReconcileAt == value {
			return stack, nil
		}
		if ready := stackview.Condition(stack, terracev1.ReadyCondition); ready != nil {
			if lastReady == nil || conditionText(ready) != conditionText(lastReady) {
				fmt.Fprintln(s.err, "  "+conditionText(ready))
			}
			lastReady = ready
		}
		// Condition times have second precision.
		if stalled := stackview.Condition(stack, terracev1.StalledCondition); stackview.IsTrue(stalled) && !stalled.LastTransitionTime.Time.Before(requested.Truncate(time.Second)) {
			return nil, fmt.Errorf("Stack %s/%s stalled: %s", stack.Namespace, stack.Name, stalled.Message)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-deadline.C:
			msg := fmt.Sprintf("timed out after %s waiting for the controller to handle the request on Stack %s/%s", timeout, k.namespace, name)
			if lastReady != nil {
				msg += "; last " + conditionText(lastReady)
			}
			return nil, errors.New(msg + " (is the Terrace controller running?)")
		case <-tick.C:
		}
	}
}

// reportReady prints the Ready condition; anything but Ready at the
// current generation or a plan awaiting approval is an error.
func reportReady(s streams, stack *terracev1.Stack) error {
	ready := stackview.Condition(stack, terracev1.ReadyCondition)
	if ready == nil {
		fmt.Fprintf(s.out, "Stack %s/%s: handled, no Ready condition reported\n", stack.Namespace, stack.Name)
		return nil
	}
	fmt.Fprintf(s.out, "Stack %s/%s: %s\n", stack.Namespace, stack.Name, conditionText(ready))
	atGeneration, why, err := readiness.ReadyAtGeneration(stack)
	switch {
	case err != nil:
		return err
	case atGeneration:
		return nil
	case ready.Reason == awaitingApprovalReason:
		fmt.Fprintf(s.out, "review it with `terrace plan %s -n %s`, then `terrace approve %s %s -n %s`\n", stack.Name, stack.Namespace, stack.Name, stackview.PendingPlan(stack), stack.Namespace)
		return nil
	case !stackview.IsTrue(ready):
		why = ready.Message
	}
	return fmt.Errorf("Stack %s/%s is not Ready: %s", stack.Namespace, stack.Name, why)
}

// conditionText renders a condition on one line: Ready=False Reason: message.
func conditionText(c *metav1.Condition) string {
	return fmt.Sprintf("%s=%s %s: %s", c.Type, c.Status, c.Reason, oneLine(c.Message))
}
