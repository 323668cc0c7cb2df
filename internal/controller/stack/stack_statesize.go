package stack

import (
	"bytes"
	"context"

	"github.com/terrace-dev/terrace/internal/controller/reconcile"
	"github.com/terrace-dev/terrace/internal/state"
	"github.com/terrace-dev/terrace/internal/tf"
	runnerv1 "github.com/terrace-dev/terrace/proto/terrace/runner/v1"
)

// StateTooLargeReason: the state a plan would leave is over the state
// server's limit (--state-server-max-state-bytes). The plan is not
// applied: the resources would change and the state recording them could
// not be saved. The Stack must change (a smaller state), or the limit.
const StateTooLargeReason = "StateTooLarge"

// checkStateSize refuses, before it is applied or kept for approval, a
// plan whose planned values alone are over the state server's limit. Plans
// applied in one pass with their plan are refused by the runner itself
// (PlanRequest.max_state_bytes), with the same reason.
func (r *Reconciler) checkStateSize(p *runnerv1.PlanResult) error {
	limit := r.Options.MaxStateBytes
	if limit <= 0 || p.GetPlannedStateBytes() <= limit {
		return nil
	}
	return reconcile.Terminalf(StateTooLargeReason, "%s", tf.StateTooLargeMessage(p.GetPlanId(), p.GetPlannedStateBytes(), limit))
}

// keepErroredState handles a plan whose state the state server refused
// after the apply, or that the runner refused to apply: terminal
// StateTooLarge. When the apply ran, tofu left the state it could not save
// in the runner, which goes with the pod: it is kept in the Stack's plan
// store (no size limit there) under tf.ErroredStateID, for `tofu state
// push` once the limit allows, the failed release says so, and so does the
// message. A plan refused before applying changed nothing: no release.
func (r *Reconciler) keepErroredState(ctx context.Context, s *scope, p planRecord, applyErr error) error {
	// The runner's message names the plan and the limit.
	refused := classify(s.run.session, applyErr, ApplyFailedReason, "state too large")
	id := tf.ErroredStateID(p.id)
	var buf bytes.Buffer
	if _, err := s.run.client.DownloadPlan(ctx, id, &buf); err != nil {
		return refused // refused before applying: there is nothing to keep
	}
	kept := state.Plan{PlanMeta: state.PlanMeta{Key: planKey(s.stack, id)}, Binary: buf.Bytes()}
	if _, err := s.run.stores.Plans.PutPlan(ctx, kept); err != nil {
		s.log.Error(err, "failed to keep the state the state server refused", "id", id, "bytes", buf.Len())
		r.recordFailedRelease(ctx, s, p, "applied, but the state server refused the state as too large, and it could not be kept")
		return reconcile.Terminalf(StateTooLargeReason, "%s; the state tofu could not save could not be kept either (%s): see the controller's log", runnerMessage(applyErr), err.Error())
	}
	r.recordFailedRelease(ctx, s, p, "applied, but the state server refused the state as too large; it is kept as plan "+id)
	r.warningEvent(s.stack, StateTooLargeReason, "the state the state server refused after applying %s is kept as plan %s", p.id, id)
	return reconcile.Terminalf(StateTooLargeReason, "%s; the state tofu could not save is kept in the Stack's plan store as %s", runnerMessage(applyErr), id)
}
