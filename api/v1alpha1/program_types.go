package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ProgramMaxTotalSize bounds the sum of all file contents of a Program, so the
// object stays comfortably below etcd's request limit.
const ProgramMaxTotalSize = 512 * 1024

// Program condition reasons.
const (
	// InvalidProgramReason means a file failed to parse; the message names file:line:col.
	InvalidProgramReason = "InvalidProgram"
	// ArtifactReadyReason means the Program is valid and its artifact is served.
	ArtifactReadyReason = "ArtifactReady"
)

// ProgramFile is the content of one file of a Program.
// +kubebuilder:validation:MaxLength=524288
type ProgramFile string

// ProgramSpec is an inline OpenTofu/Terraform module.
type ProgramSpec struct {
	// Files maps a relative file name (main.tf, variables.tf,
	// modules/net/main.tf, *.tf.json, *.tfvars, templates) to its content.
	// Names are relative, use "/" as separator, and have no empty, "." or ".."
	// segments. All contents together may not exceed 512 KiB.
	// +required
	// +kubebuilder:validation:MinProperties=1
	// +kubebuilder:validation:MaxProperties=256
	// +kubebuilder:validation:XValidation:rule="self.all(f, f.size() <= 255 && f.matches('^[A-Za-z0-9_.+@=-]+(/[A-Za-z0-9_.+@=-]+)*$') && !f.matches('(^|/)[.][.]?(/|$)'))",message="file names must be relative paths without empty, '.' or '..' segments"
	Files map[string]ProgramFile `json:"files"`
}

// ProgramStatus is the observed state of a Program.
type ProgramStatus struct {
	// ObservedGeneration is the last generation whose outcome is final.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// Conditions: Ready, Reconciling, Stalled.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`

	// Artifact is the tarball of the current generation, absent while the
	// generation is invalid.
	// +optional
	Artifact *Artifact `json:"artifact,omitempty"`

	ReconcileRequestStatus `json:",inline"`
}

// Program is an inline OpenTofu/Terraform module that Stacks can deploy.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=tfprog
// +kubebuilder:printcolumn:name="Ready",type="string",JSONPath=".status.conditions[?(@.type==\"Ready\")].status"
// +kubebuilder:printcolumn:name="Status",type="string",JSONPath=".status.conditions[?(@.type==\"Ready\")].message"
// +kubebuilder:printcolumn:name="Revision",type="string",JSONPath=".status.artifact.revision",priority=1
// +kubebuilder:printcolumn:name="Age",type="date",JSONPath=".metadata.creationTimestamp"
type Program struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// Spec holds the module's files.
	// +required
	Spec ProgramSpec `json:"spec"`

	// Status is maintained by the Program controller.
	// +optional
	// +kubebuilder:default:={"observedGeneration":-1}
	Status ProgramStatus `json:"status,omitempty"`
}

// ProgramList is a list of Programs.
// +kubebuilder:object:root=true
type ProgramList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Program `json:"items"`
}

// GetConditions returns the status conditions.
func (in *Program) GetConditions() []metav1.Condition { return in.Status.Conditions }

// SetConditions replaces the status conditions.
func (in *Program) SetConditions(c []metav1.Condition) { in.Status.Conditions = c }

func init() {
	SchemeBuilder.Register(&Program{}, &ProgramList{})
}
