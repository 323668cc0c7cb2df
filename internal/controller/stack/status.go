package stack

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/controller/outcome"
	"github.com/terrace-dev/terrace/internal/stackview"
	"github.com/terrace-dev/terrace/internal/state/release"
)

// This file is the only writer of a Stack's status: steps record what they
// saw on the scope's observations, and summarize (or, when a run starts,
// summarizeProgress) derives every field and condition from them.

// ownedConditions are the conditions the Stack controller writes.
var ownedConditions = []string{
	terracev1.ReadyCondition, terracev1.ReconcilingCondition, terracev1.StalledCondition,
	terracev1.PlannedCondition, terracev1.AppliedCondition, terracev1.DriftedCondition,
	terracev1.DependenciesReadyCondition, terracev1.HealthCheckPassedCondition, terracev1.PolicyDeniedCondition,
}

// progressConditions are the conditions a run's announcement writes.
var progressConditions = []string{terracev1.ReadyCondition, terracev1.ReconcilingCondition}

// defaultInterval is spec.interval's default, for a config not resolved.
const defaultInterval = 10 * time.Minute

// recorded is the status as it was read (plus what this reconcile's
// announcement wrote): what earlier reconciles recorded. A copy, so that
// steps can read it but never write it.
func (s *scope) recorded() *terracev1.StackStatus {
	return s.stack.Status.DeepCopy()
}

// requestedReconcile reports a reconcile request not yet handled: a
// terrace.dev/requestedAt value, or Flux's reconcile.fluxcd.io/requestedAt
// (a Flux Receiver or `flux reconcile` sets it), whichever is later.
func requestedReconcile(stack *terracev1.Stack) (string, bool) {
	v, ok := outcome.RequestedAt(stack)
	return v, ok && v != stack.Status.LastHandledReconcileAt
}

func conditionTrue(stack *terracev1.Stack, t string) bool {
	return outcome.IsTrue(stack, t)
}

// summarizeProgress records a run that is starting: its id (the state
// server admits only the current run) and, for a run of new work
// (reannounce), Reconciling with what it does. Ready goes Unknown only
// when the run may change the Stack's resources (changes); a drift check
// leaves the conditions as they are, so a Ready Stack stays Ready while
// it is checked.
func summarizeProgress(s *scope, reannounce, changes bool) {
	recordRun(s)
	msg := s.observed.runStarted.message
	switch {
	case changes:
		outcome.MarkReconciling(s.stack, ProgressingReason, "%s", msg)
	case reannounce:
		outcome.MarkTrue(s.stack, terracev1.ReconcilingCondition, ProgressingReason, "%s", msg)
	}
}

// summarize derives the status from the observations and the step error,
// and decides what Reconcile returns.
func (r *Reconciler) summarize(ctx context.Context, s *scope, stepErr error) outcome.Outcome {
	stack, o := s.stack, &s.observed
	st := &stack.Status
	wasReady := conditionTrue(stack, terracev1.ReadyCondition)
	// A request is handled by the reconcile that saw it, whatever came of
	// it (as Flux does): whoever asked reads the outcome in the conditions,
	// and a failed run is retried on its own. A run queued for a slot is
	// not handled yet: the request is what makes the Stack run once a
	// slot is there, and `terrace reconcile --wait` waits through the queue.
	if v, ok := requestedReconcile(stack); ok && !runQueued(stepErr) {
		st.LastHandledReconcileAt = v
	}
	recordRun(s)
	r.recordBackendLock(s, stepErr)
	if o.suspended {
		outcome.Delete(stack, terracev1.ReconcilingCondition)
		return outcome.Outcome{Final: true}
	}
	if stack.DeletionTimestamp == nil {
		r.setDependenciesCondition(s)
		r.setPlanConditions(s)
		setHealthCondition(s)
	}
	setPolicyCondition(s) // a destroy's plan is decided too
	err := stepErr
	if err == nil && o.awaitingApproval() {
		// Waiting on a person: not Ready (so `kubectl wait` does not
		// pass) and Reconciling with reason AwaitingApproval (so kstatus,
		// and Flux or Argo CD through it, do not take the Stack for
		// Current), not Stalled: nothing is wrong.
		err = outcome.Awaiting(AwaitingApprovalReason, "%s", readyMessage(s))
	}
	summary := outcome.Summarize(stack, err, readyReason(s), readyMessage(s), nextLook(s))
	var waiting *outcome.WaitingError
	switch {
	case summary.Err != nil:
		// Transient: retried after retryInterval doubled per failure,
		// from this stored count (finish), as the event says.
		st.Failures++
		backoff := retryBackoff(stack, st.Failures)
		s.log.Error(stepErr, "run failed; retrying", "failures", st.Failures, "retryIn", backoff)
		r.warningEventFor(s, o.plan.ref(), outcome.ReconciliationFailedReason, "%s (retry in %s)", stepErr.Error(), backoff.Round(time.Second))
	case errors.As(err, &waiting), runQueued(err):
	default:
		st.Failures = 0
	}
	if summary.Final {
		st.ObservedGeneration = stack.Generation
	}
	// A run that applied has said so in its Applied event, which names the
	// release: becoming Ready needs no second event (one API call each).
	if !wasReady && conditionTrue(stack, terracev1.ReadyCondition) && st.ObservedGeneration > 0 && o.kind != runNothing && o.applied == nil {
		r.normalEventFor(s, nil, "Ready", "%s", readyMessage(s))
	}
	return summary
}

// recordRun writes what a run did into the status fields that remember it.
// A run is current from its announcement until every command of it
// returned (the state server accepts its certificate only meanwhile); a
// run cut short stays current until the next run, so that its runner,
// interrupted, may still save the state tofu was writing, and the next
// run knows to recover from it. lastRun keeps its ID after it ends.
func recordRun(s *scope) {
	st, o := &s.stack.Status, &s.observed
	if o.runStarted != nil {
		st.LastRun = o.runStarted.id
		st.CurrentRun = o.runStarted.id
		if o.runFinished {
			st.CurrentRun = ""
		}
	}
	if o.attempted != "" {
		st.LastAttemptedRevision = o.attempted
	}
	if o.git != nil {
		checked := st.Git.DeepCopy()
		st.Git = o.git.DeepCopy()
		if checked != nil {
			st.Git.CheckedAt = checked.CheckedAt
		}
	}
	if o.gitCheckedAt != nil {
		if st.Git == nil {
			st.Git = &terracev1.GitStatus{}
		}
		st.Git.CheckedAt = ptrTime(*o.gitCheckedAt)
	}
	if st.Plan != nil && (o.discardedPlan != "" || o.lostPlan != "") {
		st.Plan.Pending = ""
	}
	if p := o.plan; p != nil {
		at := metav1.NewTime(p.at)
		sum := p.summary
		st.Plan = &terracev1.PlanStatus{
			ID: p.id, Add: sum.GetAdd(), Change: sum.GetChange(), Destroy: sum.GetDestroy(),
			Drift: sum.GetDrift(), CreatedAt: &at, InputsDigest: s.inputs.digest, Policy: p.policy, DestroyPlan: p.destroy,
		}
		if p.keptForApproval {
			st.Plan.Pending = p.id
		}
		// Every plan refreshes the state against the world: a drift check.
		st.LastDriftCheckAt = &at
		st.LastPlannedRevision = s.source.revision
		if p.upToDate {
			st.LastAppliedInputsDigest = s.inputs.digest
			if st.LastAppliedRevision == "" || o.kind == runPlan {
				st.LastAppliedRevision = s.source.revision
			}
		}
	}
	if o.drift.found {
		at := metav1.NewTime(o.drift.at)
		st.LastDriftDetectedAt = &at
	}
	if o.applied != nil {
		st.Outputs = o.applied.outputs
		st.LastAppliedRevision = s.source.revision
		st.LastAppliedInputsDigest = s.inputs.digest
		if st.Plan != nil {
			st.Plan.Pending = ""
		}
	}
	if o.outputsSecret != nil {
		st.OutputsSecret = *o.outputsSecret
	}
	if o.inventory != nil {
		st.Inventory = o.inventory
	}
	if rel := o.release; rel != nil {
		st.Release = &terracev1.ReleaseStatus{Revision: int64(rel.Revision), Status: string(rel.Status), UpdatedAt: ptrTime(rel.FinishedAt), StateSerial: rel.StateSerial}
		if o.applied == nil && o.plan != nil && o.plan.upToDate && rel.Status == release.StatusDeployed {
			// The status fell behind the history (an apply whose status
			// never landed: its controller stopped, or the Stack moved to
			// another shard meanwhile): the deployed release names the outputs.
			st.Outputs = make([]string, len(rel.Outputs))
			for i, out := range rel.Outputs {
				st.Outputs[i] = out.Name
			}
		}
	}
}

// maxBackendLockMessage bounds the lock message kept in status.
const maxBackendLockMessage = 2048

// recordBackendLock shows a lock the run met in the Stack's own backend,
// and forgets it once a run got past the lock (or the Stack left its own
// backend).
func (r *Reconciler) recordBackendLock(s *scope, stepErr error) {
	st, o := &s.stack.Status, &s.observed
	var locked *stateLockedError
	switch {
	case !ownsBackend(s.stack):
		st.BackendLock = nil
	case errors.As(stepErr, &locked):
		msg := locked.message
		if len(msg) > maxBackendLockMessage {
			msg = strings.ToValidUTF8(msg[:maxBackendLockMessage], "") + "…"
		}
		st.BackendLock = &terracev1.BackendLockStatus{Message: msg, ObservedAt: metav1.NewTime(r.now())}
	case o.plan != nil || o.applied != nil:
		st.BackendLock = nil
	}
}

func (r *Reconciler) setPlanConditions(s *scope) {
	stack, o := s.stack, &s.observed
	p := stack.Status.Plan
	switch {
	case o.awaitingApproval() && p != nil:
		outcome.MarkTrue(stack, terracev1.PlannedCondition, AwaitingApprovalReason, "plan %s (+%d ~%d -%d) awaits approval", p.Pending, p.Add, p.Change, p.Destroy)
	case o.plan != nil && o.plan.hasChanges:
		outcome.MarkTrue(stack, terracev1.PlannedCondition, PlannedReason, "plan %s: +%d ~%d -%d", p.ID, p.Add, p.Change, p.Destroy)
	case o.plan != nil:
		outcome.MarkTrue(stack, terracev1.PlannedCondition, NoChangesReason, "plan %s has no changes", p.ID)
	}
	if o.applied != nil {
		outcome.MarkTrue(stack, terracev1.AppliedCondition, AppliedReason, "applied %s", stack.Status.LastAppliedRevision)
	}
	switch {
	case o.drift.found && o.applied != nil:
		outcome.MarkTrue(stack, terracev1.DriftedCondition, DriftRepairedReason, "resources changed outside Terrace were put back (%s) at %s", planCounts(stack), r.now().UTC().Format(time.RFC3339))
	case o.drift.found:
		outcome.MarkTrue(stack, terracev1.DriftedCondition, DriftDetectedReason, "resources changed outside Terrace: %s", planCounts(stack))
	case o.drift.checked || o.applied != nil:
		outcome.MarkFalse(stack, terracev1.DriftedCondition, NoDriftReason, "no drift at %s", r.now().UTC().Format(time.RFC3339))
	}
}

func (r *Reconciler) setDependenciesCondition(s *scope) {
	if len(s.stack.Spec.DependsOn) == 0 {
		outcome.Delete(s.stack, terracev1.DependenciesReadyCondition)
		return
	}
	if s.observed.dependencyWait != "" {
		outcome.MarkFalse(s.stack, terracev1.DependenciesReadyCondition, DependencyNotReadyReason, "waiting for %s", s.observed.dependencyWait)
		return
	}
	outcome.MarkTrue(s.stack, terracev1.DependenciesReadyCondition, "DependenciesReady", "all dependencies are Ready")
}

func planCounts(stack *terracev1.Stack) string {
	p := stack.Status.Plan
	if p == nil {
		return ""
	}
	return fmt.Sprintf("+%d ~%d -%d", p.Add, p.Change, p.Destroy)
}

func readyReason(s *scope) string {
	o := &s.observed
	switch {
	case o.awaitingApproval():
		return AwaitingApprovalReason
	case o.plan != nil && o.plan.planOnly:
		return PlanOnlyReason
	case o.drift.found && o.applied == nil:
		return DriftDetectedReason
	}
	return AppliedReason
}

func readyMessage(s *scope) string {
	st, o := s.stack.Status, &s.observed
	switch {
	case o.awaitingApproval() && st.Plan != nil:
		return fmt.Sprintf("plan %s (+%d ~%d -%d) awaits approval: set spec.approvePlan to it", st.Plan.Pending, st.Plan.Add, st.Plan.Change, st.Plan.Destroy)
	case o.plan != nil && o.plan.planOnly:
		return fmt.Sprintf("planned %s (planOnly): %s", st.Plan.ID, planCounts(s.stack))
	case o.drift.found && o.applied == nil:
		return fmt.Sprintf("drift detected (%s), not repaired: approvePlan is not auto or driftDetection is warn", planCounts(s.stack))
	}
	// The message is the Status column of `kubectl get stacks`: short digest.
	rev := stackview.ShortRevision(st.LastAppliedRevision)
	if st.Release != nil && st.Release.Revision > 0 {
		return fmt.Sprintf("applied %s (release %d)", rev, st.Release.Revision)
	}
	return fmt.Sprintf("up to date at %s", rev)
}

// nextLook is when a settled Stack looks again: at the next drift check or
// interval. A terminal failure looks again at the interval too: the world
// may change under an unchanged plan (a cloud API back up).
func nextLook(s *scope) time.Duration {
	if s.observed.requeueAfter > 0 {
		return s.observed.requeueAfter
	}
	if s.config.Interval > 0 {
		return jitter(s.stack, s.config.Interval)
	}
	return jitter(s.stack, defaultInterval)
}

func ptrTime(t time.Time) *metav1.Time {
	mt := metav1.NewTime(t)
	return &mt
}

// normalEvent records a Normal event on the Stack; messages never carry
// secret values.
func (r *Reconciler) normalEvent(stack *terracev1.Stack, reason, format string, args ...any) {
	r.record(stack, "Normal", reason, fmt.Sprintf(format, args...))
}

// warningEvent records a Warning event on the Stack.
func (r *Reconciler) warningEvent(stack *terracev1.Stack, reason, format string, args ...any) {
	r.record(stack, "Warning", reason, fmt.Sprintf(format, args...))
}

func (r *Reconciler) record(stack *terracev1.Stack, eventType, reason, note string) {
	if r.Recorder == nil {
		return
	}
	r.Recorder.Eventf(stack, nil, eventType, reason, reason, "%s", note)
}
