package stack

import (
	"github.com/terrace-dev/terrace/internal/controller/reconcile"
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
