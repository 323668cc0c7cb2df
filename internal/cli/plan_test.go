package cli

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/state"
	"github.com/terrace-dev/terrace/internal/state/secrets"
)

const humanPlan = `OpenTofu will perform the following actions:

  # terraform_data.web will be created
  + resource "terraform_data" "web" {}

Plan: 2 to add, 1 to change, 0 to destroy.
`

func TestPlanShowsThePendingPlanWithItsReadableRendering(t *testing.T) {
	env, _ := apiServer(t)
	ns := env.Namespace(t)
	newStack(t, ns, "web", func(s *terracev1.StackSpec) { s.StoreReadablePlan = terracev1.ReadablePlanHuman }, awaiting("plan-7-abc"))
	plans := secrets.New(env.Client, secrets.Options{})
	_, err := plans.PutPlan(context.Background(), state.Plan{
		PlanMeta: state.PlanMeta{Key: state.PlanKey{Namespace: ns, Stack: "web", ID: "plan-7-abc"}, ReadableFormat: state.ReadableHuman,
			Policy: &state.PlanPolicy{Decision: "allowed", Warnings: []string{"terraform_data.web: discouraged"}, PoliciesDigest: "sha256:0f"}},
		Binary: []byte("saved plan bytes"), Readable: []byte(humanPlan),
	})
	if err != nil {
		t.Fatal(err)
	}

	out, _, err := verb(t, "plan", "web", "-n", ns)
	if err != nil {
		t.Fatal(err)
	}
	mustContain(t, "plan", out,
		"Stack "+ns+"/web: plan plan-7-abc awaits approval",
		"+2 to add, ~1 to change, -0 to destroy",
		"created:   "+planCreated.UTC().Format(time.RFC3339)+" (5m", "main@sha1:def",
		"terrace approve web plan-7-abc -n "+ns,
		"policy:    allowed (policies sha256:0f)", "warn: terraform_data.web: discouraged",
		`+ resource "terraform_data" "web" {}`)

	out, _, err = verb(t, "plan", "web", "-n", ns, "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		Plan       terracev1.PlanStatus `json:"plan"`
		Approvable bool                 `json:"approvable"`
		Readable   string               `json:"readable"`
		Stored     *state.PlanPolicy    `json:"storedPolicy"`
	}
	if err := json.Unmarshal([]byte(out), &got); err != nil || got.Plan.Pending != "plan-7-abc" || !got.Approvable || got.Readable != humanPlan ||
		got.Stored == nil || got.Stored.Decision != "allowed" {
		t.Fatalf("plan -o json: %v %+v", err, got)
	}
}

func TestPlanSaysWhyNoneIsPending(t *testing.T) {
	env, _ := apiServer(t)
	ns := env.Namespace(t)
	newStack(t, ns, "ready", nil, readyAt(3))
	newStack(t, ns, "auto", func(s *terracev1.StackSpec) { s.ApprovePlan = terracev1.ApprovePlanAuto }, readyAt(1))
	newStack(t, ns, "fresh", nil, nil)
	newStack(t, ns, "running", nil, func(st *terracev1.StackStatus) {
		setCondition(st, terracev1.ReconcilingCondition, metav1.ConditionTrue, "Progressing", "planning main@sha1:def")
		setCondition(st, terracev1.ReadyCondition, metav1.ConditionUnknown, "Progressing", "planning main@sha1:def")
	})
	newStack(t, ns, "nostore", nil, awaiting("plan-2-ccc"))

	_, _, err := verb(t, "plan", "ready", "-n", ns)
	mustFail(t, err, "no plan is pending for Stack "+ns+"/ready: it is Ready at release 3 (main@sha1:abc)")
	_, _, err = verb(t, "plan", "auto", "-n", ns)
	mustFail(t, err, "approvePlan is auto")
	_, _, err = verb(t, "plan", "fresh", "-n", ns)
	mustFail(t, err, "has not been reconciled yet")
	_, _, err = verb(t, "plan", "running", "-n", ns)
	mustFail(t, err, "a run is in progress: planning main@sha1:def")
	_, _, err = verb(t, "plan", "missing", "-n", ns)
	mustFail(t, err, "Stack "+ns+"/missing not found in namespace "+ns)

	// Pending, but the Stack stores no readable plan: say how to get one.
	out, _, err := verb(t, "plan", "nostore", "-n", ns)
	if err != nil {
		t.Fatal(err)
	}
	mustContain(t, "plan", out, "plan plan-2-ccc awaits approval", "set spec.storeReadablePlan to human or json")
}

func TestApproveSetsThePendingPlanAndRefusesAStaleOne(t *testing.T) {
	env, _ := apiServer(t)
	ns := env.Namespace(t)
	newStack(t, ns, "web", nil, awaiting("plan-7-abc"))
	newStack(t, ns, "db", nil, awaiting("plan-3-ddd"))
	newStack(t, ns, "ready", nil, readyAt(2))

	_, _, err := verb(t, "approve", "web", "plan-6-old", "-n", ns)
	mustFail(t, err, "plan plan-6-old is not the pending plan of Stack "+ns+"/web: plan-7-abc is (+2 ~1 -0)")
	if got := getStack(t, ns, "web").Spec.ApprovePlan; got != "" {
		t.Fatalf("a stale id changed spec.approvePlan to %q", got)
	}

	out, _, err := verb(t, "approve", "web", "plan-7-abc", "-n", ns)
	if err != nil {
		t.Fatal(err)
	}
	mustContain(t, "approve", out, "approved plan plan-7-abc of Stack "+ns+"/web (+2 ~1 -0)")
	web := getStack(t, ns, "web")
	if web.Spec.ApprovePlan != "plan-7-abc" || web.Status.Plan.Pending != "plan-7-abc" {
		t.Fatalf("approvePlan %q, status %+v", web.Spec.ApprovePlan, web.Status.Plan)
	}
	out, _, err = verb(t, "approve", "web", "-n", ns)
	if err != nil || !strings.Contains(out, "already approved") {
		t.Fatalf("second approve: %v %s", err, out)
	}

	// Without an id, the pending plan is approved.
	if _, _, err := verb(t, "approve", "db", "-n", ns); err != nil {
		t.Fatal(err)
	}
	if got := getStack(t, ns, "db").Spec.ApprovePlan; got != "plan-3-ddd" {
		t.Fatalf("approvePlan = %q", got)
	}

	_, _, err = verb(t, "approve", "ready", "-n", ns)
	mustFail(t, err, "no plan is pending for Stack "+ns+"/ready: it is Ready at release 2")
	_, _, err = verb(t, "approve", "gone", "-n", ns)
	mustFail(t, err, "Stack "+ns+"/gone not found in namespace "+ns)
}
