package server

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	runnerv1 "github.com/terrace-dev/terrace/proto/terrace/runner/v1"
)

const cycleSecret = "s3cr3t-Pa55<w0rd>&more"

var cycleModule = map[string]string{
	"main.tf": `
variable "secret" {
  type      = string
  sensitive = true
}

variable "name" {
  type    = string
  default = "web"
}

locals {
  greeting = "hello-${var.name}"
}

module "child" {
  source = "./modules/child"
  input  = local.greeting
  secret = var.secret
}

resource "terraform_data" "plain" {
  input = local.greeting
}

resource "terraform_data" "secret" {
  input = var.secret
}

output "greeting" {
  value = module.child.upper
}

output "secret" {
  value     = var.secret
  sensitive = true
}

# A copy stripped of its sensitivity: tofu prints it in clear, the runner
# must still redact it.
output "copy" {
  value = nonsensitive("copy:${var.secret}")
}
`,
	"modules/child/main.tf": `
variable "input" {
  type = string
}

variable "secret" {
  type      = string
  sensitive = true
}

resource "terraform_data" "child" {
  input = {
    name  = var.input
    token = var.secret
  }
}

output "upper" {
  value = upper(var.input)
}
`,
}

func TestFullCycleOverMutualTLS(t *testing.T) {
	tr := startRunner(t, nil)
	c := tr.client
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	logs := &logCollector{}
	var leaving []string // everything that left the runner, besides outputs

	tr.upload(t, cycleModule)
	initRes, err := c.Init(ctx, &runnerv1.InitRequest{}, logs.log)
	if err != nil {
		t.Fatalf("init failed: %v", err)
	}
	if initRes.GetVersion() == "" {
		t.Errorf("init reported no tofu version")
	}

	secretVars, _ := json.Marshal(map[string]string{"secret": cycleSecret})
	vars := &runnerv1.Variables{Json: secretVars}
	plan, err := c.Plan(ctx, &runnerv1.PlanRequest{Variables: vars}, logs.log)
	if err != nil {
		t.Fatalf("plan failed: %v", err)
	}
	s := plan.GetSummary()
	if !plan.GetHasChanges() || s.GetAdd() != 3 || s.GetChange() != 0 || s.GetDestroy() != 0 || s.GetOutputChanges() != 3 {
		t.Fatalf("first plan: has_changes=%v summary=%v, want 3 to add and 3 output changes", plan.GetHasChanges(), s)
	}
	if !strings.HasPrefix(plan.GetPlanId(), "plan-") {
		t.Errorf("plan id %q", plan.GetPlanId())
	}
	leaving = append(leaving, string(plan.JSON))
	var planDoc map[string]any
	if err := json.Unmarshal(plan.JSON, &planDoc); err != nil {
		t.Fatalf("plan JSON does not parse: %v", err)
	}
	if v := planDoc["variables"].(map[string]any)["secret"].(map[string]any)["value"]; v != "(sensitive value)" {
		t.Errorf("plan JSON variables.secret.value = %v, want redacted", v)
	}

	shownJSON, err := c.ShowPlan(ctx, plan.GetPlanId(), runnerv1.PlanFormat_PLAN_FORMAT_JSON)
	if err != nil {
		t.Fatalf("show json failed: %v", err)
	}
	human, err := c.ShowPlan(ctx, plan.GetPlanId(), runnerv1.PlanFormat_PLAN_FORMAT_HUMAN)
	if err != nil {
		t.Fatalf("show human failed: %v", err)
	}
	leaving = append(leaving, string(shownJSON), string(human))
	if !strings.Contains(string(human), "terraform_data.secret") || !strings.Contains(string(human), "(sensitive value)") {
		t.Errorf("human plan lacks the resource or the redaction marker:\n%s", human)
	}

	if err := c.Apply(ctx, plan.GetPlanId(), logs.log); err != nil {
		t.Fatalf("apply failed: %v", err)
	}
	outs, err := c.Outputs(ctx)
	if err != nil {
		t.Fatalf("outputs failed: %v", err)
	}
	if got := outs["greeting"]; got.Sensitive || string(got.Value) != `"HELLO-WEB"` {
		t.Errorf("output greeting = %+v", got)
	}
	var secretOut string
	if err := json.Unmarshal(outs["secret"].Value, &secretOut); err != nil || !outs["secret"].Sensitive || secretOut != cycleSecret {
		t.Errorf("output secret: sensitive=%v value=%q err=%v; want the clear value flagged sensitive", outs["secret"].Sensitive, secretOut, err)
	}

	again, err := c.Plan(ctx, &runnerv1.PlanRequest{Variables: vars, PlanId: "second"}, logs.log)
	if err != nil {
		t.Fatalf("second plan failed: %v", err)
	}
	if again.GetHasChanges() || again.GetSummary().GetAdd()+again.GetSummary().GetChange()+again.GetSummary().GetDestroy() != 0 {
		t.Fatalf("second plan has changes: %v", again.GetSummary())
	}
	if again.GetPlanId() != "second" {
		t.Errorf("plan id = %q, want the requested one", again.GetPlanId())
	}
	leaving = append(leaving, string(again.JSON))

	destroyPlan, err := c.Plan(ctx, &runnerv1.PlanRequest{Variables: vars, Destroy: true}, logs.log)
	if err != nil {
		t.Fatalf("destroy plan failed: %v", err)
	}
	if destroyPlan.GetSummary().GetDestroy() != 3 || destroyPlan.GetSummary().GetAdd() != 0 {
		t.Errorf("destroy plan summary = %v, want 3 to destroy", destroyPlan.GetSummary())
	}
	leaving = append(leaving, string(destroyPlan.JSON))

	if err := c.Destroy(ctx, &runnerv1.DestroyRequest{Variables: vars}, logs.log); err != nil {
		t.Fatalf("destroy failed: %v", err)
	}
	outs, err = c.Outputs(ctx)
	if err != nil {
		t.Fatalf("outputs after destroy failed: %v", err)
	}
	if len(outs) != 0 {
		t.Errorf("outputs after destroy = %v, want none", outs)
	}
	after, err := c.Plan(ctx, &runnerv1.PlanRequest{Variables: vars}, logs.log)
	if err != nil {
		t.Fatalf("plan after destroy failed: %v", err)
	}
	if after.GetSummary().GetAdd() != 3 {
		t.Errorf("plan after destroy = %v, want 3 to add again", after.GetSummary())
	}
	leaving = append(leaving, string(after.JSON))

	logText := logs.text()
	for _, want := range []string{"Apply complete!", "Destroy complete!", "terraform_data.secret"} {
		if !strings.Contains(logText, want) {
			t.Errorf("logs lack %q", want)
		}
	}
	leaving = append(leaving, logText, tr.echo.String())
	for i, text := range leaving {
		for _, form := range []string{cycleSecret, "s3cr3t-Pa55", `s3cr3t-Pa55\u003cw0rd\u003e\u0026more`} {
			if strings.Contains(text, form) {
				t.Errorf("the sensitive value (%q) left the runner in output #%d", form, i)
			}
		}
	}
}
