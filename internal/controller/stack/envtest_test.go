package stack

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/artifact"
	"github.com/terrace-dev/terrace/internal/controller/reconcile"
	"github.com/terrace-dev/terrace/internal/readiness"
)

// eventLog is the suite's event recorder: it keeps every event by object.
type eventLog struct {
	mu     sync.Mutex
	events map[string][]string // namespace/name → "Type Reason"
}

func (l *eventLog) Eventf(regarding runtime.Object, _ runtime.Object, eventtype, reason, _, _ string, _ ...any) {
	obj, ok := regarding.(client.Object)
	if !ok {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.events == nil {
		l.events = map[string][]string{}
	}
	key := obj.GetNamespace() + "/" + obj.GetName()
	l.events[key] = append(l.events[key], eventtype+" "+reason)
}

// reasons lists the event reasons of an object, in order.
func (l *eventLog) reasons(namespace, name string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, e := range l.events[namespace+"/"+name] {
		out = append(out, strings.Fields(e)[1])
	}
	return out
}

// Modules the scenarios deploy, served as tarballs over HTTP (spec.source.url).
const (
	dataModule = `
variable "greeting" { type = string }
resource "terraform_data" "greeting" { input = var.greeting }
output "greeting" { value = terraform_data.greeting.output }
`
	failingDestroyModule = `
resource "terraform_data" "guarded" {
  provisioner "local-exec" {
    when    = destroy
    command = "echo refusing to destroy; exit 1"
  }
}
`
	fileModuleForDrift = `
terraform {
  required_providers {
    testfile = {
      source  = "terrace-dev/testfile"
      version = "0.1.0"
    }
  }
}
variable "path" { type = string }
resource "testfile_file" "managed" {
  path    = var.path
  content = "managed by terrace"
}
`
)

// moduleServer serves each module as a tar.gz and returns url and digest.
func moduleServer(t *testing.T, module string) (string, string) {
	t.Helper()
	data, digest, err := artifact.Build(map[string][]byte{"main.tf": []byte(module)})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write(data) }))
	t.Cleanup(srv.Close)
	return srv.URL + "/module.tar.gz", digest
}

// suiteEnv is one scenario's namespace.
type suiteEnv struct {
	t  *testing.T
	c  client.Client
	ns string
}

func newSuiteEnv(t *testing.T) *suiteEnv {
	t.Helper()
	t.Parallel()
	c := suite.env.Client
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "stack-"}}
	if err := c.Create(context.Background(), ns); err != nil {
		t.Fatal(err)
	}
	return &suiteEnv{t: t, c: c, ns: ns.Name}
}

func (e *suiteEnv) stack(name, module string, vars map[string]string, mutate func(*terracev1.Stack)) *terracev1.Stack {
	e.t.Helper()
	url, digest := moduleServer(e.t, module)
	st := &terracev1.Stack{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: e.ns}, Spec: terracev1.StackSpec{
		Source:        terracev1.StackSource{URL: url, Digest: digest},
		Vars:          map[string]apiextensionsv1.JSON{},
		RetryInterval: &metav1.Duration{Duration: time.Second},
	}}
	for k, v := range vars {
		st.Spec.Vars[k] = apiextensionsv1.JSON{Raw: []byte(fmt.Sprintf("%q", v))}
	}
	if mutate != nil {
		mutate(st)
	}
	if err := e.c.Create(context.Background(), st); err != nil {
		e.t.Fatal(err)
	}
	return st
}

// waitFor polls the Stack until check passes, failing after timeout with
// the last status.
func (e *suiteEnv) waitFor(name, what string, check func(*terracev1.Stack) bool) *terracev1.Stack {
	e.t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	st := &terracev1.Stack{}
	for {
		err := e.c.Get(context.Background(), client.ObjectKey{Namespace: e.ns, Name: name}, st)
		if err == nil && check(st) {
			return st
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("Stack %s/%s never became %s; conditions %s; events %v", e.ns, name, what, conditionsText(st), suite.events.reasons(e.ns, name))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func (e *suiteEnv) update(name string, mutate func(*terracev1.Stack)) {
	e.t.Helper()
	for {
		st := &terracev1.Stack{}
		if err := e.c.Get(context.Background(), client.ObjectKey{Namespace: e.ns, Name: name}, st); err != nil {
			e.t.Fatal(err)
		}
		mutate(st)
		err := e.c.Update(context.Background(), st)
		if err == nil {
			return
		}
		if !apierrors.IsConflict(err) {
			e.t.Fatal(err)
		}
	}
}

// grantSecretReads lets a ServiceAccount of the namespace get its Secrets.
func (e *suiteEnv) grantSecretReads(serviceAccount string) {
	e.t.Helper()
	ctx := context.Background()
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "read-secrets", Namespace: e.ns},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"get"}}}}
	binding := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "read-secrets", Namespace: e.ns},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: "read-secrets"},
		Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Name: serviceAccount, Namespace: e.ns}}}
	for _, obj := range []client.Object{role, binding} {
		if err := e.c.Create(ctx, obj); err != nil {
			e.t.Fatal(err)
		}
	}
}

func (e *suiteEnv) request(name string) {
	e.update(name, func(st *terracev1.Stack) {
		if st.Annotations == nil {
			st.Annotations = map[string]string{}
		}
		st.Annotations[terracev1.ReconcileRequestAnnotation] = time.Now().Format(time.RFC3339Nano)
	})
}

// expectEvents checks that the Stack's events hold want in this order
// (others may come between).
func (e *suiteEnv) expectEvents(name string, want ...string) {
	e.t.Helper()
	got := suite.events.reasons(e.ns, name)
	i := 0
	for _, r := range got {
		if i < len(want) && r == want[i] {
			i++
		}
	}
	if i < len(want) {
		e.t.Errorf("events %v do not hold %v in order", got, want)
	}
}

func is(cond, status, reason string) func(*terracev1.Stack) bool {
	return func(st *terracev1.Stack) bool {
		c := reconcile.Get(st, cond)
		return c != nil && string(c.Status) == status && c.Reason == reason && c.ObservedGeneration == st.Generation
	}
}

func readyAt(st *terracev1.Stack) bool {
	return is(terracev1.ReadyCondition, "True", AppliedReason)(st) && st.Status.ObservedGeneration == st.Generation
}

func conditionsText(st *terracev1.Stack) string {
	var parts []string
	for _, c := range st.Status.Conditions {
		parts = append(parts, fmt.Sprintf("%s=%s/%s %q", c.Type, c.Status, c.Reason, c.Message))
	}
	return strings.Join(parts, "; ")
}

func TestEnvtestPlanPendingThenApprovedThenApplied(t *testing.T) {
	e := newSuiteEnv(t)
	e.stack("web", dataModule, map[string]string{"greeting": "hello"}, nil)
	st := e.waitFor("web", "awaiting approval", is(terracev1.ReadyCondition, "False", AwaitingApprovalReason))
	pending := st.Status.Plan.Pending
	if pending == "" || !is(terracev1.PlannedCondition, "True", AwaitingApprovalReason)(st) ||
		reconcile.Get(st, terracev1.ReconcilingCondition) != nil || reconcile.Get(st, terracev1.StalledCondition) != nil {
		t.Fatalf("awaiting approval: plan %+v, conditions %s", st.Status.Plan, conditionsText(st))
	}
	e.expectEvents("web", "PlanCreated")

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
	if !is(terracev1.ReadyCondition, "False", VarsNotFoundReason)(st) || reconcile.Get(st, terracev1.ReconcilingCondition) != nil ||
		st.Status.ObservedGeneration != st.Generation || st.Status.Failures != 0 || st.Status.LastRun != "" {
		t.Fatalf("terminal: %s, status %+v", conditionsText(st), st.Status)
	}
	if !strings.Contains(reconcile.Get(st, terracev1.ReadyCondition).Message, "absent") {
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
	msg := reconcile.Get(st, terracev1.ReadyCondition).Message
	if !strings.Contains(msg, "deletion blocked") || !strings.Contains(msg, "refusing to destroy") || !slices.Contains(st.Finalizers, Finalizer) {
		t.Fatalf("Ready message %q, finalizers %v", msg, st.Finalizers)
	}
	// Leave the resources, as the message says.
	e.update("guarded", func(st *terracev1.Stack) { st.Finalizers = nil })
}
