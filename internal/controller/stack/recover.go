package stack

import (
	"context"
	"fmt"
	"slices"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/controller/outcome"
	"github.com/terrace-dev/terrace/internal/pki"
	"github.com/terrace-dev/terrace/internal/state"
	"github.com/terrace-dev/terrace/internal/state/migrate"
	"github.com/terrace-dev/terrace/internal/state/release"
	"github.com/terrace-dev/terrace/internal/tf"
)

// The actions that deal with what an earlier run may have left: its
// runner pod and its state lock. They run after the new run's
// announcement: the dead run's certificate no longer opens the state, so
// a lock released here cannot be taken again by it.

// mayHaveDeadRun says whether an earlier run of the Stack may have left a
// runner pod or a state lock (recover), from status fields and what this
// process did, never from conditions: a run is current (status.currentRun)
// until every command of it returned, and unless this process closed that
// very run's runner after an outcome that was not a transient failure
// (status.failures 0) nor a failed apply (status.release), its pod or its
// lock may be left. A Stack whose last run finished every command
// (tofu released its lock) or that never ran has no lock to recover, but
// may have a pod (sweep): a runner is started while its run is announced,
// so a controller that stopped between the two left a pod of a run that
// no status names. The sweep holds until cleanedUpHere.
func (r *Reconciler) mayHaveDeadRun(s *scope) (recover, sweep bool) {
	key := client.ObjectKeyFromObject(s.stack)
	st := &s.stack.Status
	if st.CurrentRun == "" {
		_, swept := r.cleanedHere.Load(key)
		return false, !swept
	}
	closed, _ := r.closedHere.Load(key)
	failedApply := st.Release != nil && st.Release.Status == string(release.StatusFailed)
	return closed != st.CurrentRun || st.Failures > 0 || failedApply, false
}

// cleanedUpHere records that this process has swept the Stack's pods.
func (r *Reconciler) cleanedUpHere(s *scope) {
	r.cleanedHere.Store(client.ObjectKeyFromObject(s.stack), true)
}

// recoverDeadRun removes runner pods of earlier runs (a controller that
// restarted mid-run left them) and looks at the state lock, which only
// such a run can hold (runs of one Stack never overlap): what holds it
// decides the next action (releaseDeadRunLock, waitForMigration,
// holdUnsavedState). A Stack's own backend's lock is the backend's:
// Terrace cannot tell whose it is and never touches it.
func (r *Reconciler) recoverDeadRun(ctx context.Context, s *scope) error {
	if err := r.cleanupEarlierRuns(ctx, s); err != nil {
		return fmt.Errorf("failed to remove runner pods of earlier runs: %w", err)
	}
	if !ownsBackend(s.stack) {
		holder, err := s.run.stores.States.GetLock(ctx, stateKey(s.stack))
		if err != nil {
			return err
		}
		if s.run.facts.lock, err = r.whoseLock(ctx, s, holder); err != nil {
			return err
		}
		s.run.lockHolder = holder
	}
	s.run.facts.recoverFirst = false
	if s.run.facts.lock == lockNone {
		r.cleanedUpHere(s)
	}
	return nil
}

// whoseLock names the holder of the state lock. A run of this Stack whose
// apply left a state the controller could not save (keepUnsavedState) holds
// it on purpose, while that state is kept in the plan store under the
// errored-state ID of the last plan: a run now would plan from a state that
// misses that apply's changes.
func (r *Reconciler) whoseLock(ctx context.Context, s *scope, holder *state.LockInfo) (lockFinding, error) {
	switch {
	case holder == nil:
		return lockNone, nil
	case holder.Operation == migrate.LockOperation:
		return lockMigration, nil
	}
	_, stack, _, ok := pki.Identity(holder.Owner).Runner()
	plan := s.stack.Status.Plan
	if !ok || stack != s.stack.Name || plan == nil || plan.ID == "" {
		return lockDeadRun, nil
	}
	kept, err := s.run.stores.Plans.ListPlans(ctx, s.stack.Namespace, s.stack.Name)
	if err != nil {
		return "", fmt.Errorf("failed to list the Stack's plans: %w", err)
	}
	unsaved := tf.ErroredStateID(plan.ID)
	if slices.ContainsFunc(kept, func(p state.PlanMeta) bool { return p.Key.ID == unsaved }) {
		return lockUnsaved, nil
	}
	return lockDeadRun, nil
}

// releaseDeadRunLock releases the state lock of a run that is gone.
func (r *Reconciler) releaseDeadRunLock(ctx context.Context, s *scope) error {
	holder := s.run.lockHolder
	if err := s.run.stores.States.ForceUnlock(ctx, stateKey(s.stack)); err != nil {
		return fmt.Errorf("failed to release the state lock of a dead run: %w", err)
	}
	s.log.Info("released the state lock of a dead run", "lockID", holder.ID, "operation", holder.Operation, "created", holder.Created)
	r.normalEvent(s.stack, "StateUnlocked", "released the state lock held since %s by a run that is gone", holder.Created.Format(time.RFC3339))
	s.run.facts.lock = lockNone
	r.cleanedUpHere(s)
	return nil
}

// waitForMigration never breaks a migration's lock: the copy would miss
// what the run writes.
func (r *Reconciler) waitForMigration(_ context.Context, s *scope) error {
	holder := s.run.lockHolder
	return outcome.Waiting(StateMigrationPendingReason, migrationRecheck, fmt.Errorf("the state of %s is being copied to another backend (lock %s since %s)", stateKey(s.stack), holder.ID, holder.Created.Format(time.RFC3339)))
}

// holdUnsavedState keeps the Stack Stalled with StateNotSaved while the
// lock of the run whose state is kept is held. `terrace push-state`
// writes the kept state and releases the lock; `terrace force-unlock`
// releases it without (the user's choice).
func (r *Reconciler) holdUnsavedState(_ context.Context, s *scope) error {
	id := tf.ErroredStateID(s.stack.Status.Plan.ID)
	return outcome.Terminalf(StateNotSavedReason, "tofu applied %s but could not save the state; it is kept in the Stack's plan store as %s; the Stack does not run while the failed run's lock is held: push it first with `terrace push-state %s %s -n %s`",
		s.stack.Status.Plan.ID, id, s.stack.Name, id, s.stack.Namespace)
}

// stateKey names the Stack's state.
func stateKey(stack *terracev1.Stack) state.Key {
	return state.Key{Namespace: stack.Namespace, Stack: stack.Name, Workspace: stack.Spec.Workspace}
}
