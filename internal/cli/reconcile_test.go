package cli

import (
	"context"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
)

type verbResult struct {
	out, errOut string
	err         error
}

// startVerb runs a verb in the background; the result arrives on the channel.
func startVerb(t *testing.T, args ...string) <-chan verbResult {
	t.Helper()
	apiServer(t) // start it here, not in the goroutine
	done := make(chan verbResult, 1)
	go func() {
		out, errOut, err := verbContext(context.Background(), t, args...)
		done <- verbResult{out, errOut, err}
	}()
	return done
}

// requestedAt waits until the Stack carries a reconcile request other than
// previous and returns it.
func requestedAt(t *testing.T, ns, name, previous string, done <-chan verbResult) string {
	t.Helper()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(10 * time.Second)
	for {
		if v := getStack(t, ns, name).Annotations[terracev1.ReconcileRequestAnnotation]; v != "" && v != previous {
			return v
		}
		select {
		case r := <-done:
			t.Fatalf("the command ended before requesting a reconcile: %v\n%s%s", r.err, r.out, r.errOut)
		case <-deadline:
			t.Fatal("no terrace.dev/requestedAt annotation after 10s")
		case <-tick.C:
		}
	}
}

func result(t *testing.T, done <-chan verbResult) verbResult {
	t.Helper()
	select {
	case r := <-done:
		return r
	case <-time.After(15 * time.Second):
		t.Fatal("the command did not return within 15s")
		return verbResult{}
	}
}

// handle plays the controller: it echoes the request and sets Ready.
func handle(t *testing.T, ns, name, value string, ready metav1.ConditionStatus, reason, message string) {
	t.Helper()
	env, _ := apiServer(t)
	stack := getStack(t, ns, name)
	stack.Status.LastHandledReconcileAt = value
	setCondition(&stack.Status, terracev1.ReadyCondition, ready, reason, message)
	if err := env.Client.Status().Update(context.Background(), stack); err != nil {
		t.Fatal(err)
	}
}

func TestReconcileWaitsUntilTheRequestIsHandled(t *testing.T) {
	env, _ := apiServer(t)
	ns := env.Namespace(t)
	newStack(t, ns, "web", nil, readyAt(1))

	done := startVerb(t, "reconcile", "web", "-n", ns)
	value := requestedAt(t, ns, "web", "", done)
	if _, err := time.Parse(time.RFC3339Nano, value); err != nil {
		t.Fatalf("requestedAt %q is not RFC3339Nano: %v", value, err)
	}
	select {
	case r := <-done:
		t.Fatalf("returned before the request was handled: %v %s", r.err, r.out)
	default:
	}
	// An older value is not this request.
	handle(t, ns, "web", "2020-01-01T00:00:00Z", metav1.ConditionTrue, "Applied", "applied main@sha1:old (release 1)")
	handle(t, ns, "web", value, metav1.ConditionTrue, "Applied", "applied main@sha1:new (release 2)")
	r := result(t, done)
	if r.err != nil {
		t.Fatalf("reconcile: %v\n%s", r.err, r.errOut)
	}
	mustContain(t, "reconcile", r.out, "Stack "+ns+"/web: Ready=True Applied: applied main@sha1:new (release 2)")

	// A failure after the request is an error (exit 1).
	done = startVerb(t, "reconcile", "web", "-n", ns)
	value = requestedAt(t, ns, "web", value, done)
	handle(t, ns, "web", value, metav1.ConditionFalse, "DependencyNotReady", "Stack db is not Ready")
	r = result(t, done)
	mustFail(t, r.err, "Stack "+ns+"/web is not Ready: Stack db is not Ready")

	// A plan awaiting approval is an outcome, not a failure.
	done = startVerb(t, "reconcile", "web", "-n", ns)
	value = requestedAt(t, ns, "web", value, done)
	handle(t, ns, "web", value, metav1.ConditionFalse, "AwaitingApproval", "plan plan-2-abc (+1 ~0 -0) awaits approval")
	if r = result(t, done); r.err != nil {
		t.Fatalf("reconcile with a pending plan: %v", r.err)
	}
	mustContain(t, "reconcile", r.out, "Ready=False AwaitingApproval", "terrace plan web")

	// A Stack that stalls after the request never echoes it: stop waiting.
	done = startVerb(t, "reconcile", "web", "-n", ns)
	value = requestedAt(t, ns, "web", value, done)
	stack := getStack(t, ns, "web")
	setCondition(&stack.Status, terracev1.StalledCondition, metav1.ConditionTrue, "InvalidVars", "variable count must be a number")
	if err := env.Client.Status().Update(context.Background(), stack); err != nil {
		t.Fatal(err)
	}
	r = result(t, done)
	mustFail(t, r.err, "Stack "+ns+"/web stalled: variable count must be a number")
}

func TestReconcileWithoutWaitTimeoutAndSuspended(t *testing.T) {
	env, _ := apiServer(t)
	ns := env.Namespace(t)
	newStack(t, ns, "web", nil, readyAt(1))
	newStack(t, ns, "off", func(s *terracev1.StackSpec) { s.Suspend = true }, readyAt(1))

	_, errOut, err := verb(t, "reconcile", "web", "-n", ns, "--wait=false")
	if err != nil {
		t.Fatal(err)
	}
	value := getStack(t, ns, "web").Annotations[terracev1.ReconcileRequestAnnotation]
	mustContain(t, "reconcile --wait=false", errOut, "requested a reconcile of Stack "+ns+"/web at "+value)

	_, _, err = verb(t, "reconcile", "web", "-n", ns, "--timeout", "1s")
	mustFail(t, err, "timed out after 1s", "is the Terrace controller running?")

	_, _, err = verb(t, "reconcile", "off", "-n", ns)
	mustFail(t, err, "is suspended", "terrace resume off")
	if getStack(t, ns, "off").Annotations[terracev1.ReconcileRequestAnnotation] != "" {
		t.Fatal("a suspended Stack was annotated")
	}
	_, _, err = verb(t, "reconcile", "gone", "-n", ns)
	mustFail(t, err, "Stack "+ns+"/gone not found in namespace "+ns)
}

func TestSuspendAndResumePatchSpecSuspend(t *testing.T) {
	env, _ := apiServer(t)
	ns := env.Namespace(t)
	newStack(t, ns, "web", func(s *terracev1.StackSpec) { s.ApprovePlan = terracev1.ApprovePlanAuto }, readyAt(1))

	out, _, err := verb(t, "suspend", "web", "-n", ns)
	if err != nil || out != "Stack "+ns+"/web suspended\n" {
		t.Fatalf("suspend: %v %q", err, out)
	}
	stack := getStack(t, ns, "web")
	if !stack.Spec.Suspend || stack.Spec.ApprovePlan != terracev1.ApprovePlanAuto || stack.Status.Release == nil {
		t.Fatalf("after suspend: spec %+v status %+v", stack.Spec, stack.Status)
	}
	out, _, err = verb(t, "suspend", "web", "-n", ns)
	if err != nil || out != "Stack "+ns+"/web is already suspended\n" {
		t.Fatalf("second suspend: %v %q", err, out)
	}
	out, _, err = verb(t, "resume", "web", "-n", ns)
	if err != nil || out != "Stack "+ns+"/web resumed\n" {
		t.Fatalf("resume: %v %q", err, out)
	}
	if stack := getStack(t, ns, "web"); stack.Spec.Suspend || stack.Spec.ApprovePlan != terracev1.ApprovePlanAuto {
		t.Fatalf("after resume: %+v", stack.Spec)
	}
	_, _, err = verb(t, "resume", "gone", "-n", ns)
	mustFail(t, err, "Stack "+ns+"/gone not found in namespace "+ns)
}
