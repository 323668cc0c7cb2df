package cli

import (
	"context"
	"errors"
	"fmt"

	"github.com/spf13/cobra"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/backend"
	"github.com/terrace-dev/terrace/internal/state"
)

func newPushStateCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "push-state STACK ID",
		Short: "Make a state the controller kept in the plan store the Stack's current state",
		Long: "When tofu applied but the state could not be saved (Stalled with StateNotSaved, or StateTooLarge after\n" +
			"the apply), the controller keeps the state tofu left in the Stack's plan store as errored-state-<plan id>,\n" +
			"in parts when it is large, and names it in the Ready condition. push-state joins that record's parts,\n" +
			"checks that it follows the stored state (same lineage, higher serial), writes it as the current state\n" +
			"under the lock the failed run left, releases that lock, and removes the record. Refused while a runner\n" +
			"pod of the Stack is running or pending, or a state migration holds the lock. A state over the state\n" +
			"server's limit (StateTooLarge) is written all the same: raise --state-server-max-state-bytes first, or\n" +
			"the next run cannot read it.",
		Example: "  terrace push-state web errored-state-plan-7-3f9a0c2b1d -n team",
		Args:    cobra.ExactArgs(2),
	}
	return stackVerb(cmd, "", nil, func(ctx context.Context, k *kube, s streams, stack *terracev1.Stack, _ string) error {
		if b := stack.Spec.Backend; b != nil {
			return fmt.Errorf("Stack %s/%s keeps its state in its own %s backend (spec.backend): Terrace keeps no state of it", stack.Namespace, stack.Name, b.Type)
		}
		set, closeStores, err := k.stores(ctx)
		if err != nil {
			return err
		}
		defer closeStores()
		pushed, released, err := pushKeptState(ctx, k, set, stack, cmd.Flags().Arg(1))
		if err != nil {
			return err
		}
		if released != nil {
			fmt.Fprintf(s.out, "released the state lock the failed run left: %s\n", lockText(released))
		}
		fmt.Fprintf(s.out, "the state of Stack %s/%s (workspace %s) is now serial %d (%d bytes, from %s); its next run plans from it: `terrace reconcile %s -n %s`\n",
			stack.Namespace, stack.Name, workspaceOf(stack), pushed.Serial, pushed.Size, cmd.Flags().Arg(1), stack.Name, stack.Namespace)
		return nil
	})
}

// pushKeptState writes the kept state id as the Stack's current state,
// releases the lock it was written under (returned) and removes its records.
func pushKeptState(ctx context.Context, k *kube, set *backend.Set, stack *terracev1.Stack, id string) (state.StateMeta, *state.LockInfo, error) {
	data, parts, err := readKeptState(ctx, set.Plans, stack, id)
	if err != nil {
		return state.StateMeta{}, nil, err
	}
	key := state.Key{Namespace: stack.Namespace, Stack: stack.Name, Workspace: workspaceOf(stack)}
	holder, err := set.States.GetLock(ctx, key)
	if err != nil {
		return state.StateMeta{}, nil, fmt.Errorf("failed to read the state lock of %s: %w", key, err)
	}
	if holder != nil {
		if err := mayForceUnlock(ctx, k, stack, holder, ""); err != nil {
			return state.StateMeta{}, nil, err
		}
	}
	meta, err := state.PutAndRelease(ctx, set.States, key, data, holder)
	var unreleased *state.ReleaseError
	if errors.As(err, &unreleased) {
		return meta, nil, fmt.Errorf("wrote %s as the state of %s, but failed to release the failed run's lock (%s): %w; release it with `terrace force-unlock %s -n %s`", id, key, lockText(holder), unreleased.Err, stack.Name, stack.Namespace)
	}
	if err != nil {
		return state.StateMeta{}, nil, fmt.Errorf("refused to write %s as the state of %s: %w", id, key, err)
	}
	for _, p := range parts {
		if err := set.Plans.DeletePlan(ctx, state.PlanKey{Namespace: stack.Namespace, Stack: stack.Name, ID: p}); err != nil {
			return meta, holder, fmt.Errorf("wrote %s as the state of %s, but failed to remove its record %s: %w", id, key, p, err)
		}
	}
	return meta, holder, nil
}

// readKeptState joins the plan records id, id-part-2, id-part-3... the
// controller kept a state in, and returns them and the records' IDs.
func readKeptState(ctx context.Context, plans state.PlanStore, stack *terracev1.Stack, id string) ([]byte, []string, error) {
	var data []byte
	var parts []string
	for n := 1; ; n++ {
		partID := state.PartID(id, n)
		p, err := plans.GetPlan(ctx, state.PlanKey{Namespace: stack.Namespace, Stack: stack.Name, ID: partID})
		if errors.Is(err, state.ErrNotFound) && n > 1 {
			break
		}
		if errors.Is(err, state.ErrNotFound) {
			return nil, nil, fmt.Errorf("Stack %s/%s has no kept state %s in its plan store: the Ready condition names the record", stack.Namespace, stack.Name, id)
		}
		if err != nil {
			return nil, nil, fmt.Errorf("failed to read %s: %w", partID, err)
		}
		data = append(data, p.Binary...)
		parts = append(parts, partID)
	}
	if _, err := state.ParseHeader(data); err != nil {
		return nil, nil, fmt.Errorf("%s is not a state: %w", id, err)
	}
	return data, parts, nil
}
