package stack

import (
	"time"

	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
)

// This file names the state a Stack is in from what was observed, the way
// helm-controller's DetermineReleaseState does; actions.go picks the one
// next action for that state. A reconcile decides again after every
// action, from what the action observed, until an action ends it.

// State is what a Stack is in, as determineState names it.
type State string

// States before a run.
const (
	StateDeleting             State = "Deleting"             // deleted; its resources are kept
	StateDeletingWithDestroy  State = "DeletingWithDestroy"  // deleted with destroyOnDelete; not destroyed yet
	StateDestroyed            State = "Destroyed"            // deleted; destroyed, its stored data not removed yet
	StateSuspended            State = "Suspended"            // spec.suspend
	StateUnresolved           State = "Unresolved"           // source, config and inputs not read yet
	StateDependenciesNotReady State = "DependenciesNotReady" // a dependsOn Stack is not Ready at its generation
	StateCacheUnverified      State = "CacheUnverified"      // a run is due; the cached Stack may be behind
	StateCacheStale           State = "CacheStale"           // the cached Stack is behind: decide again when it caught up
	StateStalePlan            State = "StalePlan"            // a waiting plan was made from other inputs
	StateAwaitingApproval     State = "AwaitingApproval"     // a plan waits for spec.approvePlan to name it
	StateApproved             State = "Approved"             // the waiting plan is approved
	StateOutOfSync            State = "OutOfSync"            // new inputs or generation, a request, or a failed run
	StateDriftDue             State = "DriftDue"             // the interval passed since the last drift check
	StateSourceCheckDue       State = "SourceCheckDue"       // the interval passed since the Git ref was last looked at
	StateInSync               State = "InSync"               // nothing to do until the next check
	StateMigrationPending     State = "MigrationPending"     // the state is being copied to another backend
	StateHeld                 State = "StateHeld"            // an apply's unsaved state is kept and its lock held
	StateDeadRun              State = "DeadRun"              // an earlier run may have left a pod or a lock
	StateDeadRunLock          State = "DeadRunLock"          // a dead run's state lock is held
	StateRunAnnouncing        State = "RunAnnouncing"        // a run has its slot, not yet in status.currentRun
	StateRunnerStarting       State = "RunnerStarting"       // the run's runner is starting
	StateSourceCloned         State = "SourceCloned"         // the runner cloned a Git commit, not adopted yet
	StateSourceUnchanged      State = "SourceUnchanged"      // a Git check found the applied commit: nothing to plan
	StateRunnerReady          State = "RunnerReady"          // the runner has the module, not initialised
	StatePlanDue              State = "PlanDue"              // initialised: plan (drift checks too)
	StateApprovedPlanDue      State = "ApprovedPlanDue"      // initialised: apply the stored, approved plan
	StateDestroyDue           State = "DestroyDue"           // initialised: destroy
	StatePlanDenied           State = "PlanDenied"           // the plan policies denied the plan
	StateUpToDate             State = "UpToDate"             // the plan has no changes
	StatePlanOnly             State = "PlanOnly"             // spec.planOnly: the plan is reported, never applied
	StateDriftReported        State = "DriftReported"        // drift under driftDetection warn: reported only
	StatePlanTooLarge         State = "PlanTooLarge"         // the planned state is over the state server's limit
	StatePlanApproved         State = "PlanApproved"         // approvePlan auto: apply the plan just made
	StateNeedsApproval        State = "NeedsApproval"        // keep the plan for a person to approve
	StateApplied              State = "Applied"              // the apply succeeded: settle
	StateApplyStateTooLarge   State = "ApplyStateTooLarge"   // the state server refused the applied state
	StateApplyStateUnsaved    State = "ApplyStateUnsaved"    // the state server did not answer the upload
	StateApplyPlanStale       State = "ApplyPlanStale"       // the state changed between plan and apply
	StateApplyFailed          State = "ApplyFailed"          // the apply failed otherwise
	StateRunDone              State = "RunDone"              // every command of the run returned
)

// runKind is what a run does; observations.kind also says what a
// reconcile that ran nothing did (runNothing, runAwaitApproval).
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
	// runSourceCheck: the interval passed: clone the Git ref to see
	// whether it moved; a new commit makes the run a plan (runPlan).
	runSourceCheck runKind = "check"
)

// applyFailure is how an apply failed, as the runner's reason says.
type applyFailure string

const (
	applyOK               applyFailure = ""
	applyStateTooLarge    applyFailure = "StateTooLarge"
	applyStateUnavailable applyFailure = "StateUnavailable"
	applyPlanStale        applyFailure = "PlanStale"
	applyOtherFailure     applyFailure = "Failed"
)

// lockFinding is what the state lock said when a dead run was looked for.
type lockFinding string

const (
	lockNone      lockFinding = ""
	lockMigration lockFinding = "migration"    // a backend migration holds it
	lockUnsaved   lockFinding = "unsavedState" // the run whose unsaved state is kept holds it
	lockDeadRun   lockFinding = "deadRun"      // a run that is gone holds it
)

// observed is what determineState decides from: plain facts read from
// the Stack (spec and status fields, never conditions), the resolved
// inputs and what this reconcile's actions saw. observe builds it.
type observed struct {
	deleting        bool
	destroyOnDelete bool
	// everApplied: some inputs were applied (status.lastAppliedInputsDigest).
	everApplied bool
	destroyed   bool
	suspended   bool

	resolved       bool
	dependencyWait bool

	// requested: a terrace.dev/requestedAt not handled yet.
	requested bool
	// pendingPlan: a plan made from the current inputs waits for approval.
	pendingPlan bool
	approved    bool
	// stalePlan: a waiting plan made from other inputs, not discarded yet.
	stalePlan         bool
	inputsChanged     bool
	generationChanged bool
	// runFailed: the last run did not finish (status.currentRun is set)
	// and a failure is counted (status.failures).
	runFailed     bool
	driftDisabled bool
	driftDue      bool
	// gitCheckDue: the Git ref (a branch, tag or semver range) was last
	// looked at an interval ago (status.git.checkedAt).
	gitCheckDue bool

	// cacheVerified: the Stack was read from the API server (or written
	// by this reconcile); cacheStale: the cache was found behind.
	cacheVerified bool
	cacheStale    bool

	// run is the run this reconcile started, until it is done.
	run *runFacts
}

// runFacts are what the actions of a run observed.
type runFacts struct {
	kind      runKind
	announced bool
	// recoverFirst: an earlier run may have left a pod or a lock, not
	// dealt with yet; lock is what the lock said once looked at.
	recoverFirst bool
	lock         lockFinding
	runnerReady  bool
	// sourceCloned: the runner cloned a Git commit not adopted yet;
	// sourceUnchanged: a check run's clone is the commit applied.
	sourceCloned    bool
	sourceUnchanged bool
	initialised     bool
	// stepDone: the kind's command ran (apply or destroy).
	stepDone bool

	planned       bool
	hasChanges    bool
	policyDenied  bool
	planOnly      bool
	driftWarnOnly bool
	stateTooLarge bool
	// autoApprove: spec.approvePlan auto approves the plan just made.
	autoApprove bool
	// reported: the plan was kept for approval, stored or reported.
	reported bool

	applyAttempted bool
	applyFailure   applyFailure
	settled        bool
	finished       bool
}

// determineState names the state from what was observed. It is pure: the
// table in state_test.go holds every case.
func determineState(o observed) State {
	if r := o.run; r != nil && !r.finished {
		return determineRunState(r)
	}
	switch {
	case o.deleting && o.destroyed:
		return StateDestroyed
	case o.deleting && !o.cacheVerified:
		return StateCacheUnverified
	case o.deleting && o.cacheStale:
		return StateCacheStale
	case o.deleting && o.destroyOnDelete && o.everApplied && !o.resolved:
		return StateUnresolved
	case o.deleting && o.destroyOnDelete && o.everApplied:
		return StateDeletingWithDestroy
	case o.deleting:
		return StateDeleting
	case o.suspended:
		return StateSuspended
	case o.dependencyWait:
		return StateDependenciesNotReady
	case !o.resolved:
		return StateUnresolved
	}
	due := dueState(o)
	switch {
	case runsSomething(due) && o.cacheStale:
		return StateCacheStale
	case runsSomething(due) && !o.cacheVerified:
		return StateCacheUnverified
	case o.stalePlan:
		return StateStalePlan
	}
	return due
}

// dueState is what the Stack needs, from its status and inputs.
func dueState(o observed) State {
	switch {
	case o.pendingPlan && !o.requested && o.approved:
		return StateApproved
	case o.pendingPlan && !o.requested:
		return StateAwaitingApproval
	case o.requested || o.runFailed || o.inputsChanged || o.generationChanged:
		return StateOutOfSync
	case !o.driftDisabled && o.driftDue:
		return StateDriftDue
	case o.gitCheckDue:
		return StateSourceCheckDue
	}
	return StateInSync
}

// runsSomething says a state starts a run.
func runsSomething(st State) bool {
	return st == StateApproved || st == StateOutOfSync || st == StateDriftDue || st == StateSourceCheckDue
}

// determineRunState names the state inside a run.
func determineRunState(r *runFacts) State {
	switch {
	case !r.announced:
		return StateRunAnnouncing
	case r.lock == lockMigration:
		return StateMigrationPending
	case r.lock == lockUnsaved:
		return StateHeld
	case r.lock == lockDeadRun:
		return StateDeadRunLock
	case r.recoverFirst:
		return StateDeadRun
	case !r.runnerReady:
		return StateRunnerStarting
	case r.sourceCloned:
		return StateSourceCloned
	case r.sourceUnchanged:
		return StateSourceUnchanged
	case !r.initialised:
		return StateRunnerReady
	case r.settled:
		return StateRunDone
	case r.applyAttempted:
		return applyState(r.applyFailure)
	case r.kind == runDestroy && r.stepDone:
		return StateRunDone
	case r.kind == runDestroy:
		return StateDestroyDue
	case r.kind == runApplyPending:
		return StateApprovedPlanDue
	case !r.planned:
		return StatePlanDue
	case r.policyDenied:
		return StatePlanDenied
	case !r.hasChanges:
		return StateUpToDate
	case r.reported:
		return StateRunDone
	case r.planOnly:
		return StatePlanOnly
	case r.driftWarnOnly:
		return StateDriftReported
	case r.stateTooLarge:
		return StatePlanTooLarge
	case r.autoApprove:
		return StatePlanApproved
	}
	return StateNeedsApproval
}

func applyState(f applyFailure) State {
	switch f {
	case applyStateTooLarge:
		return StateApplyStateTooLarge
	case applyStateUnavailable:
		return StateApplyStateUnsaved
	case applyPlanStale:
		return StateApplyPlanStale
	case applyOtherFailure:
		return StateApplyFailed
	}
	return StateApplied
}

// observe reads the facts determineState decides from.
func (r *Reconciler) observe(s *scope) observed {
	stack, st := s.stack, &s.stack.Status
	_, requested := requestedReconcile(stack)
	o := observed{
		deleting:        !stack.DeletionTimestamp.IsZero() && controllerutil.ContainsFinalizer(stack, Finalizer),
		destroyOnDelete: stack.Spec.DestroyOnDelete,
		everApplied:     st.LastAppliedInputsDigest != "",
		destroyed:       s.run != nil && s.run.kind == runDestroy && s.run.facts.finished,
		suspended:       stack.Spec.Suspend,
		resolved:        s.inputs != nil && s.options != nil,
		dependencyWait:  s.observed.dependencyWait != "",
		requested:       requested,
		cacheVerified:   s.current,
		cacheStale:      s.observed.staleCache,
		runFailed:       st.Failures > 0 && st.CurrentRun != "",
	}
	if s.run != nil {
		o.run = &s.run.facts
	}
	if !o.resolved {
		return o
	}
	o.pendingPlan = pendingPlan(s) != ""
	o.approved = approved(stack.Spec.ApprovePlan, pendingPlan(s))
	o.stalePlan = staleWaitingPlan(s) != "" && s.observed.discardedPlan == ""
	o.inputsChanged = st.LastAppliedInputsDigest != s.inputs.digest
	o.generationChanged = st.ObservedGeneration != stack.Generation
	o.driftDisabled = s.config.DriftMode == terracev1.DriftDetectionDisabled
	o.driftDue = st.LastDriftCheckAt == nil || !r.now().Before(st.LastDriftCheckAt.Add(s.config.Interval))
	o.gitCheckDue = gitCheckDue(stack, s.config.Interval, r.now())
	return o
}

// nextDriftCheck is how long until the next drift check, or the next
// look at a Git ref, is due.
func (r *Reconciler) nextDriftCheck(s *scope) time.Duration {
	st := s.stack.Status
	next := s.config.Interval
	if s.config.DriftMode != terracev1.DriftDetectionDisabled && st.LastDriftCheckAt != nil {
		next = st.LastDriftCheckAt.Add(s.config.Interval).Sub(r.now())
	}
	if git := untilGitCheck(s.stack, s.config.Interval, r.now()); git > 0 && git < next {
		next = git
	}
	return next
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
