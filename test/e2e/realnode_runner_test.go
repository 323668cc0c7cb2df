package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/controller/outcome"
	"github.com/terrace-dev/terrace/internal/scheme"
)

// TestRunnerKilledByTheOOMKillerEndsInAClearCondition runs a Stack whose
// runner pod has a memory limit tofu cannot live in, on the real node: the
// kernel's OOM killer ends tofu inside the container's cgroup, and the Stack
// says so and what to raise, instead of "signal: killed".
func TestRunnerKilledByTheOOMKillerEndsInAClearCondition(t *testing.T) {
	// A dev cluster of its own: runs beside the others like it, after
	// the tests of the shared cluster (ownClusterTest).
	ownClusterTest(t)
	dev := startTerraceDev(t, t.TempDir())
	defer dev.interrupt(t)
	cfg, err := clientcmd.BuildConfigFromFlags("", dev.kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme.New()})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	ns := "oom"
	for _, obj := range []client.Object{
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}},
		&terracev1.Program{
			ObjectMeta: metav1.ObjectMeta{Name: "small", Namespace: ns},
			Spec:       terracev1.ProgramSpec{Files: map[string]terracev1.ProgramFile{"main.tf": `resource "terraform_data" "x" { input = 1 }`}},
		},
		&terracev1.Stack{
			ObjectMeta: metav1.ObjectMeta{Name: "small", Namespace: ns},
			Spec: terracev1.StackSpec{
				Source:      terracev1.StackSource{ProgramRef: &terracev1.LocalObjectReference{Name: "small"}},
				ApprovePlan: terracev1.ApprovePlanAuto,
				Runner: &terracev1.RunnerPodTemplate{Resources: &corev1.ResourceRequirements{
					Limits: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("6Mi")},
				}},
			},
		},
	} {
		if err := c.Create(ctx, obj); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, 2*time.Minute, "the Stack to say its runner ran out of memory", func() error {
		var s terracev1.Stack
		if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "small"}, &s); err != nil {
			return err
		}
		ready := outcome.Get(&s, terracev1.ReadyCondition)
		if ready == nil || ready.Status != metav1.ConditionFalse {
			return fmt.Errorf("Ready is %+v", ready)
		}
		for _, want := range []string{"out-of-memory killer", "6 MiB", "spec.runner.resources.limits.memory"} {
			if !strings.Contains(ready.Message, want) {
				return fmt.Errorf("Ready=False says %q, without %q", ready.Message, want)
			}
		}
		return nil
	})
}

// TestRunnerPastItsActiveDeadlineEndsInAClearCondition: the kubelet stops a
// runner pod at its activeDeadlineSeconds (the backstop that ends a run
// whose controller is gone). Here the running pod's deadline is shortened
// to have the kubelet act now: the Stack reports the kubelet's reason,
// keeps its state, and the retry applies the change.
func TestRunnerPastItsActiveDeadlineEndsInAClearCondition(t *testing.T) {
	e, before, _ := slowRunInProgress(t, "4")
	run := e.getStack(t, "slow").Status.CurrentRun
	var pods corev1.PodList
	if err := e.c.List(context.Background(), &pods, client.InNamespace(e.ns), client.MatchingLabels{"terrace.dev/stack": "slow", "terrace.dev/run": run}); err != nil || len(pods.Items) != 1 {
		t.Fatalf("the run's pods: %v, %v", len(pods.Items), err)
	}
	pod := &pods.Items[0]
	patch := client.MergeFrom(pod.DeepCopy())
	pod.Spec.ActiveDeadlineSeconds = ptr.To[int64](1)
	if err := e.c.Patch(context.Background(), pod, patch); err != nil {
		t.Fatal(err)
	}
	eventually(t, 2*time.Minute, "the Stack or its events to name the kubelet's DeadlineExceeded", func() error {
		var events corev1.EventList
		if err := e.c.List(context.Background(), &events, client.InNamespace(e.ns)); err != nil {
			return err
		}
		for _, ev := range events.Items {
			if ev.InvolvedObject.Kind == "Stack" && strings.Contains(ev.Message, "DeadlineExceeded") {
				t.Logf("event %s: %s", ev.Reason, ev.Message)
				return nil
			}
		}
		if text := conditionsText(e.getStack(t, "slow")); strings.Contains(text, "DeadlineExceeded") {
			return nil
		}
		return fmt.Errorf("no Stack event or condition names DeadlineExceeded among %d events", len(events.Items))
	})
	e.assertRecovered(t, before, "4")
}
