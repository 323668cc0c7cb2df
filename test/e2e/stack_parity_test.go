package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
)

// optionsModule exercises the run options: count from a var file in the
// source, a value from a file mapped into the module directory (an
// auto-loaded tfvars), one from a file mapped into the home directory,
// and two resources that targets and replace pick between.
var optionsModule = map[string]string{
	"main.tf": `
variable "replicas" { type = number }
variable "suffix" { type = string }
variable "x" {
  type    = string
  default = "one"
}
resource "terraform_data" "replica" {
  count = var.replicas
  input = count.index
}
resource "terraform_data" "a" { input = var.x }
resource "terraform_data" "b" { input = var.x }
output "suffix" { value = var.suffix }
output "greeting" { value = trimspace(file(pathexpand("~/.terrace-test/greeting"))) }
`,
	"env/prod.tfvars":  "replicas = 3\n",
	"env/large.tfvars": "replicas = 103\n",
}

// parallelismModule has two resources whose create provisioners each wait
// (up to var.wait seconds) to see the other one running, and record with a
// "saw-<key>" file that they did, after a handshake so that neither ends
// before the other looked. Under parallelism 1 tofu never runs them
// together, so neither can see the other, whatever the timing; under 2
// both run at once and both see.
const parallelismModule = `
variable "dir" { type = string }
variable "round" { type = number }
variable "wait" { type = number }
resource "terraform_data" "r" {
  for_each         = { a = "b", b = "a" }
  triggers_replace = [var.round]
  provisioner "local-exec" {
    command = <<-EOT
      d=${var.dir}/${var.round}; k=${each.key}; o=${each.value}; n=0
      mkdir -p $d && touch $d/running-$k
      until { [ -e $d/running-$o ] && [ ! -e $d/done-$o ]; } || [ $n -ge ${var.wait * 10} ]; do sleep 0.1; n=$((n+1)); done
      if [ -e $d/running-$o ] && [ ! -e $d/done-$o ]; then
        touch $d/saw-$k; n=0
        until [ -e $d/saw-$o ] || [ $n -ge ${var.wait * 10} ]; do sleep 0.1; n=$((n+1)); done
      fi
      touch $d/done-$k
    EOT
  }
}
`

// parallelismStack runs parallelismModule with spec.parallelism n, in
// dir, a runnerDir.
func parallelismStack(t *testing.T, dir string, n int32, round, wait int) *terracev1.Stack {
	return withRunnerDir(&terracev1.Stack{
		ObjectMeta: metav1.ObjectMeta{Name: "par"},
		Spec: terracev1.StackSpec{
			Source:        terracev1.StackSource{ProgramRef: &terracev1.LocalObjectReference{Name: "parallel"}},
			ApprovePlan:   terracev1.ApprovePlanAuto,
			Parallelism:   ptr.To(n),
			Vars:          jsonVars(t, map[string]any{"dir": dir, "round": round, "wait": wait}),
			RetryInterval: &metav1.Duration{Duration: 2 * time.Second},
		},
	}, dir)
}

// sawEachOther reports which of the round's two provisioners saw the other
// running, after checking that both ran to their end.
func sawEachOther(t *testing.T, dir string, round int) []string {
	t.Helper()
	var saw []string
	for _, k := range []string{"a", "b"} {
		d := filepath.Join(dir, fmt.Sprint(round))
		if _, err := os.Stat(filepath.Join(d, "done-"+k)); err != nil {
			t.Fatalf("round %d: the provisioner of %s did not finish: %v", round, k, err)
		}
		if _, err := os.Stat(filepath.Join(d, "saw-"+k)); err == nil {
			saw = append(saw, k)
		}
	}
	return saw
}

func optionsStack(name string) *terracev1.Stack {
	return &terracev1.Stack{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: terracev1.StackSpec{
			Source:        terracev1.StackSource{ProgramRef: &terracev1.LocalObjectReference{Name: "options"}},
			ApprovePlan:   terracev1.ApprovePlanAuto,
			VarsFiles:     []string{"env/prod.tfvars"},
			Parallelism:   ptr.To[int32](2),
			RetryInterval: &metav1.Duration{Duration: 2 * time.Second},
			FileMappings: []terracev1.FileMapping{
				{SecretRef: terracev1.SecretKeyReference{Name: "files", Key: "tfvars"}, Location: terracev1.FileMappingWorkDir, Path: "mapped.auto.tfvars"},
				{SecretRef: terracev1.SecretKeyReference{Name: "files", Key: "greeting"}, Location: terracev1.FileMappingHome, Path: ".terrace-test/greeting"},
			},
			WriteOutputsToSecret: &terracev1.OutputsSecret{Name: name + "-outputs"},
		},
	}
}

// TestStackRunOptionsAndInventory: var files, file mappings, parallelism,
// targets and replace reach tofu, and the inventory follows the state (in
// the status, then in a Secret once it is large), shown by describe.
// Parallelism is shown by what tofu does: two resources' provisioners never
// run together under parallelism 1, and do under 2.
func TestStackRunOptionsAndInventory(t *testing.T) {
	e := newStackEnv(t)
	e.allowRunnerToRead(t, "files")
	e.create(t, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "files"}, StringData: map[string]string{
		"tfvars": "suffix = \"mapped\"\n", "greeting": "hello from home\n",
	}})
	e.program(t, "options", optionsModule)
	e.create(t, optionsStack("opts"))
	parDir := e.runnerDir(t)
	e.program(t, "parallel", map[string]string{"main.tf": parallelismModule})
	// Under parallelism 1 the wait only costs time: it can never be met.
	e.create(t, parallelismStack(t, parDir, 1, 1, 3))
	st := e.waitStack(t, "opts", stackTimeout, "Ready", readyAt)
	if out := e.outputs(t, "opts-outputs"); out["suffix"] != "mapped" || out["greeting"] != "hello from home" {
		t.Errorf("outputs from the mapped files: %v", out)
	}
	wantInventory := "terraform_data.a,terraform_data.b,terraform_data.replica[0],terraform_data.replica[1],terraform_data.replica[2]"
	if inv := st.Status.Inventory; inv == nil || inv.Count != 5 || strings.Join(inv.Resources, ",") != wantInventory || inv.SecretRef != nil {
		t.Fatalf("status.inventory: %+v", st.Status.Inventory)
	}

	// targets: only terraform_data.a is planned although both use x.
	e.updateStack(t, "opts", func(s *terracev1.Stack) {
		s.Spec.Targets = []string{"terraform_data.a"}
		s.Spec.Vars = jsonVars(t, map[string]any{"x": "two"})
	})
	e.waitStack(t, "opts", stackTimeout, "targeted apply", func(s *terracev1.Stack) error {
		if err := readyAt(s); err != nil {
			return err
		}
		if p := s.Status.Plan; p == nil || p.Change != 1 || p.Add != 0 {
			return fmt.Errorf("plan %+v, want exactly one change", s.Status.Plan)
		}
		return nil
	})

	// replace: replica[0] is replaced though nothing about it changed.
	e.updateStack(t, "opts", func(s *terracev1.Stack) {
		s.Spec.Targets = nil
		s.Spec.Replace = []string{"terraform_data.replica[0]"}
		s.Spec.Vars = nil
	})
	e.waitStack(t, "opts", stackTimeout, "replacing apply", func(s *terracev1.Stack) error {
		if err := readyAt(s); err != nil {
			return err
		}
		// x back to "one": only a changes (the targeted apply left b at
		// "one"); replica[0] is replaced.
		if p := s.Status.Plan; p == nil || p.Add != 1 || p.Destroy != 1 || p.Change != 1 {
			return fmt.Errorf("plan %+v, want +1 ~1 -1", s.Status.Plan)
		}
		return nil
	})

	// A large inventory goes to a Secret of the Stack's own.
	e.updateStack(t, "opts", func(s *terracev1.Stack) {
		s.Spec.Replace = nil
		s.Spec.VarsFiles = []string{"env/large.tfvars"}
	})
	st = e.waitStack(t, "opts", stackTimeout, "large inventory", func(s *terracev1.Stack) error {
		if err := readyAt(s); err != nil {
			return err
		}
		if inv := s.Status.Inventory; inv == nil || inv.Count != 105 || inv.SecretRef == nil || len(inv.Resources) != 0 {
			return fmt.Errorf("status.inventory %+v", s.Status.Inventory)
		}
		return nil
	})
	var sec corev1.Secret
	if err := e.c.Get(context.Background(), client.ObjectKey{Namespace: e.ns, Name: st.Status.Inventory.SecretRef.Name}, &sec); err != nil {
		t.Fatal(err)
	}
	if lines := strings.Fields(string(sec.Data["resources"])); len(lines) != 105 || lines[0] != "terraform_data.a" {
		t.Errorf("inventory Secret lists %d addresses, first %q", len(lines), lines[0])
	}
	if len(sec.OwnerReferences) != 1 || sec.OwnerReferences[0].UID != st.UID {
		t.Errorf("the inventory Secret is not owned by the Stack: %+v", sec.OwnerReferences)
	}
	described := terraceCLI(t, e, "describe", "opts", "-n", e.ns)
	for _, want := range []string{"Inventory (105 resources)", "terraform_data.replica[102]", "terraform_data.b"} {
		if !strings.Contains(described, want) {
			t.Errorf("describe does not show %q:\n%s", want, described)
		}
	}

	e.waitStack(t, "par", stackTimeout, "Ready under parallelism 1", readyAt)
	if saw := sawEachOther(t, parDir, 1); len(saw) != 0 {
		t.Errorf("under parallelism 1, %v saw the other resource's provisioner running", saw)
	}
	// A new round replaces both (provisioners run at create), now two at once.
	e.updateStack(t, "par", func(s *terracev1.Stack) { s.Spec = parallelismStack(t, parDir, 2, 2, 120).Spec })
	e.waitStack(t, "par", stackTimeout, "Ready under parallelism 2", readyAt)
	if saw := sawEachOther(t, parDir, 2); len(saw) != 2 {
		t.Errorf("under parallelism 2, only %v saw the other resource's provisioner running", saw)
	}
}

// TestStackRunOptionsRefuseEscapes: a var file outside the source and a
// file mapping climbing out are refused with a clear reason.
func TestStackRunOptionsRefuseEscapes(t *testing.T) {
	e := newStackEnv(t)
	e.program(t, "options", optionsModule)
	escaping := optionsStack("escape")
	escaping.Spec.FileMappings = nil
	escaping.Spec.VarsFiles = []string{"../../../../../../etc/hostname"}
	e.create(t, escaping)
	e.waitStack(t, "escape", stackTimeout, "refused var file", func(s *terracev1.Stack) error {
		if err := conditionIs(terracev1.StalledCondition, metav1.ConditionTrue, "PlanFailed")(s); err != nil {
			return err
		}
		if c := stalled(s); !strings.Contains(c, "outside the source") {
			return fmt.Errorf("Stalled message %q does not say the var file is outside the source", c)
		}
		return nil
	})

	climbing := optionsStack("climb")
	climbing.Spec.FileMappings[0].Path = "../../outside.tfvars"
	climbing.Namespace = e.ns
	err := e.c.Create(context.Background(), climbing)
	if err == nil || !strings.Contains(err.Error(), "may not contain '..'") {
		t.Errorf("a file mapping climbing out of its location was accepted: %v", err)
	}
}

// TestStackRefreshFalseDoesNotSeeDrift: with refresh: false a plan does
// not read the world, so a file edited by hand is not drift.
func TestStackRefreshFalseDoesNotSeeDrift(t *testing.T) {
	e := newStackEnv(t)
	path := e.managedFile(t)
	e.program(t, "files", map[string]string{"main.tf": fileModule})
	st := fileStack("norefresh", path, terracev1.ApprovePlanAuto, terracev1.DriftDetectionEnabled)
	st.Spec.Refresh = ptr.To(false)
	e.create(t, st)
	applied := e.waitStack(t, "norefresh", stackTimeout, "Ready", readyAt)
	if err := os.WriteFile(path, []byte("edited by hand"), 0o644); err != nil {
		t.Fatal(err)
	}
	// Two drift checks after the edit, neither finding anything.
	checked := applied.Status.LastDriftCheckAt
	for range 2 {
		after := checked
		s := e.waitStack(t, "norefresh", stackTimeout, "a drift check after the edit", func(s *terracev1.Stack) error {
			if s.Status.LastDriftCheckAt == nil || !s.Status.LastDriftCheckAt.After(after.Time) {
				return fmt.Errorf("no new drift check yet")
			}
			return nil
		})
		checked = s.Status.LastDriftCheckAt
		if err := conditionIs(terracev1.DriftedCondition, metav1.ConditionTrue, "")(s); err == nil {
			t.Fatalf("refresh: false still found drift: %s", conditionsText(s))
		}
	}
	if got := readFile(t, path); got != "edited by hand" {
		t.Fatalf("the file was put back although refresh is false: %q", got)
	}
}

func stalled(s *terracev1.Stack) string {
	for _, c := range s.Status.Conditions {
		if c.Type == terracev1.StalledCondition {
			return c.Message
		}
	}
	return ""
}

// terraceCLI runs the terrace binary the tests built against the dev cluster.
func terraceCLI(t *testing.T, e *stackEnv, args ...string) string {
	t.Helper()
	cmd := exec.Command(terraceBinary, args...)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+e.dev.KubeconfigPath)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("terrace %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}
