package e2e

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/controller/config"
	"github.com/terrace-dev/terrace/internal/controller/stack"
	"github.com/terrace-dev/terrace/internal/launcher"
)

// TestRunnerPolicyRefusesHostileStacks is issue 10 item 3 as the attack: a
// Stack author asks for a runner pod that reaches beyond the namespace's
// RBAC (the node's filesystem, Terrace's own ServiceAccounts, an image of
// their choosing, the namespace's Secrets through envFrom, a node of their
// choosing). Each Stack is refused with RunnerPolicyViolation naming the
// field, no pod is ever created for it, and the controller goes on serving
// this namespace and another.
func TestRunnerPolicyRefusesHostileStacks(t *testing.T) {
	e := newStackEnv(t)
	created := e.watchRunnerPods(t)
	e.program(t, "bench", map[string]string{"main.tf": benchModule})
	// The namespace admin narrows the floor (no env, no placement) and
	// tries to widen it (any image).
	e.create(t, &terracev1.TerraceConfig{
		ObjectMeta: metav1.ObjectMeta{Name: terracev1.TerraceConfigName},
		Spec: terracev1.TerraceConfigSpec{Runner: &terracev1.RunnerConfig{Policy: &terracev1.RunnerPolicy{
			AllowedImages: []string{"**"}, AllowEnv: ptr.To(false), AllowPlacement: ptr.To(false),
		}}},
	})
	e.create(t, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "victim"}, StringData: map[string]string{"password": "do-not-touch"}})

	hostile := map[string]struct {
		change func(*terracev1.StackSpec)
		field  string
	}{
		"host-path": {func(s *terracev1.StackSpec) {
			s.Runner = &terracev1.RunnerPodTemplate{Volumes: []corev1.Volume{{Name: "root", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/"}}}}}
		}, "spec.runner.volumes[0].hostPath"},
		"evil-image":      {func(s *terracev1.StackSpec) { s.Runner = &terracev1.RunnerPodTemplate{Image: "evil/image:latest"} }, "spec.runner.image"},
		"api-account":     {func(s *terracev1.StackSpec) { s.ServiceAccountName = config.APIName }, "spec.serviceAccountName"},
		"control-account": {func(s *terracev1.StackSpec) { s.ServiceAccountName = "terrace-controller" }, "spec.serviceAccountName"},
		"env-from-secret": {func(s *terracev1.StackSpec) {
			s.Runner = &terracev1.RunnerPodTemplate{EnvFrom: []corev1.EnvFromSource{{SecretRef: &corev1.SecretEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "victim"}}}}}
		}, "spec.runner.envFrom[0].secretRef"},
		"node-selector": {func(s *terracev1.StackSpec) {
			s.Runner = &terracev1.RunnerPodTemplate{NodeSelector: map[string]string{"node-role.kubernetes.io/control-plane": ""}}
		}, "spec.runner.nodeSelector"},
	}
	for name, h := range hostile {
		s := benchStack(t, name, 1)
		h.change(&s.Spec)
		e.create(t, s)
	}
	// A well-behaved Stack next to them, and one in another namespace.
	e.create(t, benchStack(t, "fine", 2))
	other := newStackEnv(t)
	other.program(t, "bench", map[string]string{"main.tf": benchModule})
	other.create(t, benchStack(t, "elsewhere", 3))

	for name, h := range hostile {
		s := e.waitStack(t, name, stackTimeout, "refused by the runner policy", conditionIs(terracev1.StalledCondition, metav1.ConditionTrue, stack.RunnerPolicyViolationReason))
		ready := meta.FindStatusCondition(s.Status.Conditions, terracev1.ReadyCondition)
		if ready == nil || ready.Status != metav1.ConditionFalse || ready.Reason != stack.RunnerPolicyViolationReason || !strings.Contains(ready.Message, h.field) {
			t.Errorf("Stack %s: Ready %+v, want False/%s naming %s", name, ready, stack.RunnerPolicyViolationReason, h.field)
		}
		if s.Status.LastAppliedRevision != "" || s.Status.Plan != nil {
			t.Errorf("Stack %s was planned or applied: %+v", name, s.Status)
		}
	}
	e.waitStack(t, "fine", stackTimeout, "applied", readyAt)
	other.waitStack(t, "elsewhere", stackTimeout, "applied", readyAt)

	for name := range hostile {
		if created.has(name) {
			t.Errorf("a runner pod was created for the refused Stack %s", name)
		}
	}
	if !created.has("fine") {
		t.Error("no runner pod was seen for the Stack that ran: the watch proves nothing")
	}
	// The victim Secret is as it was.
	var victim corev1.Secret
	if err := e.c.Get(context.Background(), client.ObjectKey{Namespace: e.ns, Name: "victim"}, &victim); err != nil || string(victim.Data["password"]) != "do-not-touch" {
		t.Errorf("victim Secret changed: %v %q", err, victim.Data)
	}
	// The namespace config is told which of its widenings do not count.
	var cfg terracev1.TerraceConfig
	eventually(t, stackTimeout, "the TerraceConfig reporting its narrowed policy", func() error {
		if err := e.c.Get(context.Background(), client.ObjectKey{Namespace: e.ns, Name: terracev1.TerraceConfigName}, &cfg); err != nil {
			return err
		}
		c := meta.FindStatusCondition(cfg.Status.Conditions, config.RunnerPolicyNarrowedCondition)
		if c == nil || c.Status != metav1.ConditionTrue || !strings.Contains(c.Message, `allowedImages: "**"`) {
			return fmt.Errorf("condition %+v", c)
		}
		return nil
	})

	// Fixing the Stack is all it takes.
	e.updateStack(t, "node-selector", func(s *terracev1.Stack) { s.Spec.Runner = nil })
	e.waitStack(t, "node-selector", stackTimeout, "applied once fixed", readyAt)
}

// TestNamespaceRunnerImageStaysOutOfTheAPIServer is issue 10 item 5 as the
// attack: a namespace admin names their own runner image and enables the
// Installations API. The API server still runs the controller's image (it
// sees every caller's token), and Stacks are not run from the image either,
// since the operator's floor does not allow it.
func TestNamespaceRunnerImageStaysOutOfTheAPIServer(t *testing.T) {
	e := newStackEnv(t)
	created := e.watchRunnerPods(t)
	e.program(t, "bench", map[string]string{"main.tf": benchModule})
	e.create(t, &terracev1.TerraceConfig{
		ObjectMeta: metav1.ObjectMeta{Name: terracev1.TerraceConfigName},
		Spec: terracev1.TerraceConfigSpec{
			Runner: &terracev1.RunnerConfig{Image: "evil/image"},
			API:    &terracev1.APIConfig{Enabled: true},
		},
	})
	e.create(t, benchStack(t, "web", 1))

	var dep appsv1.Deployment
	eventually(t, stackTimeout, "the API server Deployment", func() error {
		return e.c.Get(context.Background(), client.ObjectKey{Namespace: e.ns, Name: config.APIName}, &dep)
	})
	if img := dep.Spec.Template.Spec.Containers[0].Image; img != terraceImage {
		t.Fatalf("the API server runs %q, want the controller's own image %q", img, terraceImage)
	}
	s := e.waitStack(t, "web", stackTimeout, "refused by the runner policy", conditionIs(terracev1.StalledCondition, metav1.ConditionTrue, stack.RunnerPolicyViolationReason))
	if msg := meta.FindStatusCondition(s.Status.Conditions, terracev1.ReadyCondition).Message; !strings.Contains(msg, "spec.runner.image of TerraceConfig "+e.ns+"/default") {
		t.Errorf("Ready message %q does not name the config's image", msg)
	}
	if created.has("web") {
		t.Error("a runner pod was created from the namespace's image")
	}
}

// runnerPodWatch records the Stacks runner pods were created for.
type runnerPodWatch struct {
	mu     sync.Mutex
	stacks map[string]bool
}

func (w *runnerPodWatch) has(stack string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.stacks[stack]
}

// watchRunnerPods records every runner pod created in the namespace from
// now on, even one deleted right away, until the test ends.
func (e *stackEnv) watchRunnerPods(t *testing.T) *runnerPodWatch {
	t.Helper()
	w, err := e.cs.CoreV1().Pods(e.ns).Watch(context.Background(), metav1.ListOptions{
		LabelSelector: launcher.LabelComponent + "=" + launcher.ComponentRunner,
	})
	if err != nil {
		t.Fatal(err)
	}
	seen := &runnerPodWatch{stacks: map[string]bool{}}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ev := range w.ResultChan() {
			if pod, ok := ev.Object.(*corev1.Pod); ok && ev.Type == watch.Added {
				seen.mu.Lock()
				seen.stacks[pod.Labels[launcher.LabelStack]] = true
				seen.mu.Unlock()
			}
		}
	}()
	t.Cleanup(func() { w.Stop(); <-done })
	return seen
}
