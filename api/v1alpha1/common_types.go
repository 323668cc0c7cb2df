package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Condition types shared by every Terrace kind. They follow kstatus, so
// `kubectl wait --for=condition=Ready`, Flux and Argo CD understand them.
const (
	// ReadyCondition is True when the object's last outcome is the desired one.
	ReadyCondition = "Ready"
	// ReconcilingCondition is True while the controller works towards a new outcome.
	ReconcilingCondition = "Reconciling"
	// StalledCondition is True when the controller cannot progress until the user changes something.
	StalledCondition = "Stalled"
)

// ReconcileRequestAnnotation forces a reconcile when its value changes; the
// handled value is echoed in status.lastHandledReconcileAt.
const ReconcileRequestAnnotation = "terrace.dev/requestedAt"

// ReconcileRequestStatus records the last handled value of the
// terrace.dev/requestedAt annotation.
type ReconcileRequestStatus struct {
	// LastHandledReconcileAt is the value of the terrace.dev/requestedAt
	// annotation the controller last acted on.
	// +optional
	LastHandledReconcileAt string `json:"lastHandledReconcileAt,omitempty"`
}

// LocalObjectReference names an object in the same namespace.
type LocalObjectReference struct {
	// Name of the referent.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`
}

// SecretKeyReference names one key of a Secret in the same namespace.
type SecretKeyReference struct {
	// Name of the Secret.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`

	// Key in the Secret's data. Each field that uses this type documents its default.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	Key string `json:"key,omitempty"`
}

// ConfigMapKeyReference names one key of a ConfigMap in the same namespace.
type ConfigMapKeyReference struct {
	// Name of the ConfigMap.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`

	// Key in the ConfigMap's data. Each field that uses this type documents its default.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	Key string `json:"key,omitempty"`
}

// Artifact describes a tarball served for runners, in the shape Flux sources use.
type Artifact struct {
	// URL the artifact is served at.
	// +required
	URL string `json:"url"`

	// Revision is a human-readable identifier of the content, for a Program
	// "<generation>@sha256:<hex>".
	// +required
	Revision string `json:"revision"`

	// Digest is "sha256:<hex>" of exactly the bytes served at URL.
	// +required
	// +kubebuilder:validation:Pattern="^sha256:[a-f0-9]{64}$"
	Digest string `json:"digest"`

	// Size of the artifact in bytes.
	// +optional
	Size *int64 `json:"size,omitempty"`

	// LastUpdateTime is when the artifact last changed.
	// +required
	LastUpdateTime metav1.Time `json:"lastUpdateTime"`
}
