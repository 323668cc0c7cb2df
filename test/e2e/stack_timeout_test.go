package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/controller/outcome"
	"github.com/terrace-dev/terrace/internal/launcher"
)

// markedSlowModule sleeps var.sleep seconds while applying, after touching
// "<marker>-<generation>" so the test knows tofu reached the apply.
const markedSlowModule = `
variable "generation" { type = number }
variable "sleep" { type = number }
variable "marker" { type = string }
resource "terraform_data" "slow" {
  input            = var.generation
  triggers_replace = [var.generation] # provisioners run on create only
  provisioner "local-exec" {
    # "; true" keeps the shell (whose command line names the marker) for
    # the whole apply: busybox's sh would otherwise exec the sleep.
    command = "touch ${var.marker}-${var.generation} && sleep ${var.sleep}; true"
  }
}
output "generation" { value = terraform_data.slow.output }
`

// Run timing: the timed-out run sleeps longer than its whole timeout, so it
// cannot finish whatever the runner's start-up costs; the timeout leaves
// the start-up (pod, init, plan: a few seconds here, several times that on
// a loaded CI machine) room to reach apply.
const (
	shortRunTimeout = 20 * time.Second
	slowApplySleep  = 45
)

// TestStackRunTimeout runs an apply longer than spec.timeout: the run is
// stopped mid-apply, the Stack says it timed out, no lock, pod or process
// is left behind, and raising the timeout brings the Stack back to Ready
// on the same state.
func TestStackRunTimeout(t *testing.T) {
	e := newStackEnv(t)
	marker := filepath.Join(e.runnerDir(t), "applying")
	e.program(t, "slow", map[string]string{"main.tf": markedSlowModule})
	e.create(t, withRunnerDir(&terracev1.Stack{
		ObjectMeta: metav1.ObjectMeta{Name: "slow"},
		Spec: terracev1.StackSpec{
			Source: terracev1.StackSource{ProgramRef: &terracev1.LocalObjectReference{Name: "slow"}},
			Vars: map[string]apiextensionsv1.JSON{
				"generation": {Raw: []byte("1")},
				"sleep":      {Raw: []byte("0")},
				"marker":     {Raw: []byte(strconv.Quote(marker))},
			},
			ApprovePlan: terracev1.ApprovePlanAuto,
			// No retry while the test looks at what the timed-out run left.
			RetryInterval:  &metav1.Duration{Duration: 10 * time.Minute},
			DriftDetection: &terracev1.DriftDetection{Mode: terracev1.DriftDetectionDisabled},
		},
	}, filepath.Dir(marker)))
	e.waitStack(t, "slow", stackTimeout, "Ready", readyAt)
	before, _ := e.stateOf(t, "slow")

	e.updateStack(t, "slow", func(s *terracev1.Stack) {
		s.Spec.Vars["generation"] = apiextensionsv1.JSON{Raw: []byte("2")}
		s.Spec.Vars["sleep"] = apiextensionsv1.JSON{Raw: []byte(strconv.Itoa(slowApplySleep))}
		s.Spec.Timeout = &metav1.Duration{Duration: shortRunTimeout}
	})
	eventually(t, shortRunTimeout+5*time.Second, "the apply of generation 2 to start", func() error {
		_, err := os.Stat(marker + "-2")
		return err
	})
	runner := e.runnerPid(t, "slow", e.getStack(t, "slow").Status.CurrentRun)

	failed := e.waitStack(t, "slow", 30*time.Second, "the run reported as timed out", func(s *terracev1.Stack) error {
		ready := outcome.Get(s, terracev1.ReadyCondition)
		if ready == nil || ready.Status != metav1.ConditionFalse || ready.ObservedGeneration != s.Generation {
			return fmt.Errorf("not failed at generation %d", s.Generation) // Unknown while the run lasts
		}
		return nil
	})
	msg := outcome.Get(failed, terracev1.ReadyCondition).Message
	if !strings.Contains(strings.ToLower(msg), "timeout") || !strings.Contains(msg, shortRunTimeout.String()) {
		t.Errorf("the Ready message does not say the run hit spec.timeout (%s): %q", shortRunTimeout, msg)
	}
	if failed.Status.LastAppliedRevision == "" || failed.Status.Failures != 1 {
		t.Errorf("after the timed-out run: lastAppliedRevision %q, failures %d; want the old revision kept and one failure", failed.Status.LastAppliedRevision, failed.Status.Failures)
	}

	// The run is over: nothing of it may hold the state or keep running.
	e.assertRunGone(t, "slow", runner, marker)
	mid, lock := e.stateOf(t, "slow")
	if lock != nil {
		t.Errorf("the timed-out run left the state locked: %+v", lock)
	}
	if mid.Lineage != before.Lineage {
		t.Errorf("the timed-out run changed the lineage: %s → %s", before.Lineage, mid.Lineage)
	}

	e.updateStack(t, "slow", func(s *terracev1.Stack) {
		s.Spec.Timeout = &metav1.Duration{Duration: 2 * time.Minute}
		s.Spec.Vars["sleep"] = apiextensionsv1.JSON{Raw: []byte("1")} // the retry need not wait out the long sleep
	})
	e.assertRecovered(t, before, "2")
	if st := e.getStack(t, "slow"); st.Status.Failures != 0 {
		t.Errorf("failures not reset after recovering: %d", st.Status.Failures)
	}
}

// assertRunGone waits until the Stack has no runner pod, the runner process
// has exited and no process of the apply (its command line names marker)
// is left.
func (e *stackEnv) assertRunGone(t *testing.T, stack string, runnerPid int, marker string) {
	t.Helper()
	eventually(t, 30*time.Second, "the timed-out run's pod and processes gone", func() error {
		var pods corev1.PodList
		if err := e.c.List(context.Background(), &pods, client.InNamespace(e.ns), client.MatchingLabels{launcher.LabelStack: launcher.StackLabelValue(stack)}); err != nil {
			return err
		}
		for _, p := range pods.Items {
			return fmt.Errorf("runner pod %s is still there (phase %s)", p.Name, p.Status.Phase)
		}
		if alive(runnerPid) {
			return fmt.Errorf("runner process %d still runs", runnerPid)
		}
		if left := processesMentioning(marker); len(left) > 0 {
			return fmt.Errorf("processes of the apply still run: %v", left)
		}
		return nil
	})
}
