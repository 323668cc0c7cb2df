package stack

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/controller/outcome"
	terracesettings "github.com/terrace-dev/terrace/internal/settings"
)

const runnerAccessOperatorNS = "terrace-system"

// runnerAccessReconciler resolves configs and asks reviews as the
// controller does, against a fake API server whose authorizer allows
// only grants.
func runnerAccessReconciler(auth *authorizer, objs ...client.Object) *Reconciler {
	c := auth.client(objs...)
	return &Reconciler{Client: c, APIReader: c, Configs: &terracesettings.Resolver{
		Reader: c, OperatorNamespace: runnerAccessOperatorNS, Builtin: terracesettings.BuiltinDefaults("ghcr.io/terrace-dev/terrace:v1"),
	}}
}

func stackWithRunner(tmpl *terracev1.RunnerPodTemplate, sa string) *terracev1.Stack {
	return &terracev1.Stack{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: outputsNS, UID: "uid-web"},
		Spec: terracev1.StackSpec{Runner: tmpl, ServiceAccountName: sa}}
}

func victimRef() corev1.LocalObjectReference { return corev1.LocalObjectReference{Name: "victim"} }

// runnerAttacks are issue 44 item 2 as the attack: a Stack author with no
// right to read Secrets names the namespace's Secret victim (another
// Stack's state, an encryption key...) in spec.runner, so that the kubelet
// mounts it into the runner pod and the module exports it; or runs the
// pod as an account with more rights; or labels and annotates it out of
// its confinement.
var runnerAttacks = []struct {
	name   string
	tmpl   *terracev1.RunnerPodTemplate
	sa     string
	reason string
	field  string
	says   []string
}{
	{name: "a Secret volume", tmpl: &terracev1.RunnerPodTemplate{
		Volumes:      []corev1.Volume{{Name: "loot", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "victim"}}}},
		VolumeMounts: []corev1.VolumeMount{{Name: "loot", MountPath: "/loot"}},
	}, reason: RunnerObjectForbiddenReason, field: "spec.runner.volumes[0].secret.secretName", says: []string{"Secret team/victim", "(get secrets)"}},
	{name: "a projected volume", tmpl: &terracev1.RunnerPodTemplate{
		Volumes: []corev1.Volume{{Name: "loot", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{Sources: []corev1.VolumeProjection{
			{DownwardAPI: &corev1.DownwardAPIProjection{}},
			{Secret: &corev1.SecretProjection{LocalObjectReference: victimRef(), Optional: ptr.To(true)}},
		}}}}},
	}, reason: RunnerObjectForbiddenReason, field: "spec.runner.volumes[0].projected.sources[1].secret.name", says: []string{"Secret team/victim"}},
	{name: "a token for another audience", tmpl: &terracev1.RunnerPodTemplate{
		Volumes: []corev1.Volume{{Name: "tok", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{Sources: []corev1.VolumeProjection{
			{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{Audience: "vault", Path: "token"}},
		}}}}},
	}, reason: RunnerObjectForbiddenReason, field: "spec.runner.volumes[0].projected.sources[0].serviceAccountToken", says: []string{"a token of ServiceAccount team/default", "(create serviceaccounts/token)"}},
	{name: "a secretKeyRef env", tmpl: &terracev1.RunnerPodTemplate{
		Env: []corev1.EnvVar{{Name: "LOOT", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{LocalObjectReference: victimRef(), Key: "password"}}}},
	}, reason: RunnerObjectForbiddenReason, field: "spec.runner.env[0].valueFrom.secretKeyRef", says: []string{"Secret team/victim"}},
	{name: "envFrom a Secret", tmpl: &terracev1.RunnerPodTemplate{
		EnvFrom: []corev1.EnvFromSource{{SecretRef: &corev1.SecretEnvSource{LocalObjectReference: victimRef()}}},
	}, reason: RunnerObjectForbiddenReason, field: "spec.runner.envFrom[0].secretRef", says: []string{"Secret team/victim"}},
	{name: "a claim of another Stack", tmpl: &terracev1.RunnerPodTemplate{
		Volumes: []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "victim"}}}},
	}, reason: RunnerObjectForbiddenReason, field: "spec.runner.volumes[0].persistentVolumeClaim.claimName", says: []string{"PersistentVolumeClaim team/victim"}},
	{name: "a foreign ServiceAccount", sa: "deployer",
		reason: RunnerPolicyViolationReason, field: "spec.serviceAccountName", says: []string{`ServiceAccount "deployer" is not allowed`}},
	{name: "a terrace.dev label", tmpl: &terracev1.RunnerPodTemplate{Labels: map[string]string{"terrace.dev/stack": "prod-db"}},
		reason: RunnerPolicyViolationReason, field: "spec.runner.labels[terrace.dev/stack]", says: []string{"Terrace's own"}},
	{name: "an unconfined AppArmor annotation", tmpl: &terracev1.RunnerPodTemplate{Annotations: map[string]string{"container.apparmor.security.beta.kubernetes.io/runner": "unconfined"}},
		reason: RunnerPolicyViolationReason, field: "spec.runner.annotations[container.apparmor.security.beta.kubernetes.io/runner]", says: []string{"AppArmor"}},
}

// TestRunnerPodSpecAttacksAreRefused runs each attack through the
// controller's config step: each is a terminal error with its reason,
// naming the field, so no run (and no pod) starts. The Secret exists or
// not: the answer is the same. No review is asked for a Stack the policy
// refuses, and none for a Stack without spec.runner.
func TestRunnerPodSpecAttacksAreRefused(t *testing.T) {
	const password = "do-not-touch"
	victim := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "victim", Namespace: outputsNS}, Data: map[string][]byte{"password": []byte(password)}}
	for _, exists := range []bool{true, false} {
		for _, tt := range runnerAttacks {
			t.Run(fmt.Sprintf("%s (the Secret exists: %v)", tt.name, exists), func(t *testing.T) {
				auth := &authorizer{}
				var objs []client.Object
				if exists {
					objs = append(objs, victim.DeepCopy())
				}
				r := runnerAccessReconciler(auth, objs...)
				s := &scope{stack: stackWithRunner(tt.tmpl, tt.sa)}
				err := r.resolveConfig(context.Background(), s)
				var terminal *outcome.TerminalError
				if !errors.As(err, &terminal) || terminal.Reason != tt.reason {
					t.Fatalf("err = %v, want terminal %s", err, tt.reason)
				}
				msg := err.Error()
				for _, want := range append([]string{tt.field}, tt.says...) {
					if !strings.Contains(msg, want) {
						t.Errorf("message %q does not say %q", msg, want)
					}
				}
				if strings.Contains(msg, password) {
					t.Fatalf("the message holds the Secret's value: %q", msg)
				}
				if tt.reason == RunnerPolicyViolationReason && len(auth.reviews) != 0 {
					t.Errorf("a refused Stack's objects were reviewed: %+v", auth.reviews)
				}
				if tt.reason == RunnerObjectForbiddenReason {
					for _, want := range []string{"ServiceAccount default", "kubectl -n team create rolebinding", "--serviceaccount=team:default"} {
						if !strings.Contains(msg, want) {
							t.Errorf("message %q does not say %q", msg, want)
						}
					}
				}
			})
		}
	}
	auth := &authorizer{}
	if err := runnerAccessReconciler(auth).resolveConfig(context.Background(), &scope{stack: stackWithRunner(nil, "")}); err != nil || len(auth.reviews) != 0 {
		t.Fatalf("a Stack without spec.runner: %v, reviews %+v", err, auth.reviews)
	}
}

// TestRunnerObjectsTheServiceAccountMayReadAreAllowed: the same pod specs
// pass once the runner's ServiceAccount may get what they name (the
// namespace's RBAC already gave it to whoever runs as it), and the
// reviews are the account's, in the Stack's namespace, with its groups.
func TestRunnerObjectsTheServiceAccountMayReadAreAllowed(t *testing.T) {
	tmpl := &terracev1.RunnerPodTemplate{
		Volumes: []corev1.Volume{
			{Name: "creds", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "app-creds"}}},
			{Name: "both", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{Sources: []corev1.VolumeProjection{
				{Secret: &corev1.SecretProjection{LocalObjectReference: corev1.LocalObjectReference{Name: "app-creds"}}},
				{ConfigMap: &corev1.ConfigMapProjection{LocalObjectReference: corev1.LocalObjectReference{Name: "settings"}}},
				{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{Audience: "vault", Path: "token"}},
			}}}},
		},
		Env:     []corev1.EnvVar{{Name: "TOKEN", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "app-creds"}, Key: "token"}}}},
		EnvFrom: []corev1.EnvFromSource{{ConfigMapRef: &corev1.ConfigMapEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "settings"}}}},
		Labels:  map[string]string{"team": "payments"},
	}
	const user = "system:serviceaccount:team:deployer"
	auth := &authorizer{grants: map[string]bool{
		user + " get secrets/app-creds":                 true,
		user + " get configmaps/settings":               true,
		user + " create serviceaccounts/token/deployer": true,
	}}
	// The namespace's admin lets Stacks run as deployer.
	cfg := &terracev1.TerraceConfig{ObjectMeta: metav1.ObjectMeta{Name: terracev1.TerraceConfigName, Namespace: outputsNS},
		Spec: terracev1.TerraceConfigSpec{Runner: &terracev1.RunnerConfig{Policy: &terracev1.RunnerPolicy{AllowedServiceAccounts: []string{"default", "deployer"}}}}}
	r := runnerAccessReconciler(auth, cfg)
	s := &scope{stack: stackWithRunner(tmpl, "deployer")}
	if err := r.resolveConfig(context.Background(), s); err != nil {
		t.Fatalf("objects the runner's account may read: %v", err)
	}
	if len(auth.reviews) != 3 {
		t.Fatalf("want one review per object (3), got %d: %+v", len(auth.reviews), auth.reviews)
	}
	for _, rv := range auth.reviews {
		if rv.User != user || !strings.Contains(strings.Join(rv.Groups, ","), "system:serviceaccounts:team") || rv.ResourceAttributes.Namespace != outputsNS {
			t.Errorf("review %+v", rv)
		}
	}
	// One grant revoked: refused again, naming only that object.
	delete(auth.grants, user+" get configmaps/settings")
	err := r.resolveConfig(context.Background(), &scope{stack: stackWithRunner(tmpl, "deployer")})
	var terminal *outcome.TerminalError
	if !errors.As(err, &terminal) || terminal.Reason != RunnerObjectForbiddenReason ||
		!strings.Contains(err.Error(), "spec.runner.volumes[1].projected.sources[1].configMap.name, spec.runner.envFrom[0].configMapRef: ConfigMap team/settings") ||
		strings.Contains(err.Error(), "app-creds") {
		t.Fatalf("after the revocation: %v", err)
	}
}
