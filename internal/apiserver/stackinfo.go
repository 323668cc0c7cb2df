package apiserver

import (
	"context"
	"errors"
	"fmt"

	"connectrpc.com/connect"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/stackview"
	"github.com/terrace-dev/terrace/internal/state"
	"github.com/terrace-dev/terrace/internal/state/release"
	apiv1 "github.com/terrace-dev/terrace/proto/terrace/api/v1"
)

// plan shows the pending plan (or a planOnly Stack's latest), with its
// readable rendering when the Stack stores one and the caller may read
// Secrets, where plans are kept.
func (s *site) plan(ctx context.Context, c *call) (*apiv1.Plan, error) {
	stack, err := s.stack(ctx, c.name)
	if err != nil {
		return nil, err
	}
	planID := stackview.ShownPlan(stack)
	if planID == "" {
		return nil, failure(connect.CodeNotFound, reasonNoPlan, (&stackview.NoPendingPlanError{Stack: stack}).Error())
	}
	p := stack.Status.Plan
	out := &apiv1.Plan{
		Id: planID, Approvable: p.Pending == planID,
		Add: p.Add, Change: p.Change, Destroy: p.Destroy, Drift: p.Drift, DestroyPlan: p.DestroyPlan,
		CreatedAt: timestampOf(p.CreatedAt), Revision: stack.Status.LastPlannedRevision,
		ReadableFormat: stackview.ReadableFormat(stack), Policy: planPolicyOf(stackview.StatusPolicy(p.Policy)),
	}
	ok, err := s.allowed(ctx, "get", "secrets")
	if err != nil {
		return nil, err
	}
	switch {
	case !ok && out.ReadableFormat != "":
		out.Note = fmt.Sprintf("(the readable plan is withheld: %s may not get secrets in namespace %s, where plans are kept)", c.caller.Username, s.Namespace)
	case !ok:
		out.Note = stackview.NoReadablePlanStored
	default:
		set, err := s.stores(ctx, c, readPlans)
		if denied := permissionDenied(err); denied != nil {
			out.Note = "(the readable plan is withheld: " + denied.Message() + ")"
			break
		}
		if err != nil {
			return nil, err
		}
		stored := stackview.ReadStoredPlan(ctx, set.Plans, stack, planID)
		if stored.Policy != nil {
			out.Policy = planPolicyOf(stored.Policy)
		}
		out.Readable, out.Note = string(stored.Readable), stored.Note
	}
	return out, nil
}

// planPolicyOf is a policy decision as the API shows it.
func planPolicyOf(d *state.PlanPolicy) *apiv1.PlanPolicy {
	if d == nil {
		return nil
	}
	return &apiv1.PlanPolicy{Decision: d.Decision, Violations: d.Violations, Warnings: d.Warnings, PoliciesDigest: d.PoliciesDigest}
}

// approve sets spec.approvePlan to planID only when it is the pending plan.
func (s *site) approve(ctx context.Context, c *call, planID string) (*apiv1.Installation, error) {
	if planID == "" {
		return nil, invalid(`planId is required (the body must be {"planId": "<the pending plan's id>"}): read it from GET /v1/installations/` + c.name + `/plan`)
	}
	get := func(ctx context.Context) (*terracev1.Stack, error) { return s.stack(ctx, c.name) }
	stack, _, err := stackview.Approve(ctx, s.Caller, get, planID)
	var noPlan *stackview.NoPendingPlanError
	var notPending *stackview.NotPendingError
	switch {
	case errors.As(err, &noPlan):
		return nil, failure(connect.CodeFailedPrecondition, reasonNoPlan, err.Error())
	case errors.As(err, &notPending):
		return nil, failure(connect.CodeFailedPrecondition, reasonPlanNotPending, err.Error())
	case apierrors.IsConflict(err):
		return nil, failure(connect.CodeAborted, reasonChanged, fmt.Sprintf("Stack %s kept changing while it was approved: read its plan again and retry", c.name))
	case err != nil:
		var cerr *connect.Error
		if errors.As(err, &cerr) {
			return nil, err
		}
		return nil, kubeError(err, "Stack "+c.name)
	}
	return installationOf(stack), nil
}

// releases lists the Stack's release records from the namespace's release store.
func (s *site) releases(ctx context.Context, c *call) (*apiv1.ListReleasesResponse, error) {
	stack, err := s.stack(ctx, c.name)
	if err != nil {
		return nil, err
	}
	set, err := s.stores(ctx, c, readReleases)
	if err != nil {
		return nil, err
	}
	records, err := set.History.List(ctx, stack.Namespace, stack.Name)
	if err != nil {
		return nil, kubeError(err, "the release records of Stack "+stack.Name)
	}
	out := &apiv1.ListReleasesResponse{Items: make([]*apiv1.Release, 0, len(records))}
	for i := range records {
		out.Items = append(out.Items, releaseOf(&records[i]))
	}
	return out, nil
}

// outputs shows the outputs Secret with sensitive values masked; which are
// sensitive comes from the deployed release, and an unknown one is masked.
func (s *site) outputs(ctx context.Context, c *call) (*apiv1.GetOutputsResponse, error) {
	stack, err := s.stack(ctx, c.name)
	if err != nil {
		return nil, err
	}
	spec := stack.Spec.WriteOutputsToSecret
	// The outputs Secret first: a caller who may not read it learns nothing more.
	secret := &corev1.Secret{}
	if spec != nil {
		err := s.Caller.Get(ctx, client.ObjectKey{Namespace: s.Namespace, Name: spec.Name}, secret)
		switch {
		case apierrors.IsNotFound(err):
			return nil, notFound(fmt.Sprintf("Stack %s writes its outputs to Secret %s, which does not exist yet: no apply has finished", stack.Name, spec.Name))
		case err != nil:
			return nil, kubeError(err, "Secret "+spec.Name)
		}
	}
	set, releaseErr := s.stores(ctx, c, readReleases)
	storesDenied := permissionDenied(releaseErr) != nil
	if releaseErr != nil && !storesDenied {
		return nil, releaseErr
	}
	var deployed *release.Release
	if releaseErr == nil {
		deployed, releaseErr = set.History.Deployed(ctx, stack.Namespace, stack.Name)
	}
	switch {
	case storesDenied && spec == nil:
		// Without an outputs Secret the values are in the release records.
		return nil, releaseErr
	case apierrors.IsForbidden(releaseErr) && spec == nil:
		return nil, kubeError(releaseErr, "the release records of Stack "+stack.Name)
	case releaseErr != nil && !storesDenied && !apierrors.IsForbidden(releaseErr):
		s.Log.Error(releaseErr, "failed to read the deployed release", "stack", stack.Name)
	}
	if releaseErr != nil {
		deployed = nil
	}
	out := &apiv1.GetOutputsResponse{}
	var items []stackview.Output
	if spec == nil {
		items = stackview.OutputsFromRelease(stack, deployed)
		out.Note = "the Stack has no outputs Secret; values are from its deployed release, which never records sensitive ones"
	} else {
		items = stackview.OutputsFromSecret(secret, deployed, false)
		if deployed == nil {
			out.Note = "no release record says which outputs are sensitive (" + stackview.ReleaseProblem(releaseErr) + "): every value is masked"
		}
	}
	for _, o := range items {
		out.Items = append(out.Items, &apiv1.Output{Name: o.Name, Sensitive: o.Sensitive, Value: o.Value, Masked: o.Masked})
	}
	return out, nil
}
