package stack

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/terrace-dev/terrace/internal/controller/reconcile"
	"github.com/terrace-dev/terrace/internal/release"
	"github.com/terrace-dev/terrace/internal/runner"
	"github.com/terrace-dev/terrace/internal/runphase"
	"github.com/terrace-dev/terrace/internal/state"
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

// applyApproved is the step of apply runs: the stored, approved plan is
// restored in this (new) runner and applied exactly.
func (r *Reconciler) applyApproved(ctx context.Context, s *scope) error {
	planID := pendingPlan(s)
	stores := s.run.stores
	stored, err := stores.Plans.GetPlan(ctx, planKey(s.stack, planID))
	if errors.Is(err, state.ErrNotFound) {
		s.observed.lostPlan = planID
		return reconcile.Terminalf(PlanNoLongerValidReason, "plan %s is no longer stored; a new plan will be made on the next change or terrace.dev/requestedAt", planID)
	}
	if err != nil {
		return fmt.Errorf("failed to read plan %s: %w", planID, err)
	}
	if d := stored.Policy; d != nil && d.Decision == policyDenied {
		// Never kept for approval today; a record that says so is refused all the same.
		return reconcile.Terminalf(PolicyDeniedReason, "plan %s is denied by the plan policies and not applied: %s", planID, strings.Join(d.Violations, "; "))
	}
	if err := s.run.client.UploadPlan(ctx, planID, stored.Digest, bytes.NewReader(stored.Binary)); err != nil {
		return classify(s.run.session, err, ApplyFailedReason, "failed to restore the plan in the runner")
	}
	summary := &runnerv1.PlanSummary{}
	if p := s.recorded().Plan; p != nil {
		summary = &runnerv1.PlanSummary{Add: p.Add, Change: p.Change, Destroy: p.Destroy}
	}
	if err := r.apply(ctx, s, planRecord{id: planID, summary: summary, started: r.now(), policy: stored.Policy}); err != nil {
		if s.observed.lostPlan != "" {
			_ = stores.Plans.DeletePlan(context.WithoutCancel(ctx), planKey(s.stack, planID))
		}
		return err
	}
	return stores.Plans.DeletePlan(ctx, planKey(s.stack, planID))
}

// apply applies a saved plan, then writes the outputs and records the
// release. A failed apply is recorded as a failed release and retried.
func (r *Reconciler) apply(ctx context.Context, s *scope, p planRecord) error {
	run := s.run
	if err := run.client.SetSensitiveVariables(ctx, s.inputs.sensitiveNames()); err != nil {
		return fmt.Errorf("failed to tell the runner which variables came from Secrets: %w", err)
	}
	applyDone := run.timings.Start(runphase.Apply)
	err := run.client.ApplyWith(ctx, applyRequest(s, p.id), run.logf)
	applyDone()
	return r.afterApply(ctx, s, p, err)
}

// afterApply records what an apply (alone, or in one pass with its plan)
// left: on failure a failed release, retried with backoff whatever tofu
// said (an apply fails half-way for reasons that pass, a cloud API's
// limits, and the next plan starts from the state it left); on success
// the outputs and a deployed release.
func (r *Reconciler) afterApply(ctx context.Context, s *scope, p planRecord, applyErr error) error {
	run := s.run
	run.after = nil // the apply wrote the state: read it afresh
	switch runner.Reason(applyErr) {
	case runner.ReasonStateTooLarge:
		return r.keepErroredState(context.WithoutCancel(ctx), s, p, applyErr)
	case runner.ReasonStateUnavailable:
		return r.saveUnsavedState(context.WithoutCancel(ctx), s, p, applyErr)
	}
	if applyErr != nil {
		r.recordFailedRelease(context.WithoutCancel(ctx), s, p, "apply failed; see the Stack's Ready condition")
		if runner.Reason(applyErr) == runner.ReasonPlanStale {
			// Another write to the state came between plan and apply (a
			// run whose controller died, finishing): this plan can never
			// apply; the retry makes a new one, to be approved again.
			s.observed.lostPlan = p.id
			r.warningEvent(s.stack, PlanNoLongerValidReason, "plan %s can no longer be applied: the state changed after it was made; planning again", p.id)
			return fmt.Errorf("plan %s can no longer be applied, the state changed after it was made (a new plan is made): %w", p.id, applyErr)
		}
		return fmt.Errorf("apply of %s failed: %w", p.id, applyErr)
	}
	outputsDone := run.timings.Start(runphase.Outputs)
	outputs, err := runOutputs(ctx, s)
	if err != nil {
		return fmt.Errorf("failed to read outputs after applying %s: %w", p.id, err)
	}
	if err := r.writeOutputs(ctx, s, outputs); err != nil {
		return err
	}
	outputsDone()
	defer run.timings.Start(runphase.Records)()
	rel := r.newRelease(s, p)
	rel.Outputs = releaseOutputs(outputs)
	names := make([]string, len(rel.Outputs))
	for i, o := range rel.Outputs {
		names[i] = o.Name
	}
	rel.HealthChecks = r.runHealthChecks(ctx, s)
	rel.Status, rel.FinishedAt = release.StatusDeployed, r.now()
	recorded, err := r.recordRelease(ctx, s, rel)
	if err != nil {
		return fmt.Errorf("failed to record the release: %w", err)
	}
	s.observed.applied = &applyObservation{outputs: names}
	s.observed.release = recorded
	r.normalEvent(s.stack, AppliedReason, "applied %s (%s): release %d (run: %s)", p.id, summaryText(p.summary), recorded.Revision, run.timings.String())
	return nil
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
