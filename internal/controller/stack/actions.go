package stack

import (
	"context"
	"fmt"
)

// actionType says what an action does, for logs and the tests' walk.
type actionType string

const (
	// actionObserve reads and records what it saw; nothing changes.
	actionObserve actionType = "observe"
	// actionRun drives the runner: tofu commands, which may change
	// infrastructure.
	actionRun actionType = "run"
	// actionRecord writes the stores, outputs or the Stack's status.
	actionRecord actionType = "record"
	// actionEnd ends the reconcile: it waits, or the outcome is known.
	actionEnd actionType = "end"
)

// action is the one next thing a reconcile does in a state. Its do
// records what it saw on the scope; the reconcile then decides again,
// unless the action is of type actionEnd or failed.
type action struct {
	name string
	typ  actionType
	do   func(r *Reconciler, ctx context.Context, s *scope) error
}

// actionFor is the one switch from state to action. A run that is not a
// destroy is the rest of its reconcile (startXRun ends it: the run goes on
// in its own goroutine and decides on its own); a destroy run goes on in
// its reconcile, which then removes what Terrace stored and the finalizer.
func actionFor(st State) action {
	switch st {
	case StateDeleting:
		return action{"finalizeKeepingResources", actionEnd, (*Reconciler).finalizeKeepingResources}
	case StateDestroyed:
		return action{"finalizeDestroyed", actionEnd, (*Reconciler).finalizeDestroyed}
	case StateDeletingWithDestroy:
		return action{"startDestroyRun", actionRun, (*Reconciler).startDestroyRun}
	case StateSuspended:
		return action{"suspend", actionEnd, (*Reconciler).suspend}
	case StateUnresolved:
		return action{"resolve", actionObserve, (*Reconciler).resolve}
	case StateDependenciesNotReady:
		return action{"waitForDependencies", actionEnd, (*Reconciler).waitForDependencies}
	case StateCacheUnverified:
		return action{"verifyCache", actionObserve, (*Reconciler).verifyCache}
	case StateCacheStale:
		return action{"waitForCache", actionEnd, (*Reconciler).waitForCache}
	case StateStalePlan:
		return action{"discardStalePlan", actionRecord, (*Reconciler).discardStalePlan}
	case StateAwaitingApproval:
		return action{"awaitApproval", actionEnd, (*Reconciler).awaitApproval}
	case StateApproved:
		return action{"startApplyRun", actionEnd, (*Reconciler).startApplyRun}
	case StateOutOfSync:
		return action{"startPlanRun", actionEnd, (*Reconciler).startPlanRun}
	case StateDriftDue:
		return action{"startDriftRun", actionEnd, (*Reconciler).startDriftRun}
	case StateSourceCheckDue:
		return action{"startSourceCheckRun", actionEnd, (*Reconciler).startSourceCheckRun}
	case StateInSync:
		return action{"scheduleNextCheck", actionEnd, (*Reconciler).scheduleNextCheck}

	case StateRunAnnouncing:
		return action{"announce", actionRecord, (*Reconciler).announce}
	case StateDeadRun:
		return action{"recoverDeadRun", actionObserve, (*Reconciler).recoverDeadRun}
	case StateMigrationPending:
		return action{"waitForMigration", actionEnd, (*Reconciler).waitForMigration}
	case StateHeld:
		return action{"holdUnsavedState", actionEnd, (*Reconciler).holdUnsavedState}
	case StateDeadRunLock:
		return action{"releaseDeadRunLock", actionRecord, (*Reconciler).releaseDeadRunLock}
	case StateRunnerStarting:
		return action{"awaitRunner", actionObserve, (*Reconciler).awaitRunner}
	case StateSourceCloned:
		return action{"adoptClonedSource", actionObserve, (*Reconciler).adoptClonedSource}
	case StateSourceUnchanged:
		return action{"finishSourceCheck", actionEnd, (*Reconciler).finishSourceCheck}
	case StateRunnerReady:
		return action{"initialise", actionRun, (*Reconciler).initialise}
	case StatePlanDue:
		return action{"plan", actionRun, (*Reconciler).plan}
	case StateApprovedPlanDue:
		return action{"applyApproved", actionRun, (*Reconciler).applyApproved}
	case StateDestroyDue:
		return action{"destroy", actionRun, (*Reconciler).destroy}
	case StatePlanDenied:
		return action{"refuseDeniedPlan", actionEnd, (*Reconciler).refuseDeniedPlan}
	case StateUpToDate, StateApplied:
		return action{"settle", actionRecord, (*Reconciler).settle}
	case StatePlanOnly:
		return action{"storePlanOnly", actionRecord, (*Reconciler).storePlanOnly}
	case StateDriftReported:
		return action{"reportDrift", actionRecord, (*Reconciler).reportDrift}
	case StatePlanTooLarge:
		return action{"refusePlanTooLarge", actionEnd, (*Reconciler).refusePlanTooLarge}
	case StatePlanApproved:
		return action{"apply", actionRun, (*Reconciler).apply}
	case StateNeedsApproval:
		return action{"keepForApproval", actionRecord, (*Reconciler).keepForApproval}
	case StateApplyStateTooLarge:
		return action{"keepErroredState", actionEnd, (*Reconciler).keepErroredState}
	case StateApplyStateUnsaved:
		return action{"saveUnsavedState", actionEnd, (*Reconciler).saveUnsavedState}
	case StateApplyPlanStale:
		return action{"discardAppliedStalePlan", actionEnd, (*Reconciler).discardAppliedStalePlan}
	case StateApplyFailed:
		return action{"recordFailedApply", actionEnd, (*Reconciler).recordFailedApply}
	case StateRunDone:
		return action{"finishRun", actionEnd, (*Reconciler).finishRun}
	}
	panic(fmt.Sprintf("no action for state %q", st)) // a state without an action is a bug of this file
}

// maxActions bounds one reconcile's decisions: a state machine that does
// not advance is a bug, reported instead of spinning.
const maxActions = 64

// decideAndAct names the state, does its action and decides again, until
// an action ends the reconcile (or hands the run to its own goroutine).
func (r *Reconciler) decideAndAct(ctx context.Context, s *scope) error {
	for range maxActions {
		st := determineState(r.observe(s))
		a := actionFor(st)
		s.walk = append(s.walk, string(st)+"→"+a.name)
		s.log.V(1).Info("next action", "state", st, "action", a.name, "type", a.typ)
		if err := a.do(r, ctx, s); err != nil || a.typ == actionEnd {
			return err
		}
	}
	return fmt.Errorf("internal error: no outcome after %d actions (%v)", maxActions, s.walk)
}
