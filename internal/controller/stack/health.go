package stack

import (
	"context"
	"fmt"
	"strings"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/controller/outcome"
	"github.com/terrace-dev/terrace/internal/state/release"
	runnerv1 "github.com/terrace-dev/terrace/proto/terrace/runner/v1"
)

// Condition reasons of HealthCheckPassed.
const (
	HealthCheckPassedReason = "HealthCheckPassed"
	HealthCheckFailedReason = "HealthCheckFailed"
)

// healthObservation is the outcome of the Stack's health checks in this reconcile.
type healthObservation struct {
	results []release.HealthCheckResult
}

func (h *healthObservation) failed() []release.HealthCheckResult {
	var out []release.HealthCheckResult
	for _, r := range h.results {
		if !r.Passed {
			out = append(out, r)
		}
	}
	return out
}

// runHealthChecks has the runner pod check spec.healthChecks (never the
// controller: the addresses come from the tenant's outputs, and are
// reached from the tenant's network position). The results are observed
// and returned for the release record.
func (r *Reconciler) runHealthChecks(ctx context.Context, s *scope) []release.HealthCheckResult {
	specs := s.stack.Spec.HealthChecks
	if len(specs) == 0 {
		return nil
	}
	checks := make([]*runnerv1.HealthCheck, 0, len(specs))
	for _, c := range specs {
		hc := &runnerv1.HealthCheck{Name: c.Name, Target: c.URL, ExpectedStatus: c.ExpectedStatus, BodyMatch: c.BodyMatch,
			Type: runnerv1.HealthCheckType_HEALTH_CHECK_TYPE_HTTP}
		if c.Type == terracev1.HealthCheckTCP {
			hc.Type, hc.Target = runnerv1.HealthCheckType_HEALTH_CHECK_TYPE_TCP, c.Address
		}
		if c.Timeout != nil {
			hc.TimeoutMs = c.Timeout.Milliseconds()
		}
		checks = append(checks, hc)
	}
	obs := &healthObservation{}
	results, err := s.run.client.CheckHealth(ctx, checks)
	if err != nil {
		for _, c := range specs {
			obs.results = append(obs.results, release.HealthCheckResult{Name: c.Name, Message: "the runner could not run the check: " + runnerMessage(err)})
		}
	}
	for _, res := range results {
		msg := res.GetMessage()
		if t := res.GetTarget(); t != "" {
			msg = t + ": " + msg
		}
		obs.results = append(obs.results, release.HealthCheckResult{Name: res.GetName(), Passed: res.GetPassed(), Message: msg})
	}
	s.observed.health = obs
	if failed := obs.failed(); len(failed) > 0 {
		r.warningEvent(s.stack, HealthCheckFailedReason, "%s", healthText(failed))
	}
	return obs.results
}

// healthDue says a run that found nothing to apply checks health: every
// run does, as Flux's health checks run at every reconcile, so a target that
// stopped answering since the last apply shows at the next interval. (No
// condition is read back to decide it.)
func healthDue(s *scope) bool {
	return len(s.stack.Spec.HealthChecks) > 0 && s.observed.health == nil
}

// healthError is the transient error of failed checks: the Stack is
// retried with backoff, and the retry checks again.
func healthError(s *scope) error {
	if s.observed.health == nil {
		return nil
	}
	if failed := s.observed.health.failed(); len(failed) > 0 {
		return fmt.Errorf("%s", healthText(failed))
	}
	return nil
}

func healthText(failed []release.HealthCheckResult) string {
	parts := make([]string, len(failed))
	for i, f := range failed {
		parts[i] = fmt.Sprintf("health check %s failed: %s", f.Name, f.Message)
	}
	return strings.Join(parts, "; ")
}

// setHealthCondition derives HealthCheckPassed from this reconcile's checks.
func setHealthCondition(s *scope) {
	stack := s.stack
	if len(stack.Spec.HealthChecks) == 0 {
		outcome.Delete(stack, terracev1.HealthCheckPassedCondition)
		return
	}
	h := s.observed.health
	if h == nil {
		return
	}
	if failed := h.failed(); len(failed) > 0 {
		outcome.MarkFalse(stack, terracev1.HealthCheckPassedCondition, HealthCheckFailedReason, "%s", healthText(failed))
		return
	}
	outcome.MarkTrue(stack, terracev1.HealthCheckPassedCondition, HealthCheckPassedReason, "%d health check(s) passed", len(h.results))
}
