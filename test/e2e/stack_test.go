package e2e

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/controller/outcome"
	"github.com/terrace-dev/terrace/internal/readiness"
	"github.com/terrace-dev/terrace/internal/state/release"
	"github.com/terrace-dev/terrace/internal/state/secrets"
)

// stackTimeout bounds one run on the dev cluster: pod start, init, plan,
// apply. Runs take seconds; the margin is for a loaded two-core machine.
const stackTimeout = 3 * time.Minute

// webModule uses terraform_data, locals, a local-path child module, a
// sensitive variable and a sensitive output.
var webModule = map[string]string{
	"main.tf": `
variable "environment" { type = string }
variable "replicas" {
  type    = number
  default = 1
}
variable "api_token" {
  type      = string
  sensitive = true
}
locals { name = "web-${var.environment}" }
module "naming" {
  source = "./modules/naming"
  prefix = local.name
}
resource "terraform_data" "app" {
  input = {
    name     = module.naming.full_name
    replicas = var.replicas
  }
}
output "app_name" { value = terraform_data.app.output.name }
output "replicas" { value = terraform_data.app.output.replicas }
output "token_echo" {
  value     = var.api_token
  sensitive = true
}
`,
	"modules/naming/main.tf": `
variable "prefix" { type = string }
output "full_name" { value = "${var.prefix}-app" }
`,
}

func jsonVars(t *testing.T, vars map[string]any) map[string]apiextensionsv1.JSON {
	t.Helper()
	out := map[string]apiextensionsv1.JSON{}
	for k, v := range vars {
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		out[k] = apiextensionsv1.JSON{Raw: b}
	}
	return out
}

// secretToken returns a value unique to the test that must never appear
// anywhere but the Secrets holding it.
func secretToken(t *testing.T) string {
	h := sha256.Sum256([]byte(t.Name() + time.Now().String()))
	return "tok-" + hex.EncodeToString(h[:12])
}

// credentials creates a Secret the runner may read (varsFrom is read with
// the runner ServiceAccount's rights).
func (e *stackEnv) credentials(t *testing.T, name, token string) {
	e.allowRunnerToRead(t, name)
	e.create(t, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name}, StringData: map[string]string{"api_token": token}})
}

func webStack(name string, approve string, vars map[string]apiextensionsv1.JSON) *terracev1.Stack {
	return &terracev1.Stack{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: terracev1.StackSpec{
			Source:               terracev1.StackSource{ProgramRef: &terracev1.LocalObjectReference{Name: "web"}},
			Vars:                 vars,
			VarsFrom:             []terracev1.VarsReference{{Kind: "Secret", Name: "creds"}},
			ApprovePlan:          approve,
			WriteOutputsToSecret: &terracev1.OutputsSecret{Name: name + "-outputs"},
			RetryInterval:        &metav1.Duration{Duration: 2 * time.Second},
		},
	}
}

func (e *stackEnv) releases(t *testing.T, stack string) []release.Release {
	t.Helper()
	rs, err := secrets.New(e.c, secrets.Options{}).ListReleases(context.Background(), e.ns, stack)
	if err != nil {
		t.Fatal(err)
	}
	return rs
}

func (e *stackEnv) outputs(t *testing.T, name string) map[string]string {
	t.Helper()
	var sec corev1.Secret
	if err := e.c.Get(context.Background(), client.ObjectKey{Namespace: e.ns, Name: name}, &sec); err != nil {
		t.Fatalf("outputs Secret %s: %v", name, err)
	}
	out := map[string]string{}
	for k, v := range sec.Data {
		out[k] = string(v)
	}
	return out
}

// assertNoSecretAnywhere checks status, events, release records and the
// controller's log for the token.
func (e *stackEnv) assertNoSecretAnywhere(t *testing.T, stack, token string) {
	t.Helper()
	st := e.getStack(t, stack)
	statusJSON, _ := json.Marshal(st.Status)
	if strings.Contains(string(statusJSON), token) {
		t.Errorf("the secret appears in the Stack's status: %s", statusJSON)
	}
	var events eventsv1.EventList
	if err := e.c.List(context.Background(), &events, client.InNamespace(e.ns)); err != nil {
		t.Fatal(err)
	}
	for _, ev := range events.Items {
		if strings.Contains(ev.Note, token) {
			t.Errorf("the secret appears in event %s: %s", ev.Reason, ev.Note)
		}
	}
	for _, r := range e.releases(t, stack) {
		body, _ := json.Marshal(r)
		if strings.Contains(string(body), token) {
			t.Errorf("the secret appears in release %d: %s", r.Revision, body)
		}
	}
	if strings.Contains(controllerLog.String(), token) {
		t.Errorf("the secret appears in the controller's log")
	}
}

func TestStackAutoApply(t *testing.T) {
	e := newStackEnv(t)
	token := secretToken(t)
	e.credentials(t, "creds", token)
	e.program(t, "web", webModule)
	e.create(t, webStack("web", terracev1.ApprovePlanAuto, jsonVars(t, map[string]any{"environment": "test", "replicas": 2})))

	st := e.waitStack(t, "web", stackTimeout, "Ready", readyAt)
	if ready, why, err := readiness.ReadyAtGeneration(st); err != nil || !ready {
		t.Errorf("not Ready at its generation as kstatus reads it: %s %v", why, err)
	}
	out := e.outputs(t, "web-outputs")
	if out["app_name"] != "web-test-app" || out["replicas"] != "2" {
		t.Errorf("outputs Secret: %v", out)
	}
	if out["token_echo"] != token {
		t.Errorf("the outputs Secret must hold the sensitive output (it is a Secret); got %q", out["token_echo"])
	}
	if got := strings.Join(st.Status.Outputs, ","); got != "app_name,replicas,token_echo" {
		t.Errorf("status.outputs: %s", got)
	}
	rs := e.releases(t, "web")
	if len(rs) != 1 || rs[0].Revision != 1 || rs[0].Status != release.StatusDeployed || rs[0].Plan.Add != 1 {
		t.Fatalf("releases: %+v", rs)
	}
	// What applied it: `terrace history` shows these.
	if !strings.HasPrefix(rs[0].ToolVersion, "1.") || rs[0].RunnerImage == "" {
		t.Errorf("the release does not say what applied it: tool version %q, runner image %q", rs[0].ToolVersion, rs[0].RunnerImage)
	}
	if st.Status.Release == nil || st.Status.Release.Revision != 1 || st.Status.Release.Status != "deployed" {
		t.Errorf("status.release: %+v", st.Status.Release)
	}
	e.assertNoSecretAnywhere(t, "web", token)
}

func TestStackApprovalAppliesExactlyThePlan(t *testing.T) {
	e := newStackEnv(t)
	e.credentials(t, "creds", secretToken(t))
	e.program(t, "web", webModule)
	e.create(t, webStack("web", terracev1.ApprovePlanAuto, jsonVars(t, map[string]any{"environment": "test", "replicas": 2})))
	e.waitStack(t, "web", stackTimeout, "Ready", readyAt)

	// Manual approval from now on; a change of vars makes a pending plan.
	e.updateStack(t, "web", func(s *terracev1.Stack) {
		s.Spec.ApprovePlan = ""
		s.Spec.Vars = jsonVars(t, map[string]any{"environment": "test", "replicas": 5})
	})
	st := e.waitStack(t, "web", stackTimeout, "a pending plan", conditionIs(terracev1.ReadyCondition, metav1.ConditionFalse, "AwaitingApproval"))
	p := st.Status.Plan
	if p == nil || p.Pending == "" || p.Add != 0 || p.Change != 1 || p.Destroy != 0 {
		t.Fatalf("pending plan: %+v", p)
	}
	if out := e.outputs(t, "web-outputs"); out["replicas"] != "2" {
		t.Fatalf("a pending plan changed the outputs: %v", out)
	}
	if rs := e.releases(t, "web"); len(rs) != 1 {
		t.Fatalf("a pending plan recorded a release: %+v", rs)
	}

	planID := p.Pending
	e.updateStack(t, "web", func(s *terracev1.Stack) { s.Spec.ApprovePlan = planID })
	st = e.waitStack(t, "web", stackTimeout, "Ready after approval", readyAt)
	if st.Status.Plan.Pending != "" {
		t.Errorf("plan still pending after apply: %+v", st.Status.Plan)
	}
	if out := e.outputs(t, "web-outputs"); out["replicas"] != "5" {
		t.Errorf("outputs after approval: %v", out)
	}
	rs := e.releases(t, "web")
	if len(rs) != 2 || rs[0].Status != release.StatusSuperseded || rs[1].Status != release.StatusDeployed || rs[1].PlanID != planID {
		t.Fatalf("releases after approval: %+v", rs)
	}
}

func TestStackBadInputsStallAndRecover(t *testing.T) {
	e := newStackEnv(t)
	e.program(t, "web", webModule)

	// A missing varsFrom Secret the runner would be allowed to read.
	e.allowRunnerToRead(t, "creds")
	e.create(t, webStack("web", terracev1.ApprovePlanAuto, jsonVars(t, map[string]any{"environment": "test"})))
	e.waitStack(t, "web", stackTimeout, "Stalled on the missing Secret", func(s *terracev1.Stack) error {
		if err := conditionIs(terracev1.StalledCondition, metav1.ConditionTrue, "VarsNotFound")(s); err != nil {
			return err
		}
		if msg := outcome.Get(s, terracev1.ReadyCondition).Message; !strings.Contains(msg, "creds") {
			return fmt.Errorf("message does not name the Secret: %s", msg)
		}
		return nil
	})
	e.credentials(t, "creds", secretToken(t))
	e.updateStack(t, "web", func(s *terracev1.Stack) {
		s.Annotations = map[string]string{terracev1.ReconcileRequestAnnotation: "secret-created"}
	})
	e.waitStack(t, "web", stackTimeout, "Ready once the Secret exists", readyAt)

	// A variable of the wrong type.
	e.updateStack(t, "web", func(s *terracev1.Stack) {
		s.Spec.Vars = jsonVars(t, map[string]any{"environment": "test", "replicas": "many"})
	})
	e.waitStack(t, "web", stackTimeout, "Stalled on the wrong type", func(s *terracev1.Stack) error {
		if err := conditionIs(terracev1.StalledCondition, metav1.ConditionTrue, "PlanFailed")(s); err != nil {
			return err
		}
		if msg := outcome.Get(s, terracev1.ReadyCondition).Message; !strings.Contains(msg, "replicas") {
			return fmt.Errorf("message does not name the variable: %s", msg)
		}
		return nil
	})
	e.updateStack(t, "web", func(s *terracev1.Stack) {
		s.Spec.Vars = jsonVars(t, map[string]any{"environment": "test", "replicas": 3})
	})
	e.waitStack(t, "web", stackTimeout, "Ready with the right type", readyAt)

	// Invalid HCL in the Program.
	broken := map[string]string{"main.tf": webModule["main.tf"] + "\nresource \"terraform_data\" \"oops\" {\n", "modules/naming/main.tf": webModule["modules/naming/main.tf"]}
	e.program(t, "web", broken)
	e.waitStack(t, "web", stackTimeout, "Stalled on invalid HCL", func(s *terracev1.Stack) error {
		if err := conditionIs(terracev1.StalledCondition, metav1.ConditionTrue, terracev1.InvalidProgramReason)(s); err != nil {
			return err
		}
		if msg := outcome.Get(s, terracev1.ReadyCondition).Message; !strings.Contains(msg, "main.tf:") {
			return fmt.Errorf("message does not name file and line: %s", msg)
		}
		return nil
	})
	e.program(t, "web", webModule)
	e.waitStack(t, "web", stackTimeout, "Ready once the Program is fixed", func(s *terracev1.Stack) error {
		if err := readyAt(s); err != nil {
			return err
		}
		if outcome.IsTrue(s, terracev1.StalledCondition) {
			return fmt.Errorf("still Stalled")
		}
		return nil
	})
}
