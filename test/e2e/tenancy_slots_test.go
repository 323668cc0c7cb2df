package e2e

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/controller/outcome"
)

// endlessModule sleeps in its apply for longer than the test: an endless
// run, as far as the controller can tell.
const endlessModule = `
resource "terraform_data" "endless" {
  provisioner "local-exec" {
    command = "sleep 3600"
  }
}
`

// TestTenancyEndlessRunsLeaveRunsForOthers is issue 44's item 5 on the
// real node: a tenant fills the controller with endless runs (a module
// that sleeps in its apply, spec.timeout within the operator's limit), one
// more Stack than its namespace's share of run slots. Its runs beyond the
// share wait as RunQueued, and another tenant's Stack still applies. The
// other tenant's time to Ready, quiet and under the attack, is logged (a
// figure, not an assertion).
func TestTenancyEndlessRunsLeaveRunsForOthers(t *testing.T) {
	victim := newStackEnv(t)
	victim.program(t, "data", map[string]string{"main.tf": benchModule})
	timeToReady := func(name string) time.Duration {
		begin := time.Now()
		victim.create(t, &terracev1.Stack{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: terracev1.StackSpec{
				Source:      terracev1.StackSource{ProgramRef: &terracev1.LocalObjectReference{Name: "data"}},
				Vars:        jsonVars(t, map[string]any{"n": 1}),
				ApprovePlan: terracev1.ApprovePlanAuto,
			},
		})
		victim.waitStack(t, name, stackTimeout, "Ready", readyAt)
		return time.Since(begin)
	}
	quiet := []time.Duration{timeToReady("quiet-1"), timeToReady("quiet-2")}

	attacker := newStackEnv(t)
	attacker.program(t, "endless", map[string]string{"main.tf": endlessModule})
	// The harness's controller runs 8 at once, 7 of them per namespace.
	const share = 7
	var endless []string
	for i := range share + 1 {
		name := fmt.Sprintf("endless-%d", i)
		endless = append(endless, name)
		attacker.create(t, &terracev1.Stack{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: terracev1.StackSpec{
				Source:      terracev1.StackSource{ProgramRef: &terracev1.LocalObjectReference{Name: "endless"}},
				ApprovePlan: terracev1.ApprovePlanAuto,
				Timeout:     &metav1.Duration{Duration: time.Hour},
			},
		})
	}
	t.Cleanup(func() {
		// Suspended first, so that their runs, cut short when the
		// namespace goes, are not retried.
		for _, name := range endless {
			attacker.updateStack(t, name, func(s *terracev1.Stack) { s.Spec.Suspend = true })
		}
		// Their runner pods go at once: the next tests want the slots.
		eventually(t, 2*time.Minute, "the endless runs' pods gone", func() error {
			if err := attacker.c.DeleteAllOf(context.Background(), &corev1.Pod{}, client.InNamespace(attacker.ns),
				client.HasLabels{"terrace.dev/run"}, client.GracePeriodSeconds(0)); err != nil {
				return err
			}
			if n := runningRunnerPods(t, attacker); n > 0 {
				return fmt.Errorf("%d runner pods left", n)
			}
			return nil
		})
	})
	// The attack is on once the namespace's share runs and the rest waits.
	eventually(t, 3*time.Minute, "the attacker's runs to fill its share, the last one queued", func() error {
		running, queued := 0, 0
		for _, name := range endless {
			s := attacker.getStack(t, name)
			switch {
			case slices.ContainsFunc(s.Status.Conditions, func(c metav1.Condition) bool { return c.Reason == "RunQueued" }):
				queued++
			case outcome.IsTrue(s, terracev1.ReconcilingCondition) && s.Status.CurrentRun != "":
				running++
			}
		}
		pods := runningRunnerPods(t, attacker)
		if pods > share {
			t.Fatalf("the attacker's namespace runs %d runner pods, above its share of %d", pods, share)
		}
		if pods < share || queued != 1 {
			return fmt.Errorf("%d runner pods running, %d Stacks running, %d queued", pods, running, queued)
		}
		return nil
	})
	attacked := []time.Duration{timeToReady("attacked-1"), timeToReady("attacked-2")}
	t.Logf("another tenant's Stack, create to Ready: quiet %v; with %d endless runs of %s going on and one queued: %v",
		quiet, share, attacker.ns, attacked)
	if pods := runningRunnerPods(t, attacker); pods > share {
		t.Errorf("the attacker's namespace runs %d runner pods, above its share of %d", pods, share)
	}
}

// runningRunnerPods counts the runner pods of e's namespace that run.
func runningRunnerPods(t *testing.T, e *stackEnv) int {
	t.Helper()
	var pods corev1.PodList
	if err := e.c.List(context.Background(), &pods, client.InNamespace(e.ns), client.HasLabels{"terrace.dev/run"}); err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, p := range pods.Items {
		if p.Status.Phase == corev1.PodRunning && p.DeletionTimestamp == nil {
			n++
		}
	}
	return n
}
