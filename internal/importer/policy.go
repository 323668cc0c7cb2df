package importer

import (
	"errors"
	"strings"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/runnerpolicy"
)

// PolicyCheck returns runnerpolicy.Violations when the namespace's runner
// policy refuses the Stack (settings.Effective.CheckRunner does).
type PolicyCheck func(*terracev1.Stack) error

// ApplyPolicy keeps the Stack within its runner policy: every field the
// policy refuses is removed and listed in Unmapped with the policy's
// reason, so the written Stack is one the controller will run. A refusal
// of something the Stack does not set (the config's own image) is an error.
func (r *Result) ApplyPolicy(check PolicyCheck) error {
	err := check(r.Stack)
	var violations runnerpolicy.Violations
	if err == nil {
		return nil
	}
	if !errors.As(err, &violations) {
		return err
	}
	for _, v := range violations {
		switch {
		case strings.HasPrefix(v.Field, "spec.runner.") && r.Stack.Spec.Runner != nil:
			field, key := runnerFieldOf(v.Field)
			dropRunnerField(r.Stack.Spec.Runner, key)
			r.Unmapped = append(r.Unmapped, Unmapped{Field: field, Reason: "the runner policy refuses it: " + v.Reason})
		case v.Field == "spec.serviceAccountName" && r.Stack.Spec.ServiceAccountName != "":
			r.Unmapped = append(r.Unmapped, Unmapped{Field: "spec.serviceAccountName", Reason: "the runner policy refuses it: " + v.Reason})
			r.Stack.Spec.ServiceAccountName = ""
		case v.Field == "spec.backend" && r.Stack.Spec.Backend != nil:
			r.Unmapped = append(r.Unmapped, Unmapped{Field: "spec.backendConfig.customConfiguration", Reason: "the runner policy refuses it: " + v.Reason +
				"; move the state to Terrace (`tofu state pull` into `terrace state adopt`) or ask for allowOwnBackend"})
			r.Stack.Spec.Backend = nil
		default:
			return errors.New("the namespace's runner policy refuses what its TerraceConfig sets, whatever the Stack says: " + v.Field + ": " + v.Reason)
		}
	}
	if err := check(r.Stack); err != nil {
		return err
	}
	return nil
}
