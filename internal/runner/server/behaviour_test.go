package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/terrace-dev/terrace/internal/runner"
	runnerv1 "github.com/terrace-dev/terrace/proto/terrace/runner/v1"
)

func TestInvalidConfigurationNamesFileAndLine(t *testing.T) {
	tr := startRunner(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	tr.upload(t, map[string]string{"main.tf": "resource \"terraform_data\" \"a\" {\n  input = \"x\"\n  this is not hcl\n}\n"})
	_, err := tr.client.Init(ctx, &runnerv1.InitRequest{}, nil)
	if runner.Reason(err) != runner.ReasonCommandFailed || !strings.Contains(err.Error(), "main.tf line 3") {
		t.Fatalf("init of invalid HCL answered %v, want a command failure naming main.tf line 3", err)
	}

	tr.upload(t, map[string]string{
		"main.tf":          "resource \"terraform_data\" \"a\" {\n  input = \"x\"\n}\n",
		"modules/m/x.tf":   "",
		"outputs.tf":       "\n\noutput \"o\" {\n  value = local.missing\n}\n",
		"variables.tf":     "",
		"terraform.tfvars": "",
	})
	if _, err := tr.client.Init(ctx, &runnerv1.InitRequest{}, nil); err != nil {
		t.Fatalf("init failed: %v", err)
	}
	logs := &logCollector{}
	_, err = tr.client.Plan(ctx, &runnerv1.PlanRequest{}, logs.log)
	if runner.Reason(err) != runner.ReasonCommandFailed || !strings.Contains(err.Error(), "outputs.tf line 4") || !strings.Contains(err.Error(), "local.missing") {
		t.Fatalf("plan of an invalid reference answered %v, want a command failure naming outputs.tf line 4", err)
	}
	if !strings.Contains(logs.text(), "outputs.tf line 4") {
		t.Errorf("the plan's log lines do not carry the diagnostic:\n%s", logs.text())
	}
}

const slowModule = `
resource "terraform_data" "slow" {
  provisioner "local-exec" {
    command = "sleep 120"
  }
}
`

func TestOneOperationAtATimeAndCancelInterruptsTofu(t *testing.T) {
	tr := startRunner(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	tr.upload(t, map[string]string{"main.tf": slowModule})
	if _, err := tr.client.Init(ctx, &runnerv1.InitRequest{}, nil); err != nil {
		t.Fatalf("init failed: %v", err)
	}
	plan, err := tr.client.Plan(ctx, &runnerv1.PlanRequest{}, nil)
	if err != nil {
		t.Fatalf("plan failed: %v", err)
	}

	applyCtx, stopApply := context.WithCancel(ctx)
	defer stopApply()
	provisioning := make(chan struct{})
	var once bool
	applyDone := make(chan error, 1)
	start := time.Now()
	go func() {
		applyDone <- tr.client.Apply(applyCtx, plan.GetPlanId(), func(line string) {
			if !once && strings.Contains(line, "local-exec") {
				once = true
				close(provisioning)
			}
		})
	}()
	select {
	case <-provisioning:
	case err := <-applyDone:
		t.Fatalf("apply ended before provisioning: %v", err)
	case <-ctx.Done():
		t.Fatal("apply never reached the provisioner")
	}

	lockFile := filepath.Join(tr.workDir, "source", ".terraform.tfstate.lock.info")
	if _, err := os.Stat(lockFile); err != nil {
		t.Fatalf("tofu holds no state lock during apply: %v", err)
	}
	_, err = tr.client.Plan(ctx, &runnerv1.PlanRequest{}, nil)
	if status.Code(err) != codes.FailedPrecondition || !runner.IsBusy(err) {
		t.Fatalf("a concurrent plan answered %v, want FailedPrecondition (busy)", err)
	}
	if _, err := tr.client.Outputs(ctx); !runner.IsBusy(err) {
		t.Fatalf("a concurrent output answered %v, want busy", err)
	}

	stopApply()
	if err := <-applyDone; status.Code(err) != codes.Canceled {
		t.Fatalf("cancelled apply answered %v, want Canceled", err)
	}
	// The runner stays busy until tofu has stopped; then the lock is gone.
	for {
		_, err := tr.client.Outputs(ctx)
		if err == nil {
			break
		}
		if !runner.IsBusy(err) {
			t.Fatalf("outputs after the cancel answered %v", err)
		}
		select {
		case <-ctx.Done():
			t.Fatal("the runner stayed busy after the cancel")
		case <-time.After(100 * time.Millisecond):
		}
	}
	if elapsed := time.Since(start); elapsed > 60*time.Second {
		t.Errorf("tofu took %s to stop; the 120s provisioner was not interrupted", elapsed)
	}
	if _, err := os.Stat(lockFile); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("state lock still present after the interrupt: %v", err)
	}
	if !strings.Contains(tr.echo.String(), "Interrupt received") {
		t.Errorf("tofu did not report a graceful interrupt; its output:\n%s", tr.echo.String())
	}
	// A new operation takes the lock again.
	if _, err := tr.client.Plan(ctx, &runnerv1.PlanRequest{PlanId: "after-interrupt"}, nil); err != nil {
		t.Fatalf("plan after the interrupt failed: %v", err)
	}
}

// bigModule makes a 4.4 MB string (base64 of hashes, so it compresses
// poorly) that lands in the plan JSON, the plan file, the state and an
// output, each over 4 MiB.
const bigModule = `
locals {
  big = join("", [for i in range(1000) : join("", [for j in range(50) : base64sha512("${i}-${j}")])])
}

resource "terraform_data" "big" {
  input = local.big
}

output "big" {
  value = local.big
}
`

const bigLength = 1000 * 50 * 88

func TestLargePlanAndStateStreamAcrossRunners(t *testing.T) {
	const limit = 4 << 20
	if bigLength <= limit {
		t.Fatalf("the module's value (%d bytes) must exceed 4 MiB", bigLength)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	planner := startRunner(t, nil)
	// The value lands in the plan JSON several times over (before, after,
	// planned values, output changes): past runner.DefaultLimits, which another
	// test holds. This one is about streaming past gRPC's 4 MiB.
	planner.client.SetLimits(runner.Limits{PlanJSONBytes: 64 << 20, ShowPlanBytes: 64 << 20})
	planner.upload(t, map[string]string{"main.tf": bigModule})
	if _, err := planner.client.Init(ctx, &runnerv1.InitRequest{}, nil); err != nil {
		t.Fatalf("init failed: %v", err)
	}
	plan, err := planner.client.Plan(ctx, &runnerv1.PlanRequest{PlanId: "big"}, nil)
	if err != nil {
		t.Fatalf("plan failed: %v", err)
	}
	if len(plan.JSON) <= limit || !json.Valid(plan.JSON) {
		t.Fatalf("plan JSON is %d bytes (valid=%v), want a valid document over 4 MiB", len(plan.JSON), json.Valid(plan.JSON))
	}
	shown, err := planner.client.ShowPlan(ctx, "big", runnerv1.PlanFormat_PLAN_FORMAT_JSON)
	if err != nil || len(shown) <= limit {
		t.Fatalf("show plan: %d bytes, err %v", len(shown), err)
	}
	var planFile bytes.Buffer
	header, err := planner.client.DownloadPlan(ctx, "big", &planFile)
	if err != nil {
		t.Fatalf("download plan failed: %v", err)
	}
	if planFile.Len() <= limit || header.GetSize() != int64(planFile.Len()) {
		t.Fatalf("plan file is %d bytes (header %d), want over 4 MiB", planFile.Len(), header.GetSize())
	}

	// A fresh runner, as after an approval hours later, applies the kept plan.
	applier := startRunner(t, planner.authority)
	applier.client.SetLimits(runner.Limits{PlanJSONBytes: 64 << 20, ShowPlanBytes: 64 << 20})
	applier.upload(t, map[string]string{"main.tf": bigModule})
	if _, err := applier.client.Init(ctx, &runnerv1.InitRequest{}, nil); err != nil {
		t.Fatalf("init on the second runner failed: %v", err)
	}
	if err := applier.client.UploadPlan(ctx, "big", "sha256:"+strings.Repeat("0", 64), bytes.NewReader(planFile.Bytes())); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("upload of a plan with a wrong digest answered %v, want InvalidArgument", err)
	}
	if err := applier.client.UploadPlan(ctx, "big", header.GetDigest(), bytes.NewReader(planFile.Bytes())); err != nil {
		t.Fatalf("upload plan failed: %v", err)
	}
	if err := applier.client.Apply(ctx, "big", nil); err != nil {
		t.Fatalf("apply of the uploaded plan failed: %v", err)
	}
	state, err := os.Stat(filepath.Join(applier.workDir, "source", "terraform.tfstate"))
	if err != nil || state.Size() <= limit {
		t.Fatalf("state: %v, want a state over 4 MiB", err)
	}
	outs, err := applier.client.Outputs(ctx)
	if err != nil {
		t.Fatalf("outputs failed: %v", err)
	}
	var big string
	if err := json.Unmarshal(outs["big"].Value, &big); err != nil || len(big) != bigLength {
		t.Fatalf("output big: %d bytes, err %v; want %d", len(big), err, bigLength)
	}
	again, err := applier.client.Plan(ctx, &runnerv1.PlanRequest{}, nil)
	if err != nil {
		t.Fatalf("plan after applying the uploaded plan failed: %v", err)
	}
	if again.GetHasChanges() {
		t.Fatal("plan after applying the uploaded plan has changes, want none")
	}
	if _, err := applier.client.ShowPlan(ctx, "no-such-plan", runnerv1.PlanFormat_PLAN_FORMAT_JSON); status.Code(err) != codes.NotFound {
		t.Errorf("show of an unknown plan answered %v, want NotFound", err)
	}
}
