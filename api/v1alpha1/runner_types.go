package v1alpha1

// What a runner pod may be: the parts a Stack sets (RunnerPodTemplate) and
// the TerraceConfig's runner settings and policy that bound them.

import (
	corev1 "k8s.io/api/core/v1"
)

// RunnerBinary is the infrastructure-as-code tool a runner executes.
// +kubebuilder:validation:Enum=tofu;terraform
type RunnerBinary string

const (
	BinaryTofu      RunnerBinary = "tofu"
	BinaryTerraform RunnerBinary = "terraform"
)

// RunnerConfig holds runner settings for the Stacks a config governs.
type RunnerConfig struct {
	// Image of the runner pods.
	// +optional
	Image string `json:"image,omitempty"`

	// Binary the runner executes: tofu or terraform.
	// +optional
	Binary RunnerBinary `json:"binary,omitempty"`

	// ServiceAccountName of runner pods when a Stack names none.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	ServiceAccountName string `json:"serviceAccountName,omitempty"`

	// Resources of the runner container.
	// +optional
	Resources *corev1.ResourceRequirements `json:"resources,omitempty"`

	// Env adds environment variables to every runner container.
	// +optional
	Env []corev1.EnvVar `json:"env,omitempty"`

	// Retain keeps runner pods after their run, for debugging.
	// +optional
	Retain *bool `json:"retain,omitempty"`

	// Warm is how many single-use runner pods are kept started ahead of
	// demand in each namespace this config governs that has Stacks, for
	// the runner class of a Stack that sets no spec.runner of its own and
	// no other image or ServiceAccount: a run claims one and a replacement
	// starts in the background. 0 (the default) starts a pod per run.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=64
	Warm *int32 `json:"warm,omitempty"`

	// Policy says what Stacks may set in spec.runner and
	// spec.serviceAccountName. The policy of the operator namespace's config
	// is the floor for the whole cluster; a namespace's config may only
	// narrow it (anything wider is ignored and reported in its status).
	// +optional
	Policy *RunnerPolicy `json:"policy,omitempty"`
}

// VolumeType names a volume source as the pod API spells it (configMap,
// secret, emptyDir, persistentVolumeClaim, ...).
// +kubebuilder:validation:Enum=hostPath;emptyDir;gcePersistentDisk;awsElasticBlockStore;gitRepo;secret;nfs;iscsi;glusterfs;persistentVolumeClaim;rbd;flexVolume;cinder;cephfs;flocker;downwardAPI;fc;azureFile;configMap;vsphereVolume;quobyte;azureDisk;photonPersistentDisk;projected;portworxVolume;scaleIO;storageos;csi;ephemeral;image
type VolumeType string

// RunnerPolicy bounds the runner pods Stacks may ask for. Unset fields take
// the floor's value (in the operator namespace: the built-in default).
// +kubebuilder:validation:XValidation:rule="!has(self.allowedVolumeTypes) || !self.allowedVolumeTypes.exists(t, t == 'hostPath')",message="hostPath volumes are never allowed for runner pods: they reach the node's filesystem"
type RunnerPolicy struct {
	// AllowedImages are patterns a runner image must match, as written in
	// the Stack or config ('*' matches within one path segment, '**' across them, '?' one character).
	// Default: only the default runner image (this config's runner.image in
	// the operator namespace, else the controller's own image).
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MinLength=1
	// +kubebuilder:validation:items:MaxLength=512
	AllowedImages []string `json:"allowedImages,omitempty"`

	// AllowedServiceAccounts are patterns of the ServiceAccount names (in the
	// Stack's own namespace) runner pods may run as; list the default
	// runner account too if Stacks that name none should run. Default:
	// only the namespace's default runner account (spec.runner.serviceAccountName
	// of the namespace's config, else of the operator namespace's, else
	// "default"). When the operator namespace's config lists none, a
	// namespace's list applies as written; when it lists some, a
	// namespace's list only narrows them.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MinLength=1
	// +kubebuilder:validation:items:MaxLength=253
	AllowedServiceAccounts []string `json:"allowedServiceAccounts,omitempty"`

	// DeniedServiceAccounts are names no runner pod may run as, in addition
	// to Terrace's own accounts (terrace-api, terrace-controller), which are
	// always denied.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MinLength=1
	// +kubebuilder:validation:items:MaxLength=253
	DeniedServiceAccounts []string `json:"deniedServiceAccounts,omitempty"`

	// AllowedVolumeTypes are the volume sources spec.runner.volumes may use.
	// hostPath is never allowed. Default: those of the restricted Pod
	// Security Standard (configMap, csi, downwardAPI, emptyDir, ephemeral,
	// persistentVolumeClaim, projected, secret).
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=32
	AllowedVolumeTypes []VolumeType `json:"allowedVolumeTypes,omitempty"`

	// AllowEnv says whether Stacks may set spec.runner.env and
	// spec.runner.envFrom, and mount Secrets (secret volumes, projected
	// Secrets, projected tokens for another audience), all of which can
	// expose the namespace's Secrets to module code. Either way, every
	// Secret, ConfigMap and claim spec.runner names must be one the
	// runner's ServiceAccount may get. Default: true.
	// +optional
	AllowEnv *bool `json:"allowEnv,omitempty"`

	// AllowPlacement says whether Stacks may set spec.runner.nodeSelector,
	// tolerations and affinity. Default: true.
	// +optional
	AllowPlacement *bool `json:"allowPlacement,omitempty"`

	// AllowOwnBackend says whether Stacks may set spec.backend, keeping
	// their state in a backend of their own instead of Terrace's state
	// server (its runner identity binding, migration and size limits then
	// do not apply). Default: true.
	// +optional
	AllowOwnBackend *bool `json:"allowOwnBackend,omitempty"`
}

// RunnerPodTemplate holds the parts of the runner pod a Stack may set,
// within the runner policy of its TerraceConfigs. Every Secret, ConfigMap
// and PersistentVolumeClaim it names (volumes, projected sources, env,
// envFrom), and a projected token for another audience, must be one the
// runner's ServiceAccount may get (create serviceaccounts/token for a
// token); otherwise the Stack stalls with RunnerObjectForbidden and no pod
// is made.
type RunnerPodTemplate struct {
	// Image of the runner; defaults to the TerraceConfig's, then the controller's own.
	// +optional
	Image string `json:"image,omitempty"`

	// Env adds environment variables to the runner container.
	// +optional
	Env []corev1.EnvVar `json:"env,omitempty"`

	// EnvFrom adds environment variables from Secrets or ConfigMaps.
	// +optional
	EnvFrom []corev1.EnvFromSource `json:"envFrom,omitempty"`

	// Resources of the runner container.
	// +optional
	Resources *corev1.ResourceRequirements `json:"resources,omitempty"`

	// NodeSelector for the runner pod.
	// +optional
	NodeSelector map[string]string `json:"nodeSelector,omitempty"`

	// Tolerations for the runner pod.
	// +optional
	Tolerations []corev1.Toleration `json:"tolerations,omitempty"`

	// Affinity for the runner pod.
	// +optional
	Affinity *corev1.Affinity `json:"affinity,omitempty"`

	// Volumes added to the runner pod.
	// +optional
	Volumes []corev1.Volume `json:"volumes,omitempty"`

	// VolumeMounts added to the runner container.
	// +optional
	VolumeMounts []corev1.VolumeMount `json:"volumeMounts,omitempty"`

	// Labels added to the runner pod. Keys of terrace.dev, kubernetes.io,
	// k8s.io and service meshes' domains are refused.
	// +optional
	Labels map[string]string `json:"labels,omitempty"`

	// Annotations added to the runner pod. Keys of terrace.dev,
	// kubernetes.io and k8s.io (AppArmor, seccomp...), container
	// runtimes', Multus' and service meshes' are refused.
	// +optional
	Annotations map[string]string `json:"annotations,omitempty"`
}
