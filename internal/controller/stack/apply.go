package stack

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/terrace-dev/terrace/internal/controller/outcome"
	"github.com/terrace-dev/terrace/internal/runner"
	"github.com/terrace-dev/terrace/internal/runphase"
	"github.com/terrace-dev/terrace/internal/state"
	"github.com/terrace-dev/terrace/internal/state/release"
	runnerv1 "github.com/terrace-dev/terrace/proto/terrace/runner/v1"
)

// planRecord is a saved plan about to be applied.
type planRecord struct {
	id      string
	summary *runnerv1.PlanSummary
	started time.Time
	// policy is the decision stored with the plan, for a stored plan.
	policy *state.PlanPolicy
}

// applyApproved is the command of apply runs: the stored, approved plan
// is restored in this (new) runner and applied exactly.
func (r *Reconciler) applyApproved(_ context.Context, s *scope) error {
	ctx := runContext(s)
	planID := pendingPlan(s)
	stored, err := s.run.stores.Plans.GetPlan(ctx, planKey(s.stack, planID))
	if errors.Is(err, state.ErrNotFound) {
		s.observed.lostPlan = planID
		return outcome.Terminalf(PlanNoLongerValidReason, "plan %s is no longer stored; a new plan will be made on the next change or terrace.dev/requestedAt", planID)
	}
	if err != nil {
		return fmt.Errorf("failed to read plan %s: %w", planID, err)
	}
	if d := stored.Policy; d != nil && d.Decision == policyDenied {
		// Never kept for approval today; a record that says so is refused all the same.
		return outcome.Terminalf(PolicyDeniedReason, "plan %s is denied by the plan policies and not applied: %s", planID, strings.Join(d.Violations, "; "))
	}
	if err := s.run.client.UploadPlan(ctx, planID, stored.Digest, bytes.NewReader(stored.Binary)); err != nil {
		return classify(s.run.session, err, ApplyFailedReason, "failed to restore the plan in the runner")
	}
	summary := &runnerv1.PlanSummary{}
	if p := s.recorded().Plan; p != nil {
		summary = &runnerv1.PlanSummary{Add: p.Add, Change: p.Change, Destroy: p.Destroy}
	}
	s.run.record = planRecord{id: planID, summary: summary, started: r.now(), policy: stored.Policy}
	return r.apply(ctx, s)
}

// apply applies the run's saved plan (s.run.record) and records how it
// went for the next decision: settle, or one of the failure actions.
func (r *Reconciler) apply(_ context.Context, s *scope) error {
	ctx, run := runContext(s), s.run
	if err := run.client.SetSensitiveVariables(ctx, s.inputs.sensitiveNames()); err != nil {
		return fmt.Errorf("failed to tell the runner which variables came from Secrets: %w", err)
	}
	applyDone := run.timings.Start(runphase.Apply)
	err := run.client.ApplyWith(ctx, applyRequest(s, run.record.id), run.logf)
	applyDone()
	observeApply(s, err)
	return nil
}

// observeApply records an apply's outcome (alone, or in one pass with its
// plan); the state it wrote is read afresh after it.
func observeApply(s *scope, applyErr error) {
	run := s.run
	run.after = nil
	run.applyErr = applyErr
	run.facts.applyAttempted = true
	switch {
	case applyErr == nil:
		run.facts.applyFailure = applyOK
	case runner.Reason(applyErr) == runner.ReasonStateTooLarge:
		run.facts.applyFailure = applyStateTooLarge
	case runner.Reason(applyErr) == runner.ReasonStateUnavailable:
		run.facts.applyFailure = applyStateUnavailable
	case runner.Reason(applyErr) == runner.ReasonPlanStale:
		run.facts.applyFailure = applyPlanStale
	default:
		run.facts.applyFailure = applyOtherFailure
	}
}

// recordFailedApply records a failed apply as a failed release; it is
// retried with backoff whatever tofu said (an apply fails half-way for
// reasons that pass, a cloud API's limits, and the next plan starts from
// the state it left).
func (r *Reconciler) recordFailedApply(ctx context.Context, s *scope) error {
	p := s.run.record
	r.recordFailedRelease(context.WithoutCancel(ctx), s, p, "apply failed; see the Stack's Ready condition")
	if died := s.run.session.Died(); died != nil {
		// The kubelet's reason (activeDeadlineSeconds, out of memory, an
		// eviction) says more than the broken connection did.
		return fmt.Errorf("apply of %s failed: the runner died: %w", p.id, died)
	}
	return fmt.Errorf("apply of %s failed: %w", p.id, s.run.applyErr)
}

// discardAppliedStalePlan handles a plan that another write to the state
// overtook between plan and apply (a run whose controller died,
// finishing): it can never apply; the retry makes a new one, to be
// approved again.
func (r *Reconciler) discardAppliedStalePlan(ctx context.Context, s *scope) error {
	p := s.run.record
	ctx = context.WithoutCancel(ctx)
	r.recordFailedRelease(ctx, s, p, "apply failed; see the Stack's Ready condition")
	s.observed.lostPlan = p.id
	if s.run.kind == runApplyPending {
		_ = s.run.stores.Plans.DeletePlan(ctx, planKey(s.stack, p.id))
	}
	r.warningEvent(s.stack, PlanNoLongerValidReason, "plan %s can no longer be applied: the state changed after it was made; planning again", p.id)
	return fmt.Errorf("plan %s can no longer be applied, the state changed after it was made (a new plan is made): %w", p.id, s.run.applyErr)
}

// newRelease is the release record of applying p, before the apply.
func (r *Reconciler) newRelease(s *scope, p planRecord) release.Release {
	return release.Release{
		Namespace: s.stack.Namespace, Stack: s.stack.Name,
		SourceRevision: s.source.revision, PlanID: p.id, StartedAt: p.started,
		ToolVersion: s.observed.tool.version, RunnerImage: s.observed.tool.image,
		Plan:         release.PlanSummary{Add: int(p.summary.GetAdd()), Change: int(p.summary.GetChange()), Destroy: int(p.summary.GetDestroy())},
		SecretInputs: s.inputs.secretValues(),
		Policy:       appliedPolicy(s, p),
	}
}

// recordFailedRelease records a failed apply of p; the failure itself is
// reported by the Ready condition, so a record that cannot be written is
// not an error of its own.
func (r *Reconciler) recordFailedRelease(ctx context.Context, s *scope, p planRecord, message string) {
	rel := r.newRelease(s, p)
	rel.Status, rel.FinishedAt, rel.Message = release.StatusFailed, r.now(), message
	if recorded, err := r.recordRelease(ctx, s, rel); err == nil {
		s.observed.release = recorded // numbered as stored
	}
}

// releaseOutputs are a run's outputs as a release keeps them, by name.
func releaseOutputs(outputs map[string]runner.Output) []release.Output {
	out := make([]release.Output, 0, len(outputs))
	for name, o := range outputs {
		out = append(out, release.Output{Name: name, Sensitive: o.Sensitive, Value: o.Value})
	}
	slices.SortFunc(out, func(a, b release.Output) int { return strings.Compare(a.Name, b.Name) })
	return out
}

func mergeMaps(base, extra, forced map[string]string) map[string]string {
	if base == nil {
		base = map[string]string{}
	}
	for k, v := range extra {
		base[k] = v
	}
	for k, v := range forced {
		base[k] = v
	}
	return base
}
