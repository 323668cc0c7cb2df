package launcher

import (
	"fmt"
	"maps"
	"regexp"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/runnerbin"
)

// The runner container's layout. Paths under the emptyDir and Secret
// mounts are passed as flags: the runner assumes no layout of its own.
const (
	containerName = "runner"
	tlsVolume     = "terrace-tls"
	workVolume    = "terrace-work"
	tmpVolume     = "terrace-tmp"
	gitVolume     = "terrace-git-credentials"
	forgeVolume   = "terrace-forge-credentials"
	tlsMountPath  = "/etc/terrace/tls"
	workMountPath = "/var/lib/terrace/work"
	tmpMountPath  = "/var/lib/terrace/tmp"
	grpcPortName  = "grpc"
	healthPortNm  = "health"

	// runnerUID is distroless' "nonroot"; explicit so runAsNonRoot holds
	// whatever USER the image declares.
	runnerUID = int64(65532)

	// interruptGrace is how long the runner lets tofu stop after SIGTERM
	// (releasing its state lock); the pod's grace period leaves room after it.
	interruptGrace   = 2 * time.Minute
	terminationGrace = interruptGrace + 30*time.Second
)

// GitCredentialsPath is where a runner pod mounts the Secret of
// spec.source.git.secretRef, read-only: the runner reads the credentials
// there, so they reach no process but the pod's and never travel over
// the controller's connection.
const GitCredentialsPath = "/etc/terrace/git"

// ForgeCredentialsPath is where a runner pod mounts RunSpec.ForgeSecretName,
// read-only: the runner reads the forge's token there.
const ForgeCredentialsPath = "/etc/terrace/forge"

// DefaultRunTimeout is a run's timeout when neither RunSpec, ctx nor the
// Stack says otherwise (the Stack API's default).
const DefaultRunTimeout = 20 * time.Minute

// reservedEnv are variables the runner's flags depend on; user env cannot replace them.
var reservedEnv = map[string]bool{"POD_IP": true, "POD_NAME": true, "POD_NAMESPACE": true}

var runIDPattern = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)

// maxRunIDLength keeps pod names readable and within a DNS label.
const maxRunIDLength = 40

// DefaultResources are the runner container's resources when RunSpec sets none.
func DefaultResources() corev1.ResourceRequirements {
	return corev1.ResourceRequirements{
		Requests: corev1.ResourceList{
			corev1.ResourceCPU:    resource.MustParse("100m"),
			corev1.ResourceMemory: resource.MustParse("256Mi"),
		},
		Limits: corev1.ResourceList{
			corev1.ResourceMemory: resource.MustParse("2Gi"),
		},
	}
}

// podParams is everything a runner pod is built from, resolved.
type podParams struct {
	spec         RunSpec
	image        string
	grpcPort     int32
	healthPort   int32
	deadline     time.Duration // activeDeadlineSeconds
	secretName   string
	stackOwner   metav1.OwnerReference
	podName      string
	runnerLabels map[string]string
}

// buildPod makes the runner pod: restricted security context, read-only
// root with emptyDirs for the work and temp directories, the run's TLS
// Secret at /etc/terrace/tls; no probe (the controller's dial is the test).
func buildPod(p podParams) *corev1.Pod {
	spec := p.spec
	tmpl := spec.Stack.Spec.Runner
	if tmpl == nil {
		tmpl = &terracev1.RunnerPodTemplate{}
	}
	binary := string(spec.Binary)
	if binary == "" {
		binary = string(terracev1.BinaryTofu)
	}
	sa := spec.ServiceAccountName
	if sa == "" {
		sa = "default"
	}
	resources := DefaultResources()
	if spec.Resources != nil {
		resources = *spec.Resources.DeepCopy()
	}

	// The runner binds the pod's own address only (not a hostNetwork
	// pod's every address). The brackets make the address valid for IPv4
	// and IPv6 alike.
	args := []string{
		fmt.Sprintf("--listen=[$(POD_IP)]:%d", p.grpcPort),
		fmt.Sprintf("--health-listen=[$(POD_IP)]:%d", p.healthPort),
		"--tls-dir=" + tlsMountPath,
		"--work-dir=" + workMountPath,
		"--binary=" + binary,
		"--interrupt-grace=" + interruptGrace.String(),
	}
	if spec.ProviderMirror != "" {
		args = append(args, "--provider-mirror="+spec.ProviderMirror)
	}

	env := []corev1.EnvVar{
		fieldEnv("POD_IP", "status.podIP"),
		fieldEnv("POD_NAME", "metadata.name"),
		fieldEnv("POD_NAMESPACE", "metadata.namespace"),
		// The root filesystem is read-only: home and temporary files live
		// in emptyDirs (tofu itself uses <work-dir>/tmp).
		{Name: "HOME", Value: workMountPath},
		{Name: "TMPDIR", Value: tmpMountPath},
	}
	env = mergeEnv(env, spec.Env)

	labels := map[string]string{}
	maps.Copy(labels, tmpl.Labels)
	maps.Copy(labels, p.runnerLabels)
	var annotations map[string]string
	if len(tmpl.Annotations) > 0 {
		annotations = maps.Clone(tmpl.Annotations)
	}

	volumes := []corev1.Volume{
		{Name: tlsVolume, VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{
			SecretName: p.secretName, DefaultMode: ptr.To(int32(0o440)),
		}}},
		{Name: workVolume, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
		{Name: tmpVolume, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
	}
	volumes = append(volumes, deepCopyVolumes(tmpl.Volumes)...)
	mounts := []corev1.VolumeMount{
		{Name: tlsVolume, MountPath: tlsMountPath, ReadOnly: true},
		{Name: workVolume, MountPath: workMountPath},
		{Name: tmpVolume, MountPath: tmpMountPath},
	}
	if g := spec.Stack.Spec.Source.Git; g != nil && g.SecretRef != nil && !spec.NoGitCredentials {
		volumes = append(volumes, corev1.Volume{Name: gitVolume, VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{
			SecretName: g.SecretRef.Name, DefaultMode: ptr.To(int32(0o440)),
		}}})
		mounts = append(mounts, corev1.VolumeMount{Name: gitVolume, MountPath: GitCredentialsPath, ReadOnly: true})
	}
	if spec.ForgeSecretName != "" {
		volumes = append(volumes, corev1.Volume{Name: forgeVolume, VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{
			SecretName: spec.ForgeSecretName, DefaultMode: ptr.To(int32(0o440)),
		}}})
		mounts = append(mounts, corev1.VolumeMount{Name: forgeVolume, MountPath: ForgeCredentialsPath, ReadOnly: true})
	}
	for _, m := range tmpl.VolumeMounts {
		mounts = append(mounts, *m.DeepCopy())
	}
	var envFrom []corev1.EnvFromSource
	for _, e := range tmpl.EnvFrom {
		envFrom = append(envFrom, *e.DeepCopy())
	}
	var tolerations []corev1.Toleration
	for _, t := range tmpl.Tolerations {
		tolerations = append(tolerations, *t.DeepCopy())
	}

	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name:            p.podName,
			Namespace:       spec.Stack.Namespace,
			Labels:          labels,
			Annotations:     annotations,
			OwnerReferences: []metav1.OwnerReference{p.stackOwner},
		},
		Spec: corev1.PodSpec{
			ServiceAccountName: sa,
			// The module may talk to the cluster as the Stack's ServiceAccount.
			AutomountServiceAccountToken:  ptr.To(true),
			RestartPolicy:                 corev1.RestartPolicyNever,
			EnableServiceLinks:            ptr.To(false),
			TerminationGracePeriodSeconds: ptr.To(int64(terminationGrace / time.Second)),
			ActiveDeadlineSeconds:         ptr.To(int64((p.deadline + time.Second - 1) / time.Second)),
			NodeSelector:                  maps.Clone(tmpl.NodeSelector),
			Tolerations:                   tolerations,
			Affinity:                      tmpl.Affinity.DeepCopy(),
			SecurityContext: &corev1.PodSecurityContext{
				RunAsNonRoot:   ptr.To(true),
				RunAsUser:      ptr.To(runnerUID),
				RunAsGroup:     ptr.To(runnerUID),
				FSGroup:        ptr.To(runnerUID),
				SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
			},
			Volumes: volumes,
			Containers: []corev1.Container{{
				Name:  containerName,
				Image: p.image,
				// The lean runner binary: the terrace entrypoint would
				// start with twice the work and memory.
				Command: []string{runnerbin.ImagePath},
				Args:    args,
				Ports: []corev1.ContainerPort{
					{Name: grpcPortName, ContainerPort: p.grpcPort, Protocol: corev1.ProtocolTCP},
					{Name: healthPortNm, ContainerPort: p.healthPort, Protocol: corev1.ProtocolTCP},
				},
				Env:          env,
				EnvFrom:      envFrom,
				Resources:    resources,
				VolumeMounts: mounts,
				// No readiness probe: nothing reads a runner pod's readiness
				// (the controller dials it as soon as it runs), and a probe
				// every second costs the kubelet a request per pod per
				// second and each pod a status write more (Ready after
				// Running). /readyz still answers on the health port.
				TerminationMessagePolicy: corev1.TerminationMessageReadFile,
				SecurityContext: &corev1.SecurityContext{
					RunAsNonRoot:             ptr.To(true),
					Privileged:               ptr.To(false),
					AllowPrivilegeEscalation: ptr.To(false),
					ReadOnlyRootFilesystem:   ptr.To(true),
					Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
					SeccompProfile:           &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
				},
			}},
		},
	}
	return pod
}

func fieldEnv(name, path string) corev1.EnvVar {
	return corev1.EnvVar{Name: name, ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: path}}}
}

// mergeEnv appends extra to base; a later variable replaces an earlier one
// of the same name (moving to its later position, so $(VAR) references
// keep working), except the reserved variables the runner's flags use.
func mergeEnv(base, extra []corev1.EnvVar) []corev1.EnvVar {
	out := append([]corev1.EnvVar(nil), base...)
	for _, e := range extra {
		if reservedEnv[e.Name] {
			continue
		}
		for i := range out {
			if out[i].Name == e.Name {
				out = append(out[:i], out[i+1:]...)
				break
			}
		}
		out = append(out, *e.DeepCopy())
	}
	return out
}

func deepCopyVolumes(in []corev1.Volume) []corev1.Volume {
	var out []corev1.Volume
	for _, v := range in {
		out = append(out, *v.DeepCopy())
	}
	return out
}

// buildSecret holds the run's leaf; createPodAndSecret makes the pod its owner.
func buildSecret(name string, p podParams, data map[string][]byte, labels map[string]string) *corev1.Secret {
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			Name:      name,
			Namespace: p.spec.Stack.Namespace,
			Labels:    labels,
		},
		Type:      corev1.SecretTypeTLS,
		Immutable: ptr.To(true),
		Data:      data,
	}
}

// stackOwnerRef makes the Stack the pod's controller; blockOwnerDeletion is
// off so deleting a Stack never waits on its runner pods.
func stackOwnerRef(stack *terracev1.Stack) metav1.OwnerReference {
	return metav1.OwnerReference{
		APIVersion:         terracev1.GroupVersion.String(),
		Kind:               "Stack",
		Name:               stack.Name,
		UID:                stack.UID,
		Controller:         ptr.To(true),
		BlockOwnerDeletion: ptr.To(false),
	}
}

// podOwnerRef makes the pod own its TLS Secret, so the Secret goes with it.
func podOwnerRef(pod *corev1.Pod) metav1.OwnerReference {
	return metav1.OwnerReference{
		APIVersion:         "v1",
		Kind:               "Pod",
		Name:               pod.Name,
		UID:                pod.UID,
		Controller:         ptr.To(true),
		BlockOwnerDeletion: ptr.To(false),
	}
}
