package launcher

import (
	"context"
	"errors"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/runnerpolicy"
)

// TestPolicyViolationCreatesNothing starts runs the policy refuses: each
// fails with ErrPolicyViolation naming the field, and neither a pod nor a
// Secret was created.
func TestPolicyViolationCreatesNothing(t *testing.T) {
	onlyDefault, _ := runnerpolicy.Resolve(runnerpolicy.Layer{Source: "terrace-system/default"}, nil, "ghcr.io/terrace-dev/terrace:v1")
	deny := false
	noOwnBackend, _ := runnerpolicy.Resolve(runnerpolicy.Layer{Source: "terrace-system/default", Spec: &terracev1.RunnerPolicy{AllowOwnBackend: &deny}}, nil, "ghcr.io/terrace-dev/terrace:v1")
	tests := []struct {
		name   string
		policy *runnerpolicy.Policy
		spec   func(*RunSpec)
		field  string
	}{
		{"hostPath without any policy", nil, func(s *RunSpec) {
			s.Stack.Spec.Runner = &terracev1.RunnerPodTemplate{Volumes: []corev1.Volume{{Name: "root", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/"}}}}}
		}, "spec.runner.volumes[0].hostPath"},
		{"the API server's account without any policy", nil, func(s *RunSpec) { s.ServiceAccountName = "terrace-api" }, "spec.serviceAccountName"},
		{"a forged run label without any policy", nil, func(s *RunSpec) {
			s.Stack.Spec.Runner = &terracev1.RunnerPodTemplate{Labels: map[string]string{LabelRun: "forged"}}
		}, "spec.runner.labels[terrace.dev/run]"},
		{"an unconfined AppArmor profile without any policy", nil, func(s *RunSpec) {
			s.Stack.Spec.Runner = &terracev1.RunnerPodTemplate{Annotations: map[string]string{"container.apparmor.security.beta.kubernetes.io/runner": "unconfined"}}
		}, "spec.runner.annotations[container.apparmor.security.beta.kubernetes.io/runner]"},
		{"another account than the config's", &onlyDefault, func(s *RunSpec) { s.ServiceAccountName = "deployer" }, "spec.serviceAccountName"},
		{"an image the policy does not list", &onlyDefault, func(s *RunSpec) { s.Image = "evil/image" }, "spec.runner.image"},
		{"a config's image, named as such", &onlyDefault, func(s *RunSpec) {
			s.Image, s.ImageField = "evil/image", "spec.runner.image of TerraceConfig team/default"
		}, "spec.runner.image of TerraceConfig team/default"},
		// The controller checks this before it launches; the launcher holds
		// the line for a Stack that changed (or a caller that skipped it).
		{"a backend of the Stack's own under allowOwnBackend: false", &noOwnBackend, func(s *RunSpec) {
			s.Stack.Spec.Backend = &terracev1.StackBackend{Type: "pg"}
		}, "spec.backend"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := testLauncher(t)
			spec := RunSpec{Stack: testStack(), RunID: "r1", Policy: tt.policy}
			tt.spec(&spec)
			_, err := l.Start(context.Background(), spec)
			var v runnerpolicy.Violations
			if !errors.Is(err, ErrPolicyViolation) || !errors.As(err, &v) || !slices.Equal(v.Fields(), []string{tt.field}) {
				t.Fatalf("err = %v, want a violation of %s", err, tt.field)
			}
			cs := l.opts.Client.(*fake.Clientset)
			pods, _ := cs.CoreV1().Pods("team-a").List(context.Background(), metav1.ListOptions{})
			secrets, _ := cs.CoreV1().Secrets("team-a").List(context.Background(), metav1.ListOptions{})
			if len(pods.Items)+len(secrets.Items) != 0 {
				t.Fatalf("a refused run created %d pods and %d Secrets", len(pods.Items), len(secrets.Items))
			}
		})
	}
	// The default image passes the same policy.
	l := testLauncher(t)
	if _, err := l.plan(context.Background(), RunSpec{Stack: testStack(), RunID: "r1", Policy: &onlyDefault}); err != nil {
		t.Fatalf("the default image is refused: %v", err)
	}
	// A Stack of its own backend passes a policy that allows it.
	own := RunSpec{Stack: testStack(), RunID: "r1", Policy: &onlyDefault}
	own.Stack.Spec.Backend = &terracev1.StackBackend{Type: "pg"}
	if _, err := l.plan(context.Background(), own); err != nil {
		t.Fatalf("an allowed own backend is refused: %v", err)
	}
}
