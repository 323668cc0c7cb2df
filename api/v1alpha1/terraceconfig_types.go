package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TerraceConfigName is the only name a TerraceConfig may have, which makes
// it one per namespace.
const TerraceConfigName = "default"

// StateBackend is where state, plans and releases are kept.
// +kubebuilder:validation:Enum=secrets;postgres
type StateBackend string

const (
	StateBackendSecrets  StateBackend = "secrets"
	StateBackendPostgres StateBackend = "postgres"
)

// PostgresConfig says how to reach PostgreSQL.
type PostgresConfig struct {
	// ConnectionSecretRef names a Secret key (default "url") holding a
	// PostgreSQL connection URL.
	// +required
	ConnectionSecretRef SecretKeyReference `json:"connectionSecretRef"`
}

// EncryptionConfig enables AES-256-GCM encryption of state and plans.
type EncryptionConfig struct {
	// KeySecretRef names a Secret key (default "key") holding 32 bytes, raw or base64.
	// +required
	KeySecretRef SecretKeyReference `json:"keySecretRef"`
}

// StateConfig says where state, plans and releases are kept.
// +kubebuilder:validation:XValidation:rule="!has(self.backend) || self.backend != 'postgres' || has(self.postgres)",message="backend postgres requires postgres.connectionSecretRef"
type StateConfig struct {
	// Backend: secrets (in the Stack's namespace) or postgres.
	// +optional
	Backend StateBackend `json:"backend,omitempty"`

	// Postgres connection, required by backend postgres.
	// +optional
	Postgres *PostgresConfig `json:"postgres,omitempty"`

	// Encryption of state and saved plans at rest.
	// +optional
	Encryption *EncryptionConfig `json:"encryption,omitempty"`

	// History is how many state versions and release records to keep per Stack.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1000
	History *int32 `json:"history,omitempty"`
}

// APIConfig runs the Installations API server for the namespace.
type APIConfig struct {
	// Enabled runs the API server.
	// +optional
	Enabled bool `json:"enabled,omitempty"`

	// Replicas of the API server.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=10
	Replicas *int32 `json:"replicas,omitempty"`

	// TokenAudiences are audiences one of which a caller's token must also
	// be issued for (its aud claim); the Kubernetes API server must accept
	// the token as well, since the API server passes it on. Default: any
	// token the Kubernetes API server accepts.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=16
	// +kubebuilder:validation:items:MinLength=1
	// +kubebuilder:validation:items:MaxLength=253
	// +kubebuilder:validation:items:Pattern=`^[^,\s]+$`
	TokenAudiences []string `json:"tokenAudiences,omitempty"`

	// Clusters are the other clusters API servers may act in: a request
	// names one in its cluster field (empty: the cluster the server runs
	// in). Callers send a token of that cluster, which the server passes on
	// as it does at home; it holds no credentials of its own there. Only the
	// operator namespace's TerraceConfig (the cluster default) registers
	// clusters, for every API server, since a cluster is where callers'
	// tokens are sent; in any other namespace's config they are refused
	// (APIServerReady=False, reason APIClustersNotAllowed) and never used.
	// +optional
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=32
	Clusters []APICluster `json:"clusters,omitempty"`

	// OIDC offers sign-in to the web console with an OpenID Connect
	// provider (the authorization code flow with PKCE); the console then
	// sends the ID token as the bearer token, so the Kubernetes API server
	// must accept that provider's tokens (its --oidc-* flags or structured
	// authentication configuration). Without it the console takes pasted
	// tokens only.
	// +optional
	OIDC *APIOIDC `json:"oidc,omitempty"`
}

// APIOIDC is the web console's OpenID Connect client.
// +kubebuilder:validation:XValidation:rule="!has(self.scopes) || !self.scopes.exists(s, s == 'openid')",message="scopes are those asked for beyond openid, which is always asked for: remove openid"
type APIOIDC struct {
	// IssuerURL is the provider; its /.well-known/openid-configuration is
	// read by the API server, and it must be the issuer the Kubernetes API
	// server trusts.
	// +required
	// +kubebuilder:validation:MaxLength=2048
	// +kubebuilder:validation:Pattern=`^https://`
	IssuerURL string `json:"issuerURL"`

	// ClientID is the console's client ID at the provider (the audience of
	// its ID tokens, which the Kubernetes API server must accept).
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	ClientID string `json:"clientID"`

	// ClientSecretRef names the Secret of this namespace holding the client
	// secret (key default "client-secret"); it is mounted into the API
	// server's pod, never put on its command line. Empty for a public
	// client, PKCE alone.
	// +optional
	ClientSecretRef *SecretKeyReference `json:"clientSecretRef,omitempty"`

	// RedirectURL is the console's callback as the provider knows it:
	// https://<the console's host>/oidc/callback.
	// +required
	// +kubebuilder:validation:MaxLength=2048
	// +kubebuilder:validation:Pattern=`^https://[^/]+(/.*)?/oidc/callback$`
	RedirectURL string `json:"redirectURL"`

	// CABundleRef names a ConfigMap of this namespace holding the PEM
	// certificates to trust for the provider (key default "ca.crt"), beside
	// the system's roots: for a provider whose certificate a private CA
	// issued. It is mounted into the API server's pod and read when the
	// server starts (`kubectl rollout restart` its Deployment after a change).
	// +optional
	CABundleRef *ConfigMapKeyReference `json:"caBundleRef,omitempty"`

	// Scopes to ask for beyond openid (e.g. email, groups).
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=16
	// +kubebuilder:validation:items:MinLength=1
	// +kubebuilder:validation:items:MaxLength=253
	// +kubebuilder:validation:items:Pattern=`^[^,\s]+$`
	Scopes []string `json:"scopes,omitempty"`
}

// DefaultOIDCClientSecretKey is the key of spec.api.oidc.clientSecretRef
// when it names none.
const DefaultOIDCClientSecretKey = "client-secret"

// DefaultOIDCCABundleKey is the key of spec.api.oidc.caBundleRef when it
// names none.
const DefaultOIDCCABundleKey = "ca.crt"

// APICluster is a cluster the API server may act in.
type APICluster struct {
	// Name is what a request's cluster field says.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	Name string `json:"name"`

	// Server is the https:// URL of the cluster's Kubernetes API server.
	// +required
	// +kubebuilder:validation:MaxLength=2048
	// +kubebuilder:validation:Pattern=`^https://`
	Server string `json:"server"`

	// CABundle is the PEM CA bundle that signs the server's certificate
	// (public data, so inline rather than in a Secret); the system's roots
	// when empty.
	// +optional
	// +kubebuilder:validation:MaxLength=65536
	CABundle string `json:"caBundle,omitempty"`

	// Namespace is the namespace acted in there; the API server's own
	// namespace's name when empty (the usual choice: each API server then
	// acts in the same-named namespace there).
	// +optional
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	Namespace string `json:"namespace,omitempty"`
}

// StackDefaults are defaults for the Stacks a config governs.
type StackDefaults struct {
	// Interval between reconciles of a Stack that sets none.
	// +optional
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:Pattern="^([0-9]+(\\.[0-9]+)?(ms|s|m|h))+$"
	Interval *metav1.Duration `json:"interval,omitempty"`

	// DriftDetection for a Stack that sets none.
	// +optional
	DriftDetection *DriftDetection `json:"driftDetection,omitempty"`
}

// TerraceConfigSpec holds settings for a namespace. Fields left empty fall
// back, one by one, to the TerraceConfig in the operator's namespace and then
// to built-in defaults.
type TerraceConfigSpec struct {
	// Runner settings.
	// +optional
	Runner *RunnerConfig `json:"runner,omitempty"`

	// State storage settings.
	// +optional
	State *StateConfig `json:"state,omitempty"`

	// API server settings.
	// +optional
	API *APIConfig `json:"api,omitempty"`

	// Defaults for Stacks.
	// +optional
	Defaults *StackDefaults `json:"defaults,omitempty"`

	// PlanPolicy checks every plan of the governed Stacks against Rego
	// policies before it is applied. The operator namespace's policies and
	// the namespace's own both apply.
	// +optional
	PlanPolicy *PlanPolicyConfig `json:"planPolicy,omitempty"`
}

// StateBackendStatus reports which backend is in use and any migration.
type StateBackendStatus struct {
	// Current backend serving runs.
	// +optional
	Current StateBackend `json:"current,omitempty"`

	// Target backend of a migration in progress.
	// +optional
	Target StateBackend `json:"target,omitempty"`

	// Phase of the migration: Migrating, Verified or Failed.
	// +optional
	Phase string `json:"phase,omitempty"`

	// Migrated is how many Stacks have been copied and verified.
	// +optional
	Migrated int32 `json:"migrated,omitempty"`

	// Total is how many Stacks the migration covers.
	// +optional
	Total int32 `json:"total,omitempty"`

	// Message explains the phase.
	// +optional
	Message string `json:"message,omitempty"`
}

// TerraceConfigStatus is the observed state of a TerraceConfig.
type TerraceConfigStatus struct {
	// ObservedGeneration is the last generation whose outcome is final.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// Conditions: Ready, Reconciling, Stalled.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`

	// StateBackend reports the backend in use and migration progress.
	// +optional
	StateBackend *StateBackendStatus `json:"stateBackend,omitempty"`

	ReconcileRequestStatus `json:",inline"`
}

// TerraceConfig holds runner, storage and API settings for its namespace; the
// one in the operator's namespace is the cluster default. Its name must be "default".
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=tcfg
// +kubebuilder:validation:XValidation:rule="self.metadata.name == 'default'",message="a TerraceConfig must be named default (one per namespace)"
// +kubebuilder:printcolumn:name="Ready",type="string",JSONPath=".status.conditions[?(@.type==\"Ready\")].status"
// +kubebuilder:printcolumn:name="Backend",type="string",JSONPath=".status.stateBackend.current"
// +kubebuilder:printcolumn:name="Age",type="date",JSONPath=".metadata.creationTimestamp"
type TerraceConfig struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// Spec holds the settings.
	// +optional
	Spec TerraceConfigSpec `json:"spec,omitempty"`

	// Status is maintained by the TerraceConfig controller.
	// +optional
	// +kubebuilder:default:={"observedGeneration":-1}
	Status TerraceConfigStatus `json:"status,omitempty"`
}

// TerraceConfigList is a list of TerraceConfigs.
// +kubebuilder:object:root=true
type TerraceConfigList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []TerraceConfig `json:"items"`
}

// GetConditions returns the status conditions.
func (in *TerraceConfig) GetConditions() []metav1.Condition { return in.Status.Conditions }

// SetConditions replaces the status conditions.
func (in *TerraceConfig) SetConditions(c []metav1.Condition) { in.Status.Conditions = c }

func init() {
	SchemeBuilder.Register(&TerraceConfig{}, &TerraceConfigList{})
}
