package cli

import (
	"context"
	"fmt"
	"time"

	"github.com/spf13/cobra"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/state"
	"github.com/terrace-dev/terrace/internal/state/migrate"
)

func newForceUnlockCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "force-unlock STACK [LOCK_ID]",
		Short: "Release the Stack's state lock left by a run that is gone",
		Long: "Releases the lock on the Stack's state (workspace spec.workspace) in the namespace's state store.\n" +
			"Refused while a runner pod of the Stack is running or pending, or a state migration holds the lock:\n" +
			"the holder is shown. With LOCK_ID only that lock is released, as `tofu force-unlock` does.\n" +
			"The controller releases the lock of a dead run by itself before its next run; this is for the rare\n" +
			"case it cannot tell.",
		Example: "  terrace force-unlock web -n team\n  terrace force-unlock web 6b3f0c1e-2a7d-4d1c-9f3e-0a1b2c3d4e5f -n team",
		Args:    cobra.RangeArgs(1, 2),
	}
	return stackVerb(cmd, "", nil, func(ctx context.Context, k *kube, s streams, stack *terracev1.Stack, _ string) error {
		if b := stack.Spec.Backend; b != nil {
			return fmt.Errorf("Stack %s/%s keeps its state in its own %s backend (spec.backend), whose locks Terrace does not hold: release it with `tofu force-unlock` against that backend", stack.Namespace, stack.Name, b.Type)
		}
		wantID := ""
		if args := cmd.Flags().Args(); len(args) == 2 {
			wantID = args[1]
		}
		set, closeStores, err := k.stores(ctx)
		if err != nil {
			return err
		}
		defer closeStores()
		key := state.Key{Namespace: stack.Namespace, Stack: stack.Name, Workspace: workspaceOf(stack)}
		holder, err := set.States.GetLock(ctx, key)
		if err != nil {
			return fmt.Errorf("failed to read the state lock of %s: %w", key, err)
		}
		if holder == nil {
			fmt.Fprintf(s.out, "the state of Stack %s/%s (workspace %s) is not locked\n", stack.Namespace, stack.Name, key.Workspace)
			return nil
		}
		if err := mayForceUnlock(ctx, k, stack, holder, wantID); err != nil {
			return err
		}
		if err := set.States.ForceUnlock(ctx, key); err != nil {
			return fmt.Errorf("failed to release the state lock of %s: %w", key, err)
		}
		fmt.Fprintf(s.out, "released the state lock of Stack %s/%s: %s\n", stack.Namespace, stack.Name, lockText(holder))
		return nil
	})
}

// mayForceUnlock refuses to break a lock a live run or a migration holds.
func mayForceUnlock(ctx context.Context, k *kube, stack *terracev1.Stack, holder *state.LockInfo, wantID string) error {
	where := fmt.Sprintf("Stack %s/%s", stack.Namespace, stack.Name)
	if wantID != "" && wantID != holder.ID {
		return fmt.Errorf("the state of %s is locked by another lock than %s: %s", where, wantID, lockText(holder))
	}
	if holder.Operation == migrate.LockOperation {
		return fmt.Errorf("refused: a state migration holds the lock of %s (%s); it releases it when the copy is verified", where, lockText(holder))
	}
	cs, err := k.clientset()
	if err != nil {
		return err
	}
	pods, err := runnerPods(ctx, cs, stack)
	if err != nil {
		return err
	}
	if len(pods) > 0 && isActivePod(pods[0]) {
		return fmt.Errorf("refused: runner pod %s of %s is %s and may hold the lock (%s); wait for its run to end (`terrace logs %s -n %s -f`)",
			pods[0].Name, where, pods[0].Status.Phase, lockText(holder), stack.Name, stack.Namespace)
	}
	return nil
}

func lockText(l *state.LockInfo) string {
	text := fmt.Sprintf("lock %s", l.ID)
	if l.Operation != "" {
		text += ", operation " + l.Operation
	}
	if l.Who != "" {
		text += ", held by " + l.Who
	}
	if !l.Created.IsZero() {
		text += fmt.Sprintf(" since %s (%s ago)", l.Created.UTC().Format(time.RFC3339), age(metav1.NewTime(l.Created), time.Now()))
	}
	return text
}

func workspaceOf(stack *terracev1.Stack) string {
	if stack.Spec.Workspace == "" {
		return "default"
	}
	return stack.Spec.Workspace
}
