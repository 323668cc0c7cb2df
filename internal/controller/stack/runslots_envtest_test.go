package stack

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/controller/outcome"
)

// endlessModule sleeps in its apply for longer than any test: an endless
// run, as far as the controller can tell.
const endlessModule = `
resource "terraform_data" "endless" {
  provisioner "local-exec" {
    command = "sleep 900"
  }
}
`

// suiteMaxRunTimeout is the suite's --max-run-timeout (the operator's default).
const suiteMaxRunTimeout = 2 * time.Hour

// serialSuiteEnv is a scenario's namespace for a test that must have the
// suite's controller to itself (it does not run in parallel): its
// figures are measured against a quiet controller.
func serialSuiteEnv(t *testing.T) *suiteEnv {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "stack-"}}
	if err := suite.env.Client.Create(context.Background(), ns); err != nil {
		t.Fatal(err)
	}
	return &suiteEnv{t: t, c: suite.env.Client, ns: ns.Name}
}

// killRunners kills the Stack's started runners, as runner pods killed
// mid-run: their runs fail and free their slots.
func killRunners(namespace, name string) {
	suite.hooks.mu.Lock()
	var open []*processSession
	for s := range suite.hooks.open[namespace+"/"+name] {
		open = append(open, s)
	}
	suite.hooks.mu.Unlock()
	for _, s := range open {
		if s.killed.CompareAndSwap(false, true) {
			s.died(errors.New("runner killed (test)"))
			go s.stop()
		}
	}
}

// runningIn counts the started, unclosed runners of the named Stacks.
func runningIn(namespace string, names []string) int {
	n := 0
	for _, name := range names {
		n += suite.hooks.openSessions(namespace, name)
	}
	return n
}

// timeToReady creates a Stack applying dataModule and returns how long it
// took to become Ready.
func timeToReady(e *suiteEnv, name string) time.Duration {
	e.t.Helper()
	start := time.Now()
	e.stack(name, dataModule, map[string]string{"greeting": name}, func(st *terracev1.Stack) { st.Spec.ApprovePlan = terracev1.ApprovePlanAuto })
	e.waitFor(name, "Ready", readyAt)
	return time.Since(start)
}

// stackReconcileErrors is controller-runtime's count of the Stack
// controller's reconciles that returned an error.
func stackReconcileErrors(t *testing.T) float64 {
	t.Helper()
	families, err := metrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != "controller_runtime_reconcile_errors_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "controller" && l.GetValue() == "stack" {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

// The attack of issue 44, item 5, as a tenant makes it: four Stacks of one
// namespace whose runs never end (a module that sleeps in its apply, with
// a long spec.timeout within the operator's limit) while another
// namespace's Stacks want to run. The suite's controller has 4 run slots
// (and 4 workers): before, each endless run held a reconcile worker for
// its whole timeout, the four held all of them, and no other tenant's
// Stack ran until they ended. Now one namespace holds at most 3 slots
// (--max-runs-per-namespace, default one less than --max-concurrent-runs),
// its fourth run waits as RunQueued, a run holds no worker, and the other
// tenant's Stack runs at once. The queued run starts as soon as one of
// its namespace's runs ends. Figures (time to Ready of the other tenant's
// Stack, quiet and under the attack) are logged, not asserted.
func TestEnvtestEndlessRunsOfOneTenantLeaveRunsForOthers(t *testing.T) {
	quiet := serialSuiteEnv(t)
	timeToReady(quiet, "warm-up") // tofu's first run in the process is slower
	errorsBefore := stackReconcileErrors(t)
	var baseline []time.Duration
	for _, name := range []string{"quiet-1", "quiet-2", "quiet-3"} {
		baseline = append(baseline, timeToReady(quiet, name))
	}
	// A reconcile that hands its run over ends without an error (else
	// controller-runtime would retry it while the run goes on).
	if n := stackReconcileErrors(t) - errorsBefore; n != 0 {
		t.Errorf("%v reconcile errors for runs that succeeded", n)
	}

	attacker := serialSuiteEnv(t)
	endless := []string{"endless-1", "endless-2", "endless-3", "endless-4"}
	second := serialSuiteEnv(t)
	t.Cleanup(func() {
		// Stop the endless runs: suspended, then their runners killed.
		for _, e := range []*suiteEnv{attacker, second} {
			for _, name := range endless {
				st := &terracev1.Stack{}
				if e.c.Get(context.Background(), client.ObjectKey{Namespace: e.ns, Name: name}, st) != nil {
					continue
				}
				e.update(name, func(st *terracev1.Stack) { st.Spec.Suspend = true })
			}
			deadline := time.Now().Add(time.Minute)
			for runningIn(e.ns, endless) > 0 && time.Now().Before(deadline) {
				for _, name := range endless {
					killRunners(e.ns, name)
				}
				time.Sleep(200 * time.Millisecond)
			}
		}
	})
	for _, name := range endless {
		attacker.stack(name, endlessModule, nil, func(st *terracev1.Stack) {
			st.Spec.ApprovePlan = terracev1.ApprovePlanAuto
			st.Spec.Timeout = &metav1.Duration{Duration: time.Hour}
		})
	}
	// The attack is on once every endless Stack runs or waits.
	peak := 0
	settled := func() bool {
		peak = max(peak, runningIn(attacker.ns, endless))
		for _, name := range endless {
			st := &terracev1.Stack{}
			if err := attacker.c.Get(context.Background(), client.ObjectKey{Namespace: attacker.ns, Name: name}, st); err != nil {
				return false
			}
			if c := outcome.Get(st, terracev1.ReconcilingCondition); c == nil || c.Status != metav1.ConditionTrue {
				return false
			}
		}
		return runningIn(attacker.ns, endless) >= 3
	}
	deadline := time.Now().Add(2 * time.Minute)
	for !settled() {
		if time.Now().After(deadline) {
			t.Fatalf("the endless runs never all started or queued: %d runners started", runningIn(attacker.ns, endless))
		}
		time.Sleep(100 * time.Millisecond)
	}

	victim := serialSuiteEnv(t)
	var attacked []time.Duration
	for _, name := range []string{"victim-1", "victim-2", "victim-3"} {
		attacked = append(attacked, timeToReady(victim, name))
		peak = max(peak, runningIn(attacker.ns, endless))
	}
	t.Logf("other tenant's Stack, create to Ready: quiet %v (median %v); with 4 endless runs in %s: %v (median %v)",
		baseline, median(baseline), attacker.ns, attacked, median(attacked))

	if peak > 3 {
		t.Errorf("the attacker's namespace ran %d runs at once, above its share of 3", peak)
	}
	var queued []string
	for _, name := range endless {
		if suite.hooks.openSessions(attacker.ns, name) == 0 {
			queued = append(queued, name)
		}
	}
	if len(queued) != 1 {
		t.Fatalf("Stacks of the attacker without a runner: %v, want exactly one (the fourth, queued)", queued)
	}
	st := attacker.waitFor(queued[0], "queued", is(terracev1.ReconcilingCondition, "True", RunQueuedReason))
	if c := outcome.Get(st, terracev1.ReadyCondition); c == nil || c.Status != metav1.ConditionFalse || c.Reason != RunQueuedReason ||
		!strings.Contains(c.Message, "--max-runs-per-namespace=3") {
		t.Errorf("queued Stack: conditions %s; want Ready=False RunQueued naming --max-runs-per-namespace=3", conditionsText(st))
	}

	// One endless run ends (its runner killed): the queued run takes its slot.
	var running string
	for _, name := range endless {
		if name != queued[0] {
			running = name
			break
		}
	}
	freed := time.Now()
	killRunners(attacker.ns, running)
	for suite.hooks.openSessions(attacker.ns, queued[0]) == 0 {
		if time.Since(freed) > 2*time.Minute {
			t.Fatalf("the queued run never started after a slot of its namespace freed; conditions %s", conditionsText(st))
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("queued run started %v after its namespace's slot freed", time.Since(freed).Round(time.Millisecond))
	if n := runningIn(attacker.ns, endless); n > 3 {
		t.Errorf("the attacker's namespace runs %d runs after the retry, above its share of 3", n)
	}

	// A second namespace's endless run takes the last slot: every slot is
	// held, by runs that hold no reconcile worker. A Stack that needs no
	// runner is still reconciled at once, and one that needs a run waits
	// as RunQueued, saying every slot is taken.
	second.stack("endless-1", endlessModule, nil, func(st *terracev1.Stack) {
		st.Spec.ApprovePlan = terracev1.ApprovePlanAuto
		st.Spec.Timeout = &metav1.Duration{Duration: time.Hour}
	})
	for runningIn(second.ns, endless[:1]) == 0 {
		if time.Since(freed) > 2*time.Minute {
			t.Fatal("the second namespace's endless run never started")
		}
		time.Sleep(50 * time.Millisecond)
	}
	busy := time.Now()
	victim.stack("too-long", dataModule, map[string]string{"greeting": "hi"}, func(st *terracev1.Stack) {
		st.Spec.Timeout = &metav1.Duration{Duration: 1000 * time.Hour}
	})
	victim.waitFor("too-long", "refused", is(terracev1.StalledCondition, "True", RunTimeoutTooLongReason))
	t.Logf("with every run slot held, a Stack needing no runner was reconciled in %v", time.Since(busy).Round(time.Millisecond))
	victim.stack("waits", dataModule, map[string]string{"greeting": "hi"}, nil)
	st = victim.waitFor("waits", "queued", is(terracev1.ReadyCondition, "False", RunQueuedReason))
	if c := outcome.Get(st, terracev1.ReadyCondition); !strings.Contains(c.Message, "all 4 run slots are taken") {
		t.Errorf("queued with every slot taken: %q", c.Message)
	}
}

// A Stack that asks for a longer run than the operator allows
// (--max-run-timeout; the suite's is 2h) is refused before any runner
// starts, with a terminal condition naming the limit; lowered to the
// limit or below, it runs.
func TestEnvtestATimeoutAboveTheOperatorsLimitIsRefused(t *testing.T) {
	e := newSuiteEnv(t)
	e.stack("long", dataModule, map[string]string{"greeting": "hi"}, func(st *terracev1.Stack) {
		st.Spec.ApprovePlan = terracev1.ApprovePlanAuto
		st.Spec.Timeout = &metav1.Duration{Duration: 1000 * time.Hour}
	})
	st := e.waitFor("long", "refused", is(terracev1.StalledCondition, "True", RunTimeoutTooLongReason))
	c := outcome.Get(st, terracev1.ReadyCondition)
	if c == nil || c.Status != metav1.ConditionFalse || !strings.Contains(c.Message, "1000h0m0s") || !strings.Contains(c.Message, "--max-run-timeout") || !strings.Contains(c.Message, "2h0m0s") {
		t.Errorf("conditions %s; want Ready=False naming spec.timeout, the limit (2h0m0s) and --max-run-timeout", conditionsText(st))
	}
	if n := suite.hooks.openSessions(e.ns, "long") + len(suite.hooks.closedRunners(e.ns, "long")); n != 0 {
		t.Errorf("%d runners started for a refused Stack", n)
	}
	e.update("long", func(st *terracev1.Stack) { st.Spec.Timeout = &metav1.Duration{Duration: suiteMaxRunTimeout} })
	e.waitFor("long", "Ready at the limit", readyAt)
}
