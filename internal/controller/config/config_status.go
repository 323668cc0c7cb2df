package config

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/log"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/controller/outcome"
	"github.com/terrace-dev/terrace/internal/runnerpolicy"
)

// summarize derives the status from what the steps observed; it is the
// only writer of the config's status besides HandleReconcileRequest.
func (r *Reconciler) summarize(ctx context.Context, s *configScope) outcome.Outcome {
	if s.deleting {
		return r.summarizeDelete(s)
	}
	cfg := s.config
	setStateBackendStatus(s)
	setConcernCondition(cfg, SecretsReadyCondition, s.outcomes, SecretsUsableReason, "every Secret the config names exists and holds a usable value")
	setConcernCondition(cfg, StateBackendReadyCondition, s.outcomes, StateBackendCurrentReason, stateBackendMessage(s))
	if apiEnabled(cfg) {
		setConcernCondition(cfg, APIServerReadyCondition, s.outcomes, APIServerDeployedReason, apiServerMessage(cfg))
	} else {
		// Nothing to report once the API server is gone; a failure to remove it stays visible.
		setConcernCondition(cfg, APIServerReadyCondition, s.outcomes, "", "")
	}
	r.setRunnerPolicyCondition(cfg, s)

	errs := []error{s.setupErr}
	for _, c := range r.concerns() {
		errs = append(errs, s.outcomes[c.condition])
	}
	err := decisive(errs)
	out := outcome.Summarize(cfg, err, ConfigReadyReason, r.readyMessage(s), 0)
	if out.Final {
		cfg.Status.ObservedGeneration = cfg.Generation
	}
	out.Result.RequeueAfter, out.Err = retryOf(errs)
	if !s.apiRenewAt.IsZero() && out.Err == nil {
		renew := max(time.Until(s.apiRenewAt), time.Second)
		if out.Result.RequeueAfter == 0 || renew < out.Result.RequeueAfter {
			out.Result.RequeueAfter = renew
		}
	}
	logger := log.FromContext(ctx)
	if err != nil {
		logger.Info("terrace config not ready", "reason", outcome.Get(cfg, terracev1.ReadyCondition).Reason, "error", err.Error())
		return out
	}
	if conditionStatus(s.previous.Conditions, terracev1.ReadyCondition) == metav1.ConditionFalse {
		r.Recorder.Eventf(cfg, nil, corev1.EventTypeNormal, RecoveredReason, "Validate", "terrace config is valid again")
		logger.Info("terrace config recovered")
	}
	return out
}

// summarizeDelete reports a deletion that failed, so that a config stuck
// on its finalizer says why; a deletion that worked leaves nothing to say.
func (r *Reconciler) summarizeDelete(s *configScope) outcome.Outcome {
	if s.deleteErr == nil {
		return outcome.Outcome{}
	}
	setConcernCondition(s.config, APIServerReadyCondition, map[string]error{APIServerReadyCondition: s.deleteErr}, "", "")
	return outcome.Summarize(s.config, fmt.Errorf("failed to remove the API server of the deleted config: %w", s.deleteErr), ConfigReadyReason, "", 0)
}

// setStateBackendStatus writes status.stateBackend: the migration's
// progress when one was looked at, else the backend in use.
func setStateBackendStatus(s *configScope) {
	switch {
	case s.migration != nil:
		applyMigrationStatus(s.config, s.previous.StateBackend, s.migration)
	case s.effective != nil && s.outcomes[StateBackendReadyCondition] == nil:
		s.config.Status.StateBackend = &terracev1.StateBackendStatus{Current: s.effective.StateBackend}
	}
}

// setConcernCondition sets the condition a concern owns from its outcome:
// True with okReason and okMessage, False with the reason of its error,
// removed when it succeeded with no okReason. A concern that did not run
// leaves its condition as it was.
func setConcernCondition(cfg *terracev1.TerraceConfig, condType string, outcomes map[string]error, okReason, okMessage string) {
	err, ran := outcomes[condType]
	switch {
	case !ran:
	case err != nil:
		outcome.MarkFalse(cfg, condType, reasonOf(err), "%s", err.Error())
	case okReason != "":
		outcome.MarkTrue(cfg, condType, okReason, "%s", okMessage)
	default:
		outcome.Delete(cfg, condType)
	}
}

// reasonOf is the condition reason of a concern's error.
func reasonOf(err error) string {
	var terminal *outcome.TerminalError
	var waiting *outcome.WaitingError
	switch {
	case errors.As(err, &terminal):
		return terminal.Reason
	case errors.As(err, &waiting):
		return waiting.Reason
	default:
		return outcome.ReconciliationFailedReason
	}
}

func stateBackendMessage(s *configScope) string {
	if s.effective == nil {
		return ""
	}
	return fmt.Sprintf("state backend %s", s.effective.StateBackend)
}

func apiServerMessage(cfg *terracev1.TerraceConfig) string {
	return fmt.Sprintf("API server at https://%s.%s.svc", APIName, cfg.Namespace)
}

// readyMessage is Ready's message when every concern succeeded.
func (r *Reconciler) readyMessage(s *configScope) string {
	msg := ""
	if s.effective != nil {
		msg = fmt.Sprintf("state backend %s; settings from %v", s.effective.StateBackend, s.effective.Sources)
	}
	if apiEnabled(s.config) && r.API != nil {
		msg += "; " + apiServerMessage(s.config)
	}
	return msg
}

// decisive returns the error that decides Ready, Reconciling and Stalled
// when the concerns failed with errs (nil entries are successes): what
// only the user can fix comes first, since it is what they must act on;
// then a transient failure; then a wait. The message names every failure,
// in order. What the others need, retries, is retryOf's.
func decisive(errs []error) error {
	failed := slices.DeleteFunc(slices.Clone(errs), func(err error) bool { return err == nil })
	switch len(failed) {
	case 0:
		return nil
	case 1:
		return failed[0]
	}
	messages := make([]string, len(failed))
	for i, err := range failed {
		messages[i] = err.Error()
	}
	msg := strings.Join(messages, "; ")
	terminal, transient, waiting := sortFailures(failed)
	switch {
	case terminal != nil:
		return outcome.Terminal(terminal.Reason, errors.New(msg))
	case len(transient) > 0:
		return &retryError{message: msg, transient: transient}
	default:
		return outcome.Waiting(waiting.Reason, waiting.RequeueAfter, errors.New(msg))
	}
}

// retryOf is what the failures in errs need whatever decided the
// conditions: the transient ones returned (joined) for backoff, else the
// soonest wait. A config Stalled on one concern keeps retrying the others.
func retryOf(errs []error) (requeueAfter time.Duration, err error) {
	_, transient, waiting := sortFailures(errs)
	switch {
	case len(transient) > 0:
		return 0, errors.Join(transient...)
	case waiting != nil:
		return waiting.RequeueAfter, nil
	}
	return 0, nil
}

// sortFailures returns the first terminal error, the transient ones and
// the soonest wait among errs.
func sortFailures(errs []error) (terminal *outcome.TerminalError, transient []error, waiting *outcome.WaitingError) {
	for _, err := range errs {
		var w *outcome.WaitingError
		var t *outcome.TerminalError
		switch {
		case err == nil:
		case errors.As(err, &w):
			if waiting == nil || w.RequeueAfter < waiting.RequeueAfter {
				waiting = w
			}
		case errors.As(err, &t):
			if terminal == nil {
				terminal = t
			}
		default:
			transient = append(transient, err)
		}
	}
	return terminal, transient, waiting
}

// retryError is several failures of which some are transient and none
// terminal. It says all of them but unwraps to the transient ones only, so
// Summarize takes it for transient rather than for a wait.
type retryError struct {
	message   string
	transient []error
}

func (e *retryError) Error() string   { return e.message }
func (e *retryError) Unwrap() []error { return e.transient }

// setRunnerPolicyCondition reports what of this config's runner settings
// does not take effect, with a warning event when that changes.
func (r *Reconciler) setRunnerPolicyCondition(cfg *terracev1.TerraceConfig, s *configScope) {
	if s.effective == nil {
		return
	}
	var parts []string
	source := cfg.Namespace + "/" + cfg.Name
	for _, n := range s.effective.RunnerPolicyNotes {
		if n.Source == source {
			parts = append(parts, "spec.runner.policy."+n.Message)
		}
	}
	var refused runnerpolicy.Violations
	if errors.As(s.effective.CheckConfigRunner(), &refused) {
		// Only what this config itself names: an inherited image is
		// reported by the config that names it.
		refused = slices.DeleteFunc(refused, func(v runnerpolicy.Violation) bool { return !strings.HasSuffix(v.Field, " of TerraceConfig "+source) })
		if len(refused) > 0 {
			parts = append(parts, refused.Error())
		}
	}
	if len(parts) == 0 {
		outcome.Delete(cfg, RunnerPolicyNarrowedCondition)
		return
	}
	msg := strings.Join(parts, "; ")
	if prev := outcome.Get(cfg, RunnerPolicyNarrowedCondition); prev == nil || prev.Message != msg {
		r.Recorder.Eventf(cfg, nil, corev1.EventTypeWarning, OutsideRunnerPolicyReason, "Validate", "%s", msg)
	}
	outcome.MarkTrue(cfg, RunnerPolicyNarrowedCondition, OutsideRunnerPolicyReason, "%s", msg)
}

func conditionStatus(conds []metav1.Condition, t string) metav1.ConditionStatus {
	for _, c := range conds {
		if c.Type == t {
			return c.Status
		}
	}
	return ""
}
