package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/state"
	"github.com/terrace-dev/terrace/internal/state/release"
	"github.com/terrace-dev/terrace/internal/state/secrets"
	"github.com/terrace-dev/terrace/internal/testenv"
)

func TestDescribeShowsConditionsRunsPlanAndEvents(t *testing.T) {
	env, _ := apiServer(t)
	ns := env.Namespace(t)
	ctx := context.Background()
	revision := "3@sha256:" + strings.Repeat("ab", 32)
	lockSeen := metav1.NewTime(time.Now().Add(-2 * time.Minute).Truncate(time.Second))
	newStack(t, ns, "web", nil, func(st *terracev1.StackStatus) {
		awaiting("plan-4-bbb")(st)
		st.LastAppliedRevision = revision
		st.Release = &terracev1.ReleaseStatus{Revision: 1, Status: "deployed"}
		st.Outputs = []string{"url"}
		st.BackendLock = &terracev1.BackendLockStatus{Message: "Error acquiring the state lock\n\nError message: workspace default is already locked", ObservedAt: lockSeen}
	})
	// The decision describe shows is the one stored with the plan.
	if _, err := secrets.New(env.Client, secrets.Options{}).PutPlan(ctx, state.Plan{
		PlanMeta: state.PlanMeta{Key: state.PlanKey{Namespace: ns, Stack: "web", ID: "plan-4-bbb"},
			Policy: &state.PlanPolicy{Decision: "allowed", Warnings: []string{"terraform_data.web: discouraged"}, PoliciesDigest: "sha256:1e"}},
		Binary: []byte("saved plan"),
	}); err != nil {
		t.Fatal(err)
	}
	started := time.Now().Add(-time.Hour).Truncate(time.Second)
	rel := release.Release{Namespace: ns, Stack: "web", Revision: 1, Status: release.StatusDeployed, SourceRevision: revision,
		Plan: release.PlanSummary{Add: 2}, StartedAt: started, FinishedAt: started.Add(1500 * time.Millisecond), ToolVersion: "1.12.6",
		Outputs: []release.Output{{Name: "token", Sensitive: true, Value: json.RawMessage(`"s3cr3t-value"`)}}}
	if err := secrets.New(env.Client, secrets.Options{}).CreateRelease(ctx, &rel); err != nil {
		t.Fatal(err)
	}
	event := &corev1.Event{
		ObjectMeta:     metav1.ObjectMeta{Namespace: ns, GenerateName: "web-"},
		InvolvedObject: corev1.ObjectReference{Kind: "Stack", Namespace: ns, Name: "web", APIVersion: terracev1.GroupVersion.String()},
		Type:           "Warning", Reason: "DriftDetected", Message: "drift detected: +0 ~1 -0",
		LastTimestamp: metav1.NewTime(time.Now().Add(-time.Minute)), Count: 1,
	}
	if err := env.Client.Create(ctx, event); err != nil {
		t.Fatal(err)
	}

	out, _, err := verb(t, "describe", "web", "-n", ns)
	if err != nil {
		t.Fatal(err)
	}
	mustContain(t, "describe", out,
		"Source:", "Program web",
		"Applied revision:", revision, // the full digest
		"plan-4-bbb (+2 ~1 -0), awaiting approval: terrace approve web plan-4-bbb -n "+ns,
		"Conditions:", "Ready", "AwaitingApproval",
		"Plan policy (stored with plan plan-4-bbb): allowed (policies sha256:1e)", "warn: terraform_data.web: discouraged",
		"State lock (spec.backend): a run met it at "+lockSeen.UTC().Format(time.RFC3339), "tofu force-unlock",
		"Error acquiring the state lock Error message: workspace default is already locked",
		"Last runs (releases):", started.UTC().Format(time.RFC3339), "1.5s", "1.12.6",
		"Events:", "DriftDetected", "drift detected: +0 ~1 -0")

	out, _, err = verb(t, "describe", "web", "-n", ns, "-o", "yaml")
	if err != nil {
		t.Fatal(err)
	}
	var d description
	if err := yaml.Unmarshal([]byte(out), &d); err != nil || d.Stack == nil || d.Stack.Name != "web" || len(d.Releases) != 1 || len(d.Events) != 1 ||
		d.StoredPlan == nil || d.StoredPlan.Policy == nil || d.StoredPlan.Policy.Decision != "allowed" || d.Stack.Status.BackendLock == nil {
		t.Fatalf("describe -o yaml: %v\n%s", err, out)
	}
	if strings.Contains(out, "s3cr3t-value") {
		t.Fatalf("describe -o yaml shows a sensitive output value:\n%s", out)
	}
}

func TestPlanAsYAMLEmbedsAJSONRendering(t *testing.T) {
	env, _ := apiServer(t)
	ns := env.Namespace(t)
	newStack(t, ns, "web", func(s *terracev1.StackSpec) { s.StoreReadablePlan = terracev1.ReadablePlanJSON }, awaiting("plan-7-abc"))
	plans := secrets.New(env.Client, secrets.Options{})
	rendering := `{"format_version":"1.2","resource_changes":[{"address":"terraform_data.web","change":{"actions":["create"]}}]}`
	_, err := plans.PutPlan(context.Background(), state.Plan{
		PlanMeta: state.PlanMeta{Key: state.PlanKey{Namespace: ns, Stack: "web", ID: "plan-7-abc"}, ReadableFormat: state.ReadableJSON},
		Binary:   []byte("saved plan bytes"), Readable: []byte(rendering),
	})
	if err != nil {
		t.Fatal(err)
	}

	out, _, err := verb(t, "plan", "web", "-n", ns, "-o", "yaml")
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		Plan     terracev1.PlanStatus `json:"plan"`
		Readable struct {
			ResourceChanges []struct {
				Address string `json:"address"`
			} `json:"resource_changes"`
		} `json:"readable"`
	}
	if err := yaml.Unmarshal([]byte(out), &got); err != nil || got.Plan.Pending != "plan-7-abc" ||
		len(got.Readable.ResourceChanges) != 1 || got.Readable.ResourceChanges[0].Address != "terraform_data.web" {
		t.Fatalf("plan -o yaml: %v %+v\n%s", err, got, out)
	}
}

func TestReplanReportsTheNewPlan(t *testing.T) {
	env, _ := apiServer(t)
	ns := env.Namespace(t)
	newStack(t, ns, "web", nil, awaiting("plan-4-old"))

	done := startVerb(t, "replan", "web", "-n", ns)
	value := requestedAt(t, ns, "web", "", done)
	stack := getStack(t, ns, "web")
	stack.Status.LastHandledReconcileAt = value
	awaiting("plan-4-new")(&stack.Status)
	if err := env.Client.Status().Update(context.Background(), stack); err != nil {
		t.Fatal(err)
	}
	r := result(t, done)
	if r.err != nil {
		t.Fatalf("replan: %v\n%s", r.err, r.errOut)
	}
	mustContain(t, "replan", r.out, "plan plan-4-old replaced by plan plan-4-new (+2 ~1 -0)", "terrace approve web plan-4-new")
}

func TestGetWatchPrintsEveryChange(t *testing.T) {
	env, kubeconfig := apiServer(t)
	ns := env.Namespace(t)
	newStack(t, ns, "web", nil, readyAt(1))

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var out testenv.SyncBuffer
	done := make(chan error, 1)
	go func() {
		cmd := NewRootCommand()
		cmd.SetOut(&out)
		cmd.SetErr(&bytes.Buffer{})
		cmd.SetArgs([]string{"get", "-w", "-n", ns, "--kubeconfig", kubeconfig})
		done <- cmd.ExecuteContext(ctx)
	}()
	waitFor(t, &out, "applied main@sha1:abc (release 1)", done)

	stack := getStack(t, ns, "web")
	setCondition(&stack.Status, terracev1.ReadyCondition, metav1.ConditionFalse, "PlanFailed", "plan failed: Error: Unsupported argument")
	if err := env.Client.Status().Update(context.Background(), stack); err != nil {
		t.Fatal(err)
	}
	waitFor(t, &out, "plan failed: Error: Unsupported argument", done)
	if err := env.Client.Delete(context.Background(), stack); err != nil {
		t.Fatal(err)
	}
	waitFor(t, &out, "(deleted)", done)
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("get -w ended with %v", err)
	}
	if n := strings.Count(out.String(), "NAME"); n != 1 {
		t.Errorf("the header was printed %d times:\n%s", n, out.String())
	}
}

// waitFor polls out until it contains want.
func waitFor(t *testing.T, out *testenv.SyncBuffer, want string, done <-chan error) {
	t.Helper()
	deadline := time.After(15 * time.Second)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for !strings.Contains(out.String(), want) {
		select {
		case err := <-done:
			t.Fatalf("the command ended (%v) before printing %q:\n%s", err, want, out.String())
		case <-deadline:
			t.Fatalf("no %q within 15s:\n%s", want, out.String())
		case <-tick.C:
		}
	}
}

func TestCompletionOffersTheNamespacesStacks(t *testing.T) {
	env, kubeconfig := apiServer(t)
	ns := env.Namespace(t)
	newStack(t, ns, "web", nil, nil)
	newStack(t, ns, "db", nil, nil)
	cmd := NewRootCommand()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&bytes.Buffer{})
	cmd.SetArgs([]string{"__complete", "describe", "-n", ns, "--kubeconfig", kubeconfig, ""})
	if err := cmd.Execute(); err != nil {
		t.Fatal(err)
	}
	mustContain(t, "completion", out.String(), "db\n", "web\n", ":4\n")

	cmd = NewRootCommand()
	out.Reset()
	cmd.SetOut(&out)
	cmd.SetArgs([]string{"completion", "bash"})
	if err := cmd.Execute(); err != nil {
		t.Fatal(err)
	}
	mustContain(t, "completion bash", out.String(), "__start_terrace")
}
