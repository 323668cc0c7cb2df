package cli

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/testenv"
)

// The user verbs share one API server, started on first use so the
// package's other tests do not pay for it.
var verbsEnv struct {
	once       sync.Once
	env        *testenv.Env
	kubeconfig string
	err        error
}

func TestMain(m *testing.M) {
	code := m.Run()
	if verbsEnv.env != nil {
		_ = verbsEnv.env.Stop()
		_ = os.RemoveAll(verbsEnv.kubeconfig)
	}
	os.Exit(code)
}

// apiServer returns the shared envtest API server and a kubeconfig for it.
func apiServer(t *testing.T) (*testenv.Env, string) {
	t.Helper()
	verbsEnv.once.Do(func() {
		verbsEnv.env, verbsEnv.err = testenv.Start()
		if verbsEnv.err != nil {
			return
		}
		dir, err := os.MkdirTemp("", "terrace-cli-")
		if err != nil {
			verbsEnv.err = err
			return
		}
		verbsEnv.kubeconfig, verbsEnv.err = verbsEnv.env.Kubeconfig(dir)
	})
	if verbsEnv.err != nil {
		t.Fatal(verbsEnv.err)
	}
	return verbsEnv.env, verbsEnv.kubeconfig
}

// verb runs `terrace args... --kubeconfig K` in-process, returning stdout
// and stderr apart.
func verb(t *testing.T, args ...string) (string, string, error) {
	t.Helper()
	return verbContext(context.Background(), t, args...)
}

func verbContext(ctx context.Context, t *testing.T, args ...string) (string, string, error) {
	t.Helper()
	_, kubeconfig := apiServer(t)
	cmd := NewRootCommand()
	var out, errOut bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&errOut)
	cmd.SetArgs(append(args, "--kubeconfig", kubeconfig))
	err := cmd.ExecuteContext(ctx)
	return out.String(), errOut.String(), err
}

// newStack creates a Stack and then sets its status as the controller would.
func newStack(t *testing.T, ns, name string, spec func(*terracev1.StackSpec), status func(*terracev1.StackStatus)) *terracev1.Stack {
	t.Helper()
	env, _ := apiServer(t)
	ctx := context.Background()
	stack := &terracev1.Stack{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       terracev1.StackSpec{Source: terracev1.StackSource{ProgramRef: &terracev1.LocalObjectReference{Name: name}}},
	}
	if spec != nil {
		spec(&stack.Spec)
	}
	if err := env.Client.Create(ctx, stack); err != nil {
		t.Fatalf("failed to create Stack %s/%s: %v", ns, name, err)
	}
	if status != nil {
		stack.Status.ObservedGeneration = stack.Generation
		status(&stack.Status)
		if err := env.Client.Status().Update(ctx, stack); err != nil {
			t.Fatalf("failed to set the status of Stack %s/%s: %v", ns, name, err)
		}
	}
	return stack
}

func getStack(t *testing.T, ns, name string) *terracev1.Stack {
	t.Helper()
	env, _ := apiServer(t)
	stack := &terracev1.Stack{}
	if err := env.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, stack); err != nil {
		t.Fatal(err)
	}
	return stack
}

func setCondition(st *terracev1.StackStatus, conditionType string, status metav1.ConditionStatus, reason, message string) {
	meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: conditionType, Status: status, Reason: reason, Message: message})
}

// readyAt is the status of a Stack applied at release revision.
func readyAt(revision int64) func(*terracev1.StackStatus) {
	return func(st *terracev1.StackStatus) {
		setCondition(st, terracev1.ReadyCondition, metav1.ConditionTrue, "Applied", fmt.Sprintf("applied main@sha1:abc (release %d)", revision))
		st.LastAppliedRevision = "main@sha1:abc"
		st.Release = &terracev1.ReleaseStatus{Revision: revision, Status: "deployed"}
		st.Plan = &terracev1.PlanStatus{ID: "plan-1-aaa", Add: 1}
	}
}

// planCreated is when the plans of awaiting were made.
var planCreated = time.Now().Add(-5 * time.Minute).Truncate(time.Second)

// awaiting is the status of a Stack whose plan id waits for approval.
func awaiting(id string) func(*terracev1.StackStatus) {
	return func(st *terracev1.StackStatus) {
		created := metav1.NewTime(planCreated)
		setCondition(st, terracev1.ReadyCondition, metav1.ConditionFalse, "AwaitingApproval", "plan "+id+" (+2 ~1 -0) awaits approval: set spec.approvePlan to it")
		st.Plan = &terracev1.PlanStatus{ID: id, Pending: id, Add: 2, Change: 1, CreatedAt: &created}
		st.LastPlannedRevision = "main@sha1:def"
	}
}

func mustContain(t *testing.T, what, got string, wants ...string) {
	t.Helper()
	for _, want := range wants {
		if !strings.Contains(got, want) {
			t.Fatalf("%s does not contain %q:\n%s", what, want, got)
		}
	}
}

func mustFail(t *testing.T, err error, wants ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("expected an error containing %q, got none", wants)
	}
	mustContain(t, "error", err.Error(), wants...)
}
