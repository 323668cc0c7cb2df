package tf

import (
	"strings"
	"testing"
)

func TestPlannedStateBytesIsTheSizeOfThePlannedValues(t *testing.T) {
	values := `{"root_module":{"resources":[{"address":"terraform_data.padded","values":{"input":"` + strings.Repeat("0", 1000) + `"}}]}}`
	plan := `{"format_version":"1.2","prior_state":{"values":{"big":"` + strings.Repeat("x", 5000) + `"}},"planned_values":` + values + `}`
	if got := PlannedStateBytes([]byte(plan)); got != int64(len(values)) {
		t.Errorf("PlannedStateBytes = %d, want %d (the planned values only, not the prior state)", got, len(values))
	}
	for _, bad := range []string{`{}`, `not json`, ``} {
		if got := PlannedStateBytes([]byte(bad)); got != 0 {
			t.Errorf("PlannedStateBytes(%q) = %d, want 0", bad, got)
		}
	}
}

func TestStateTooLargeIsReadFromTofusDiagnostics(t *testing.T) {
	refused := &CommandError{Op: "apply", Message: "Error: Failed to save state\n\nError saving state: HTTP error: 413"}
	if !refused.StateTooLarge() || (&CommandError{Op: "apply", Message: "Error saving state: HTTP error: 503"}).StateTooLarge() {
		t.Error("a state refused as too large is not told from another failed save")
	}
}
