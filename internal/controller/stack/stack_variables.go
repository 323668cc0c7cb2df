package stack

import "github.com/terrace-dev/terrace/internal/runner"

// UndeclaredVariableReason: spec.vars or spec.varsFrom set a variable the
// module does not declare, and that is why the run failed (a YAML-boolean
// key such as "false" from an unquoted n, or a misspelt required variable).
const UndeclaredVariableReason = "UndeclaredVariable"

// runnerFailureReason names a runner's refusal more precisely than the
// step's own reason when the runner said why.
func runnerFailureReason(err error, stepReason string) string {
	if runner.Reason(err) == runner.ReasonUndeclaredVariable {
		return UndeclaredVariableReason
	}
	return stepReason
}
