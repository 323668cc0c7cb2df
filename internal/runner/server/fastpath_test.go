package server

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/terrace-dev/terrace/internal/pki"
	"github.com/terrace-dev/terrace/internal/runner"
	"github.com/terrace-dev/terrace/internal/runphase"
	"github.com/terrace-dev/terrace/internal/testenv"
	"github.com/terrace-dev/terrace/internal/tf"
	runnerv1 "github.com/terrace-dev/terrace/proto/terrace/runner/v1"
)

// countingTofu puts a wrapper in front of the real tofu that appends each
// invocation's subcommand to a file, and returns how to read the list.
func countingTofu(t *testing.T) (wrapper string, calls func() []string) {
	t.Helper()
	tofu := testenv.RequireTofu(t)
	dir := t.TempDir()
	log := filepath.Join(dir, "calls")
	wrapper = filepath.Join(dir, "tofu")
	script := fmt.Sprintf("#!/bin/sh\necho \"$1 $2\" >> %q\nexec %q \"$@\"\n", log, tofu)
	if err := os.WriteFile(wrapper, []byte(script), 0o700); err != nil {
		t.Fatal(err)
	}
	return wrapper, func() []string {
		data, err := os.ReadFile(log)
		if err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
		return strings.Fields(strings.ReplaceAll(string(data), "\n", " "))
	}
}

// subcommands keeps the subcommand of each recorded call ("version -json" → "version").
func subcommands(calls []string) []string {
	var out []string
	for _, c := range calls {
		if !strings.HasPrefix(c, "-") {
			out = append(out, c)
		}
	}
	return out
}

// fastModule has a sensitive variable, a sensitive output and a plain one.
var fastModule = map[string]string{"main.tf": `
variable "token" {
  type      = string
  sensitive = true
}
variable "n" { type = number }
resource "terraform_data" "item" { input = "item-${var.n}" }
output "name" { value = terraform_data.item.output }
output "token" {
  value     = var.token
  sensitive = true
}
output "shape" { value = { n = var.n, tags = ["a", "b"] } }
`}

const fastToken = "fast-path-t0ken-value"

// TestOneRunStartsOnlyTheToolProcessesItNeeds is the run of a Stack under
// approvePlan: auto, against the http backend as in a runner pod: init,
// one pass of plan and apply, outputs read from the state the backend
// holds. In one process (PlanRequest.one_process) tofu runs twice, init
// and apply, as direct tofu does; with a saved plan (for a state that must
// be checked against the limit first) four times: init, then its version
// (terraform-exec asks once), plan, one `show -json` and apply. Before:
// ten, with four `version` and two `show`.
func TestOneRunStartsOnlyTheToolProcessesItNeeds(t *testing.T) {
	for _, tc := range []struct {
		oneProcess bool
		want       string
	}{{true, "init apply"}, {false, "init version plan show apply"}} {
		t.Run(fmt.Sprintf("one_process=%v", tc.oneProcess), func(t *testing.T) { checkOneRun(t, tc.oneProcess, tc.want) })
	}
}

func checkOneRun(t *testing.T, oneProcess bool, wantCalls string) {
	wrapper, calls := countingTofu(t)
	tr := startRunnerWith(t, nil, func(c *tf.Config) { c.BinaryPath = wrapper })
	backend := &memoryBackend{callers: map[pki.Identity]bool{}}
	url := serveTLS(t, backend, pki.ServerTLSConfig(certSource(t, issue(t, tr.authority, pki.ControllerIdentity)), pki.TrustFunc(tr.authority.TrustPool), nil))
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	tr.upload(t, fastModule)
	address := url + "/state/team-a/web/default"
	initRes, err := tr.client.Init(ctx, &runnerv1.InitRequest{HttpBackend: &runnerv1.HTTPBackend{Address: address, LockAddress: address, UnlockAddress: address}}, nil)
	if err != nil {
		t.Fatalf("init failed: %v", err)
	}
	if initRes.GetVersion() == "" {
		t.Error("init reported no version")
	}
	vars, _ := json.Marshal(map[string]any{"token": fastToken, "n": 7})
	logs := &logCollector{}
	timings := &runphase.Timings{}
	plan, applied, err := tr.client.PlanAndApply(ctx, &runnerv1.PlanRequest{Variables: &runnerv1.Variables{Json: vars}, PlanId: "p1", OneProcess: oneProcess}, logs.log, timings)
	if err != nil {
		t.Fatalf("plan and apply failed: %v", err)
	}
	for _, p := range []runphase.Phase{runphase.Plan, runphase.Apply} {
		if d, ok := timings.Get(p); !ok || d <= 0 {
			t.Errorf("phase %s = %s (%v), want it timed", p, d, ok)
		}
	}
	if !applied || plan.GetPlanId() != "p1" || !plan.GetHasChanges() || plan.GetSummary().GetAdd() != 1 || plan.GetSummary().GetOutputChanges() != 3 {
		t.Fatalf("plan and apply = applied %v, plan %v", applied, plan.PlanResult)
	}
	if (len(plan.JSON) == 0) != oneProcess || strings.Contains(string(plan.JSON), fastToken) {
		t.Errorf("plan JSON of %d bytes (want none in one process) or unredacted", len(plan.JSON))
	}
	for _, want := range []string{"Plan: 1 to add, 0 to change, 0 to destroy.", "Apply complete!"} {
		if !strings.Contains(logs.text(), want) {
			t.Errorf("logs lack %q:\n%s", want, logs.text())
		}
	}
	if strings.Contains(logs.text(), fastToken) || strings.Contains(tr.echo.String(), fastToken) {
		t.Error("the sensitive value reached the logs")
	}

	backend.mu.Lock()
	state := append([]byte(nil), backend.state...)
	backend.mu.Unlock()
	fromState, err := tr.client.OutputsFromState(state)
	if err != nil {
		t.Fatalf("outputs from state: %v", err)
	}
	if got := subcommands(calls()); strings.Join(got, " ") != wantCalls {
		t.Errorf("tofu ran %d times: %v; want %s", len(got), got, wantCalls)
	}

	// The same outputs as tofu reads them (an extra process, only here).
	fromTofu, err := tr.client.Outputs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(fromState) != 3 || len(fromTofu) != 3 {
		t.Fatalf("outputs: from state %v, from tofu %v", fromState, fromTofu)
	}
	for name, want := range fromTofu {
		got := fromState[name]
		if got.Sensitive != want.Sensitive || compact(t, got.Value) != compact(t, want.Value) || compact(t, got.Type) != compact(t, want.Type) {
			t.Errorf("output %s: from state %+v, from tofu %+v", name, got, want)
		}
	}
	if !fromState["token"].Sensitive || compact(t, fromState["token"].Value) != `"`+fastToken+`"` {
		t.Errorf("token output from state = %+v, want the clear value flagged sensitive", fromState["token"])
	}

	// A second pass with the same inputs plans no change and applies nothing.
	again := &runphase.Timings{}
	second, applied, err := tr.client.PlanAndApply(ctx, &runnerv1.PlanRequest{Variables: &runnerv1.Variables{Json: vars}, PlanId: "p2", OneProcess: oneProcess}, nil, again)
	if err != nil || applied || second.GetHasChanges() {
		t.Fatalf("second pass = %v applied %v err %v, want no changes and no apply", second, applied, err)
	}
	if _, ok := again.Get(runphase.Apply); ok {
		t.Error("a plan without changes was timed as applied")
	}
}

func compact(t *testing.T, raw []byte) string {
	t.Helper()
	var v any
	if err := json.Unmarshal(raw, &v); err != nil {
		t.Fatalf("not JSON: %s", raw)
	}
	out, _ := json.Marshal(v)
	return string(out)
}

// TestPlanAndApplyReportsThePlanWhenTheApplyFails: the plan's summary
// reaches the controller even if applying it then fails.
func TestPlanAndApplyReportsThePlanWhenTheApplyFails(t *testing.T) {
	for _, oneProcess := range []bool{false, true} {
		t.Run(fmt.Sprintf("one_process=%v", oneProcess), func(t *testing.T) { checkFailedApplyReportsPlan(t, oneProcess) })
	}
}

func checkFailedApplyReportsPlan(t *testing.T, oneProcess bool) {
	tr := startRunner(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	// The postcondition is checked only once the resource is applied.
	tr.upload(t, map[string]string{"main.tf": `
resource "terraform_data" "a" {
  input = "x"
  lifecycle {
    postcondition {
      condition     = self.output == "y"
      error_message = "the output is not y"
    }
  }
}
`})
	if _, err := tr.client.Init(ctx, &runnerv1.InitRequest{}, nil); err != nil {
		t.Fatal(err)
	}
	plan, applied, err := tr.client.PlanAndApply(ctx, &runnerv1.PlanRequest{PlanId: "p1", OneProcess: oneProcess}, nil, nil)
	if err == nil || applied {
		t.Fatalf("applied %v, err %v; want the apply's failure", applied, err)
	}
	if runner.Reason(err) != runner.ReasonCommandFailed || !strings.Contains(err.Error(), "the output is not y") {
		t.Errorf("err = %v, want the postcondition's message", err)
	}
	if plan == nil || plan.GetSummary().GetAdd() != 1 {
		t.Fatalf("plan = %v, want the plan's summary", plan)
	}
}

// TestOneProcessRefusesWhatItCannotPlanAsAFailedPlan: a module that does
// not plan fails as a plan, with tofu's diagnostic, and reports no plan.
func TestOneProcessRefusesWhatItCannotPlanAsAFailedPlan(t *testing.T) {
	tr := startRunner(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	tr.upload(t, map[string]string{"main.tf": "variable \"n\" { type = number }\nresource \"terraform_data\" \"a\" { input = var.n }\n"})
	if _, err := tr.client.Init(ctx, &runnerv1.InitRequest{}, nil); err != nil {
		t.Fatal(err)
	}
	vars, _ := json.Marshal(map[string]any{"n": "not a number"})
	plan, applied, err := tr.client.PlanAndApply(ctx, &runnerv1.PlanRequest{PlanId: "p1", OneProcess: true, Variables: &runnerv1.Variables{Json: vars}}, nil, nil)
	if err == nil || applied || plan != nil {
		t.Fatalf("plan %v, applied %v, err %v; want a failed plan and no plan", plan, applied, err)
	}
	if !strings.Contains(err.Error(), "Invalid value for input variable") {
		t.Errorf("err = %v, want tofu's diagnostic on the variable", err)
	}
	for _, req := range []*runnerv1.PlanRequest{{OneProcess: true}, {OneProcess: true, PlanId: "p2", Destroy: true}} {
		if _, _, err := tr.client.PlanAndApply(ctx, req, nil, nil); runner.Reason(err) != runner.ReasonInvalidArgument {
			t.Errorf("PlanAndApply(%v) = %v, want an invalid argument", req, err)
		}
	}
}

// TestProvidersComeFromTheMirrorUncopied: with the filesystem mirror (the
// runner's --provider-mirror, an image directory or a volume shared by the
// runs of a runner class), init installs the test provider as a link into
// the mirror: no run downloads or copies a provider.
func TestProvidersComeFromTheMirrorUncopied(t *testing.T) {
	tr, providerMirror := startRunnerWithMirror(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	tr.upload(t, map[string]string{"main.tf": driftModule})
	if _, err := tr.client.Init(ctx, &runnerv1.InitRequest{}, nil); err != nil {
		t.Fatalf("init from the mirror failed: %v", err)
	}
	entries, err := filepath.Glob(filepath.Join(tr.workDir, "source", ".terraform", "providers", "registry.opentofu.org", "terrace-dev", "testfile", "0.1.0", "*"))
	var installed []string // linux_amd64, without tofu's linux_amd64.lock
	for _, e := range entries {
		if !strings.HasSuffix(e, ".lock") {
			installed = append(installed, e)
		}
	}
	if err != nil || len(installed) != 1 {
		t.Fatalf("installed provider packages = %v, %v; want one", installed, err)
	}
	fi, err := os.Lstat(installed[0])
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode()&os.ModeSymlink == 0 {
		t.Fatalf("%s is a copy (%s), not a link into the mirror", installed[0], fi.Mode())
	}
	target, err := filepath.EvalSymlinks(installed[0])
	if err != nil {
		t.Fatal(err)
	}
	mirror, _ := filepath.EvalSymlinks(providerMirror)
	if !strings.HasPrefix(target, mirror+string(filepath.Separator)) {
		t.Errorf("the provider links to %s, outside the mirror %s", target, mirror)
	}
}
