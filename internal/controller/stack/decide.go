package stack

import (
	"time"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
)

// runKind is what a reconcile does with a runner.
type runKind string

const (
	// runNothing: everything is up to date; look again later.
	runNothing runKind = ""
	// runAwaitApproval: a plan waits for approval; nothing to run.
	runAwaitApproval runKind = "await"
	// runPlan: the inputs changed (or a retry/request is due): plan, and apply if approved.
	runPlan runKind = "plan"
	// runApplyPending: the pending plan was approved: apply exactly it.
	runApplyPending runKind = "apply"
	// runDrift: the interval passed: plan to find drift.
	runDrift runKind = "drift"
	// runDestroy: the Stack is deleted with destroyOnDelete.
	runDestroy runKind = "destroy"
)

// startsRunner reports whether a kind runs anything.
func (k runKind) startsRunner() bool {
	return k != runNothing && k != runAwaitApproval
}

// decide says what this reconcile runs and, for runNothing, when to look again.
func (r *Reconciler) decide(s *scope) (runKind, time.Duration) {
	st := s.recorded()
	_, requested := requestedReconcile(s.stack)
	if pending := pendingPlan(s); pending != "" && !requested {
		if approved(s.stack.Spec.ApprovePlan, pending) {
			return runApplyPending, 0
		}
		return runAwaitApproval, 0
	}
	if requested || st.Failures > 0 || st.LastAppliedInputsDigest != s.inputs.digest ||
		st.ObservedGeneration != s.stack.Generation {
		return runPlan, 0
	}
	if s.config.DriftMode == terracev1.DriftDetectionDisabled {
		return runNothing, s.config.Interval
	}
	if st.LastDriftCheckAt == nil {
		return runDrift, 0
	}
	if due := st.LastDriftCheckAt.Add(s.config.Interval); !r.now().Before(due) {
		return runDrift, 0
	} else {
		return runNothing, due.Sub(r.now())
	}
}

// pendingPlan is the id of the plan waiting for approval that was made
// from the current inputs, or "".
func pendingPlan(s *scope) string {
	if p := s.recorded().Plan; p != nil && p.InputsDigest == s.inputs.digest {
		return p.Pending
	}
	return ""
}

// staleWaitingPlan is the id of a waiting plan made from other inputs: it
// can never be applied, and is discarded.
func staleWaitingPlan(s *scope) string {
	if p := s.recorded().Plan; p != nil && p.Pending != "" && p.InputsDigest != s.inputs.digest {
		return p.Pending
	}
	return ""
}

func approved(approvePlan, planID string) bool {
	return approvePlan == terracev1.ApprovePlanAuto || (planID != "" && approvePlan == planID)
}
