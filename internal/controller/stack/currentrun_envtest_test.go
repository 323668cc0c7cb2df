package stack

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/launcher"
)

// The attack, after a run of the real controller: someone who may create
// pods and read Secrets in the Stack's namespace kept a copy of the run's
// TLS Secret and, once the run is over, creates its runner pod again (its
// name, its labels) to mount it. The run ended with its last command:
// status.currentRun is cleared by the run's final status (status.lastRun
// keeps its ID), and the state server's check refuses the run from any
// pod, even from one whose own UID its certificate would name.
func TestEnvtestAFinishedRunIsNoLongerCurrent(t *testing.T) {
	e := newSuiteEnv(t)
	e.stack("web", dataModule, map[string]string{"greeting": "done"}, func(st *terracev1.Stack) { st.Spec.ApprovePlan = terracev1.ApprovePlanAuto })
	st := e.waitFor("web", "Ready", readyAt)
	run := st.Status.LastRun
	if run == "" || st.Status.CurrentRun != "" {
		t.Fatalf("after the run: currentRun %q, lastRun %q; want no run current and the run kept as the last", st.Status.CurrentRun, run)
	}

	ctx := context.Background()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: e.ns, Name: launcher.PodName("web", run), Labels: map[string]string{
			launcher.LabelManagedBy: launcher.ManagedByTerrace, launcher.LabelComponent: launcher.ComponentRunner,
			launcher.LabelStack: launcher.StackLabelValue("web"), launcher.LabelRun: run,
		}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "runner", Image: "attacker"}}},
	}
	if err := e.c.Create(ctx, pod); err != nil {
		t.Fatal(err)
	}
	runs := &launcher.StackRuns{Stacks: e.c, Pods: e.c, Live: e.c}
	if ok, err := runs.IsCurrentRun(ctx, e.ns, "web", run, string(pod.UID)); err != nil || ok {
		t.Fatalf("the finished run %s from its runner pod created again: current %v (%v), want refused", run, ok, err)
	}
}
