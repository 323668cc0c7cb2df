package stack

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/cli-utils/pkg/kstatus/status"
	"sigs.k8s.io/controller-runtime/pkg/client"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
)

// plainKstatus is cli-utils' kstatus on the Stack as it is, without
// Terrace's readiness package: what Flux's health checks, Argo CD and
// cli-utils pollers see.
func plainKstatus(t *testing.T, st *terracev1.Stack) *status.Result {
	t.Helper()
	content, err := runtime.DefaultUnstructuredConverter.ToUnstructured(st)
	if err != nil {
		t.Fatal(err)
	}
	u := &unstructured.Unstructured{Object: content}
	u.SetGroupVersionKind(terracev1.GroupVersion.WithKind("Stack"))
	res, err := status.Compute(u)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// expectNotCurrent asserts that a Stack awaiting approval is not Current
// to plain kstatus and that `kubectl wait --for=condition=Ready` keeps
// waiting for it.
func expectNotCurrent(t *testing.T, e *suiteEnv, st *terracev1.Stack) {
	t.Helper()
	if res := plainKstatus(t, st); res.Status == status.CurrentStatus {
		t.Errorf("kstatus says %s (%s) for a Stack awaiting approval", res.Status, res.Message)
	}
	kubectl := filepath.Join(os.Getenv("KUBEBUILDER_ASSETS"), "kubectl")
	if _, err := os.Stat(kubectl); err != nil {
		t.Fatalf("no kubectl beside the envtest binaries: %v", err)
	}
	kubeconfig, err := suite.env.Kubeconfig(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, kubectl, "--kubeconfig", kubeconfig, "wait", "--for=condition=Ready",
		"stacks.terrace.dev/"+st.Name, "-n", st.Namespace, "--timeout=3s").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "timed out") {
		t.Errorf("kubectl wait --for=condition=Ready on a Stack awaiting approval: %v: %s", err, out)
	}
}

// A Stack whose drift checks find nothing stays Ready while it is
// checked, and so do the Stacks that depend on it: a chain of three whose
// head checks every few seconds, sampled throughout, never leaves Ready
// at its generation, by Terrace's judgement nor by plain kstatus.
func TestEnvtestDriftChecksThatFindNothingLeaveTheChainReady(t *testing.T) {
	e := newSuiteEnv(t)
	interval := &metav1.Duration{Duration: 2 * time.Second}
	e.stack("head", dataModule, map[string]string{"greeting": "head"}, func(st *terracev1.Stack) {
		st.Spec.ApprovePlan = terracev1.ApprovePlanAuto
		st.Spec.Interval = interval
		st.Spec.DriftDetection = &terracev1.DriftDetection{Mode: terracev1.DriftDetectionEnabled}
	})
	for _, link := range [][2]string{{"middle", "head"}, {"tail", "middle"}} {
		e.stack(link[0], dataModule, map[string]string{"greeting": link[0]}, func(st *terracev1.Stack) {
			st.Spec.ApprovePlan = terracev1.ApprovePlanAuto
			st.Spec.DependsOn = []terracev1.DependencyReference{{Name: link[1]}}
		})
	}
	names := []string{"head", "middle", "tail"}
	for _, name := range names {
		e.waitFor(name, "Ready", readyAt)
	}
	first := e.waitFor("head", "Ready", readyAt).Status.LastDriftCheckAt

	deadline := time.Now().Add(12 * time.Second)
	checks := map[string]bool{}
	for time.Now().Before(deadline) {
		for _, name := range names {
			st := &terracev1.Stack{}
			if err := e.c.Get(context.Background(), client.ObjectKey{Namespace: e.ns, Name: name}, st); err != nil {
				t.Fatal(err)
			}
			if !readyAt(st) {
				t.Fatalf("%s left Ready during the head's drift checks: %s", name, conditionsText(st))
			}
			if res := plainKstatus(t, st); res.Status != status.CurrentStatus {
				t.Fatalf("%s is %s to kstatus during the head's drift checks: %s", name, res.Status, res.Message)
			}
			if name == "head" && st.Status.LastDriftCheckAt != nil {
				checks[st.Status.LastDriftCheckAt.String()] = true
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	if delete(checks, first.String()); len(checks) < 2 {
		t.Fatalf("the head checked for drift %d times in the window, want at least 2", len(checks))
	}
}
