package cli

import (
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
)

func TestGetPrintsTheStacksOfTheNamespace(t *testing.T) {
	env, _ := apiServer(t)
	ns := env.Namespace(t)
	other := env.Namespace(t)
	newStack(t, ns, "web", nil, readyAt(3))
	newStack(t, ns, "db", nil, awaiting("plan-4-bbb"))
	newStack(t, other, "cache", func(s *terracev1.StackSpec) { s.Suspend = true }, nil)

	out, _, err := verb(t, "get", "-n", ns)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 3 {
		t.Fatalf("want a header and 2 rows:\n%s", out)
	}
	mustContain(t, "header", lines[0], "NAME", "READY", "STATUS", "PLAN", "REVISION", "AGE")
	// Sorted by name: db before web.
	mustContain(t, "db row", lines[1], "db", "False", "awaits approval", "plan-4-bbb")
	mustContain(t, "web row", lines[2], "web", "True", "applied main@sha1:abc (release 3)", "main@sha1:abc")
	if strings.Contains(out, "cache") {
		t.Fatalf("a Stack of another namespace is listed:\n%s", out)
	}

	out, _, err = verb(t, "get", "-A")
	if err != nil {
		t.Fatal(err)
	}
	mustContain(t, "get -A", out, "NAMESPACE", ns, other, "cache", "suspended", "Unknown")

	out, _, err = verb(t, "get", "web", "-n", ns, "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var got terracev1.Stack
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("-o json is not a Stack: %v\n%s", err, out)
	}
	if got.Kind != "Stack" || got.Name != "web" || got.Status.Release.Revision != 3 || len(got.ManagedFields) != 0 {
		t.Fatalf("unexpected Stack: %+v", got)
	}
	out, _, err = verb(t, "get", "db", "-n", ns, "-o", "yaml")
	if err != nil {
		t.Fatal(err)
	}
	mustContain(t, "-o yaml", out, "kind: Stack", "pending: plan-4-bbb")

	_, _, err = verb(t, "get", "nope", "-n", ns)
	mustFail(t, err, "Stack "+ns+"/nope not found in namespace "+ns)
	_, _, err = verb(t, "get", "-n", ns, "-o", "name")
	mustFail(t, err, `unknown output format "name"`)

	empty := env.Namespace(t)
	out, errOut, err := verb(t, "get", "-n", empty)
	if err != nil || out != "" || !strings.Contains(errOut, "No Stacks found in namespace "+empty) {
		t.Fatalf("empty namespace: %v %q %q", err, out, errOut)
	}
}

// Without -n the kubeconfig context's namespace is used, else default.
func TestGetDefaultsToTheDefaultNamespace(t *testing.T) {
	_, _, err := verb(t, "get", "no-such-stack")
	mustFail(t, err, "Stack default/no-such-stack not found in namespace default")
}

// A listing of Stacks with real digests, long messages and pending plans
// fits a 160-column terminal; -o wide has the full digest and message.
func TestGetListingFitsA160ColumnTerminal(t *testing.T) {
	env, _ := apiServer(t)
	ns := env.Namespace(t)
	digest := "sha256:e3f62017" + strings.Repeat("9a", 28)
	revision := "12@" + digest
	newStack(t, ns, "network-core", nil, func(st *terracev1.StackStatus) {
		setCondition(st, terracev1.ReadyCondition, metav1.ConditionTrue, "Applied", "applied "+revision+" (release 12)")
		st.LastAppliedRevision = revision
	})
	newStack(t, ns, "payments-api", nil, func(st *terracev1.StackStatus) {
		setCondition(st, terracev1.ReadyCondition, metav1.ConditionFalse, "AwaitingApproval", "plan plan-13-0123456789 (+12 ~3 -1) awaits approval: set spec.approvePlan to it")
		st.Plan = &terracev1.PlanStatus{ID: "plan-13-0123456789", Pending: "plan-13-0123456789"}
		st.LastAppliedRevision = revision
	})
	long := "plan failed: Error: No value for required variable " + strings.Repeat("and a long diagnostic ", 10) + "at " + revision
	newStack(t, ns, "dns-zones", nil, func(st *terracev1.StackStatus) {
		setCondition(st, terracev1.ReadyCondition, metav1.ConditionFalse, "PlanFailed", long)
		st.LastAppliedRevision = revision
	})

	out, _, err := verb(t, "get", "-A")
	if err != nil {
		t.Fatal(err)
	}
	mustContain(t, "get -A", out, "12@sha256:e3f62017 ", "network-core", "plan-13-0123456789")
	if strings.Contains(out, digest) {
		t.Errorf("get -A shows a full digest:\n%s", out)
	}
	for _, line := range strings.Split(out, "\n") {
		if n := utf8.RuneCountInString(line); n > 160 {
			t.Errorf("a line of get -A is %d columns wide, want at most 160:\n%s", n, line)
		}
	}

	out, _, err = verb(t, "get", "-n", ns, "-o", "wide")
	if err != nil {
		t.Fatal(err)
	}
	mustContain(t, "get -o wide", out, revision+" ", long)
}
