package server

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/terrace-dev/terrace/internal/testenv"
	"github.com/terrace-dev/terrace/internal/tf"
	runnerv1 "github.com/terrace-dev/terrace/proto/terrace/runner/v1"
)

const driftModule = `
terraform {
  required_providers {
    testfile = {
      source  = "terrace-dev/testfile"
      version = "0.1.0"
    }
  }
}

variable "path" {
  type = string
}

resource "testfile_file" "managed" {
  path    = var.path
  content = "as declared\n"
}
`

// startRunnerWithMirror starts a runner that installs providers only from
// the mirror of the test provider, and returns the mirror too.
func startRunnerWithMirror(t *testing.T) (*testRunner, string) {
	t.Helper()
	tools, _ := testenv.FindTools()
	if _, err := os.Stat(tools.ProviderMirror); err != nil {
		t.Fatalf("provider mirror %q is missing: run `make tools`", tools.ProviderMirror)
	}
	return startRunnerWith(t, nil, func(c *tf.Config) { c.ProviderMirror = tools.ProviderMirror }), tools.ProviderMirror
}

func TestDriftIsCountedByRefreshOnlyPlans(t *testing.T) {
	tr, _ := startRunnerWithMirror(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	tr.upload(t, map[string]string{"main.tf": driftModule})
	initRes, err := tr.client.Init(ctx, &runnerv1.InitRequest{}, nil)
	if err != nil {
		t.Fatalf("init from the mirror failed: %v", err)
	}
	if v := initRes.GetProviderVersions()["registry.opentofu.org/terrace-dev/testfile"]; v != "0.1.0" {
		t.Errorf("provider versions = %v, want testfile 0.1.0", initRes.GetProviderVersions())
	}
	managed := filepath.Join(t.TempDir(), "managed.txt")
	varsJSON, _ := json.Marshal(map[string]string{"path": managed})
	vars := &runnerv1.Variables{Json: varsJSON}
	plan, err := tr.client.Plan(ctx, &runnerv1.PlanRequest{Variables: vars}, nil)
	if err != nil {
		t.Fatalf("plan failed: %v", err)
	}
	if err := tr.client.Apply(ctx, plan.GetPlanId(), nil); err != nil {
		t.Fatalf("apply failed: %v", err)
	}
	quiet, err := tr.client.Plan(ctx, &runnerv1.PlanRequest{Variables: vars, RefreshOnly: true}, nil)
	if err != nil {
		t.Fatalf("refresh-only plan failed: %v", err)
	}
	if quiet.GetHasChanges() || quiet.GetSummary().GetDrift() != 0 {
		t.Fatalf("refresh-only plan without drift: has_changes=%v summary=%v", quiet.GetHasChanges(), quiet.GetSummary())
	}

	if err := os.WriteFile(managed, []byte("edited by hand\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	drift, err := tr.client.Plan(ctx, &runnerv1.PlanRequest{Variables: vars, RefreshOnly: true}, nil)
	if err != nil {
		t.Fatalf("refresh-only plan failed: %v", err)
	}
	if !drift.GetHasChanges() || drift.GetSummary().GetDrift() != 1 || drift.GetSummary().GetChange() != 0 {
		t.Fatalf("refresh-only plan after a hand edit: has_changes=%v summary=%v, want 1 drift", drift.GetHasChanges(), drift.GetSummary())
	}
	repair, err := tr.client.Plan(ctx, &runnerv1.PlanRequest{Variables: vars}, nil)
	if err != nil {
		t.Fatalf("plan failed: %v", err)
	}
	if repair.GetSummary().GetDrift() != 1 || repair.GetSummary().GetChange() != 1 {
		t.Fatalf("normal plan after a hand edit: summary=%v, want 1 drift and 1 change", repair.GetSummary())
	}
	if err := tr.client.Apply(ctx, repair.GetPlanId(), nil); err != nil {
		t.Fatalf("apply of the repair failed: %v", err)
	}
	if got, _ := os.ReadFile(managed); string(got) != "as declared\n" {
		t.Errorf("file after the repair = %q", got)
	}
}
