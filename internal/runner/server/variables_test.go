package server

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/terrace-dev/terrace/internal/runner"
	runnerv1 "github.com/terrace-dev/terrace/proto/terrace/runner/v1"
)

// kubectl stores `vars: {n: 3}` as the key "false" (YAML 1.1); the user must
// learn that from the error, not from tofu's "No value for required variable".
func TestUndeclaredVariablesAreExplained(t *testing.T) {
	tr := startRunner(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	plan := func(vars string) error {
		_, err := tr.client.Plan(ctx, &runnerv1.PlanRequest{Variables: &runnerv1.Variables{Json: []byte(vars)}}, nil)
		return err
	}
	refused := func(t *testing.T, err error, want ...string) {
		t.Helper()
		if runner.Reason(err) != runner.ReasonUndeclaredVariable || status.Code(err) != codes.InvalidArgument {
			t.Fatalf("plan answered %v, want InvalidArgument with reason %s", err, runner.ReasonUndeclaredVariable)
		}
		for _, w := range want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("the error %q does not say %q", err, w)
			}
		}
	}

	// A YAML-boolean key is refused even when the variable has a default:
	// tofu would only warn and silently use the default.
	tr.upload(t, map[string]string{"main.tf": "variable \"n\" {\n  default = 1\n}\noutput \"n\" {\n  value = var.n\n}\n"})
	if _, err := tr.client.Init(ctx, &runnerv1.InitRequest{}, nil); err != nil {
		t.Fatalf("init: %v", err)
	}
	refused(t, plan(`{"false": 3}`), `"false"`, "does not declare", "declares n", "quote the key")

	// A misspelt required variable: tofu's own words, and why.
	tr.upload(t, map[string]string{"main.tf": "variable \"region\" {}\noutput \"region\" {\n  value = var.region\n}\n"})
	if _, err := tr.client.Init(ctx, &runnerv1.InitRequest{}, nil); err != nil {
		t.Fatalf("init: %v", err)
	}
	err := plan(`{"regoin": "eu"}`)
	refused(t, err, "No value for required variable", `"regoin"`, "declares region", "correct the name")
	if strings.Contains(err.Error(), "quote the key") {
		t.Errorf("the error %q speaks of YAML quoting for an ordinary name", err)
	}

	// An extra key that changes nothing is left to tofu's warning, as with
	// a shared var file: Stacks that work keep working.
	if err := plan(`{"region": "eu", "unused": 1}`); err != nil {
		t.Fatalf("plan with an extra, harmless variable failed: %v", err)
	}
}
