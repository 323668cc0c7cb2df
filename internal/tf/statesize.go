package tf

import (
	"encoding/json"
	"fmt"
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
