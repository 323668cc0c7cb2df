package stack

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/controller/outcome"
	"github.com/terrace-dev/terrace/internal/policy"
	"github.com/terrace-dev/terrace/internal/runner"
	"github.com/terrace-dev/terrace/internal/settings"
	"github.com/terrace-dev/terrace/internal/state/release"
)

// Condition reasons about plan policies.
const (
	// PolicyDeniedReason: a deny rule matched the plan; it is not applied.
	PolicyDeniedReason = "PolicyDenied"
	// PolicyPassedReason: no deny rule matched (warnings may have).
	PolicyPassedReason = "PolicyPassed"
	// PolicyNotFoundReason: the config names a ConfigMap that does not exist.
	PolicyNotFoundReason = "PolicyNotFound"
	// InvalidPolicyReason: a policy module does not compile.
	InvalidPolicyReason = "InvalidPolicy"
	// PolicyEvaluationFailedReason: the policies could not decide (an
	// error at run time, a timeout, or a plan JSON too large to check).
	PolicyEvaluationFailedReason = "PolicyEvaluationFailed"
)

// Policy decisions as status.plan.policy.decision says them.
const (
	policyAllowed = "allowed"
	policyDenied  = "denied"
)

// maxListedPolicyMessages bounds the messages kept in status.
const maxListedPolicyMessages = 20

// planPolicies are the compiled policies of a Stack's configs.
type planPolicies struct {
	set *policy.Set
}

func (p *planPolicies) digest() string {
	if p == nil {
		return ""
	}
	return p.set.Digest
}

// hasPolicies says the Stack's plans must pass policies before an apply.
func (s *scope) hasPolicies() bool { return s.options != nil && s.options.policies != nil }

// loadPolicies reads and compiles the policy ConfigMaps the configs name;
// nil when they name none. A missing ConfigMap or a module that does not
// compile stops the Stack before anything runs.
func (r *Reconciler) loadPolicies(ctx context.Context, s *scope) (*planPolicies, error) {
	if len(s.config.PlanPolicies) == 0 {
		return nil, nil
	}
	var modules []policy.Module
	for _, ref := range s.config.PlanPolicies {
		var cm corev1.ConfigMap
		err := r.Client.Get(ctx, types.NamespacedName{Namespace: ref.Namespace, Name: ref.Name}, &cm)
		if apierrors.IsNotFound(err) {
			return nil, outcome.Terminalf(PolicyNotFoundReason, "TerraceConfig %s spec.planPolicy names ConfigMap %s/%s, which does not exist: create it or remove the reference", ref.Source, ref.Namespace, ref.Name)
		}
		if err != nil {
			return nil, fmt.Errorf("failed to read policy ConfigMap %s/%s: %w", ref.Namespace, ref.Name, err)
		}
		found := 0
		for key, src := range cm.Data {
			if strings.HasSuffix(key, ".rego") {
				modules = append(modules, policy.Module{Name: ref.Namespace + "/" + ref.Name + "/" + key, Source: src})
				found++
			}
		}
		if found == 0 {
			return nil, outcome.Terminalf(InvalidPolicyReason, "policy ConfigMap %s/%s (named by TerraceConfig %s) has no key ending in .rego", ref.Namespace, ref.Name, ref.Source)
		}
	}
	set, err := policy.Compile(ctx, modules)
	var invalid *policy.InvalidError
	if errors.As(err, &invalid) {
		return nil, outcome.Terminalf(InvalidPolicyReason, "plan policies do not compile: %s", invalid.Message)
	}
	if err != nil {
		return nil, fmt.Errorf("failed to compile the plan policies: %w", err)
	}
	return &planPolicies{set: set}, nil
}

// checkPolicies decides every plan before anything applies it and records
// the decision with the plan. A denial of a plan with changes is terminal:
// the module or the policies must change (a policy change makes a new plan
// due). A plan without changes applies nothing, so its denial blocks
// nothing: it is recorded and shown (PolicyDenied), and the Stack stays
// Ready with what it last applied, which the policies now deny.
func (r *Reconciler) checkPolicies(ctx context.Context, s *scope, made *planObservation, p *runner.Plan) error {
	if !s.hasPolicies() {
		return nil
	}
	err := r.decidePlan(ctx, s, made, p)
	if err != nil && !made.hasChanges {
		r.warningEvent(s.stack, PolicyDeniedReason, "plan %s has no changes, so nothing is blocked, but the plan policies deny what the Stack keeps: %s", made.id, strings.Join(made.policy.Violations, "; "))
		return nil
	}
	return err
}

// decidePlan evaluates the policies on one plan into made.policy.
func (r *Reconciler) decidePlan(ctx context.Context, s *scope, made *planObservation, p *runner.Plan) error {
	digest := s.options.policies.digest()
	if p.JSONOmitted {
		made.policy = &terracev1.PlanPolicyStatus{Decision: policyDenied, PoliciesDigest: digest,
			Violations: []string{"the plan JSON is over the controller's limit and cannot be checked"}}
		return outcome.Terminalf(PolicyEvaluationFailedReason, "plan %s cannot be checked against the plan policies: its JSON is over the controller's limit", made.id)
	}
	decision, err := s.options.policies.set.Evaluate(ctx, p.JSON)
	if err != nil {
		made.policy = &terracev1.PlanPolicyStatus{Decision: policyDenied, PoliciesDigest: digest, Violations: []string{err.Error()}}
		return outcome.Terminalf(PolicyEvaluationFailedReason, "plan %s was not applied: %s", made.id, err.Error())
	}
	made.policy = &terracev1.PlanPolicyStatus{Decision: policyAllowed, PoliciesDigest: digest,
		Violations: firstMessages(decision.Violations), Warnings: firstMessages(decision.Warnings)}
	if len(decision.Warnings) > 0 {
		r.warningEvent(s.stack, "PolicyWarning", "plan %s: %s", made.id, strings.Join(decision.Warnings, "; "))
	}
	if decision.Allowed() {
		return nil
	}
	made.policy.Decision = policyDenied
	if made.hasChanges {
		r.warningEvent(s.stack, PolicyDeniedReason, "plan %s denied: %s", made.id, strings.Join(decision.Violations, "; "))
	}
	return outcome.Terminalf(PolicyDeniedReason, "plan %s is denied by the plan policies and not applied: %s",
		made.id, strings.Join(decision.Violations, "; "))
}

func firstMessages(msgs []string) []string {
	if len(msgs) > maxListedPolicyMessages {
		return slices.Clone(msgs[:maxListedPolicyMessages])
	}
	return msgs
}

// setPolicyCondition derives PolicyDenied from this reconcile's plan.
func setPolicyCondition(s *scope) {
	stack, o := s.stack, &s.observed
	if s.options == nil {
		return // the reconcile ended before the policies were read
	}
	if len(s.config.PlanPolicies) == 0 {
		outcome.Delete(stack, terracev1.PolicyDeniedCondition)
		return
	}
	if o.plan == nil {
		return
	}
	d := o.plan.policy
	switch {
	case d == nil:
		return // a plan that ended before its decision (a denied state size, say)
	case d.Decision == policyDenied && !o.plan.hasChanges:
		outcome.MarkTrue(stack, terracev1.PolicyDeniedCondition, PolicyDeniedReason, "plan %s has no changes, so nothing was blocked, but the policies deny what the Stack keeps: %s", o.plan.id, strings.Join(d.Violations, "; "))
	case d.Decision == policyDenied:
		outcome.MarkTrue(stack, terracev1.PolicyDeniedCondition, PolicyDeniedReason, "plan %s: %s", o.plan.id, strings.Join(d.Violations, "; "))
	case len(d.Warnings) > 0:
		outcome.MarkFalse(stack, terracev1.PolicyDeniedCondition, PolicyPassedReason, "plan %s passed with %d warning(s): %s", o.plan.id, len(d.Warnings), strings.Join(d.Warnings, "; "))
	default:
		outcome.MarkFalse(stack, terracev1.PolicyDeniedCondition, PolicyPassedReason, "plan %s passed the plan policies", o.plan.id)
	}
}

// stacksForPolicyConfigMap wakes the Stacks governed by a TerraceConfig
// that names the ConfigMap, so a changed policy is applied to them now.
func (r *Reconciler) stacksForPolicyConfigMap(ctx context.Context, o client.Object) []reconcile.Request {
	var cfg terracev1.TerraceConfig
	if err := r.Client.Get(ctx, types.NamespacedName{Namespace: o.GetNamespace(), Name: terracev1.TerraceConfigName}, &cfg); err != nil {
		if !apierrors.IsNotFound(err) {
			ctrl.LoggerFrom(ctx).Error(err, "failed to read the TerraceConfig of a ConfigMap's namespace")
		}
		return nil
	}
	if cfg.Spec.PlanPolicy == nil || !slices.ContainsFunc(cfg.Spec.PlanPolicy.ConfigMapRefs, func(ref terracev1.LocalObjectReference) bool {
		return ref.Name == o.GetName()
	}) {
		return nil
	}
	return settings.StacksForConfig(r.Client, r.Options.OperatorNamespace)(ctx, &cfg)
}

// appliedPolicy is the decision recorded with a release: the one stored
// with the applied plan, this reconcile's plan's, or the approved plan's as
// its status recorded it.
func appliedPolicy(s *scope, p planRecord) *release.PolicyDecision {
	if d := p.policy; d != nil {
		return &release.PolicyDecision{Decision: d.Decision, Warnings: d.Warnings, PoliciesDigest: d.PoliciesDigest}
	}
	d := (*terracev1.PlanPolicyStatus)(nil)
	if s.observed.plan != nil {
		d = s.observed.plan.policy
	} else if p := s.recorded().Plan; p != nil {
		d = p.Policy
	}
	if d == nil {
		return nil
	}
	return &release.PolicyDecision{Decision: d.Decision, Warnings: d.Warnings, PoliciesDigest: d.PoliciesDigest}
}
