package e2e

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/state"
	"github.com/terrace-dev/terrace/internal/state/release"
	"github.com/terrace-dev/terrace/internal/state/secrets"
)

// healthModule's outputs say where the service it "deploys" listens.
const healthModule = `
variable "url" { type = string }
variable "host_port" { type = string }
resource "terraform_data" "service" { input = var.url }
output "url" { value = terraform_data.service.output }
output "host_port" { value = var.host_port }
`

// TestStackHealthChecks: the runner pod checks a server the test starts,
// with addresses from the outputs; a failing check is HealthCheckPassed
// False and recorded in the release, and the retry passes once the server
// is healthy.
func TestStackHealthChecks(t *testing.T) {
	e := newStackEnv(t)
	var healthy atomic.Bool
	lis := linkListener(t)
	srv := &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/healthz" || !healthy.Load() {
			http.Error(w, "starting", http.StatusServiceUnavailable)
			return
		}
		_, _ = fmt.Fprint(w, "status: ok")
	})}
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(func() { _ = srv.Close() })
	addr := lis.Addr().String()

	e.program(t, "svc", map[string]string{"main.tf": healthModule})
	e.create(t, &terracev1.Stack{
		ObjectMeta: metav1.ObjectMeta{Name: "svc"},
		Spec: terracev1.StackSpec{
			Source:        terracev1.StackSource{ProgramRef: &terracev1.LocalObjectReference{Name: "svc"}},
			ApprovePlan:   terracev1.ApprovePlanAuto,
			Vars:          jsonVars(t, map[string]any{"url": "http://" + addr, "host_port": addr}),
			RetryInterval: &metav1.Duration{Duration: 2 * time.Second},
			HealthChecks: []terracev1.HealthCheck{
				{Name: "web", Type: terracev1.HealthCheckHTTP, URL: "{{ .outputs.url }}/healthz", BodyMatch: "status: ok",
					Timeout: &metav1.Duration{Duration: 2 * time.Second}},
				{Name: "port", Type: terracev1.HealthCheckTCP, Address: "{{ .outputs.host_port }}"},
			},
		},
	})
	st := e.waitStack(t, "svc", stackTimeout, "health check failed", conditionIs(terracev1.HealthCheckPassedCondition, metav1.ConditionFalse, "HealthCheckFailed"))
	msg := conditionMessage(st, terracev1.HealthCheckPassedCondition)
	if !strings.Contains(msg, "health check web failed") || !strings.Contains(msg, "answered 503, expected 200") || strings.Contains(msg, "port failed") {
		t.Errorf("HealthCheckPassed message: %q", msg)
	}
	if err := readyAt(st); err == nil {
		t.Error("a Stack whose health check fails is Ready")
	}
	rs := e.releases(t, "svc")
	if len(rs) == 0 || !hasCheck(rs[0], "web", false) || !hasCheck(rs[0], "port", true) {
		t.Fatalf("the release does not record the checks: %+v", rs)
	}

	healthy.Store(true)
	st = e.waitStack(t, "svc", stackTimeout, "Ready with passing checks", func(s *terracev1.Stack) error {
		if err := conditionIs(terracev1.HealthCheckPassedCondition, metav1.ConditionTrue, "HealthCheckPassed")(s); err != nil {
			return err
		}
		return readyAt(s)
	})

	// A new apply records passing checks in its release.
	e.updateStack(t, "svc", func(s *terracev1.Stack) {
		s.Spec.Vars = jsonVars(t, map[string]any{"url": "http://" + addr + "/", "host_port": addr})
		s.Spec.HealthChecks[0].URL = "{{ .outputs.url }}healthz"
	})
	e.waitStack(t, "svc", stackTimeout, "second release", func(s *terracev1.Stack) error {
		if s.Status.Release == nil || s.Status.Release.Revision < 2 {
			return fmt.Errorf("release %+v", s.Status.Release)
		}
		return readyAt(s)
	})
	rs = e.releases(t, "svc")
	last := rs[len(rs)-1]
	if !hasCheck(last, "web", true) || !hasCheck(last, "port", true) {
		t.Errorf("release %d checks: %+v", last.Revision, last.HealthChecks)
	}
}

// TestStackHealthCheckBadTemplate: a template naming an output that does
// not exist fails the check with a message saying so.
func TestStackHealthCheckBadTemplate(t *testing.T) {
	e := newStackEnv(t)
	e.program(t, "svc", map[string]string{"main.tf": healthModule})
	e.create(t, &terracev1.Stack{
		ObjectMeta: metav1.ObjectMeta{Name: "svc"},
		Spec: terracev1.StackSpec{
			Source:        terracev1.StackSource{ProgramRef: &terracev1.LocalObjectReference{Name: "svc"}},
			ApprovePlan:   terracev1.ApprovePlanAuto,
			Vars:          jsonVars(t, map[string]any{"url": "http://127.0.0.1:1", "host_port": "127.0.0.1:1"}),
			RetryInterval: &metav1.Duration{Duration: 30 * time.Second},
			HealthChecks:  []terracev1.HealthCheck{{Name: "web", Type: terracev1.HealthCheckHTTP, URL: "{{ .outputs.nope }}"}},
		},
	})
	st := e.waitStack(t, "svc", stackTimeout, "health check failed", conditionIs(terracev1.HealthCheckPassedCondition, metav1.ConditionFalse, "HealthCheckFailed"))
	if msg := conditionMessage(st, terracev1.HealthCheckPassedCondition); !strings.Contains(msg, "cannot be filled from the outputs") {
		t.Errorf("HealthCheckPassed message: %q", msg)
	}
}

// policyDenyingTerraformData is a plan policy: deny terraform_data, warn
// about nothing else yet.
const policyDenyingTerraformData = `package terrace

deny contains msg if {
	some rc in input.resource_changes
	rc.type == "terraform_data"
	"create" in rc.change.actions
	msg := sprintf("%s: resources of type terraform_data are not allowed", [rc.address])
}
`

// policyWarningTerraformData allows it, with a warning.
const policyWarningTerraformData = `package terrace

warn contains msg if {
	some rc in input.resource_changes
	rc.type == "terraform_data"
	msg := sprintf("%s: terraform_data is discouraged", [rc.address])
}
`

// TestStackPlanPolicy: a Rego policy from a ConfigMap the namespace's
// TerraceConfig names denies a resource type (PolicyDenied, no apply),
// for auto and manual approval; after the ConfigMap changes to a warning
// the Stacks go on by themselves, the decision stored with the plan and
// the release.
func TestStackPlanPolicy(t *testing.T) {
	e := newStackEnv(t)
	e.policies(t, "types.rego", policyDenyingTerraformData)
	e.program(t, "svc", map[string]string{"main.tf": healthModule})
	for _, name := range []string{"auto", "manual"} {
		approve := terracev1.ApprovePlanAuto
		if name == "manual" {
			approve = ""
		}
		e.create(t, &terracev1.Stack{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: terracev1.StackSpec{
				Source:        terracev1.StackSource{ProgramRef: &terracev1.LocalObjectReference{Name: "svc"}},
				ApprovePlan:   approve,
				Vars:          jsonVars(t, map[string]any{"url": "http://example.invalid", "host_port": "example.invalid:80"}),
				RetryInterval: &metav1.Duration{Duration: 2 * time.Second},
			},
		})
	}
	for _, name := range []string{"auto", "manual"} {
		st := e.waitStack(t, name, stackTimeout, "denied", conditionIs(terracev1.PolicyDeniedCondition, metav1.ConditionTrue, "PolicyDenied"))
		want := "terraform_data.service: resources of type terraform_data are not allowed"
		if msg := conditionMessage(st, terracev1.PolicyDeniedCondition); !strings.Contains(msg, want) {
			t.Errorf("%s: PolicyDenied message %q does not list the violation", name, msg)
		}
		if err := conditionIs(terracev1.StalledCondition, metav1.ConditionTrue, "PolicyDenied")(st); err != nil {
			t.Errorf("%s: %v", name, err)
		}
		if p := st.Status.Plan; p == nil || p.Pending != "" || p.Policy == nil || p.Policy.Decision != "denied" || len(p.Policy.Violations) != 1 {
			t.Errorf("%s: status.plan %+v", name, st.Status.Plan)
		}
		if rs := e.releases(t, name); len(rs) != 0 {
			t.Errorf("%s: a denied plan was applied: %+v", name, rs)
		}
	}

	e.setPolicy(t, "types.rego", policyWarningTerraformData)

	st := e.waitStack(t, "auto", stackTimeout, "applied after the policy changed", readyAt)
	if err := conditionIs(terracev1.PolicyDeniedCondition, metav1.ConditionFalse, "PolicyPassed")(st); err != nil {
		t.Error(err)
	}
	if msg := conditionMessage(st, terracev1.PolicyDeniedCondition); !strings.Contains(msg, "terraform_data is discouraged") {
		t.Errorf("the warning does not annotate the plan: %q", msg)
	}
	rs := e.releases(t, "auto")
	if len(rs) != 1 || rs[0].Policy == nil || rs[0].Policy.Decision != "allowed" || len(rs[0].Policy.Warnings) != 1 {
		t.Errorf("release policy decision: %+v", rs)
	}

	manual := e.waitStack(t, "manual", stackTimeout, "plan awaiting approval", func(s *terracev1.Stack) error {
		if p := s.Status.Plan; p == nil || p.Pending == "" {
			return fmt.Errorf("no pending plan: %+v", s.Status.Plan)
		}
		return nil
	})
	if p := manual.Status.Plan; p.Policy == nil || p.Policy.Decision != "allowed" || len(p.Policy.Warnings) != 1 {
		t.Errorf("the pending plan does not carry its decision: %+v", p.Policy)
	}
	pending := manual.Status.Plan.Pending
	// The decision is kept with the stored plan, and whoever reviews it sees it.
	if rec := storedPlan(t, e, "manual", pending); rec.Policy == nil || rec.Policy.Decision != "allowed" || len(rec.Policy.Warnings) != 1 ||
		rec.Policy.PoliciesDigest != manual.Status.Plan.Policy.PoliciesDigest {
		t.Errorf("the stored plan %s does not carry its decision: %+v", pending, rec.Policy)
	}
	shown := terraceCLI(t, e, "plan", "manual", "-n", e.ns)
	for _, want := range []string{"policy:    allowed (policies " + manual.Status.Plan.Policy.PoliciesDigest, "warn: terraform_data.service: terraform_data is discouraged"} {
		if !strings.Contains(shown, want) {
			t.Errorf("terrace plan does not show %q:\n%s", want, shown)
		}
	}
	e.updateStack(t, "manual", func(s *terracev1.Stack) { s.Spec.ApprovePlan = pending })
	e.waitStack(t, "manual", stackTimeout, "approved plan applied", readyAt)
	if rs := e.releases(t, "manual"); len(rs) != 1 || rs[0].PlanID != pending || rs[0].Policy == nil || rs[0].Policy.Decision != "allowed" {
		t.Errorf("manual release: %+v", rs)
	}
}

// storedPlan is the record of a Stack's plan in the plan store.
func storedPlan(t *testing.T, e *stackEnv, stack, id string) state.PlanMeta {
	t.Helper()
	metas, err := secrets.New(e.c, secrets.Options{}).ListPlans(context.Background(), e.ns, stack)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range metas {
		if m.Key.ID == id {
			return m
		}
	}
	t.Fatalf("plan %s of %s is not stored (stored: %+v)", id, stack, metas)
	return state.PlanMeta{}
}

// policyDenyingAnyTerraformData denies every terraform_data a plan names,
// whatever the plan does with it: keeping it unchanged and deleting it too.
const policyDenyingAnyTerraformData = `package terrace

deny contains msg if {
	some rc in input.resource_changes
	rc.type == "terraform_data"
	msg := sprintf("%s: %s of a terraform_data is not allowed", [rc.address, concat("+", rc.change.actions)])
}
`

// TestStackPlanPolicyDecidesUnchangedAndDestroyPlans: a plan without
// changes is decided too, and its denial is shown (PolicyDenied) without
// blocking anything: the Stack stays Ready with what it applied. A
// destroyOnDelete destroy is planned and decided before it runs: a denial
// keeps the Stack, its resources and its state, says what to do, and the
// deletion goes through once the policy allows it.
func TestStackPlanPolicyDecidesUnchangedAndDestroyPlans(t *testing.T) {
	e := newStackEnv(t)
	e.policies(t, "types.rego", policyWarningTerraformData)
	e.program(t, "svc", map[string]string{"main.tf": healthModule})
	e.create(t, &terracev1.Stack{
		ObjectMeta: metav1.ObjectMeta{Name: "svc"},
		Spec: terracev1.StackSpec{
			Source:          terracev1.StackSource{ProgramRef: &terracev1.LocalObjectReference{Name: "svc"}},
			ApprovePlan:     terracev1.ApprovePlanAuto,
			DestroyOnDelete: true,
			Vars:            jsonVars(t, map[string]any{"url": "http://example.invalid", "host_port": "example.invalid:80"}),
			RetryInterval:   &metav1.Duration{Duration: 2 * time.Second},
		},
	})
	e.waitStack(t, "svc", stackTimeout, "Ready", readyAt)

	// The policy change plans again: no changes, denied, and nothing blocked.
	e.setPolicy(t, "types.rego", policyDenyingAnyTerraformData)
	st := e.waitStack(t, "svc", stackTimeout, "the unchanged plan denied", conditionIs(terracev1.PolicyDeniedCondition, metav1.ConditionTrue, "PolicyDenied"))
	if err := readyAt(st); err != nil {
		t.Errorf("a denied plan without changes blocked the Stack: %v (%s)", err, conditionsText(st))
	}
	if msg := conditionMessage(st, terracev1.PolicyDeniedCondition); !strings.Contains(msg, "has no changes, so nothing was blocked") || !strings.Contains(msg, "terraform_data.service: no-op of a terraform_data is not allowed") {
		t.Errorf("PolicyDenied message %q", msg)
	}
	if p := st.Status.Plan; p == nil || p.Policy == nil || p.Policy.Decision != "denied" {
		t.Errorf("status.plan of the unchanged plan: %+v", st.Status.Plan)
	}
	if rs := e.releases(t, "svc"); len(rs) != 1 {
		t.Errorf("releases after the unchanged plan: %d, want 1", len(rs))
	}

	// The destroy is denied: nothing destroyed, nothing removed.
	if err := e.c.Delete(context.Background(), &terracev1.Stack{ObjectMeta: metav1.ObjectMeta{Namespace: e.ns, Name: "svc"}}); err != nil {
		t.Fatal(err)
	}
	st = e.waitStack(t, "svc", stackTimeout, "the destroy denied", conditionIs(terracev1.StalledCondition, metav1.ConditionTrue, "PolicyDenied"))
	msg := stalled(st)
	for _, want := range []string{"deletion blocked", "terraform_data.service: delete of a terraform_data is not allowed", "nothing was destroyed", "change the plan policies", "remove the finalizer"} {
		if !strings.Contains(msg, want) {
			t.Errorf("Stalled message %q does not say %q", msg, want)
		}
	}
	if p := st.Status.Plan; p == nil || !p.DestroyPlan || p.Destroy != 1 || p.Policy == nil || p.Policy.Decision != "denied" {
		t.Errorf("status.plan of the destroy: %+v", st.Status.Plan)
	}
	if err := conditionIs(terracev1.PolicyDeniedCondition, metav1.ConditionTrue, "PolicyDenied")(st); err != nil {
		t.Error(err)
	}
	if kept, _ := e.stateOf(t, "svc"); !strings.Contains(string(kept.Data), `"terraform_data"`) {
		t.Errorf("the state lost its resources after a denied destroy: %.300s", kept.Data)
	}
	if rs := e.releases(t, "svc"); len(rs) != 1 {
		t.Errorf("releases after the denied destroy: %d, want 1", len(rs))
	}

	// Allowed again: the policy change wakes the deletion, which completes.
	e.setPolicy(t, "types.rego", policyWarningTerraformData)
	waitGone(t, stackTimeout, "Stack svc destroyed and deleted", func() error {
		return e.c.Get(context.Background(), client.ObjectKey{Namespace: e.ns, Name: "svc"}, &terracev1.Stack{})
	})
	if rs := e.releases(t, "svc"); len(rs) != 0 {
		t.Errorf("releases left after the destroy: %d", len(rs))
	}
}

// TestStackPlanPolicyInvalid: a policy that does not compile stops the
// Stack before any run, naming the module.
func TestStackPlanPolicyInvalid(t *testing.T) {
	e := newStackEnv(t)
	e.policies(t, "broken.rego", "package terrace\n\ndeny contains msg if {\n")
	e.program(t, "svc", map[string]string{"main.tf": healthModule})
	e.create(t, &terracev1.Stack{
		ObjectMeta: metav1.ObjectMeta{Name: "svc"},
		Spec: terracev1.StackSpec{
			Source:      terracev1.StackSource{ProgramRef: &terracev1.LocalObjectReference{Name: "svc"}},
			ApprovePlan: terracev1.ApprovePlanAuto,
			Vars:        jsonVars(t, map[string]any{"url": "http://example.invalid", "host_port": "example.invalid:80"}),
		},
	})
	st := e.waitStack(t, "svc", stackTimeout, "invalid policy", conditionIs(terracev1.StalledCondition, metav1.ConditionTrue, "InvalidPolicy"))
	if msg := stalled(st); !strings.Contains(msg, e.ns+"/policies/broken.rego:4") {
		t.Errorf("Stalled message does not name the module and line: %q", msg)
	}
	if st.Status.LastRun != "" {
		t.Errorf("a run was started with an invalid policy: %s", st.Status.LastRun)
	}
}

// policies creates the ConfigMap "policies" with one module and the
// namespace's TerraceConfig naming it.
func (e *stackEnv) policies(t *testing.T, key, module string) {
	t.Helper()
	e.create(t, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "policies"}, Data: map[string]string{key: module}})
	e.create(t, &terracev1.TerraceConfig{
		ObjectMeta: metav1.ObjectMeta{Name: terracev1.TerraceConfigName},
		Spec: terracev1.TerraceConfigSpec{PlanPolicy: &terracev1.PlanPolicyConfig{
			ConfigMapRefs: []terracev1.LocalObjectReference{{Name: "policies"}},
		}},
	})
}

// setPolicy replaces one module of the ConfigMap "policies".
func (e *stackEnv) setPolicy(t *testing.T, key, module string) {
	t.Helper()
	var cm corev1.ConfigMap
	if err := e.c.Get(context.Background(), client.ObjectKey{Namespace: e.ns, Name: "policies"}, &cm); err != nil {
		t.Fatal(err)
	}
	cm.Data[key] = module
	if err := e.c.Update(context.Background(), &cm); err != nil {
		t.Fatal(err)
	}
}

func conditionMessage(s *terracev1.Stack, t string) string {
	for _, c := range s.Status.Conditions {
		if c.Type == t {
			return c.Message
		}
	}
	return ""
}

func hasCheck(r release.Release, name string, passed bool) bool {
	for _, c := range r.HealthChecks {
		if c.Name == name && c.Passed == passed {
			return true
		}
	}
	return false
}
