package v1alpha1

import (
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Stack condition types, in addition to Ready, Reconciling and Stalled.
const (
	// PlannedCondition is True when a plan of the current inputs exists.
	PlannedCondition = "Planned"
	// AppliedCondition is True when the last approved plan was applied.
	AppliedCondition = "Applied"
	// DriftedCondition is True when the last drift check found changes made outside Terrace.
	DriftedCondition = "Drifted"
	// DependenciesReadyCondition is True when every Stack in dependsOn is Ready.
	DependenciesReadyCondition = "DependenciesReady"
)

// ApprovePlanAuto applies every plan without waiting for approval.
const ApprovePlanAuto = "auto"

// DriftDetectionMode says what a Stack does about changes made outside Terrace.
// +kubebuilder:validation:Enum=enabled;warn;disabled
type DriftDetectionMode string

const (
	// DriftDetectionEnabled plans every interval; a drift is applied only under approvePlan: auto.
	DriftDetectionEnabled DriftDetectionMode = "enabled"
	// DriftDetectionWarn plans every interval and only reports drift.
	DriftDetectionWarn DriftDetectionMode = "warn"
	// DriftDetectionDisabled never looks for drift.
	DriftDetectionDisabled DriftDetectionMode = "disabled"
)

// ReadablePlanFormat says whether and how a human-readable plan is stored.
// +kubebuilder:validation:Enum=none;json;human
type ReadablePlanFormat string

const (
	ReadablePlanNone  ReadablePlanFormat = "none"
	ReadablePlanJSON  ReadablePlanFormat = "json"
	ReadablePlanHuman ReadablePlanFormat = "human"
)

// SourceReference points at a Flux source (GitRepository, OCIRepository or
// Bucket) whose status.artifact the Stack deploys.
type SourceReference struct {
	// APIVersion of the source, for example source.toolkit.fluxcd.io/v1.
	// Defaults to the newest version Terrace knows for the kind.
	// +optional
	APIVersion string `json:"apiVersion,omitempty"`

	// Kind of the source.
	// +required
	// +kubebuilder:validation:Enum=GitRepository;OCIRepository;Bucket
	Kind string `json:"kind"`

	// Name of the source.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`

	// Namespace of the source, defaulting to the Stack's. Another namespace is
	// refused unless the controller runs with --allow-cross-namespace-refs.
	// +optional
	// +kubebuilder:validation:MaxLength=63
	Namespace string `json:"namespace,omitempty"`
}

// StackSource says where the module comes from: exactly one of programRef,
// sourceRef, url and git.
// +kubebuilder:validation:XValidation:rule="[has(self.programRef), has(self.sourceRef), has(self.url), has(self.git)].filter(x, x).size() == 1",message="exactly one of programRef, sourceRef, url and git must be set"
// +kubebuilder:validation:XValidation:rule="!has(self.url) || has(self.digest)",message="url requires digest"
// +kubebuilder:validation:XValidation:rule="!has(self.digest) || has(self.url)",message="digest is only used with url"
type StackSource struct {
	// ProgramRef names a Program in the Stack's namespace.
	// +optional
	ProgramRef *LocalObjectReference `json:"programRef,omitempty"`

	// SourceRef names a Flux GitRepository, OCIRepository or Bucket.
	// +optional
	SourceRef *SourceReference `json:"sourceRef,omitempty"`

	// URL of a tar.gz holding the module, reachable from the runner pod.
	// +optional
	// +kubebuilder:validation:MaxLength=2048
	// +kubebuilder:validation:Pattern="^https?://"
	URL string `json:"url,omitempty"`

	// Digest of the tarball at url, "sha256:<64 hex>"; a mismatch fails the run.
	// +optional
	// +kubebuilder:validation:Pattern="^sha256:[a-f0-9]{64}$"
	Digest string `json:"digest,omitempty"`

	// Git is a repository the runner clones (never the controller).
	// +optional
	Git *GitSource `json:"git,omitempty"`
}

// VarsReference reads variables from a Secret or ConfigMap in the Stack's namespace.
type VarsReference struct {
	// Kind of the object holding the values.
	// +required
	// +kubebuilder:validation:Enum=Secret;ConfigMap
	Kind string `json:"kind"`

	// Name of the Secret or ConfigMap.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`

	// Keys to read; every key when empty. A key's value is parsed as JSON
	// when it is valid JSON, otherwise used as a string.
	// +optional
	// +listType=set
	Keys []string `json:"keys,omitempty"`

	// Optional makes a missing object or key silently skipped instead of a
	// terminal error.
	// +optional
	Optional bool `json:"optional,omitempty"`
}

// DriftDetection configures drift checks.
type DriftDetection struct {
	// Mode: enabled (plan every interval and, under approvePlan: auto, repair),
	// warn (report only) or disabled. Defaults to the TerraceConfig, then enabled.
	// +optional
	Mode DriftDetectionMode `json:"mode,omitempty"`
}

// DependencyReference names a Stack that must be Ready first.
type DependencyReference struct {
	// Name of the Stack.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`

	// Namespace of the Stack, defaulting to this Stack's.
	// +optional
	// +kubebuilder:validation:MaxLength=63
	Namespace string `json:"namespace,omitempty"`
}

// OutputsSecret says where to write the Stack's outputs.
type OutputsSecret struct {
	// Name of the Secret, in the Stack's namespace, owned by the Stack.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`

	// Outputs to write; all when empty.
	// +optional
	// +listType=set
	Outputs []string `json:"outputs,omitempty"`

	// Labels added to the Secret.
	// +optional
	Labels map[string]string `json:"labels,omitempty"`

	// Annotations added to the Secret.
	// +optional
	Annotations map[string]string `json:"annotations,omitempty"`
}

// StackSpec is one deployment of a module.
type StackSpec struct {
	// Source of the module: exactly one of programRef, sourceRef and url.
	// +required
	Source StackSource `json:"source"`

	// Path is the module's directory inside the source.
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	// +kubebuilder:validation:XValidation:rule="!self.startsWith('/') && !self.matches('(^|/)[.][.](/|$)')",message="path must be relative and may not contain '..'"
	Path string `json:"path,omitempty"`

	// Workspace is the OpenTofu workspace.
	// +optional
	// +kubebuilder:default=default
	// +kubebuilder:validation:Pattern="^[A-Za-z0-9_-]{1,90}$"
	Workspace string `json:"workspace,omitempty"`

	// Vars maps variable names to values of any JSON type.
	// +optional
	Vars map[string]apiextensionsv1.JSON `json:"vars,omitempty"`

	// VarsFrom reads variables from Secrets and ConfigMaps; later entries win
	// over earlier ones and over vars. Values from Secrets never appear in
	// status, events or logs.
	// +optional
	VarsFrom []VarsReference `json:"varsFrom,omitempty"`

	// ApprovePlan: "auto" applies every plan; empty plans and waits; a plan id
	// approves that plan only.
	// +optional
	// +kubebuilder:validation:Pattern="^(auto|plan-[a-z0-9-]{1,80})?$"
	ApprovePlan string `json:"approvePlan,omitempty"`

	// PlanOnly stops every run after the plan.
	// +optional
	PlanOnly bool `json:"planOnly,omitempty"`

	// Suspend stops all runs until unset.
	// +optional
	Suspend bool `json:"suspend,omitempty"`

	// DestroyOnDelete destroys the Stack's resources when it is deleted.
	// Without it, deleting the Stack leaves them in place.
	// +optional
	DestroyOnDelete bool `json:"destroyOnDelete,omitempty"`

	// Interval between reconciles (and drift checks). Defaults to the
	// TerraceConfig, then 10m.
	// +optional
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:Pattern="^([0-9]+(\\.[0-9]+)?(ms|s|m|h))+$"
	Interval *metav1.Duration `json:"interval,omitempty"`

	// RetryInterval is the first wait after a failed run; it doubles on every
	// failure up to maxRetryInterval.
	// +optional
	// +kubebuilder:default="30s"
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:Pattern="^([0-9]+(\\.[0-9]+)?(ms|s|m|h))+$"
	RetryInterval *metav1.Duration `json:"retryInterval,omitempty"`

	// MaxRetryInterval caps the retry backoff.
	// +optional
	// +kubebuilder:default="1h"
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:Pattern="^([0-9]+(\\.[0-9]+)?(ms|s|m|h))+$"
	MaxRetryInterval *metav1.Duration `json:"maxRetryInterval,omitempty"`

	// Timeout of one run.
	// +optional
	// +kubebuilder:default="20m"
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:Pattern="^([0-9]+(\\.[0-9]+)?(ms|s|m|h))+$"
	Timeout *metav1.Duration `json:"timeout,omitempty"`

	// DriftDetection configures drift checks.
	// +optional
	DriftDetection *DriftDetection `json:"driftDetection,omitempty"`

	// DependsOn lists Stacks that must be Ready at their current generation first.
	// +optional
	DependsOn []DependencyReference `json:"dependsOn,omitempty"`

	// ServiceAccountName the runner pod runs as; defaults to the TerraceConfig's.
	// Any other account must be listed in the runner policy's
	// allowedServiceAccounts.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	ServiceAccountName string `json:"serviceAccountName,omitempty"`

	// Runner customises the runner pod.
	// +optional
	Runner *RunnerPodTemplate `json:"runner,omitempty"`

	// WriteOutputsToSecret writes the outputs to a Secret after each apply.
	// +optional
	WriteOutputsToSecret *OutputsSecret `json:"writeOutputsToSecret,omitempty"`

	// Backend keeps the Stack's state in a tofu backend of the team's own
	// (s3, gcs, azurerm, pg, http…) instead of Terrace's state server. The
	// runner policy may forbid it (allowOwnBackend). See docs/stacks.md for
	// the guarantees that are lost.
	// +optional
	Backend *StackBackend `json:"backend,omitempty"`

	// StoreReadablePlan stores a readable plan (sensitive values redacted)
	// next to the saved plan: none, json or human.
	// +optional
	// +kubebuilder:default=none
	StoreReadablePlan ReadablePlanFormat `json:"storeReadablePlan,omitempty"`

	// Targets limits plans to these resource addresses (tofu -target).
	// +optional
	// +kubebuilder:validation:MaxItems=100
	// +kubebuilder:validation:items:MaxLength=512
	Targets []string `json:"targets,omitempty"`

	// Parallelism bounds tofu's concurrent operations (-parallelism);
	// tofu's default (10) when unset.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=256
	Parallelism *int32 `json:"parallelism,omitempty"`

	// VarsFiles are .tfvars or .tfvars.json files inside the source,
	// relative to spec.path, read in order before vars and varsFrom (which
	// win). A path that leaves the source is refused.
	// +optional
	// +kubebuilder:validation:MaxItems=32
	// +kubebuilder:validation:items:MaxLength=1024
	VarsFiles []string `json:"varsFiles,omitempty"`

	// FileMappings write Secret keys as files in the module directory or
	// the home directory before init.
	// +optional
	// +kubebuilder:validation:MaxItems=32
	FileMappings []FileMapping `json:"fileMappings,omitempty"`

	// Refresh: false plans without refreshing the state against the world
	// (-refresh=false). Default true.
	// +optional
	Refresh *bool `json:"refresh,omitempty"`

	// Replace forces the replacement of these resource addresses in every
	// plan (-replace); remove them once applied.
	// +optional
	// +kubebuilder:validation:MaxItems=100
	// +kubebuilder:validation:items:MaxLength=512
	Replace []string `json:"replace,omitempty"`

	// HealthChecks are run by the runner pod after each apply; the result
	// is the HealthCheckPassed condition and part of the release record.
	// +optional
	// +kubebuilder:validation:MaxItems=32
	// +listType=map
	// +listMapKey=name
	HealthChecks []HealthCheck `json:"healthChecks,omitempty"`
}

// Stack is one deployment of an OpenTofu/Terraform module.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=stk
// +kubebuilder:printcolumn:name="Ready",type="string",JSONPath=".status.conditions[?(@.type==\"Ready\")].status"
// +kubebuilder:printcolumn:name="Status",type="string",JSONPath=".status.conditions[?(@.type==\"Ready\")].message"
// +kubebuilder:printcolumn:name="Plan",type="string",JSONPath=".status.plan.pending"
// +kubebuilder:printcolumn:name="Revision",type="string",JSONPath=".status.lastAppliedRevision",priority=1
// +kubebuilder:printcolumn:name="Age",type="date",JSONPath=".metadata.creationTimestamp"
type Stack struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// Spec is what to deploy, with which inputs.
	// +required
	Spec StackSpec `json:"spec"`

	// Status is maintained by the Stack controller.
	// +optional
	// +kubebuilder:default:={"observedGeneration":-1}
	Status StackStatus `json:"status,omitempty"`
}

// StackList is a list of Stacks.
// +kubebuilder:object:root=true
type StackList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Stack `json:"items"`
}

// GetConditions returns the status conditions.
func (in *Stack) GetConditions() []metav1.Condition { return in.Status.Conditions }

// SetConditions replaces the status conditions.
func (in *Stack) SetConditions(c []metav1.Condition) { in.Status.Conditions = c }

func init() {
	SchemeBuilder.Register(&Stack{}, &StackList{})
}
