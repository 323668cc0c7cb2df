package e2e

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/controller/stack"
)

// TestRunnerPodSpecCannotReachSecrets is issue 44 item 2 as the attack on
// the real node: a Stack author whose runner ServiceAccount may read no
// Secret names the namespace's Secret in spec.runner (a secret volume, a
// projected volume, a secretKeyRef env, envFrom), runs the pod as another
// account of the namespace that may read it, or labels and annotates the
// pod as Terrace's or unconfined. Each Stack is Stalled naming the field,
// no runner pod is ever created for it, and the Secret's value appears in
// no status or event. A Stack mounting a Secret its runner account may
// read runs, and so does a refused one once the read is granted.
func TestRunnerPodSpecCannotReachSecrets(t *testing.T) {
	e := newStackEnv(t)
	created := e.watchRunnerPods(t)
	e.program(t, tenancyProgram, tenancyModule)
	token := secretToken(t)
	e.create(t, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "victim"}, StringData: map[string]string{"password": token}})
	e.create(t, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "granted"}, StringData: map[string]string{"password": "fine"}})
	e.allowRunnerToRead(t, "granted")
	// An account of the namespace that may read every Secret, which no
	// config lists for runners.
	e.create(t, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "deployer"}})
	e.create(t, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "deployer-secrets"}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"get"}},
	}})
	e.create(t, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "deployer-secrets"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "deployer-secrets"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: "deployer", Namespace: e.ns}},
	})

	secretVolume := func(secret string) *terracev1.RunnerPodTemplate {
		return &terracev1.RunnerPodTemplate{
			Volumes:      []corev1.Volume{{Name: "loot", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: secret}}}},
			VolumeMounts: []corev1.VolumeMount{{Name: "loot", MountPath: "/loot", ReadOnly: true}},
		}
	}
	victim := corev1.LocalObjectReference{Name: "victim"}
	hostile := map[string]struct {
		change func(*terracev1.StackSpec)
		reason string
		field  string
	}{
		"secret-volume": {func(s *terracev1.StackSpec) { s.Runner = secretVolume("victim") },
			stack.RunnerObjectForbiddenReason, "spec.runner.volumes[0].secret.secretName"},
		"projected-volume": {func(s *terracev1.StackSpec) {
			s.Runner = &terracev1.RunnerPodTemplate{Volumes: []corev1.Volume{{Name: "loot", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{
				Sources: []corev1.VolumeProjection{{Secret: &corev1.SecretProjection{LocalObjectReference: victim}}},
			}}}}}
		}, stack.RunnerObjectForbiddenReason, "spec.runner.volumes[0].projected.sources[0].secret.name"},
		"secret-env": {func(s *terracev1.StackSpec) {
			s.Runner = &terracev1.RunnerPodTemplate{Env: []corev1.EnvVar{{Name: "LOOT", ValueFrom: &corev1.EnvVarSource{
				SecretKeyRef: &corev1.SecretKeySelector{LocalObjectReference: victim, Key: "password"}}}}}
		}, stack.RunnerObjectForbiddenReason, "spec.runner.env[0].valueFrom.secretKeyRef"},
		"env-from": {func(s *terracev1.StackSpec) {
			s.Runner = &terracev1.RunnerPodTemplate{EnvFrom: []corev1.EnvFromSource{{SecretRef: &corev1.SecretEnvSource{LocalObjectReference: victim}}}}
		}, stack.RunnerObjectForbiddenReason, "spec.runner.envFrom[0].secretRef"},
		"foreign-account": {func(s *terracev1.StackSpec) { s.ServiceAccountName = "deployer"; s.Runner = secretVolume("victim") },
			stack.RunnerPolicyViolationReason, "spec.serviceAccountName"},
		"terrace-label": {func(s *terracev1.StackSpec) {
			s.Runner = &terracev1.RunnerPodTemplate{Labels: map[string]string{"terrace.dev/warm-class": "default"}}
		}, stack.RunnerPolicyViolationReason, "spec.runner.labels[terrace.dev/warm-class]"},
		"unconfined": {func(s *terracev1.StackSpec) {
			s.Runner = &terracev1.RunnerPodTemplate{Annotations: map[string]string{"container.apparmor.security.beta.kubernetes.io/runner": "unconfined"}}
		}, stack.RunnerPolicyViolationReason, "spec.runner.annotations[container.apparmor.security.beta.kubernetes.io/runner]"},
	}
	for name, h := range hostile {
		s := tenancyStack(name, "")
		h.change(&s.Spec)
		e.create(t, s)
	}
	fine := tenancyStack("granted", "")
	fine.Spec.Runner = secretVolume("granted")
	e.create(t, fine)

	for name, h := range hostile {
		s := e.waitStack(t, name, stackTimeout, "refused", refusedWith(h.reason, h.field))
		if s.Status.LastAttemptedRevision != "" || s.Status.Plan != nil {
			t.Errorf("Stack %s was planned: %+v", name, s.Status)
		}
		e.assertNoSecretAnywhere(t, name, token)
	}
	e.waitStack(t, "granted", stackTimeout, "applied with the Secret its account may read", readyAt)
	for name := range hostile {
		if created.has(name) {
			t.Errorf("a runner pod was created for the refused Stack %s", name)
		}
	}
	if !created.has("granted") {
		t.Error("no runner pod was seen for the Stack that ran: the watch proves nothing")
	}

	// Granting the runner's account the read is all the Secret volume needs.
	e.allowRunnerToRead(t, "victim")
	e.updateStack(t, "secret-volume", func(s *terracev1.Stack) {
		if s.Annotations == nil {
			s.Annotations = map[string]string{}
		}
		s.Annotations[terracev1.ReconcileRequestAnnotation] = metav1.Now().String()
	})
	e.waitStack(t, "secret-volume", stackTimeout, "applied once granted", readyAt)
}
