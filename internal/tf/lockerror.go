package tf

import "strings"

// StateLocked reports whether tofu failed because another process holds
// the state lock: a conflict that passes, unlike the module's own errors.
// tofu says so only in its diagnostics ("Error acquiring the state lock"),
// so this is the one place that reads them for it.
func (e *CommandError) StateLocked() bool {
	return strings.Contains(e.Message, "Error acquiring the state lock")
}

// PlanStale reports that a saved plan could not be applied because the
// state changed after it was made: only a new plan can go on.
func (e *CommandError) PlanStale() bool {
	return strings.Contains(e.Message, "Saved plan is stale")
}

// StateTooLarge reports that the state server refused to save the state
// as larger than its limit (HTTP 413): tofu keeps it in errored.tfstate.
func (e *CommandError) StateTooLarge() bool {
	return strings.Contains(e.Message, "HTTP error: 413")
}

// OutOfSpace reports that tofu failed because the runner's disk is full:
// the runner's environment, not the module, so it passes when space does.
func (e *CommandError) OutOfSpace() bool {
	return strings.Contains(e.Message, "no space left on device")
}
