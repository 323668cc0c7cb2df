package cli

import (
	"encoding/json"
	"strings"
	"testing"

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
	_, _, err = verb(t, "get", "-n", ns, "-o", "wide")
	mustFail(t, err, `unknown output format "wide"`)

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
