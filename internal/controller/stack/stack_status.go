package stack

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/controller/reconcile"
	"github.com/terrace-dev/terrace/internal/release"
	"github.com/terrace-dev/terrace/internal/stackview"
)

// ownedConditions are the conditions the Stack controller writes.
var ownedConditions = []string{
	terracev1.ReadyCondition, terracev1.ReconcilingCondition, terracev1.StalledCondition,
	terracev1.PlannedCondition, terracev1.AppliedCondition, terracev1.DriftedCondition,
	terracev1.DependenciesReadyCondition,
}

// observations are what the steps saw; conditions are derived from them in
// one place, summarize.
type observations struct {
	kind             runKind
	suspended        bool
	dependencyWait   string
	planned          bool
	hasChanges       bool
	noChanges        bool
	planOnly         bool
	awaitingApproval bool
	applied          bool
	driftChecked     bool
	drifted          bool
	release          *release.Release
	// tool is the tofu version and runner image of the run, for its release.
	tool runTool
	// staleCache: a run was due but the cached Stack was older than the
	// API server's; nothing was done and the reconcile is retried.
	staleCache   bool
	requeueAfter time.Duration
}

// summarize derives every condition from the observations and the step
// error, and decides what Reconcile returns.
func (r *Reconciler) summarize(ctx context.Context, s *scope, stepErr error) reconcile.Outcome {
	stack := s.stack
	st := &stack.Status
	wasReady := conditionTrue(stack, terracev1.ReadyCondition)
	// A request is handled by the reconcile that saw it, whatever came of
	// it (as Flux does): whoever asked reads the outcome in the conditions,
	// and a failed run is retried on its own.
	if v, ok := requestedReconcile(stack); ok {
		st.LastHandledReconcileAt = v
	}
	if stack.DeletionTimestamp != nil {
		return r.summarizeDelete(stack, stepErr)
	}
	if s.observed.suspended {
		reconcile.Delete(stack, terracev1.ReconcilingCondition)
		return reconcile.Outcome{Final: true}
	}
	r.setDependenciesCondition(s)
	r.setPlanConditions(s)
	if s.observed.release != nil {
		st.Release = &terracev1.ReleaseStatus{Revision: int64(s.observed.release.Revision), Status: string(s.observed.release.Status), UpdatedAt: ptrTime(s.observed.release.FinishedAt)}
	}

	interval := s.config.Interval
	if interval <= 0 {
		interval = 10 * time.Minute
	}
	var outcome reconcile.Outcome
	var terminal *reconcile.TerminalError
	var waiting *reconcile.WaitingError
	switch {
	case stepErr == nil && s.observed.awaitingApproval:
		// Waiting on a person, not on the controller: not Ready (so
		// `kubectl wait` does not pass), not Reconciling, not Stalled.
		st.Failures = 0
		reconcile.MarkFalse(stack, terracev1.ReadyCondition, AwaitingApprovalReason, "%s", readyMessage(s))
		reconcile.Delete(stack, terracev1.ReconcilingCondition)
		reconcile.Delete(stack, terracev1.StalledCondition)
		outcome = reconcile.Outcome{Final: true}
	case stepErr == nil:
		st.Failures = 0
		outcome = reconcile.Summarize(stack, nil, readyReason(s), readyMessage(s), 0)
		outcome.Result.RequeueAfter = nextLook(s, interval)
	case errors.As(stepErr, &terminal):
		st.Failures = 0
		outcome = reconcile.Summarize(stack, stepErr, "", "", 0)
		// Terminal for this input, but the world may change under a plan
		// (a cloud API back up): look again at the normal interval.
		outcome.Result.RequeueAfter = interval
	case errors.As(stepErr, &waiting):
		outcome = reconcile.Summarize(stack, stepErr, "", "", 0)
	default:
		// Transient: back off from retryInterval up to maxRetryInterval, as
		// the API promises, instead of the controller's generic rate limiter.
		st.Failures++
		outcome = reconcile.Summarize(stack, stepErr, "", "", 0)
		backoff := retryBackoff(stack, st.Failures)
		ctrl.LoggerFrom(ctx).Error(stepErr, "run failed; retrying", "failures", st.Failures, "retryIn", backoff)
		r.event(stack, "Warning", reconcile.ReconciliationFailedReason, "%s (retry in %s)", stepErr.Error(), backoff.Round(time.Second))
		outcome = reconcile.Outcome{Result: ctrl.Result{RequeueAfter: backoff}}
	}
	if outcome.Final {
		st.ObservedGeneration = stack.Generation
	}
	if !wasReady && conditionTrue(stack, terracev1.ReadyCondition) && st.ObservedGeneration > 0 && s.observed.kind != "" {
		r.event(stack, "Normal", "Ready", "%s", readyMessage(s))
	}
	return outcome
}

func (r *Reconciler) setPlanConditions(s *scope) {
	stack, o := s.stack, s.observed
	switch {
	case o.awaitingApproval && stack.Status.Plan != nil:
		p := stack.Status.Plan
		reconcile.MarkTrue(stack, terracev1.PlannedCondition, AwaitingApprovalReason, "plan %s (+%d ~%d -%d) awaits approval", p.Pending, p.Add, p.Change, p.Destroy)
	case o.planned && o.hasChanges:
		reconcile.MarkTrue(stack, terracev1.PlannedCondition, PlannedReason, "plan %s: +%d ~%d -%d", stack.Status.Plan.ID, stack.Status.Plan.Add, stack.Status.Plan.Change, stack.Status.Plan.Destroy)
	case o.planned:
		reconcile.MarkTrue(stack, terracev1.PlannedCondition, NoChangesReason, "plan %s has no changes", stack.Status.Plan.ID)
	}
	if o.applied {
		reconcile.MarkTrue(stack, terracev1.AppliedCondition, AppliedReason, "applied %s", stack.Status.LastAppliedRevision)
	}
	switch {
	case o.drifted && o.applied:
		reconcile.MarkTrue(stack, terracev1.DriftedCondition, DriftRepairedReason, "resources changed outside Terrace were put back (%s) at %s", planCounts(stack), r.now().UTC().Format(time.RFC3339))
	case o.drifted:
		reconcile.MarkTrue(stack, terracev1.DriftedCondition, DriftDetectedReason, "resources changed outside Terrace: %s", planCounts(stack))
	case o.driftChecked || o.applied:
		reconcile.MarkFalse(stack, terracev1.DriftedCondition, NoDriftReason, "no drift at %s", r.now().UTC().Format(time.RFC3339))
	}
}

func planCounts(stack *terracev1.Stack) string {
	p := stack.Status.Plan
	if p == nil {
		return ""
	}
	return fmt.Sprintf("+%d ~%d -%d", p.Add, p.Change, p.Destroy)
}

func readyReason(s *scope) string {
	switch {
	case s.observed.awaitingApproval:
		return AwaitingApprovalReason
	case s.observed.planOnly:
		return PlanOnlyReason
	case s.observed.drifted && !s.observed.applied:
		return DriftDetectedReason
	}
	return AppliedReason
}

func readyMessage(s *scope) string {
	st := s.stack.Status
	switch {
	case s.observed.awaitingApproval && st.Plan != nil:
		return fmt.Sprintf("plan %s (+%d ~%d -%d) awaits approval: set spec.approvePlan to it", st.Plan.Pending, st.Plan.Add, st.Plan.Change, st.Plan.Destroy)
	case s.observed.planOnly:
		return fmt.Sprintf("planned %s (planOnly): %s", st.Plan.ID, planCounts(s.stack))
	case s.observed.drifted && !s.observed.applied:
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
// interval.
func nextLook(s *scope, interval time.Duration) time.Duration {
	if s.observed.requeueAfter > 0 {
		return s.observed.requeueAfter
	}
	return interval
}

// retryBackoff is retryInterval doubled per consecutive failure, capped.
func retryBackoff(stack *terracev1.Stack, failures int64) time.Duration {
	base, limit := 30*time.Second, time.Hour
	if d := stack.Spec.RetryInterval; d != nil && d.Duration > 0 {
		base = d.Duration
	}
	if d := stack.Spec.MaxRetryInterval; d != nil && d.Duration > 0 {
		limit = d.Duration
	}
	exp := math.Min(float64(failures-1), 30)
	backoff := time.Duration(float64(base) * math.Pow(2, exp))
	if backoff > limit || backoff <= 0 {
		return limit
	}
	return backoff
}

func ptrTime(t time.Time) *metav1.Time {
	mt := metav1.NewTime(t)
	return &mt
}

// event records an event on the Stack; messages never carry secret values.
func (r *Reconciler) event(stack *terracev1.Stack, eventType, reason, format string, args ...any) {
	if r.Recorder == nil {
		return
	}
	r.Recorder.Eventf(stack, nil, eventType, reason, reason, format, args...)
}
