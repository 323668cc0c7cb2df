package apiserver

import (
	"encoding/json"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/readiness"
	"github.com/terrace-dev/terrace/internal/release"
	"github.com/terrace-dev/terrace/internal/stackview"
)

// Source says where an installation's module comes from: a Program of the
// namespace (programRef) or a tar.gz at url with its digest.
type Source struct {
	ProgramRef string `json:"programRef,omitempty"`
	URL        string `json:"url,omitempty"`
	Digest     string `json:"digest,omitempty"`
	// SourceRef is "Kind/name" for a Stack reading a Flux source; it cannot
	// be set through the API.
	SourceRef string `json:"sourceRef,omitempty"`
}

// CreateRequest is the body of POST /v1/installations.
type CreateRequest struct {
	Name   string `json:"name"`
	Source Source `json:"source"`
	// Values are the module's variables; each is stored as JSON in the values Secret.
	Values map[string]json.RawMessage `json:"values,omitempty"`
	// ApprovePlan is "auto" to apply every plan, or empty to wait for approval.
	ApprovePlan string `json:"approvePlan,omitempty"`
	// Path is the module's directory inside the source.
	Path string `json:"path,omitempty"`
}

// ValuesRequest is the body of PUT /v1/installations/{name}/values.
type ValuesRequest struct {
	Values map[string]json.RawMessage `json:"values"`
}

// ApproveRequest is the body of POST /v1/installations/{name}/approve.
type ApproveRequest struct {
	PlanID string `json:"planId"`
}

// Installation is a Stack as the API shows it.
type Installation struct {
	Name        string `json:"name"`
	Namespace   string `json:"namespace"`
	Source      Source `json:"source"`
	Path        string `json:"path,omitempty"`
	ApprovePlan string `json:"approvePlan,omitempty"`
	// Ready is true when the Ready condition is True at the current generation.
	Ready bool `json:"ready"`
	// Status is the Ready condition's status (True, False, Unknown), "" before the first reconcile.
	Status string `json:"status,omitempty"`
	// Message is the Ready condition's message.
	Message string `json:"message,omitempty"`
	// PendingPlan is the id of the plan awaiting approval.
	PendingPlan string `json:"pendingPlan,omitempty"`
	// Revision is the source revision applied last.
	Revision string `json:"revision,omitempty"`
	// Release is the latest release revision.
	Release    int64              `json:"release,omitempty"`
	Outputs    []string           `json:"outputs,omitempty"`
	Conditions []metav1.Condition `json:"conditions,omitempty"`
	CreatedAt  time.Time          `json:"createdAt"`
	// Deleting is true once deletion has begun (destroy may still be running).
	Deleting bool `json:"deleting,omitempty"`
}

// InstallationList is the body of GET /v1/installations.
type InstallationList struct {
	Items []Installation `json:"items"`
}

// Plan is the body of GET /v1/installations/{name}/plan.
type Plan struct {
	ID string `json:"id"`
	// Approvable is false for the latest plan of a planOnly Stack.
	Approvable     bool         `json:"approvable"`
	Add            int32        `json:"add"`
	Change         int32        `json:"change"`
	Destroy        int32        `json:"destroy"`
	Drift          int32        `json:"drift,omitempty"`
	DestroyPlan    bool         `json:"destroyPlan,omitempty"`
	CreatedAt      *metav1.Time `json:"createdAt,omitempty"`
	Revision       string       `json:"revision,omitempty"`
	ReadableFormat string       `json:"readableFormat,omitempty"`
	Readable       string       `json:"readable,omitempty"`
	// Note says why Readable is empty.
	Note string `json:"note,omitempty"`
}

// ReleaseList is the body of GET /v1/installations/{name}/releases, oldest first.
type ReleaseList struct {
	Items []release.Release `json:"items"`
}

// Outputs is the body of GET /v1/installations/{name}/outputs.
type Outputs struct {
	Items []stackview.Output `json:"items"`
	// Note says where the values come from when it is not plain.
	Note string `json:"note,omitempty"`
}

// Error is the body of every error response.
type Error struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

// installationOf shows a Stack as an installation.
func installationOf(stack *terracev1.Stack) Installation {
	src := stack.Spec.Source
	in := Installation{
		Name:        stack.Name,
		Namespace:   stack.Namespace,
		Source:      Source{URL: src.URL, Digest: src.Digest},
		Path:        stack.Spec.Path,
		ApprovePlan: stack.Spec.ApprovePlan,
		PendingPlan: stackview.PendingPlan(stack),
		Revision:    stack.Status.LastAppliedRevision,
		Outputs:     stack.Status.Outputs,
		Conditions:  stack.Status.Conditions,
		CreatedAt:   stack.CreationTimestamp.UTC(),
		Deleting:    stack.DeletionTimestamp != nil,
	}
	if src.ProgramRef != nil {
		in.Source.ProgramRef = src.ProgramRef.Name
	}
	if src.SourceRef != nil {
		in.Source.SourceRef = src.SourceRef.Kind + "/" + src.SourceRef.Name
	}
	if r := stack.Status.Release; r != nil {
		in.Release = r.Revision
	}
	if ready := stackview.Condition(stack, terracev1.ReadyCondition); ready != nil {
		in.Status = string(ready.Status)
		in.Message = ready.Message
		in.Ready, _, _ = readiness.ReadyAtGeneration(stack)
	}
	return in
}
