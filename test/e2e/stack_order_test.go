package e2e

import (
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/controller/outcome"
)

// TestStackDependsOnAndSuspend: a Stack waits for its dependency, runs
// once the dependency is Ready, and a suspended Stack runs nothing.
func TestStackDependsOnAndSuspend(t *testing.T) {
	e := newStackEnv(t)
	e.program(t, "bench", map[string]string{"main.tf": benchModule})

	// The dependency starts suspended, so the dependent must wait.
	base := benchStack(t, "base", 1)
	base.Spec.Suspend = true
	app := base.DeepCopy()
	app.Name = "app"
	app.Spec.Suspend = false
	app.Spec.Vars = jsonVars(t, map[string]any{"n": 2})
	app.Spec.DependsOn = []terracev1.DependencyReference{{Name: "base"}}
	e.create(t, base)
	e.create(t, app)

	e.waitStack(t, "app", stackTimeout, "waiting on base", conditionIs(terracev1.DependenciesReadyCondition, metav1.ConditionFalse, "DependencyNotReady"))
	if st := e.getStack(t, "base"); st.Status.LastAttemptedRevision != "" || outcome.IsTrue(st, terracev1.ReadyCondition) {
		t.Fatalf("a suspended Stack ran: %s", conditionsText(st))
	}
	if st := e.getStack(t, "app"); st.Status.LastAttemptedRevision != "" {
		t.Fatalf("the dependent ran before its dependency was Ready")
	}

	e.updateStack(t, "base", func(s *terracev1.Stack) { s.Spec.Suspend = false })
	e.waitStack(t, "base", stackTimeout, "Ready once resumed", readyAt)
	app = e.waitStack(t, "app", stackTimeout, "Ready after its dependency", readyAt)
	if !outcome.IsTrue(app, terracev1.DependenciesReadyCondition) {
		t.Errorf("DependenciesReady not True: %s", conditionsText(app))
	}
	baseReady := outcome.Get(e.getStack(t, "base"), terracev1.ReadyCondition).LastTransitionTime
	appApplied := outcome.Get(app, terracev1.AppliedCondition)
	if appApplied == nil || appApplied.LastTransitionTime.Before(&baseReady) {
		t.Errorf("app applied at %v, before base was Ready at %v", appApplied, baseReady)
	}
}

// TestStackCrossNamespaceDependencyIsRefused: the controller runs without
// --allow-cross-namespace-refs, so a dependency in another namespace is a
// terminal condition that names the flag, and nothing runs.
func TestStackCrossNamespaceDependencyIsRefused(t *testing.T) {
	e := newStackEnv(t)
	e.program(t, "bench", map[string]string{"main.tf": benchModule})
	app := benchStack(t, "app", 1)
	app.Spec.DependsOn = []terracev1.DependencyReference{{Name: "network", Namespace: "platform"}}
	e.create(t, app)
	st := e.waitStack(t, "app", stackTimeout, "refused", conditionIs(terracev1.StalledCondition, metav1.ConditionTrue, "CrossNamespaceRefRefused"))
	if msg := outcome.Get(st, terracev1.ReadyCondition).Message; !strings.Contains(msg, "platform/network") || !strings.Contains(msg, "--allow-cross-namespace-refs") {
		t.Errorf("Ready message does not say what and why: %s", msg)
	}
	if st.Status.LastAttemptedRevision != "" {
		t.Errorf("a refused Stack ran: %s", st.Status.LastAttemptedRevision)
	}
}

// benchStack is an auto-applied Stack of the "bench" Program with n as its input.
func benchStack(t *testing.T, name string, n int) *terracev1.Stack {
	return &terracev1.Stack{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: terracev1.StackSpec{
			Source:      terracev1.StackSource{ProgramRef: &terracev1.LocalObjectReference{Name: "bench"}},
			Vars:        jsonVars(t, map[string]any{"n": n}),
			ApprovePlan: terracev1.ApprovePlanAuto,
		},
	}
}
