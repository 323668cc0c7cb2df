package stack

import (
	"context"
	"fmt"

	"github.com/terrace-dev/terrace/internal/runphase"
	"github.com/terrace-dev/terrace/internal/state/release"
)

// settle is the one step after every run that leaves the inputs applied
// (an apply, or a plan without changes), in a fixed order: outputs, then
// health checks, then the release, then the inventory. The release record
// carries the checks' results and the outputs, so both come before it;
// the inventory reads the state the run left. Failed checks are the run's
// transient error, so the retry checks again.
func (r *Reconciler) settle(_ context.Context, s *scope) error {
	ctx, run := runContext(s), s.run
	var err error
	if run.facts.applyAttempted {
		err = r.settleApply(ctx, s)
	} else {
		err = r.settleUpToDate(ctx, s)
	}
	if err != nil {
		return err
	}
	if err := r.recordInventory(ctx, s); err != nil {
		return err
	}
	run.facts.settled = true
	return healthError(s)
}

// settleApply writes the outputs of a successful apply, checks health and
// records a deployed release; an approved plan's stored copy goes then.
func (r *Reconciler) settleApply(ctx context.Context, s *scope) error {
	run, p := s.run, s.run.record
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
	r.normalEventFor(s, p.ref(), AppliedReason, "applied %s (%s): release %d (run: %s)", p.id, summaryText(p.summary), recorded.Revision, run.timings.String())
	if run.kind == runApplyPending {
		return run.stores.Plans.DeletePlan(ctx, planKey(s.stack, p.id))
	}
	return nil
}

// settleUpToDate settles a plan without changes: the outputs Secret in
// line with the spec, the release history naming the state the Stack is
// at, and the health checks when they have not passed at this generation.
func (r *Reconciler) settleUpToDate(ctx context.Context, s *scope) error {
	outputsDone := s.run.timings.Start(runphase.Outputs)
	err := r.syncOutputs(ctx, s)
	outputsDone()
	if err != nil {
		return err
	}
	s.observed.plan.upToDate = true
	if !s.stack.Spec.PlanOnly {
		if err := r.reconcileRelease(ctx, s); err != nil {
			return err
		}
	}
	if healthDue(s) {
		r.runHealthChecks(ctx, s)
	}
	return nil
}
