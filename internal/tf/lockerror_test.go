package tf

import "testing"

func TestStateLockedIsReadFromTofusDiagnostics(t *testing.T) {
	// What tofu 1.12 prints when the http backend answers 423.
	locked := &CommandError{Op: "plan", Message: "Error: Error acquiring the state lock\n\nError message: HTTP remote state already locked: ID=1f2e\n\nTerraform acquires a state lock to protect the state from being written\nby multiple users at the same time."}
	if !locked.StateLocked() {
		t.Error("tofu's lock refusal not recognised")
	}
	other := &CommandError{Op: "plan", Message: `Error: Invalid value for variable "lock"`}
	if other.StateLocked() {
		t.Error("an ordinary module error taken for a lock conflict")
	}
}

func TestPlanStaleIsReadFromTofusDiagnostics(t *testing.T) {
	stale := &CommandError{Op: "apply", Message: "Error: Saved plan is stale\n\nThe given plan file can no longer be applied because the state was changed by\nanother operation after the plan was created."}
	if !stale.PlanStale() || stale.StateLocked() {
		t.Error("tofu's stale-plan refusal not recognised")
	}
	if (&CommandError{Op: "apply", Message: "Error: creating thing: 500"}).PlanStale() {
		t.Error("an ordinary apply failure taken for a stale plan")
	}
}

func TestOutOfSpaceIsReadFromTofusDiagnostics(t *testing.T) {
	full := &CommandError{Op: "plan", Message: "Error: Failed to write plan file\n\nThe plan file could not be written: write /work/plans/p.tfplan: no space left on device."}
	if !full.OutOfSpace() || (&CommandError{Op: "plan", Message: "Error: Invalid reference"}).OutOfSpace() {
		t.Error("a full disk is not told from a module error")
	}
}

func TestStateUnavailableIsReadFromTofusDiagnostics(t *testing.T) {
	// What tofu 1.12 prints when the http backend's retries give up.
	down := &CommandError{Op: "init", Message: "Error: Error refreshing state\n\nFailed to get state: GET https://127.0.0.1:41121/state/ns/web/default giving up after 5 attempt(s)"}
	if !down.StateUnavailable() || down.StateLocked() {
		t.Error("a state server that did not answer is not told from a lock conflict")
	}
	if (&CommandError{Op: "plan", Message: `Error: Failed to get existing workspaces: "state" is invalid`}).StateUnavailable() {
		t.Error("a module error taken for a state server that did not answer")
	}
}
