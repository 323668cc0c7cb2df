package stack

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/release"
	"github.com/terrace-dev/terrace/internal/runner"
	runnerv1 "github.com/terrace-dev/terrace/proto/terrace/runner/v1"
)

// apply applies a saved plan, then records outputs and the release. A
// failed apply is recorded as a failed release and retried with backoff.
func (r *Reconciler) apply(ctx context.Context, s *scope, cl *runner.Client, stores *storeSet, logf runner.LogFunc, planID string, summary *runnerv1.PlanSummary, started time.Time) error {
	rel := release.Release{
		Namespace: s.stack.Namespace, Stack: s.stack.Name,
		SourceRevision: s.source.revision, PlanID: planID, StartedAt: started,
		Plan: release.PlanSummary{Add: int(summary.GetAdd()), Change: int(summary.GetChange()), Destroy: int(summary.GetDestroy())},
	}
	rel.SecretInputs = s.inputs.secretValues()
	if err := cl.SetSensitiveVariables(ctx, s.inputs.sensitiveNames()); err != nil {
		return fmt.Errorf("failed to tell the runner which variables came from Secrets: %w", err)
	}
	if err := cl.Apply(ctx, planID, logf); err != nil {
		rel.Status, rel.FinishedAt = release.StatusFailed, r.now()
		rel.Message = "apply failed; see the Stack's Ready condition"
		if _, recErr := stores.History.Record(context.WithoutCancel(ctx), rel); recErr == nil {
			s.observed.release = &rel
		}
		return fmt.Errorf("apply of %s failed: %w", planID, err)
	}
	outputs, err := cl.Outputs(ctx)
	if err != nil {
		return fmt.Errorf("failed to read outputs after applying %s: %w", planID, err)
	}
	if err := r.writeOutputs(ctx, s, outputs); err != nil {
		return err
	}
	for name, o := range outputs {
		rel.Outputs = append(rel.Outputs, release.Output{Name: name, Sensitive: o.Sensitive, Value: o.Value})
	}
	slices.SortFunc(rel.Outputs, func(a, b release.Output) int { return strings.Compare(a.Name, b.Name) })
	names := make([]string, len(rel.Outputs))
	for i, o := range rel.Outputs {
		names[i] = o.Name
	}
	rel.Status, rel.FinishedAt = release.StatusDeployed, r.now()
	recorded, err := stores.History.Record(ctx, rel)
	if err != nil {
		return fmt.Errorf("failed to record the release: %w", err)
	}
	st := &s.stack.Status
	st.Outputs = names
	st.LastAppliedRevision = s.source.revision
	st.LastAppliedInputsDigest = s.inputs.digest
	if st.Plan != nil {
		st.Plan.Pending = ""
	}
	s.observed.applied = true
	s.observed.release = recorded
	r.event(s.stack, "Normal", AppliedReason, "applied %s (%s): release %d", planID, summaryText(summary), recorded.Revision)
	return nil
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

func summaryText(sum *runnerv1.PlanSummary) string {
	return fmt.Sprintf("+%d ~%d -%d", sum.GetAdd(), sum.GetChange(), sum.GetDestroy())
}

// recordPlan copies a plan's summary into status.plan.
func (s *scope) recordPlan(planID string, p *runner.Plan, at time.Time) {
	sum := p.GetSummary()
	created := metav1.NewTime(at)
	pending := ""
	if s.stack.Status.Plan != nil {
		pending = s.stack.Status.Plan.Pending
	}
	s.stack.Status.Plan = &terracev1.PlanStatus{
		ID: planID, Pending: pending, Add: sum.GetAdd(), Change: sum.GetChange(), Destroy: sum.GetDestroy(),
		Drift: sum.GetDrift(), CreatedAt: &created, InputsDigest: s.inputs.digest,
	}
	if pending != "" {
		// A new plan replaces any plan that was waiting.
		s.stack.Status.Plan.Pending = ""
	}
	s.observed.planned = true
	s.observed.hasChanges = p.GetHasChanges()
}
