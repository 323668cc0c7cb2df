package server

import (
	"context"
	"testing"
	"time"

	runnerv1 "github.com/terrace-dev/terrace/proto/terrace/runner/v1"
)

// TestUsageCountsTofuProcessesAndTheirCPU: each tofu command the runner
// starts is counted, and the CPU of the reaped processes grows with them.
// (The runner here is in the test process, so its own CPU is the test's.)
func TestUsageCountsTofuProcessesAndTheirCPU(t *testing.T) {
	tr := startRunner(t, nil)
	c := tr.client
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	before, err := c.Usage(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if before.GetTofuProcesses() != 0 {
		t.Fatalf("a runner that ran nothing reports %d tofu processes", before.GetTofuProcesses())
	}
	tr.upload(t, map[string]string{"main.tf": `resource "terraform_data" "a" { input = 1 }`})
	if _, err := c.Init(ctx, &runnerv1.InitRequest{}, nil); err != nil {
		t.Fatal(err)
	}
	afterInit, err := c.Usage(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Plan(ctx, &runnerv1.PlanRequest{}, nil); err != nil {
		t.Fatal(err)
	}
	after, err := c.Usage(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// `tofu init -json` names its version: no `tofu version` before it.
	if n := afterInit.GetTofuProcesses(); n != 1 {
		t.Errorf("after init: %d tofu processes, want 1", n)
	}
	if n := after.GetTofuProcesses() - afterInit.GetTofuProcesses(); n < 1 {
		t.Errorf("the plan started %d tofu processes", n)
	}
	if after.GetTofuCpuSeconds() <= before.GetTofuCpuSeconds() {
		t.Errorf("tofu's CPU did not grow: %.3f s then %.3f s", before.GetTofuCpuSeconds(), after.GetTofuCpuSeconds())
	}
	if after.GetRunnerCpuSeconds() <= 0 {
		t.Errorf("the runner's own CPU is %.3f s", after.GetRunnerCpuSeconds())
	}
	t.Logf("tofu: %d processes, %.3f s of CPU", after.GetTofuProcesses(), after.GetTofuCpuSeconds()-before.GetTofuCpuSeconds())
}
