package v1alpha1

import (
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
)

// StackBackend is a tofu backend block the Stack's state is kept in instead
// of Terrace's state server: for state that must stay where it is.
type StackBackend struct {
	// Type of the backend: s3, gcs, azurerm, pg, http, consul, kubernetes…
	// The local backend is refused: a runner pod's disk is gone after its run.
	// +required
	// +kubebuilder:validation:Pattern="^[a-z][a-z0-9_]{0,31}$"
	// +kubebuilder:validation:XValidation:rule="self != 'local'",message="the local backend keeps state in the runner pod, which is gone after the run: name a remote backend"
	Type string `json:"type"`

	// Config holds the backend block's attributes. Anyone who can read the
	// Stack sees them: put secrets in credentials.
	// +optional
	// +kubebuilder:validation:MaxProperties=64
	Config map[string]apiextensionsv1.JSON `json:"config,omitempty"`

	// Credentials set environment variables of tofu from Secret keys in the
	// Stack's namespace, which the runner's ServiceAccount must be allowed to get.
	// +optional
	// +kubebuilder:validation:MaxItems=32
	// +listType=map
	// +listMapKey=env
	Credentials []BackendCredential `json:"credentials,omitempty"`
}

// BackendCredential is one environment variable of tofu taken from a Secret key.
type BackendCredential struct {
	// Env is the variable's name, e.g. PG_CONN_STR or AWS_SECRET_ACCESS_KEY.
	// TF_* variables other than TF_HTTP_* are Terrace's own and refused.
	// +required
	// +kubebuilder:validation:Pattern="^[A-Za-z_][A-Za-z0-9_]{0,127}$"
	// +kubebuilder:validation:XValidation:rule="!self.startsWith('TF_') || self.startsWith('TF_HTTP_')",message="TF_* variables other than TF_HTTP_* are set by Terrace"
	Env string `json:"env"`

	// SecretKeyRef names the Secret (in the Stack's namespace) and its key.
	// +required
	// +kubebuilder:validation:XValidation:rule="size(self.key) > 0",message="secretKeyRef.key is required"
	SecretKeyRef SecretKeyReference `json:"secretKeyRef"`

	// AsFile writes the value to a file (mode 0600) in the run's work
	// directory and sets env to the file's path instead, for variables
	// that name a file (GOOGLE_APPLICATION_CREDENTIALS, AWS_SHARED_CREDENTIALS_FILE).
	// +optional
	AsFile bool `json:"asFile,omitempty"`
}
