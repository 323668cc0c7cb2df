package v1alpha1

import metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

// Condition types of health checks and plan policies.
const (
	// HealthCheckPassedCondition is True when every spec.healthChecks entry
	// passed after the last apply.
	HealthCheckPassedCondition = "HealthCheckPassed"
	// PolicyDeniedCondition is True when the TerraceConfig's plan policies
	// denied the latest plan; its message lists each violation.
	PolicyDeniedCondition = "PolicyDenied"
)

// FileMappingLocation says where a file mapping writes its file.
// +kubebuilder:validation:Enum=workDir;home
type FileMappingLocation string

const (
	// FileMappingWorkDir writes relative to the module directory (spec.path in the source).
	FileMappingWorkDir FileMappingLocation = "workDir"
	// FileMappingHome writes relative to the home directory tofu runs with
	// (a directory of the runner's own, set as HOME).
	FileMappingHome FileMappingLocation = "home"
)

// FileMapping writes one key of a Secret as a file before init, such as a
// cloud credentials file or a backend config.
type FileMapping struct {
	// SecretRef names the Secret (in the Stack's namespace, readable by the
	// runner's ServiceAccount) and the key whose value is the file's content.
	// +required
	SecretRef SecretKeyReference `json:"secretRef"`

	// Location is workDir (the module directory) or home.
	// +required
	Location FileMappingLocation `json:"location"`

	// Path of the file relative to the location; it may not leave it.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=512
	// +kubebuilder:validation:XValidation:rule="!self.startsWith('/') && !self.matches('(^|/)[.][.](/|$)')",message="path must be relative and may not contain '..'"
	Path string `json:"path"`
}

// HealthCheckType is the kind of a health check.
// +kubebuilder:validation:Enum=http;tcp
type HealthCheckType string

const (
	HealthCheckHTTP HealthCheckType = "http"
	HealthCheckTCP  HealthCheckType = "tcp"
)

// HealthCheck is a check the runner pod makes after each apply. url and
// address are Go templates over the Stack's outputs: {{ .outputs.url }}.
// +kubebuilder:validation:XValidation:rule="self.type != 'http' || has(self.url)",message="an http check needs url"
// +kubebuilder:validation:XValidation:rule="self.type != 'tcp' || has(self.address)",message="a tcp check needs address"
type HealthCheck struct {
	// Name of the check, unique in the Stack.
	// +required
	// +kubebuilder:validation:Pattern="^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"
	Name string `json:"name"`

	// Type: http (a GET of url) or tcp (a connection to address).
	// +required
	Type HealthCheckType `json:"type"`

	// URL of an http check, e.g. "{{ .outputs.url }}/healthz".
	// +optional
	// +kubebuilder:validation:MaxLength=2048
	URL string `json:"url,omitempty"`

	// Address of a tcp check, host:port, e.g. "{{ .outputs.host }}:5432".
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	Address string `json:"address,omitempty"`

	// ExpectedStatus of an http check's answer; default 200.
	// +optional
	// +kubebuilder:validation:Minimum=100
	// +kubebuilder:validation:Maximum=599
	ExpectedStatus int32 `json:"expectedStatus,omitempty"`

	// BodyMatch is a regular expression (RE2) the answer's body (its first
	// 64 KiB) must match.
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	BodyMatch string `json:"bodyMatch,omitempty"`

	// Timeout is how long the check keeps trying (once a second) before it
	// fails; default 30s, at most 10m.
	// +optional
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:Pattern="^([0-9]+(\\.[0-9]+)?(ms|s|m|h))+$"
	Timeout *metav1.Duration `json:"timeout,omitempty"`
}

// InventoryLimit is how many resource addresses status.inventory lists
// itself; a larger inventory is written to a Secret.
const InventoryLimit = 100

// Inventory lists the resources in the Stack's state.
type Inventory struct {
	// Count of resource instances in the state (managed resources, each
	// count/for_each instance counted).
	// +optional
	Count int32 `json:"count"`

	// Resources are the instances' addresses, sorted, when there are at
	// most 100 of them; otherwise see secretRef.
	// +optional
	// +kubebuilder:validation:MaxItems=100
	Resources []string `json:"resources,omitempty"`

	// SecretRef names the Secret (owned by the Stack) whose key "resources"
	// lists every address, one per line, when there are more than 100.
	// +optional
	SecretRef *LocalObjectReference `json:"secretRef,omitempty"`
}

// PlanPolicyStatus is the decision of the plan policies on the latest plan.
type PlanPolicyStatus struct {
	// Decision is allowed or denied.
	// +optional
	Decision string `json:"decision,omitempty"`

	// Violations are the deny rules' messages (at most 20 listed).
	// +optional
	// +kubebuilder:validation:MaxItems=20
	Violations []string `json:"violations,omitempty"`

	// Warnings are the warn rules' messages (at most 20 listed); they never block.
	// +optional
	// +kubebuilder:validation:MaxItems=20
	Warnings []string `json:"warnings,omitempty"`

	// PoliciesDigest identifies the policies the plan was checked against.
	// +optional
	PoliciesDigest string `json:"policiesDigest,omitempty"`
}

// PlanPolicyConfig names the ConfigMaps holding Rego policies every plan of
// the governed Stacks is checked against before any apply.
type PlanPolicyConfig struct {
	// ConfigMapRefs name ConfigMaps in the config's namespace; every key
	// ending in .rego is a module of package terrace whose deny rules block
	// an apply and whose warn rules annotate the plan.
	// +optional
	// +kubebuilder:validation:MaxItems=32
	ConfigMapRefs []LocalObjectReference `json:"configMapRefs,omitempty"`
}

// BackendLockStatus is a state lock held in a Stack's own backend, as the
// run that met it saw it.
type BackendLockStatus struct {
	// Message is tofu's account of the lock: its ID, holder, operation and
	// time where the backend records them.
	// +required
	// +kubebuilder:validation:MaxLength=4096
	Message string `json:"message"`

	// ObservedAt is when a run last met the lock.
	// +required
	ObservedAt metav1.Time `json:"observedAt"`
}
