package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The observed side of a Stack: what its plans, releases and runs left.

// PlanStatus summarises the latest plan.
type PlanStatus struct {
	// ID of the latest plan.
	// +optional
	ID string `json:"id,omitempty"`

	// Pending is the id of a plan that waits for approval (set approvePlan to it).
	// +optional
	Pending string `json:"pending,omitempty"`

	// Add is the number of resources the plan creates.
	// +optional
	Add int32 `json:"add,omitempty"`

	// Change is the number of resources the plan updates in place.
	// +optional
	Change int32 `json:"change,omitempty"`

	// Destroy is the number of resources the plan destroys.
	// +optional
	Destroy int32 `json:"destroy,omitempty"`

	// Drift is the number of resources changed outside Terrace.
	// +optional
	Drift int32 `json:"drift,omitempty"`

	// DestroyPlan is true when the plan destroys the whole Stack.
	// +optional
	DestroyPlan bool `json:"destroyPlan,omitempty"`

	// CreatedAt is when the plan was made.
	// +optional
	CreatedAt *metav1.Time `json:"createdAt,omitempty"`

	// InputsDigest identifies the source, path, workspace and variables the
	// plan was made from; a pending plan is applied only while they are unchanged.
	// +optional
	InputsDigest string `json:"inputsDigest,omitempty"`

	// Policy is the plan policies' decision on this plan, when the
	// TerraceConfig names any.
	// +optional
	Policy *PlanPolicyStatus `json:"policy,omitempty"`
}

// ReleaseStatus is the latest release record's summary.
type ReleaseStatus struct {
	// Revision is the release number, counting from 1.
	// +optional
	Revision int64 `json:"revision,omitempty"`

	// Status of the release: deployed, failed or superseded.
	// +optional
	Status string `json:"status,omitempty"`

	// UpdatedAt is when the release last changed.
	// +optional
	UpdatedAt *metav1.Time `json:"updatedAt,omitempty"`

	// StateSerial is the serial of the state the release left. A state
	// with another serial was written by a run whose release was not
	// recorded here; the controller records it from the history.
	// +optional
	StateSerial int64 `json:"stateSerial,omitempty"`
}

// StackStatus is the observed state of a Stack.
type StackStatus struct {
	// ObservedGeneration is the last generation whose outcome is final.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// Conditions: Ready, Reconciling, Stalled, Planned, Applied, Drifted, DependenciesReady.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`

	// LastAppliedRevision is the source revision last applied.
	// +optional
	LastAppliedRevision string `json:"lastAppliedRevision,omitempty"`

	// LastAppliedInputsDigest identifies the source, path, workspace and
	// variables last applied (or planned without changes); a change means a
	// new plan is due.
	// +optional
	LastAppliedInputsDigest string `json:"lastAppliedInputsDigest,omitempty"`

	// LastAttemptedRevision is the source revision of the last run.
	// +optional
	LastAttemptedRevision string `json:"lastAttemptedRevision,omitempty"`

	// LastPlannedRevision is the source revision of the last plan.
	// +optional
	LastPlannedRevision string `json:"lastPlannedRevision,omitempty"`

	// Git is the commit the last clone of spec.source.git resolved.
	// +optional
	Git *GitStatus `json:"git,omitempty"`

	// PullRequests lists the plans of the repository's open pull requests
	// (spec.source.git.pullRequests), one per pull request.
	// +optional
	// +listType=map
	// +listMapKey=number
	// +kubebuilder:validation:MaxItems=100
	PullRequests []PullRequestPlan `json:"pullRequests,omitempty"`

	// Plan summarises the latest plan.
	// +optional
	Plan *PlanStatus `json:"plan,omitempty"`

	// Outputs lists the names of the Stack's outputs (never their values).
	// +optional
	Outputs []string `json:"outputs,omitempty"`

	// Release is the latest release record's revision and status; the full
	// history is in Secrets of type terrace.dev/release.v1.
	// +optional
	Release *ReleaseStatus `json:"release,omitempty"`

	// LastDriftCheckAt is when drift was last looked for.
	// +optional
	LastDriftCheckAt *metav1.Time `json:"lastDriftCheckAt,omitempty"`

	// LastDriftDetectedAt is when drift was last found.
	// +optional
	LastDriftDetectedAt *metav1.Time `json:"lastDriftDetectedAt,omitempty"`

	// Failures counts consecutive failed runs; it drives the retry backoff.
	// +optional
	Failures int64 `json:"failures,omitempty"`

	// CurrentRun is the ID of the Stack's run in progress, recorded before
	// its runner starts (it is in the runner pod's name and certificate)
	// and cleared once every command of the run returned. The state server
	// accepts a runner's certificate only for this run, and only from the
	// runner pod the certificate was issued for, while it exists.
	// +optional
	CurrentRun string `json:"currentRun,omitempty"`

	// LastRun is the ID of the Stack's latest run, kept after it ends: its
	// runner pod's name (<stack>-runner-<id>, or terrace-warm-<id> for
	// a run that claimed a warm pod) and log.
	// +optional
	LastRun string `json:"lastRun,omitempty"`

	// OutputsSecret is the Secret Terrace last wrote the outputs into
	// (spec.writeOutputsToSecret.name at that time), so a renamed or
	// removed one is cleaned up without searching the namespace.
	// +optional
	OutputsSecret string `json:"outputsSecret,omitempty"`

	// Inventory lists the resources in the state after the last run that
	// applied or found no changes.
	// +optional
	Inventory *Inventory `json:"inventory,omitempty"`

	// BackendLock is a state lock the last run met in the Stack's own
	// backend (spec.backend), which Terrace never releases; cleared by the
	// next run that gets past it.
	// +optional
	BackendLock *BackendLockStatus `json:"backendLock,omitempty"`

	ReconcileRequestStatus `json:",inline"`
}

// GitStatus describes the commit a Git source resolved to.
type GitStatus struct {
	// Revision is "<ref>@sha1:<40 hex>", as Flux writes it.
	// +optional
	Revision string `json:"revision,omitempty"`

	// Message is the first line of the commit message (at most 256 bytes).
	// +optional
	// +kubebuilder:validation:MaxLength=256
	Message string `json:"message,omitempty"`

	// Author is the commit's author, "Name <email>".
	// +optional
	// +kubebuilder:validation:MaxLength=256
	Author string `json:"author,omitempty"`

	// CommittedAt is the commit's time.
	// +optional
	CommittedAt *metav1.Time `json:"committedAt,omitempty"`

	// CheckedAt is when a runner last looked at the ref, whether it found
	// a new commit, the same one, or failed: the next look at a branch,
	// tag or semver range is due an interval later (a failed one is also
	// retried with the failure backoff, or at once on a reconcile request).
	// +optional
	CheckedAt *metav1.Time `json:"checkedAt,omitempty"`
}

// Pull-request plan statuses.
const (
	PullRequestPlanPending = "Pending"
	PullRequestPlanPlanned = "Planned"
	PullRequestPlanFailed  = "Failed"
)

// PullRequestPlan is the plan of one open pull request's head commit.
type PullRequestPlan struct {
	// Number of the pull request (merge request on GitLab).
	// +required
	Number int64 `json:"number"`

	// Title of the pull request.
	// +optional
	// +kubebuilder:validation:MaxLength=256
	Title string `json:"title,omitempty"`

	// URL of the pull request on the forge.
	// +optional
	// +kubebuilder:validation:MaxLength=2048
	URL string `json:"url,omitempty"`

	// HeadRevision is the planned head commit, "<branch>@sha1:<40 hex>".
	// +optional
	HeadRevision string `json:"headRevision,omitempty"`

	// Status is Pending, Planned or Failed.
	// +optional
	// +kubebuilder:validation:Enum=Pending;Planned;Failed
	Status string `json:"status,omitempty"`

	// Add, Change and Destroy count the plan's resource changes.
	// +optional
	Add int32 `json:"add,omitempty"`
	// +optional
	Change int32 `json:"change,omitempty"`
	// +optional
	Destroy int32 `json:"destroy,omitempty"`

	// Message says why a plan failed, or what it is waiting for.
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	Message string `json:"message,omitempty"`

	// PlannedAt is when the head commit was last planned.
	// +optional
	PlannedAt *metav1.Time `json:"plannedAt,omitempty"`

	// RunID is the run planning the head commit while it runs. Its runner's
	// certificate is a read-only identity: the state server lets it read
	// the Stack's state only while this names the run.
	// +optional
	// +kubebuilder:validation:MaxLength=63
	RunID string `json:"runID,omitempty"`
}
