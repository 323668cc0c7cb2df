package stack

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"github.com/terrace-dev/terrace/internal/controller/outcome"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/runphase"
	"github.com/terrace-dev/terrace/internal/stackview"
	"github.com/terrace-dev/terrace/internal/state"
	runnerv1 "github.com/terrace-dev/terrace/proto/terrace/runner/v1"
)

// plan is the first command of plan and drift-check runs: plan (and
// apply in the same runner operation, inOnePass), have the policies
// decide the plan, and record what it found for the next decision.
func (r *Reconciler) plan(_ context.Context, s *scope) error {
	ctx, run := runContext(s), s.run
	planID := newPlanID(s)
	vars, err := s.variables()
	if err != nil {
		return err
	}
	req := &runnerv1.PlanRequest{Variables: vars, PlanId: planID, MaxStateBytes: r.Options.MaxStateBytes}
	applyPlanOptions(s, req)
	if r.inOnePass(s) {
		return r.planAndApply(ctx, s, req)
	}
	started := r.now()
	planDone := run.timings.Start(runphase.Plan)
	p, err := run.client.Plan(ctx, req, run.logf)
	planDone()
	if err != nil {
		return classify(run.session, err, PlanFailedReason, "plan failed")
	}
	made := r.observePlan(s, planID, p.GetSummary(), p.GetHasChanges())
	run.record = planRecord{id: planID, summary: p.GetSummary(), started: started}
	if err := r.checkPolicies(ctx, s, made, p); err != nil {
		var terminal *outcome.TerminalError
		if !errors.As(err, &terminal) {
			return err
		}
		run.facts.policyDenied, run.policyErr = true, err
		return nil
	}
	_, requested := requestedReconcile(s.stack)
	run.facts.driftWarnOnly = s.observed.drift.found && s.config.DriftMode == terracev1.DriftDetectionWarn && !requested
	run.stateTooLarge = r.checkStateSize(p.PlanResult)
	run.facts.stateTooLarge = run.stateTooLarge != nil
	return nil
}

// observePlan records a plan just made: every plan refreshes the state
// against the world, so it counts as a drift check (the next one is due
// an interval from now), and its changes may be drift.
func (r *Reconciler) observePlan(s *scope, id string, summary *runnerv1.PlanSummary, hasChanges bool) *planObservation {
	made := &planObservation{id: id, summary: summary, hasChanges: hasChanges, at: r.now()}
	s.observed.plan = made
	r.checkDrift(s, made)
	s.run.facts.planned, s.run.facts.hasChanges = true, hasChanges
	return made
}

// refuseDeniedPlan ends a run whose plan the policies denied: nothing is applied.
func (r *Reconciler) refuseDeniedPlan(_ context.Context, s *scope) error {
	return s.run.policyErr
}

// refusePlanTooLarge ends a run whose plan would leave a state over the
// state server's limit: applied, it could not be saved.
func (r *Reconciler) refusePlanTooLarge(_ context.Context, s *scope) error {
	return s.run.stateTooLarge
}

// storePlanOnly reports the plan of a planOnly Stack, stored in the
// readable form the Stack asks for; it is never applied.
func (r *Reconciler) storePlanOnly(_ context.Context, s *scope) error {
	made := s.observed.plan
	made.planOnly = true
	if err := r.storeReadablePlan(runContext(s), s, made, nil); err != nil {
		return err
	}
	s.run.facts.reported = true
	return nil
}

// reportDrift ends a drift check under driftDetection warn: the drift is
// reported (checkDrift's event, the Drifted condition), never repaired
// unless a person asks (terrace.dev/requestedAt).
func (r *Reconciler) reportDrift(_ context.Context, s *scope) error {
	s.run.facts.reported = true
	return nil
}

// inOnePass says whether the plan is applied in the same runner operation:
// approvePlan auto, new inputs (so the plan cannot be drift that warn mode
// must only report), not planOnly, and no plan policies (the controller
// decides the plan between plan and apply). The plan record and summary are kept
// just the same.
func (r *Reconciler) inOnePass(s *scope) bool {
	return s.run.kind == runPlan && s.stack.Spec.ApprovePlan == terracev1.ApprovePlanAuto && !s.stack.Spec.PlanOnly &&
		s.recorded().LastAppliedInputsDigest != s.inputs.digest && !s.hasPolicies()
}

// planAndApply plans and, when there are changes, applies in one runner
// operation (one tofu plan -json, no second call to apply).
func (r *Reconciler) planAndApply(ctx context.Context, s *scope, req *runnerv1.PlanRequest) error {
	run := s.run
	started := r.now()
	req.OneProcess = r.oneProcessFits(s, req.GetVariables())
	// The client times the plan and the apply within the one operation.
	p, applied, err := run.client.PlanAndApply(ctx, req, run.logf, &run.timings)
	if p == nil {
		return classify(run.session, err, PlanFailedReason, "plan failed")
	}
	made := r.observePlan(s, req.GetPlanId(), p.GetSummary(), p.GetHasChanges())
	if err != nil && !made.hasChanges {
		return classify(run.session, err, PlanFailedReason, "plan failed")
	}
	if err == nil && !applied {
		return nil // no changes: settle
	}
	run.record = planRecord{id: made.id, summary: made.summary, started: started}
	observeApply(s, err)
	return nil
}

// oneProcessHeadroom is how far under the state server's limit a state
// must stay, after its inputs, for its plan to be applied in one process:
// room for what one apply computes (values the inputs do not show, such
// as a generated document) without reaching the limit.
const oneProcessHeadroom = 32 << 20

// oneProcessFits says the plan may be applied in one tofu process, as
// direct tofu does. That process shows no planned values before it
// applies (PlanRequest.one_process), so a state over the state server's
// limit would be refused only after the resources changed (and kept in the
// plan store, see keepErroredState), where a saved plan refuses it before
// anything changes. So one process is for states far from the limit: the
// last known size (this replica's copy, from the init's read) plus the
// inputs, which a state may hold more than once (as an input and again as
// an output), leave oneProcessHeadroom. Var files inside the source are
// of unknown size here: those Stacks, states of unknown size and small
// limits plan first and check the planned values.
func (r *Reconciler) oneProcessFits(s *scope, vars *runnerv1.Variables) bool {
	limit := r.Options.MaxStateBytes
	if limit <= 0 || ownsBackend(s.stack) {
		return true
	}
	if len(vars.GetFiles()) > 0 {
		return false
	}
	prior, known := state.LastKnownSize(s.run.stores.States, stateKey(s.stack))
	return known && prior+4*int64(len(vars.GetJson()))+oneProcessHeadroom <= limit
}

// checkDrift records whether a plan's changes were made outside Terrace.
func (r *Reconciler) checkDrift(s *scope, p *planObservation) {
	drift := r.isDrift(s, s.run.kind, p.hasChanges)
	s.observed.drift = driftObservation{checked: s.run.kind == runDrift || drift, found: drift, at: p.at}
	if drift {
		r.warningEventFor(s, p.ref(), DriftDetectedReason, "drift detected: %s", summaryText(p.summary))
		driftDetectedTotal.WithLabelValues(s.stack.Namespace).Inc()
	}
}

// isDrift says whether a plan's changes were made outside Terrace: the
// inputs are the ones last applied (or planned with no changes), so only
// the world can have moved. What started the run does not matter: the
// retry of a failed drift check, or a plan for a new generation that
// changed only, say, the interval, finds drift just as a drift check does.
func (r *Reconciler) isDrift(s *scope, kind runKind, hasChanges bool) bool {
	if !hasChanges || s.config.DriftMode == terracev1.DriftDetectionDisabled {
		return false
	}
	if kind == runDrift {
		return true
	}
	applied := s.recorded().LastAppliedInputsDigest
	return kind == runPlan && applied != "" && applied == s.inputs.digest
}

// keepForApproval stores the plan file so that a later run, in a new
// runner, applies exactly it once spec.approvePlan names it.
func (r *Reconciler) keepForApproval(_ context.Context, s *scope) error {
	ctx, p := runContext(s), s.observed.plan
	defer s.run.timings.Start(runphase.Records)()
	var buf bytes.Buffer
	if _, err := s.run.client.DownloadPlan(ctx, p.id, &buf); err != nil {
		return classify(s.run.session, err, PlanFailedReason, "failed to download the plan file")
	}
	if err := r.storeReadablePlan(ctx, s, p, buf.Bytes()); err != nil {
		return err
	}
	p.keptForApproval = true
	s.run.facts.reported = true
	r.normalEventFor(s, p.ref(), "PlanCreated", "plan %s awaits approval: %s; set spec.approvePlan to %q to apply it (run: %s)", p.id, summaryText(p.summary), p.id, s.run.timings.String())
	return nil
}

// storeReadablePlan saves the plan file (when given) with the readable
// rendering the Stack asks for and the policies' decision on it.
func (r *Reconciler) storeReadablePlan(ctx context.Context, s *scope, made *planObservation, binary []byte) error {
	format := s.stack.Spec.StoreReadablePlan
	if binary == nil && (format == "" || format == terracev1.ReadablePlanNone) {
		return nil
	}
	planID := made.id
	plan := state.Plan{PlanMeta: state.PlanMeta{Key: planKey(s.stack, planID), Policy: stackview.StatusPolicy(made.policy)}, Binary: binary}
	if format == terracev1.ReadablePlanJSON || format == terracev1.ReadablePlanHuman {
		f := runnerv1.PlanFormat_PLAN_FORMAT_JSON
		if format == terracev1.ReadablePlanHuman {
			f = runnerv1.PlanFormat_PLAN_FORMAT_HUMAN
		}
		readable, err := s.run.client.ShowPlan(ctx, planID, f)
		if err != nil {
			return fmt.Errorf("failed to render the plan: %w", err)
		}
		plan.Readable = readable
		plan.ReadableFormat = state.ReadableFormat(format)
	}
	if _, err := s.run.stores.Plans.PutPlan(ctx, plan); err != nil {
		return fmt.Errorf("failed to store plan %s: %w", planID, err)
	}
	return nil
}

func planKey(stack *terracev1.Stack, planID string) state.PlanKey {
	return state.PlanKey{Namespace: stack.Namespace, Stack: stack.Name, ID: planID}
}

func summaryText(sum *runnerv1.PlanSummary) string {
	return fmt.Sprintf("+%d ~%d -%d", sum.GetAdd(), sum.GetChange(), sum.GetDestroy())
}
