package stack

import (
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/settings"
)

// Every state, from the facts that name it: the decision is this pure
// function, so its table is the controller's behaviour before and inside
// a run.
func TestDetermineState(t *testing.T) {
	settled := func(mutate func(*observed)) observed {
		o := observed{resolved: true, cacheVerified: true, everApplied: true}
		if mutate != nil {
			mutate(&o)
		}
		return o
	}
	inRun := func(kind runKind, mutate func(*runFacts)) observed {
		r := &runFacts{kind: kind, announced: true, runnerReady: true, initialised: true}
		if mutate != nil {
			mutate(r)
		}
		return settled(func(o *observed) { o.run = r })
	}
	cases := []struct {
		name string
		o    observed
		want State
	}{
		// Deletion.
		{"deleted, cache not verified", observed{deleting: true}, StateCacheUnverified},
		{"deleted, cache behind", observed{deleting: true, cacheVerified: true, cacheStale: true}, StateCacheStale},
		{"deleted, resources kept", observed{deleting: true, cacheVerified: true, everApplied: true}, StateDeleting},
		{"deleted, never applied, destroyOnDelete", observed{deleting: true, cacheVerified: true, destroyOnDelete: true}, StateDeleting},
		{"deleted with destroy, inputs not read", observed{deleting: true, cacheVerified: true, destroyOnDelete: true, everApplied: true}, StateUnresolved},
		{"deleted with destroy", observed{deleting: true, cacheVerified: true, destroyOnDelete: true, everApplied: true, resolved: true}, StateDeletingWithDestroy},
		{"destroyed", observed{deleting: true, destroyed: true}, StateDestroyed},
		{"deleted while suspended", observed{deleting: true, cacheVerified: true, suspended: true}, StateDeleting},
		// Before a run.
		{"suspended", observed{suspended: true, dependencyWait: true}, StateSuspended},
		{"dependencies not ready", observed{dependencyWait: true}, StateDependenciesNotReady},
		{"inputs not read", observed{}, StateUnresolved},
		{"in sync", settled(nil), StateInSync},
		{"in sync, cache never checked", settled(func(o *observed) { o.cacheVerified = false }), StateInSync},
		{"new inputs, cache not verified", settled(func(o *observed) { o.inputsChanged, o.cacheVerified = true, false }), StateCacheUnverified},
		{"new inputs, cache behind", settled(func(o *observed) { o.inputsChanged, o.cacheStale = true, true }), StateCacheStale},
		{"new inputs", settled(func(o *observed) { o.inputsChanged = true }), StateOutOfSync},
		{"new generation", settled(func(o *observed) { o.generationChanged = true }), StateOutOfSync},
		{"requested", settled(func(o *observed) { o.requested = true }), StateOutOfSync},
		{"a run failed", settled(func(o *observed) { o.runFailed = true }), StateOutOfSync},
		{"drift check due", settled(func(o *observed) { o.driftDue = true }), StateDriftDue},
		{"drift check due, detection disabled", settled(func(o *observed) { o.driftDue, o.driftDisabled = true, true }), StateInSync},
		{"git ref check due", settled(func(o *observed) { o.gitCheckDue = true }), StateSourceCheckDue},
		{"git ref check due, detection disabled", settled(func(o *observed) { o.gitCheckDue, o.driftDisabled = true, true }), StateSourceCheckDue},
		{"git ref check and drift check due", settled(func(o *observed) { o.gitCheckDue, o.driftDue = true, true }), StateDriftDue},
		{"git ref check due, new inputs", settled(func(o *observed) { o.gitCheckDue, o.inputsChanged = true, true }), StateOutOfSync},
		{"git ref check due, cache not verified", settled(func(o *observed) { o.gitCheckDue, o.cacheVerified = true, false }), StateCacheUnverified},
		{"git ref check due, waiting plan", settled(func(o *observed) { o.gitCheckDue, o.pendingPlan = true, true }), StateAwaitingApproval},
		{"waiting plan", settled(func(o *observed) { o.pendingPlan = true }), StateAwaitingApproval},
		{"waiting plan, drift due", settled(func(o *observed) { o.pendingPlan, o.driftDue = true, true }), StateAwaitingApproval},
		{"waiting plan approved", settled(func(o *observed) { o.pendingPlan, o.approved = true, true }), StateApproved},
		{"waiting plan, requested", settled(func(o *observed) { o.pendingPlan, o.requested = true, true }), StateOutOfSync},
		{"waiting plan of other inputs", settled(func(o *observed) { o.stalePlan, o.inputsChanged = true, true }), StateStalePlan},
		{"waiting plan of other inputs, nothing due", settled(func(o *observed) { o.stalePlan = true }), StateStalePlan},
		// Inside a run.
		{"run not announced", settled(func(o *observed) { o.run = &runFacts{kind: runPlan} }), StateRunAnnouncing},
		{"dead run possible", settled(func(o *observed) { o.run = &runFacts{kind: runPlan, announced: true, recoverFirst: true} }), StateDeadRun},
		{"dead run's lock", settled(func(o *observed) { o.run = &runFacts{kind: runPlan, announced: true, lock: lockDeadRun} }), StateDeadRunLock},
		{"migration's lock", settled(func(o *observed) { o.run = &runFacts{kind: runPlan, announced: true, lock: lockMigration} }), StateMigrationPending},
		{"unsaved state's lock", settled(func(o *observed) { o.run = &runFacts{kind: runPlan, announced: true, lock: lockUnsaved} }), StateHeld},
		{"runner starting", settled(func(o *observed) { o.run = &runFacts{kind: runPlan, announced: true} }), StateRunnerStarting},
		{"runner ready", settled(func(o *observed) { o.run = &runFacts{kind: runPlan, announced: true, runnerReady: true} }), StateRunnerReady},
		{"git commit cloned", settled(func(o *observed) {
			o.run = &runFacts{kind: runSourceCheck, announced: true, runnerReady: true, sourceCloned: true}
		}), StateSourceCloned},
		{"git commit cloned for a plan", settled(func(o *observed) {
			o.run = &runFacts{kind: runPlan, announced: true, runnerReady: true, sourceCloned: true}
		}), StateSourceCloned},
		{"git check found the applied commit", settled(func(o *observed) {
			o.run = &runFacts{kind: runSourceCheck, announced: true, runnerReady: true, sourceUnchanged: true}
		}), StateSourceUnchanged},
		{"plan due", inRun(runPlan, nil), StatePlanDue},
		{"drift check's plan due", inRun(runDrift, nil), StatePlanDue},
		{"approved plan due", inRun(runApplyPending, nil), StateApprovedPlanDue},
		{"destroy due", inRun(runDestroy, nil), StateDestroyDue},
		{"destroyed, run not finished", inRun(runDestroy, func(r *runFacts) { r.stepDone = true }), StateRunDone},
		{"denied by policy", inRun(runPlan, func(r *runFacts) { r.planned, r.hasChanges, r.policyDenied = true, true, true }), StatePlanDenied},
		{"no changes", inRun(runPlan, func(r *runFacts) { r.planned = true }), StateUpToDate},
		{"no changes, planOnly", inRun(runPlan, func(r *runFacts) { r.planned, r.planOnly = true, true }), StateUpToDate},
		{"planOnly", inRun(runPlan, func(r *runFacts) { r.planned, r.hasChanges, r.planOnly, r.autoApprove = true, true, true, true }), StatePlanOnly},
		{"drift under warn", inRun(runDrift, func(r *runFacts) { r.planned, r.hasChanges, r.driftWarnOnly, r.autoApprove = true, true, true, true }), StateDriftReported},
		{"state too large", inRun(runPlan, func(r *runFacts) { r.planned, r.hasChanges, r.stateTooLarge, r.autoApprove = true, true, true, true }), StatePlanTooLarge},
		{"approved by auto", inRun(runPlan, func(r *runFacts) { r.planned, r.hasChanges, r.autoApprove = true, true, true }), StatePlanApproved},
		{"drift, auto repairs", inRun(runDrift, func(r *runFacts) { r.planned, r.hasChanges, r.autoApprove = true, true, true }), StatePlanApproved},
		{"needs approval", inRun(runPlan, func(r *runFacts) { r.planned, r.hasChanges = true, true }), StateNeedsApproval},
		{"kept for approval", inRun(runPlan, func(r *runFacts) { r.planned, r.hasChanges, r.reported = true, true, true }), StateRunDone},
		{"applied", inRun(runPlan, func(r *runFacts) { r.planned, r.hasChanges, r.applyAttempted = true, true, true }), StateApplied},
		{"approved plan applied", inRun(runApplyPending, func(r *runFacts) { r.applyAttempted = true }), StateApplied},
		{"apply: state too large", inRun(runPlan, func(r *runFacts) { r.applyAttempted, r.applyFailure = true, applyStateTooLarge }), StateApplyStateTooLarge},
		{"apply: state not saved", inRun(runPlan, func(r *runFacts) { r.applyAttempted, r.applyFailure = true, applyStateUnavailable }), StateApplyStateUnsaved},
		{"apply: plan stale", inRun(runApplyPending, func(r *runFacts) { r.applyAttempted, r.applyFailure = true, applyPlanStale }), StateApplyPlanStale},
		{"apply failed", inRun(runPlan, func(r *runFacts) { r.applyAttempted, r.applyFailure = true, applyOtherFailure }), StateApplyFailed},
		{"settled", inRun(runPlan, func(r *runFacts) { r.planned, r.settled = true, true }), StateRunDone},
		{"run finished: decided from the status again", settled(func(o *observed) { o.run = &runFacts{kind: runPlan, finished: true} }), StateInSync},
	}
	seen := map[State]bool{}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := determineState(tc.o); got != tc.want {
				t.Fatalf("determineState = %s, want %s", got, tc.want)
			}
			seen[tc.want] = true
			if a := actionFor(tc.want); a.name == "" || a.do == nil {
				t.Fatalf("state %s has no action", tc.want)
			}
		})
	}
	for _, st := range allStates {
		if !seen[st] {
			t.Errorf("state %s has no case in this table", st)
		}
	}
}

// allStates lists every State, for the table's coverage check.
var allStates = []State{
	StateDeleting, StateDeletingWithDestroy, StateDestroyed, StateSuspended, StateUnresolved, StateDependenciesNotReady,
	StateCacheUnverified, StateCacheStale, StateStalePlan, StateAwaitingApproval, StateApproved, StateOutOfSync,
	StateDriftDue, StateInSync, StateMigrationPending, StateHeld, StateDeadRun, StateDeadRunLock, StateRunAnnouncing,
	StateRunnerStarting, StateRunnerReady, StatePlanDue, StateApprovedPlanDue, StateDestroyDue, StatePlanDenied,
	StateUpToDate, StatePlanOnly, StateDriftReported, StatePlanTooLarge, StatePlanApproved, StateNeedsApproval,
	StateApplied, StateApplyStateTooLarge, StateApplyStateUnsaved, StateApplyPlanStale, StateApplyFailed, StateRunDone,
	StateSourceCheckDue, StateSourceCloned, StateSourceUnchanged,
}

// observe reads the decision's facts from status fields and the resolved
// inputs: a failure counted before any run (status.currentRun clear) does
// not force a plan, a failed run does.
func TestObserveDecidesFromTheStatus(t *testing.T) {
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	recent := metav1.NewTime(now.Add(-time.Minute))
	old := metav1.NewTime(now.Add(-time.Hour))
	settled := func(mutate func(*terracev1.Stack)) *terracev1.Stack {
		s := &terracev1.Stack{ObjectMeta: metav1.ObjectMeta{Generation: 3}}
		s.Status.ObservedGeneration = 3
		s.Status.LastAppliedInputsDigest = "sha256:in"
		s.Status.LastDriftCheckAt = &recent
		if mutate != nil {
			mutate(s)
		}
		return s
	}
	cases := []struct {
		name  string
		stack *terracev1.Stack
		drift terracev1.DriftDetectionMode
		want  State
	}{
		{"up to date", settled(nil), terracev1.DriftDetectionEnabled, StateInSync},
		{"new inputs", settled(func(s *terracev1.Stack) { s.Status.LastAppliedInputsDigest = "sha256:other" }), terracev1.DriftDetectionEnabled, StateOutOfSync},
		{"new generation", settled(func(s *terracev1.Stack) { s.Generation = 4 }), terracev1.DriftDetectionEnabled, StateOutOfSync},
		{"failed before any run", settled(func(s *terracev1.Stack) { s.Status.Failures = 2 }), terracev1.DriftDetectionEnabled, StateInSync},
		{"a run failed", settled(func(s *terracev1.Stack) { s.Status.Failures, s.Status.CurrentRun = 2, "run-1" }), terracev1.DriftDetectionEnabled, StateOutOfSync},
		{"requested", settled(func(s *terracev1.Stack) {
			s.Annotations = map[string]string{terracev1.ReconcileRequestAnnotation: "now"}
		}), terracev1.DriftDetectionEnabled, StateOutOfSync},
		{"request already handled", settled(func(s *terracev1.Stack) {
			s.Annotations = map[string]string{terracev1.ReconcileRequestAnnotation: "now"}
			s.Status.LastHandledReconcileAt = "now"
		}), terracev1.DriftDetectionEnabled, StateInSync},
		{"drift check due", settled(func(s *terracev1.Stack) { s.Status.LastDriftCheckAt = &old }), terracev1.DriftDetectionEnabled, StateDriftDue},
		{"drift check due, warn", settled(func(s *terracev1.Stack) { s.Status.LastDriftCheckAt = &old }), terracev1.DriftDetectionWarn, StateDriftDue},
		{"drift disabled", settled(func(s *terracev1.Stack) { s.Status.LastDriftCheckAt = &old }), terracev1.DriftDetectionDisabled, StateInSync},
		{"git branch looked at recently", settled(func(s *terracev1.Stack) {
			s.Spec.Source.Git = &terracev1.GitSource{URL: "https://git.example.com/infra.git"}
			s.Status.Git = &terracev1.GitStatus{Revision: "main@sha1:" + strings.Repeat("a", 40), CheckedAt: &recent}
		}), terracev1.DriftDetectionDisabled, StateInSync},
		{"git branch looked at an interval ago", settled(func(s *terracev1.Stack) {
			s.Spec.Source.Git = &terracev1.GitSource{URL: "https://git.example.com/infra.git"}
			s.Status.Git = &terracev1.GitStatus{Revision: "main@sha1:" + strings.Repeat("a", 40), CheckedAt: &old}
		}), terracev1.DriftDetectionDisabled, StateSourceCheckDue},
		{"git branch never looked at", settled(func(s *terracev1.Stack) {
			s.Spec.Source.Git = &terracev1.GitSource{URL: "https://git.example.com/infra.git"}
		}), terracev1.DriftDetectionDisabled, StateSourceCheckDue},
		{"git commit never moves", settled(func(s *terracev1.Stack) {
			s.Spec.Source.Git = &terracev1.GitSource{URL: "https://git.example.com/infra.git", Ref: &terracev1.GitRef{Commit: strings.Repeat("a", 40)}}
			s.Status.Git = &terracev1.GitStatus{Revision: "sha1:" + strings.Repeat("a", 40), CheckedAt: &old}
		}), terracev1.DriftDetectionDisabled, StateInSync},
		{"pending, not approved", settled(func(s *terracev1.Stack) {
			s.Status.Plan = &terracev1.PlanStatus{Pending: "plan-3-abc", InputsDigest: "sha256:in"}
		}), terracev1.DriftDetectionEnabled, StateAwaitingApproval},
		{"pending, approved by id", settled(func(s *terracev1.Stack) {
			s.Spec.ApprovePlan = "plan-3-abc"
			s.Status.Plan = &terracev1.PlanStatus{Pending: "plan-3-abc", InputsDigest: "sha256:in"}
		}), terracev1.DriftDetectionEnabled, StateApproved},
		{"pending, other id approved", settled(func(s *terracev1.Stack) {
			s.Spec.ApprovePlan = "plan-2-zzz"
			s.Status.Plan = &terracev1.PlanStatus{Pending: "plan-3-abc", InputsDigest: "sha256:in"}
		}), terracev1.DriftDetectionEnabled, StateAwaitingApproval},
		{"pending but inputs moved on", settled(func(s *terracev1.Stack) {
			s.Spec.ApprovePlan = "plan-3-abc"
			s.Status.LastAppliedInputsDigest = "sha256:applied"
			s.Status.Plan = &terracev1.PlanStatus{Pending: "plan-3-abc", InputsDigest: "sha256:older"}
		}), terracev1.DriftDetectionEnabled, StateStalePlan},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := &Reconciler{Now: func() time.Time { return now }}
			s := &scope{stack: tc.stack, current: true, inputs: &inputs{digest: "sha256:in"}, options: &runOptions{},
				config: settings.Effective{Interval: 10 * time.Minute, DriftMode: tc.drift}}
			if got := determineState(r.observe(s)); got != tc.want {
				t.Fatalf("state %s, want %s", got, tc.want)
			}
		})
	}
}
