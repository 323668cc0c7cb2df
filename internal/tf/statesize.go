package tf

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// PlannedStateBytes is the size of a plan's planned_values (the resources
// and outputs as the apply will leave them, from `show -json`): the state
// the apply saves holds at least these values, pretty-printed, with its
// own metadata and the values known only after the apply on top. Over the
// state server's limit, the state cannot be saved: refusing the plan
// before it is applied keeps the resources and the state together.
// 0 when the JSON has no planned values.
func PlannedStateBytes(planJSON []byte) int64 {
	var doc struct {
		PlannedValues json.RawMessage `json:"planned_values"`
	}
	if err := json.Unmarshal(planJSON, &doc); err != nil {
		return 0
	}
	return int64(len(doc.PlannedValues))
}

// StateTooLargeMessage says why a plan was not applied, in the words the
// runner and the controller both use.
func StateTooLargeMessage(planID string, planned, limit int64) string {
	return fmt.Sprintf("plan %s was not applied: its planned values alone are %d bytes, over the state server's limit of %d bytes (--state-server-max-state-bytes), so the state could not be saved; make the state smaller (split the Stack) or ask the operator to raise the limit", planID, planned, limit)
}

// ErroredStateID names the state tofu could not save after applying
// planID. It is kept among the plan files, so the controller downloads it
// as it does a plan (DownloadPlan): to keep it in the plan store, which
// has no state size limit, or to save it itself once the state store
// answers again.
func ErroredStateID(planID string) string { return "errored-state-" + planID }

// keepErroredState moves errored.tfstate, which tofu writes into the
// module directory when the backend refuses the state, to where
// OpenPlanFile finds it under ErroredStateID. Without it the apply's
// changes would be recorded nowhere once the runner pod goes.
func (e *Executor) keepErroredState(planID string) {
	dst, err := e.planPath(ErroredStateID(planID))
	if err != nil {
		return
	}
	_ = os.Rename(filepath.Join(e.moduleDir, "errored.tfstate"), dst)
}

// keepUnsavedState keeps the state tofu could not save when applyErr says
// the state server refused it as too large or did not answer
// (keepErroredState). tofu writes errored.tfstate only when it has a
// state to save, so an apply that failed before changing anything (its
// lock or its first read got no answer) leaves nothing to keep.
func (e *Executor) keepUnsavedState(planID string, applyErr error) {
	var cmdErr *CommandError
	if errors.As(applyErr, &cmdErr) && (cmdErr.StateTooLarge() || cmdErr.StateUnavailable()) {
		e.keepErroredState(planID)
	}
}
