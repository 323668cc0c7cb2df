// Package settings resolves the settings that govern a Stack (Stack fields →
// the TerraceConfig of its namespace → the one in the operator's namespace →
// built-in defaults, field by field): the runner, its policy, where state is
// kept and which PostgreSQL servers a config may name. It reads
// TerraceConfigs and reconciles nothing; the TerraceConfig reconciler
// (internal/controller/config), the Stack reconciler, the state backends and
// the CLI all read settings from here.
package settings

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"time"

	corev1 "k8s.io/api/core/v1"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/runnerpolicy"
)

// Built-in defaults, used when neither the Stack nor any TerraceConfig sets a field.
const (
	DefaultBinary             = terracev1.BinaryTofu
	DefaultServiceAccountName = runnerpolicy.DefaultServiceAccountName
	DefaultStateBackend       = terracev1.StateBackendSecrets
	DefaultHistory            = int32(10)
	DefaultInterval           = 10 * time.Minute
	DefaultDriftMode          = terracev1.DriftDetectionEnabled

	// DefaultPostgresURLKey is the Secret key of postgres.connectionSecretRef when it names none.
	DefaultPostgresURLKey = "url"
	// DefaultEncryptionKeyKey is the Secret key of encryption.keySecretRef when it names none.
	DefaultEncryptionKeyKey = "key"

	// BuiltinSource names the built-in defaults in Effective.Sources.
	BuiltinSource = "built-in"
)

// SecretKeyRef names one key of a Secret. The Secret lives in the namespace
// of the TerraceConfig that named it, which need not be the Stack's.
type SecretKeyRef struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	Key       string `json:"key"`
}

// KeyOrDefault is the Secret key a reference names, or def when it names
// none (see DefaultPostgresURLKey, DefaultEncryptionKeyKey).
func KeyOrDefault(key, def string) string {
	if key == "" {
		return def
	}
	return key
}

// String renders the reference as namespace/name[key], for messages.
func (r SecretKeyRef) String() string { return r.Namespace + "/" + r.Name + "[" + r.Key + "]" }

// Effective is the settings of one Stack (or, from ResolveNamespace, of a
// namespace) after resolution.
type Effective struct {
	RunnerImage        string                       `json:"runnerImage"`
	Binary             terracev1.RunnerBinary       `json:"binary"`
	ServiceAccountName string                       `json:"serviceAccountName"`
	Resources          *corev1.ResourceRequirements `json:"resources,omitempty"`
	// Env is the config's variables followed by the Stack's; a Stack
	// variable replaces a config variable of the same name.
	Env    []corev1.EnvVar `json:"env,omitempty"`
	Retain bool            `json:"retain"`
	// Warm is the number of warm runner pods per runner class (spec.runner.warm).
	Warm int32 `json:"warm,omitempty"`

	// RunnerPolicy is the operator's floor narrowed by the namespace's
	// config; it is not resolved field by field.
	RunnerPolicy runnerpolicy.Policy `json:"runnerPolicy"`
	// RunnerPolicyNotes say what a config asked of the policy that does
	// not take effect. They are not part of Hash.
	RunnerPolicyNotes []runnerpolicy.Note `json:"-"`
	// RunnerImageField and ServiceAccountField say where RunnerImage and
	// ServiceAccountName came from, for policy violations. Not part of Hash.
	RunnerImageField    string `json:"-"`
	ServiceAccountField string `json:"-"`

	StateBackend terracev1.StateBackend `json:"stateBackend"`
	// PostgresConnection is set only when StateBackend is postgres.
	PostgresConnection *SecretKeyRef `json:"postgresConnection,omitempty"`
	// NamedPostgresConnection is the connection the nearest config names,
	// whatever the backend: a migration away from postgres reads from it.
	// It is not part of Hash.
	NamedPostgresConnection *SecretKeyRef `json:"-"`
	// StateBackendSource names the layer StateBackend came from, as in
	// Sources: the config whose change of backend moves this namespace's
	// state. It is not part of Hash.
	StateBackendSource string `json:"-"`
	// EncryptionKey is nil when state is not encrypted.
	EncryptionKey *SecretKeyRef `json:"encryptionKey,omitempty"`
	History       int32         `json:"history"`

	Interval  time.Duration                `json:"interval"`
	DriftMode terracev1.DriftDetectionMode `json:"driftMode"`

	// Sources lists, nearest first, what contributed at least one field:
	// "namespace/default" for a TerraceConfig, "built-in" for the defaults.
	// It is not part of Hash.
	Sources []string `json:"-"`

	// PlanPolicies are the ConfigMaps of Rego policies every plan is
	// checked against: the operator namespace's config's and the
	// namespace's own, all of them. Not part of Hash (the policies'
	// contents are part of a Stack's inputs instead).
	PlanPolicies []PolicyConfigMap `json:"-"`
}

// PolicyConfigMap is a ConfigMap holding plan policies.
type PolicyConfigMap struct {
	Namespace, Name string
	// Source names the config that references it ("ns/default").
	Source string
}

// BuiltinDefaults returns the built-in settings, with the controller's own
// image as the runner image.
func BuiltinDefaults(runnerImage string) Effective {
	return Effective{
		RunnerImage:        runnerImage,
		Binary:             DefaultBinary,
		ServiceAccountName: DefaultServiceAccountName,
		StateBackend:       DefaultStateBackend,
		History:            DefaultHistory,
		Interval:           DefaultInterval,
		DriftMode:          DefaultDriftMode,
	}
}

// CheckRunner returns runnerpolicy.Violations when the policy refuses the
// runner pod stack would get: its spec.runner and the image and
// ServiceAccount resolved for it (from the Stack or a config).
func (e Effective) CheckRunner(stack *terracev1.Stack) error {
	pod := e.runnerPod(stack.Spec.Runner)
	if b := stack.Spec.Backend; b != nil {
		pod.OwnBackend = b.Type
	}
	return e.RunnerPolicy.Check(pod)
}

// CheckConfigRunner is CheckRunner for a Stack that sets nothing: whether
// the configs' own runner image and ServiceAccount are allowed.
func (e Effective) CheckConfigRunner() error {
	return e.RunnerPolicy.Check(e.runnerPod(nil))
}

func (e Effective) runnerPod(tmpl *terracev1.RunnerPodTemplate) runnerpolicy.Pod {
	return runnerpolicy.Pod{
		Template: tmpl,
		Image:    e.RunnerImage, ImageField: e.RunnerImageField,
		ServiceAccountName: e.ServiceAccountName, ServiceAccountField: e.ServiceAccountField,
	}
}

// Hash identifies the effective values (not Sources): equal settings give
// equal hashes, across processes and restarts.
func (e Effective) Hash() string {
	return hashJSON(e)
}

// StorageHash identifies only the settings that decide where and how state
// is stored (backend, PostgreSQL connection, encryption key, history).
func (e Effective) StorageHash() string {
	return hashJSON(struct {
		Backend    terracev1.StateBackend
		Postgres   *SecretKeyRef
		Encryption *SecretKeyRef
		History    int32
	}{e.StateBackend, e.PostgresConnection, e.EncryptionKey, e.History})
}

// SpecHash identifies a TerraceConfig's spec, as Hash does effective settings.
func SpecHash(spec terracev1.TerraceConfigSpec) string {
	return hashJSON(spec)
}

func hashJSON(v any) string {
	// json.Marshal of structs, slices and resource.Quantity is deterministic.
	raw, err := json.Marshal(v)
	if err != nil {
		panic("settings: effective settings must marshal: " + err.Error())
	}
	sum := sha256.Sum256(raw)
	return hex.EncodeToString(sum[:12])
}
