package stack

import (
	"context"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/controller/outcome"
	"github.com/terrace-dev/terrace/internal/readiness"
)

func TestEnvtestPlanPendingThenApprovedThenApplied(t *testing.T) {
	e := newSuiteEnv(t)
	e.stack("web", dataModule, map[string]string{"greeting": "hello"}, nil)
	st := e.waitFor("web", "awaiting approval", is(terracev1.ReadyCondition, "False", AwaitingApprovalReason))
	pending := st.Status.Plan.Pending
	if pending == "" || !is(terracev1.PlannedCondition, "True", AwaitingApprovalReason)(st) ||
		!is(terracev1.ReconcilingCondition, "True", AwaitingApprovalReason)(st) || outcome.Get(st, terracev1.StalledCondition) != nil {
		t.Fatalf("awaiting approval: plan %+v, conditions %s", st.Status.Plan, conditionsText(st))
	}
	e.expectEvents("web", "PlanCreated")
	expectNotCurrent(t, e, st)

	e.update("web", func(st *terracev1.Stack) { st.Spec.ApprovePlan = pending })
	st = e.waitFor("web", "Ready after approval", readyAt)
	if st.Status.Plan.Pending != "" || st.Status.Release == nil || st.Status.Release.Revision != 1 || !slices.Equal(st.Status.Outputs, []string{"greeting"}) {
		t.Fatalf("after apply: plan %+v release %+v outputs %v", st.Status.Plan, st.Status.Release, st.Status.Outputs)
	}
	if ok, why, err := readiness.ReadyAtGeneration(st); !ok || err != nil {
		t.Errorf("not Ready at its generation by kstatus: %s %v", why, err)
	}
	e.expectEvents("web", "PlanCreated", "Applied")
}

func TestEnvtestNoChangesMakesNoRelease(t *testing.T) {
	e := newSuiteEnv(t)
	e.stack("web", dataModule, map[string]string{"greeting": "hi"}, func(st *terracev1.Stack) { st.Spec.ApprovePlan = terracev1.ApprovePlanAuto })
	first := e.waitFor("web", "Ready", readyAt)
	e.request("web")
	st := e.waitFor("web", "re-planned with no changes", func(st *terracev1.Stack) bool {
		return readyAt(st) && st.Status.Plan != nil && st.Status.Plan.ID != first.Status.Plan.ID && is(terracev1.PlannedCondition, "True", NoChangesReason)(st)
	})
	if st.Status.Release.Revision != 1 {
		t.Fatalf("a plan without changes recorded release %d", st.Status.Release.Revision)
	}
	e.expectEvents("web", "Applied")
	applies := 0
	for _, r := range suite.events.reasons(e.ns, "web") {
		if r == AppliedReason {
			applies++
		}
	}
	if applies != 1 {
		t.Errorf("applied %d times: %v", applies, suite.events.reasons(e.ns, "web"))
	}
}

func TestEnvtestDriftWarnReportsAndAutoRepairs(t *testing.T) {
	if suite.env != nil && suite.env.Tools.ProviderMirror == "" {
		t.Fatal("no provider mirror: run `make tools`")
	}
	for _, mode := range []struct {
		drift terracev1.DriftDetectionMode
		want  string
	}{{terracev1.DriftDetectionWarn, DriftDetectedReason}, {terracev1.DriftDetectionEnabled, DriftRepairedReason}} {
		t.Run(string(mode.drift), func(t *testing.T) {
			e := newSuiteEnv(t)
			path := t.TempDir() + "/managed.txt"
			driftMode := mode.drift
			e.stack("files", fileModuleForDrift, map[string]string{"path": path}, func(st *terracev1.Stack) {
				st.Spec.ApprovePlan = terracev1.ApprovePlanAuto
				st.Spec.Interval = &metav1.Duration{Duration: 2 * time.Second}
				st.Spec.DriftDetection = &terracev1.DriftDetection{Mode: driftMode}
			})
			e.waitFor("files", "Ready", readyAt)
			if err := os.WriteFile(path, []byte("changed by hand"), 0o600); err != nil {
				t.Fatal(err)
			}
			st := e.waitFor("files", "drift "+mode.want, is(terracev1.DriftedCondition, "True", mode.want))
			if st.Status.LastDriftDetectedAt == nil {
				t.Error("lastDriftDetectedAt not recorded")
			}
			data, _ := os.ReadFile(path)
			content := string(data)
			if mode.want == DriftDetectedReason {
				if !is(terracev1.ReadyCondition, "True", DriftDetectedReason)(st) || content != "changed by hand" {
					t.Fatalf("warn mode: Ready %s, file %q (must be left alone)", conditionsText(st), content)
				}
				e.expectEvents("files", "Applied", "DriftDetected")
				return
			}
			if content != "managed by terrace" || st.Status.Release.Revision != 2 {
				t.Fatalf("auto mode: file %q, release %+v", content, st.Status.Release)
			}
			e.expectEvents("files", "Applied", "DriftDetected", "Applied")
		})
	}
}

func TestEnvtestTerminalInputErrorStartsNoRun(t *testing.T) {
	e := newSuiteEnv(t)
	// The runner's ServiceAccount may read Secrets here, so the missing
	// one is reported as missing (not as forbidden).
	e.grantSecretReads("default")
	e.stack("web", dataModule, nil, func(st *terracev1.Stack) {
		st.Spec.VarsFrom = []terracev1.VarsReference{{Kind: "Secret", Name: "absent"}}
	})
	st := e.waitFor("web", "Stalled", is(terracev1.StalledCondition, "True", VarsNotFoundReason))
	if !is(terracev1.ReadyCondition, "False", VarsNotFoundReason)(st) || outcome.Get(st, terracev1.ReconcilingCondition) != nil ||
		st.Status.ObservedGeneration != st.Generation || st.Status.Failures != 0 || st.Status.LastRun != "" {
		t.Fatalf("terminal: %s, status %+v", conditionsText(st), st.Status)
	}
	if !strings.Contains(outcome.Get(st, terracev1.ReadyCondition).Message, "absent") {
		t.Errorf("the message does not name the Secret: %s", conditionsText(st))
	}
}

func TestEnvtestTransientRunnerErrorIsRetried(t *testing.T) {
	e := newSuiteEnv(t)
	suite.runs.killNextRuns(e.ns, "web", 1)
	e.stack("web", dataModule, map[string]string{"greeting": "again"}, func(st *terracev1.Stack) { st.Spec.ApprovePlan = terracev1.ApprovePlanAuto })
	st := e.waitFor("web", "Ready after a retry", readyAt)
	if st.Status.Failures != 0 || st.Status.Release.Revision != 1 {
		t.Fatalf("after the retry: failures %d release %+v", st.Status.Failures, st.Status.Release)
	}
	e.expectEvents("web", "ReconciliationFailed", "Applied")
}

// Only a run whose commands all returned says its runner is idle (its pod
// then goes without a grace period); a run that lost its runner does not,
// so a tofu still running there gets its grace to save state and unlock.
func TestEnvtestOnlyAFinishedRunLeavesItsRunnerIdle(t *testing.T) {
	e := newSuiteEnv(t)
	suite.runs.killNextRuns(e.ns, "web", 1)
	e.stack("web", dataModule, map[string]string{"greeting": "idle"}, func(st *terracev1.Stack) { st.Spec.ApprovePlan = terracev1.ApprovePlanAuto })
	e.waitFor("web", "Ready after a retry", readyAt)
	var closed []bool
	deadline := time.Now().Add(10 * time.Second)
	for {
		if closed = suite.hooks.closedRunners(e.ns, "web"); len(closed) >= 2 || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if !slices.Equal(closed, []bool{false, true}) {
		t.Fatalf("closed runners marked idle: %v, want [false true] (the killed run's, then the finished run's)", closed)
	}
}

func TestEnvtestDestroyOnDelete(t *testing.T) {
	e := newSuiteEnv(t)
	e.stack("web", dataModule, map[string]string{"greeting": "bye"}, func(st *terracev1.Stack) {
		st.Spec.ApprovePlan = terracev1.ApprovePlanAuto
		st.Spec.DestroyOnDelete = true
	})
	e.waitFor("web", "Ready", readyAt)
	if err := e.c.Delete(context.Background(), &terracev1.Stack{ObjectMeta: metav1.ObjectMeta{Namespace: e.ns, Name: "web"}}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		err := e.c.Get(context.Background(), client.ObjectKey{Namespace: e.ns, Name: "web"}, &terracev1.Stack{})
		if apierrors.IsNotFound(err) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the Stack was never deleted; events %v", suite.events.reasons(e.ns, "web"))
		}
		time.Sleep(200 * time.Millisecond)
	}
	e.expectEvents("web", "Applied", "Destroyed")
	var secrets corev1.SecretList
	if err := e.c.List(context.Background(), &secrets, client.InNamespace(e.ns)); err != nil {
		t.Fatal(err)
	}
	for _, s := range secrets.Items {
		if s.Type != corev1.SecretTypeServiceAccountToken {
			t.Errorf("Secret %s (%s) left after destroy", s.Name, s.Type)
		}
	}
}

func TestEnvtestDestroyFailureBlocksDeletion(t *testing.T) {
	e := newSuiteEnv(t)
	e.stack("guarded", failingDestroyModule, nil, func(st *terracev1.Stack) {
		st.Spec.ApprovePlan = terracev1.ApprovePlanAuto
		st.Spec.DestroyOnDelete = true
	})
	e.waitFor("guarded", "Ready", readyAt)
	if err := e.c.Delete(context.Background(), &terracev1.Stack{ObjectMeta: metav1.ObjectMeta{Namespace: e.ns, Name: "guarded"}}); err != nil {
		t.Fatal(err)
	}
	st := e.waitFor("guarded", "blocked by a failed destroy", is(terracev1.StalledCondition, "True", DestroyFailedReason))
	msg := outcome.Get(st, terracev1.ReadyCondition).Message
	if !strings.Contains(msg, "deletion blocked") || !strings.Contains(msg, "refusing to destroy") || !slices.Contains(st.Finalizers, Finalizer) {
		t.Fatalf("Ready message %q, finalizers %v", msg, st.Finalizers)
	}
	// Leave the resources, as the message says.
	e.update("guarded", func(st *terracev1.Stack) { st.Finalizers = nil })
}
