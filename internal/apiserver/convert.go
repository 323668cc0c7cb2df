package apiserver

import (
	"encoding/json"
	"github.com/terrace-dev/terrace/internal/readiness"
	"strings"

	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/stackview"
	"github.com/terrace-dev/terrace/internal/state/release"
	apiv1 "github.com/terrace-dev/terrace/proto/terrace/api/v1"
)

// The phases of Installation.phase, a one-word summary for UIs.
const (
	phasePending          = "Pending"
	phasePlanning         = "Planning"
	phaseAwaitingApproval = "AwaitingApproval"
	phaseApplying         = "Applying"
	phaseReady            = "Ready"
	phaseFailed           = "Failed"
	phaseDeleting         = "Deleting"
)

// installationOf shows a Stack as the API does, an installation or not.
func installationOf(stack *terracev1.Stack) *apiv1.Installation {
	src := stack.Spec.Source
	in := &apiv1.Installation{
		Name:        stack.Name,
		Namespace:   stack.Namespace,
		Source:      &apiv1.Source{Url: src.URL, Digest: src.Digest},
		Path:        stack.Spec.Path,
		ApprovePlan: stack.Spec.ApprovePlan,
		PendingPlan: stackview.PendingPlan(stack),
		Revision:    stack.Status.LastAppliedRevision,
		Outputs:     stack.Status.Outputs,
		CreatedAt:   timestamppb.New(stack.CreationTimestamp.UTC()),
		Deleting:    stack.DeletionTimestamp != nil,
		Suspended:   stack.Spec.Suspend,
		// Set once: a Stack is shown by one function, for every call.
		Installation: stack.Labels[InstallationLabel] == "true",
	}
	if src.ProgramRef != nil {
		in.Source.ProgramRef = src.ProgramRef.Name
	}
	if src.SourceRef != nil {
		in.Source.SourceRef = src.SourceRef.Kind + "/" + src.SourceRef.Name
	}
	if src.Git != nil {
		in.Source.GitUrl = src.Git.URL
	}
	if g := stack.Status.Git; g != nil {
		in.Git = &apiv1.GitCommit{Revision: g.Revision, Message: g.Message, Author: g.Author, CommittedAt: timestampOf(g.CommittedAt)}
	}
	for _, pr := range stack.Status.PullRequests {
		in.PullRequests = append(in.PullRequests, &apiv1.PullRequestPlan{
			Number: pr.Number, Title: pr.Title, Url: pr.URL, HeadRevision: pr.HeadRevision, Status: pr.Status,
			Add: pr.Add, Change: pr.Change, Destroy: pr.Destroy, Message: pr.Message, PlannedAt: timestampOf(pr.PlannedAt),
		})
	}
	if in.Installation {
		// Another Stack's Secrets are its own, not values this API writes.
		in.ValuesSecret = valuesSecretOf(stack)
	}
	if r := stack.Status.Release; r != nil {
		in.Release = int32(r.Revision)
	}
	for _, c := range stack.Status.Conditions {
		in.Conditions = append(in.Conditions, &apiv1.Condition{
			Type: c.Type, Status: string(c.Status), Reason: c.Reason, Message: c.Message,
			LastTransitionTime: timestampOf(&c.LastTransitionTime),
		})
	}
	ready := stackview.Condition(stack, terracev1.ReadyCondition)
	if ready != nil {
		in.Status = string(ready.Status)
		in.Message = ready.Message
		in.Ready, _, _ = readiness.ReadyAtGeneration(stack)
	}
	in.Phase = phaseOf(stack, in, ready)
	return in
}

// phaseOf sums the Stack's conditions up in one word.
func phaseOf(stack *terracev1.Stack, in *apiv1.Installation, ready *metav1.Condition) string {
	reconciling := stackview.Condition(stack, terracev1.ReconcilingCondition)
	switch {
	case in.Deleting:
		return phaseDeleting
	case in.Ready:
		return phaseReady
	case in.PendingPlan != "":
		return phaseAwaitingApproval
	case stackview.IsTrue(stackview.Condition(stack, terracev1.StalledCondition)):
		return phaseFailed
	case stackview.IsTrue(reconciling) && strings.Contains(reconciling.Reason+reconciling.Message, "ppl"):
		return phaseApplying
	case ready == nil && reconciling == nil:
		return phasePending
	case ready != nil && ready.Status == metav1.ConditionFalse && strings.HasSuffix(ready.Reason, "Failed") && !stackview.IsTrue(reconciling):
		return phaseFailed
	}
	return phasePlanning
}

func timestampOf(t *metav1.Time) *timestamppb.Timestamp {
	if t == nil || t.IsZero() {
		return nil
	}
	return timestamppb.New(t.UTC())
}

// releaseOf shows a release record; values are JSON as recorded.
func releaseOf(r *release.Release) *apiv1.Release {
	out := &apiv1.Release{
		Namespace: r.Namespace, Stack: r.Stack, Revision: int32(r.Revision), Status: string(r.Status),
		SourceRevision: r.SourceRevision, PlanId: r.PlanID,
		Plan:        &apiv1.PlanSummary{Add: int32(r.Plan.Add), Change: int32(r.Plan.Change), Destroy: int32(r.Plan.Destroy)},
		StartedAt:   timestamppb.New(r.StartedAt),
		FinishedAt:  timestamppb.New(r.FinishedAt),
		ToolVersion: r.ToolVersion, RunnerImage: r.RunnerImage, Message: r.Message,
	}
	for _, o := range r.Outputs {
		ro := &apiv1.ReleaseOutput{Name: o.Name, Sensitive: o.Sensitive, FromSecret: o.FromSecret}
		if len(o.Value) > 0 {
			var v any
			if err := json.Unmarshal(o.Value, &v); err == nil {
				if value, err := structpb.NewValue(v); err == nil {
					ro.Value = value
				}
			}
		}
		out.Outputs = append(out.Outputs, ro)
	}
	return out
}
