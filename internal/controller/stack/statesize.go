package stack

import (
	"context"
	"fmt"
	"strings"

	"github.com/terrace-dev/terrace/internal/controller/outcome"
	"github.com/terrace-dev/terrace/internal/runner"
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
	return outcome.Terminalf(StateTooLargeReason, "%s", tf.StateTooLargeMessage(p.GetPlanId(), p.GetPlannedStateBytes(), limit))
}

// keepErroredState handles a plan whose state the state server refused
// after the apply, or that the runner refused to apply: terminal
// StateTooLarge. When the apply ran, tofu left the state it could not save
// in the runner, which goes with the pod: it is kept in the Stack's plan
// store (no size limit there) under tf.ErroredStateID, for `tofu state
// push` once the limit allows, the failed release says so, and so does the
// message. A plan refused before applying changed nothing: no release.
func (r *Reconciler) keepErroredState(ctx context.Context, s *scope) error {
	ctx, p, applyErr := context.WithoutCancel(ctx), s.run.record, s.run.applyErr
	// The runner's message names the plan and the limit.
	refused := classify(s.run.session, applyErr, ApplyFailedReason, "state too large")
	id := tf.ErroredStateID(p.id)
	// That state is over the state server's limit by definition, and may
	// be over the runner client's plan-file limit too: it is passed on in
	// parts as it comes, never held whole.
	parts := &planParts{ctx: ctx, store: s.run.stores.Plans, key: planKey(s.stack, id), size: erroredStatePartBytes}
	_, err := s.run.client.DownloadPlanUpTo(ctx, id, maxErroredStateBytes, parts)
	if err == nil {
		err = parts.Close()
	}
	if err != nil && len(parts.ids) == 0 && !parts.failed {
		return refused // refused before applying: there is nothing to keep
	}
	if err != nil {
		s.log.Error(err, "failed to keep the state the state server refused", "id", id, "parts kept", parts.ids)
		r.recordFailedRelease(ctx, s, p, "applied, but the state server refused the state as too large, and it could not be kept")
		return outcome.Terminalf(StateTooLargeReason, "%s; the state tofu could not save could not be kept either (%s): see the controller's log", runnerMessage(applyErr), err.Error())
	}
	where := partsWhere(parts.ids)
	r.recordFailedRelease(ctx, s, p, "applied, but the state server refused the state as too large; it is kept as plan "+where)
	r.warningEvent(s.stack, StateTooLargeReason, "the state the state server refused after applying %s is kept as plan %s", p.id, where)
	return outcome.Terminalf(StateTooLargeReason, "%s; the state tofu could not save is kept in the Stack's plan store as %s; once the limit allows, `terrace push-state %s %s -n %s` makes it the current state", runnerMessage(applyErr), where, s.stack.Name, id, s.stack.Namespace)
}

const (
	// erroredStatePartBytes is the size of the plan records a refused
	// state is kept in: the controller holds one part at a time, well
	// under the runner client's plan-file limit.
	erroredStatePartBytes = 16 << 20
	// maxErroredStateBytes bounds the refused state kept: the runner's own
	// bound on a plan file.
	maxErroredStateBytes = runner.DefaultMaxPlanFileBytes
)

// partsWhere names the plan records a state was kept in (planParts.ids).
func partsWhere(ids []string) string {
	if len(ids) == 1 {
		return ids[0]
	}
	return fmt.Sprintf("%d plans to be joined in this order: %s", len(ids), strings.Join(ids, ", "))
}

// planParts is a writer that keeps what it is given in plan records of
// size bytes: the first under key, the next under key's ID with
// "-part-2", "-part-3"... Close keeps the last.
type planParts struct {
	ctx   context.Context
	store state.PlanStore
	key   state.PlanKey
	size  int
	buf   []byte
	// ids are the plan IDs kept so far, in order.
	ids []string
	// failed is set once a part could not be kept.
	failed bool
}

func (p *planParts) Write(b []byte) (int, error) {
	n := len(b)
	for len(b) > 0 {
		take := min(p.size-len(p.buf), len(b))
		p.buf = append(p.buf, b[:take]...)
		b = b[take:]
		if len(p.buf) == p.size {
			if err := p.keep(); err != nil {
				return 0, err
			}
		}
	}
	return n, nil
}

// Close keeps the last part: the only one of a state under size.
func (p *planParts) Close() error {
	if len(p.buf) > 0 || len(p.ids) == 0 {
		return p.keep()
	}
	return nil
}

func (p *planParts) keep() error {
	key := p.key
	key.ID = state.PartID(p.key.ID, len(p.ids)+1)
	if _, err := p.store.PutPlan(p.ctx, state.Plan{PlanMeta: state.PlanMeta{Key: key}, Binary: p.buf}); err != nil {
		p.failed = true
		return fmt.Errorf("failed to keep part %d of %s: %w", len(p.ids)+1, p.key, err)
	}
	p.ids = append(p.ids, key.ID)
	p.buf = nil
	return nil
}
