package launcher

import (
	"time"

	corev1 "k8s.io/api/core/v1"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/runnerpolicy"
	"github.com/terrace-dev/terrace/internal/runphase"
)

// RunSpec describes one run's runner pod. Settings that a TerraceConfig can
// set arrive resolved (Stack → namespace config → default config); the pod
// template bits that only a Stack sets are read from Stack.Spec.Runner.
type RunSpec struct {
	// Stack owns the pod. Its namespace, name and UID are required; from
	// spec.runner the pod takes envFrom, nodeSelector, tolerations,
	// affinity, volumes, volumeMounts, labels and annotations.
	Stack *terracev1.Stack
	// RunID names the run (pod name, label, certificate identity): 1-40
	// lowercase letters, digits and '-'. NewRunID makes one.
	RunID string

	// Image of the runner; Options.DefaultImage when empty. Its entrypoint
	// must be the terrace binary.
	Image string
	// Binary is tofu (default) or terraform.
	Binary terracev1.RunnerBinary
	// ServiceAccountName the pod runs as; "default" when empty.
	ServiceAccountName string
	// Resources of the runner container; DefaultResources when nil.
	Resources *corev1.ResourceRequirements
	// Env is added to the runner container; a variable replaces an earlier
	// one of the same name (HOME, TMPDIR), except POD_IP, POD_NAME and POD_NAMESPACE.
	Env []corev1.EnvVar
	// ProviderMirror, when set, is a directory in the pod (image or volume)
	// that providers are installed from, exclusively.
	ProviderMirror string
	// Retain keeps the pod (and its Secret) after Close, for debugging. Only
	// the latest retained pod of a Stack is kept; it stops at its deadline.
	Retain bool
	// Timeout bounds the run: the pod's activeDeadlineSeconds is the
	// timeout plus the start timeout, and the certificate outlives both.
	// When zero: the time left until ctx's deadline, else the Stack's
	// spec.timeout, else DefaultRunTimeout.
	Timeout time.Duration

	// Policy is checked before anything is created; nil checks only what
	// holds whatever a config says (runnerpolicy.Minimal: no hostPath, none
	// of Terrace's own ServiceAccounts).
	Policy *runnerpolicy.Policy
	// ImageField and ServiceAccountField say where Image and
	// ServiceAccountName came from, for violation messages; empty means the
	// Stack's own fields.
	ImageField, ServiceAccountField string

	// Timings, when set, receives the run's pod phase: from Start until
	// the runner answers over mutual TLS (the run's StartDuration).
	Timings *runphase.Timings

	// ReadOnly runs a pull request's plan: the pod's certificate is the
	// run's read-only identity (pki.ReadOnlyRunnerIdentity), with which the
	// state server lets it read the Stack's state and nothing more. Such a
	// run never claims a warm pod (a warm pod is handed a run identity).
	ReadOnly bool
	// ForgeSecretName, when set, is mounted read-only at
	// ForgeCredentialsPath: the pull-request Secret of a run that calls the
	// forge (spec.source.git.pullRequests.secretRef).
	ForgeSecretName string
	// NoGitCredentials leaves spec.source.git.secretRef unmounted (a run
	// that clones nothing).
	NoGitCredentials bool
}
