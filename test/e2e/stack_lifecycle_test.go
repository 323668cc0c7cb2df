package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/controller/outcome"
	"github.com/terrace-dev/terrace/internal/state"
	"github.com/terrace-dev/terrace/internal/state/secrets"
)

// fileModule manages one file through the test provider, which reads the
// file back on refresh: editing it by hand is drift.
const fileModule = `
terraform {
  required_providers {
    testfile = {
      source  = "terrace-dev/testfile"
      version = "0.1.0"
    }
  }
}
variable "path" { type = string }
variable "content" {
  type    = string
  default = "managed by terrace"
}
resource "testfile_file" "managed" {
  path    = var.path
  content = var.content
}
output "path" { value = testfile_file.managed.path }
`

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		return "<" + err.Error() + ">"
	}
	return string(b)
}

func TestStackDriftRepairedUnderAuto(t *testing.T) {
	e := newStackEnv(t)
	path := e.managedFile(t)
	e.program(t, "files", map[string]string{"main.tf": fileModule})
	e.create(t, fileStack("drift", path, terracev1.ApprovePlanAuto, terracev1.DriftDetectionEnabled))
	e.waitStack(t, "drift", stackTimeout, "Ready", readyAt)
	if got := readFile(t, path); got != "managed by terrace" {
		t.Fatalf("file after apply: %q", got)
	}

	if err := os.WriteFile(path, []byte("edited by hand"), 0o644); err != nil {
		t.Fatal(err)
	}
	st := e.waitStack(t, "drift", stackTimeout, "drift found and repaired", conditionIs(terracev1.DriftedCondition, metav1.ConditionTrue, "DriftRepaired"))
	if st.Status.LastDriftDetectedAt == nil {
		t.Error("lastDriftDetectedAt not set")
	}
	if n, err := metricValue(t, "terrace_drift_detected_total", map[string]string{"namespace": e.ns}); err != nil || n < 1 {
		t.Errorf("terrace_drift_detected_total for %s = %v, %v", e.ns, n, err)
	}
	eventually(t, 30*time.Second, "terrace_stack_ready back to 1", func() error {
		v, err := metricValue(t, "terrace_stack_ready", map[string]string{"namespace": e.ns, "name": "drift"})
		if err == nil && v != 1 {
			err = fmt.Errorf("terrace_stack_ready = %v", v)
		}
		return err
	})
	eventually(t, 30*time.Second, "the file put back", func() error {
		if got := readFile(t, path); got != "managed by terrace" {
			return fmt.Errorf("file is %q", got)
		}
		return nil
	})
}

func TestStackDriftOnlyReportedUnderWarn(t *testing.T) {
	e := newStackEnv(t)
	path := e.managedFile(t)
	e.program(t, "files", map[string]string{"main.tf": fileModule})
	e.create(t, fileStack("drift", path, terracev1.ApprovePlanAuto, terracev1.DriftDetectionWarn))
	e.waitStack(t, "drift", stackTimeout, "Ready", readyAt)

	if err := os.WriteFile(path, []byte("edited by hand"), 0o644); err != nil {
		t.Fatal(err)
	}
	st := e.waitStack(t, "drift", stackTimeout, "drift reported", conditionIs(terracev1.DriftedCondition, metav1.ConditionTrue, "DriftDetected"))
	if st.Status.Plan == nil || st.Status.Plan.Change != 1 {
		t.Errorf("drift plan: %+v", st.Status.Plan)
	}
	// Reported on every check, never repaired.
	e.waitStack(t, "drift", stackTimeout, "a second drift check", func(s *terracev1.Stack) error {
		if s.Status.LastDriftCheckAt == nil || !s.Status.LastDriftCheckAt.After(st.Status.LastDriftCheckAt.Time) {
			return fmt.Errorf("no new drift check yet")
		}
		return nil
	})
	if got := readFile(t, path); got != "edited by hand" {
		t.Fatalf("warn mode changed the file: %q", got)
	}
}

func TestStackDestroyOnDelete(t *testing.T) {
	e := newStackEnv(t)
	path := e.managedFile(t)
	e.program(t, "files", map[string]string{"main.tf": fileModule})
	s := fileStack("gone", path, terracev1.ApprovePlanAuto, terracev1.DriftDetectionDisabled)
	s.Spec.DestroyOnDelete = true
	s.Spec.WriteOutputsToSecret = &terracev1.OutputsSecret{Name: "gone-outputs"}
	e.create(t, s)
	e.waitStack(t, "gone", stackTimeout, "Ready", readyAt)
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("file not created: %v", err)
	}
	if err := e.c.Delete(context.Background(), e.getStack(t, "gone")); err != nil {
		t.Fatal(err)
	}
	eventually(t, stackTimeout, "the Stack gone", func() error {
		var st terracev1.Stack
		err := e.c.Get(context.Background(), client.ObjectKey{Namespace: e.ns, Name: "gone"}, &st)
		if err == nil {
			return fmt.Errorf("still there: %s", conditionsText(&st))
		}
		return client.IgnoreNotFound(err)
	})
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Errorf("destroy left the file: %v", err)
	}
	eventually(t, 30*time.Second, "no Secret or pod left", func() error {
		var secrets corev1.SecretList
		if err := e.c.List(context.Background(), &secrets, client.InNamespace(e.ns)); err != nil {
			return err
		}
		for _, sec := range secrets.Items {
			if sec.Type != corev1.SecretTypeServiceAccountToken && !strings.HasPrefix(sec.Name, "default-token") {
				return fmt.Errorf("Secret %s (%s) left", sec.Name, sec.Type)
			}
		}
		var pods corev1.PodList
		if err := e.c.List(context.Background(), &pods, client.InNamespace(e.ns)); err != nil {
			return err
		}
		if len(pods.Items) > 0 {
			return fmt.Errorf("pod %s left", pods.Items[0].Name)
		}
		return nil
	})
}

// slowModule applies for several seconds, long enough to kill a runner or
// restart the controller mid-apply.
const slowModule = `
variable "generation" { type = number }
resource "terraform_data" "slow" {
  input = var.generation
  # A new generation replaces the resource, so every apply runs the
  # provisioner: the tests catch tofu mid-apply (an in-place update of input
  # alone takes no time).
  triggers_replace = var.generation
  provisioner "local-exec" {
    command = "sleep 6"
  }
}
output "generation" { value = terraform_data.slow.output }
`

func slowStack() *terracev1.Stack {
	return &terracev1.Stack{
		ObjectMeta: metav1.ObjectMeta{Name: "slow"},
		Spec: terracev1.StackSpec{
			Source:         terracev1.StackSource{ProgramRef: &terracev1.LocalObjectReference{Name: "slow"}},
			Vars:           map[string]apiextensionsv1.JSON{"generation": {Raw: []byte("1")}},
			ApprovePlan:    terracev1.ApprovePlanAuto,
			RetryInterval:  &metav1.Duration{Duration: 2 * time.Second},
			DriftDetection: &terracev1.DriftDetection{Mode: terracev1.DriftDetectionDisabled},
		},
	}
}

// stateOf reads the Stack's state through the Secrets store.
func (e *stackEnv) stateOf(t *testing.T, stack string) (*state.State, *state.LockInfo) {
	t.Helper()
	store := secrets.New(e.c, secrets.Options{})
	key := state.Key{Namespace: e.ns, Stack: stack, Workspace: "default"}
	st, err := store.Get(context.Background(), key)
	if err != nil {
		t.Fatalf("state of %s: %v", stack, err)
	}
	lock, err := store.GetLock(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	return st, lock
}

// runnerPid finds the host PID of the runner container of the Stack's run
// runID once it runs. It matches the run's label, not only the Stack's, and
// skips pods being deleted: a finished run's pod can still have a live
// process.
func (e *stackEnv) runnerPid(t *testing.T, stack, runID string) int {
	t.Helper()
	var pid int
	eventually(t, stackTimeout, "a runner process of run "+runID, func() error {
		var pods corev1.PodList
		if err := e.c.List(context.Background(), &pods, client.InNamespace(e.ns), client.MatchingLabels{"terrace.dev/stack": stack, "terrace.dev/run": runID}); err != nil {
			return err
		}
		for _, p := range pods.Items {
			if p.DeletionTimestamp != nil {
				continue
			}
			for _, st := range p.Status.ContainerStatuses {
				if st.Name == "runner" && st.State.Running != nil {
					var err error
					pid, err = containerPid(st.ContainerID)
					return err
				}
			}
		}
		return fmt.Errorf("no runner container running yet")
	})
	return pid
}

// waitApplying waits until the Stack runs again after run previous and
// returns the new run's ID.
func (e *stackEnv) waitApplying(t *testing.T, previous string) string {
	t.Helper()
	s := e.waitStack(t, "slow", stackTimeout, "a run in progress", func(s *terracev1.Stack) error {
		if !outcome.IsTrue(s, terracev1.ReconcilingCondition) {
			return fmt.Errorf("not reconciling")
		}
		if s.Status.CurrentRun == "" || s.Status.CurrentRun == previous {
			return fmt.Errorf("still at run %q", s.Status.CurrentRun)
		}
		return nil
	})
	return s.Status.CurrentRun
}

func (e *stackEnv) assertRecovered(t *testing.T, before *state.State, wantGeneration string) {
	t.Helper()
	e.waitStack(t, "slow", stackTimeout, "Ready again", readyAt)
	after, lock := e.stateOf(t, "slow")
	if lock != nil {
		t.Errorf("a lock is still held: %+v", lock)
	}
	if after.Lineage != before.Lineage {
		t.Errorf("lineage changed: %s → %s", before.Lineage, after.Lineage)
	}
	if after.Serial <= before.Serial {
		t.Errorf("serial did not increase: %d → %d", before.Serial, after.Serial)
	}
	if got := slowInput(t, after.Data); got != wantGeneration {
		t.Errorf("state holds input %s, want %s", got, wantGeneration)
	}
}

// slowRunInProgress applies the slow module once, then changes its input
// and returns once tofu is applying the change under the runner process.
func slowRunInProgress(t *testing.T, generation string) (e *stackEnv, before *state.State, runnerPid int) {
	t.Helper()
	e = newStackEnv(t)
	e.program(t, "slow", map[string]string{"main.tf": slowModule})
	e.create(t, slowStack())
	first := e.waitStack(t, "slow", stackTimeout, "Ready", readyAt)
	before, _ = e.stateOf(t, "slow")

	e.updateStack(t, "slow", func(s *terracev1.Stack) { s.Spec.Vars["generation"] = apiextensionsv1.JSON{Raw: []byte(generation)} })
	run := e.waitApplying(t, first.Status.LastRun)
	runnerPid = e.runnerPid(t, "slow", run)
	eventually(t, 60*time.Second, "tofu running under the runner", func() error {
		if len(descendants(runnerPid)) == 0 {
			return fmt.Errorf("no child process yet")
		}
		return nil
	})
	return e, before, runnerPid
}

func TestStackRecoversFromRunnerKilledMidApply(t *testing.T) {
	e, before, pid := slowRunInProgress(t, "2")
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	e.assertRecovered(t, before, "2")
}

func TestStackRecoversFromControllerRestartMidRun(t *testing.T) {
	e, before, _ := slowRunInProgress(t, "3")
	restartController(t, e.dev)
	e.assertRecovered(t, before, "3")
}

// slowInput reads terraform_data.slow's input from a state document.
func slowInput(t *testing.T, data []byte) string {
	t.Helper()
	var doc struct {
		Resources []struct {
			Name      string `json:"name"`
			Instances []struct {
				Attributes struct {
					Input struct {
						Value json.RawMessage `json:"value"`
					} `json:"input"`
				} `json:"attributes"`
			} `json:"instances"`
		} `json:"resources"`
	}
	if err := json.Unmarshal(data, &doc); err != nil {
		t.Fatalf("state is not JSON: %v", err)
	}
	for _, r := range doc.Resources {
		if r.Name == "slow" && len(r.Instances) == 1 {
			return string(r.Instances[0].Attributes.Input.Value)
		}
	}
	return "<none>"
}
