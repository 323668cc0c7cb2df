package stack

import (
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
)

// announcing calls f on the first status patch of the Stack that names a
// run (the first run's announcement) and lets every other patch through.
func announcing(e *suiteEnv, name string, f func() error) {
	var seen atomic.Bool
	suite.hooks.onStatusPatch(e.ns, name, func(obj client.Object) error {
		st, ok := obj.(*terracev1.Stack)
		if !ok || st.Status.CurrentRun == "" || seen.Swap(true) {
			return nil
		}
		return f()
	})
	e.t.Cleanup(func() { suite.hooks.onStatusPatch(e.ns, name, nil) })
}

// runnerStarted returns a channel closed once the Stack's first runner
// has started (the run's Start returned it).
func runnerStarted(e *suiteEnv, name string) <-chan struct{} {
	started := make(chan struct{})
	var once sync.Once
	suite.hooks.onRunnerStarted(e.ns, name, func() { once.Do(func() { close(started) }) })
	e.t.Cleanup(func() { suite.hooks.onRunnerStarted(e.ns, name, nil) })
	return started
}

// A run's runner starts while the run is announced, not after: the
// announcement is held here until the runner starts, which code that
// started the runner only after the announcement never did.
func TestEnvtestRunnerStartsWhileTheRunIsAnnounced(t *testing.T) {
	e := newSuiteEnv(t)
	started := runnerStarted(e, "web")
	announcing(e, "web", func() error {
		select {
		case <-started:
		case <-time.After(30 * time.Second):
			t.Error("the runner did not start while the run's announcement was held")
		}
		return nil
	})
	e.stack("web", dataModule, map[string]string{"greeting": "at once"}, func(st *terracev1.Stack) { st.Spec.ApprovePlan = terracev1.ApprovePlanAuto })
	e.waitFor("web", "Ready", readyAt)
}

// When the announcement fails after the runner started alongside it, that
// runner is closed: none is left that no status names, and the retry's run
// applies.
func TestEnvtestAFailedAnnouncementLeavesNoRunner(t *testing.T) {
	checkNoRunnerOutlivesTheAnnouncement(t, func() error {
		return errors.New("the API server is unavailable (test)")
	})
}

// So too when the announcement panics (the reconcile recovers the panic
// as its error).
func TestEnvtestAPanickingAnnouncementLeavesNoRunner(t *testing.T) {
	checkNoRunnerOutlivesTheAnnouncement(t, func() error { panic("the announcement panicked (test)") })
}

// checkNoRunnerOutlivesTheAnnouncement ends the first run's announcement
// with fail once its runner has started, then checks the retry applies and
// no runner of the Stack is left open.
func checkNoRunnerOutlivesTheAnnouncement(t *testing.T, fail func() error) {
	e := newSuiteEnv(t)
	started := runnerStarted(e, "web")
	var failed atomic.Bool
	announcing(e, "web", func() error {
		select {
		case <-started:
		case <-time.After(30 * time.Second):
			t.Error("the runner did not start while the run's announcement was held")
		}
		failed.Store(true)
		return fail()
	})
	e.stack("web", dataModule, map[string]string{"greeting": "again"}, func(st *terracev1.Stack) { st.Spec.ApprovePlan = terracev1.ApprovePlanAuto })
	e.waitFor("web", "Ready", readyAt)
	if !failed.Load() {
		t.Fatal("the first announcement was not failed")
	}
	deadline := time.Now().Add(time.Minute)
	for suite.hooks.openSessions(e.ns, "web") > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d runners of the Stack still open after its runs ended", suite.hooks.openSessions(e.ns, "web"))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// A Stack's first run in this process, even one that never had a run
// announced, removes pods a run left whose announcement never landed (a
// controller stopped between starting a runner and announcing its run);
// later runs of a settled Stack do not look again.
func TestEnvtestFirstRunSweepsRunnersOfUnannouncedRuns(t *testing.T) {
	e := newSuiteEnv(t)
	e.stack("web", dataModule, map[string]string{"greeting": "swept"}, func(st *terracev1.Stack) { st.Spec.ApprovePlan = terracev1.ApprovePlanAuto })
	e.waitFor("web", "Ready", readyAt)
	// A retried first run (a transient failure) may clean up again.
	first := suite.hooks.cleanupCount(e.ns, "web")
	if first < 1 {
		t.Fatal("the first run did not clean up")
	}
	e.request("web")
	e.waitFor("web", "the request handled", func(st *terracev1.Stack) bool {
		return st.Status.LastHandledReconcileAt != "" && st.Status.LastHandledReconcileAt == st.Annotations[terracev1.ReconcileRequestAnnotation] && readyAt(st)
	})
	if n := suite.hooks.cleanupCount(e.ns, "web"); n != first {
		t.Fatalf("after a second run: %d clean-ups, want still %d", n, first)
	}
}
