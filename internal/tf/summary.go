package tf

import (
	"fmt"

	tfjson "github.com/hashicorp/terraform-json"
)

// Summary counts what a plan would do, as tofu's "Plan:" line does, plus
// drift (changes made outside tofu) and output changes.
type Summary struct {
	Add, Change, Destroy, Import, Forget int
	Drift                                int
	OutputChanges                        int
}

// Summarize reads the counts from `show -json` output.
func Summarize(planJSON []byte) (Summary, error) {
	var p tfjson.Plan
	if err := p.UnmarshalJSON(planJSON); err != nil {
		return Summary{}, fmt.Errorf("failed to parse plan JSON: %w", err)
	}
	var s Summary
	for _, rc := range p.ResourceChanges {
		if rc == nil || rc.Change == nil || rc.Mode != tfjson.ManagedResourceMode {
			continue
		}
		a := rc.Change.Actions
		switch {
		case a.Replace():
			s.Add++
			s.Destroy++
		case a.Create():
			s.Add++
		case a.Update():
			s.Change++
		case a.Delete():
			s.Destroy++
		case a.Forget():
			s.Forget++
		}
		if rc.Change.Importing != nil {
			s.Import++
		}
	}
	for _, rc := range p.ResourceDrift {
		if rc == nil || rc.Change == nil || rc.Mode != tfjson.ManagedResourceMode {
			continue
		}
		if !rc.Change.Actions.NoOp() {
			s.Drift++
		}
	}
	for _, oc := range p.OutputChanges {
		if oc != nil && !oc.Actions.NoOp() {
			s.OutputChanges++
		}
	}
	return s, nil
}
