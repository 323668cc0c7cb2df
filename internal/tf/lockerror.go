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

// stateRequestFailures are how tofu's http backend words a state request
// that got no usable answer: the connection failed, or the server still
// answered 5xx after tofu's retries ("giving up after N attempt(s)"); a
// 4xx is not retried and is worded otherwise.
var stateRequestFailures = []string{
	"Failed to get state:", "Failed to upload state:", "Failed to lock:", "Failed to unlock:", "Failed to delete state:",
}

// StateUnavailable reports that tofu failed because the state server did
// not answer (a restart of it, or of the database behind it): a failure
// that passes, unlike the module's own errors. The stored state is
// untouched; an apply whose upload failed left the state it made in
// errored.tfstate, kept for the controller to save (keepUnsavedState).
func (e *CommandError) StateUnavailable() bool {
	for _, s := range stateRequestFailures {
		if strings.Contains(e.Message, s) {
			return true
		}
	}
	return false
}
