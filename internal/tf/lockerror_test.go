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
