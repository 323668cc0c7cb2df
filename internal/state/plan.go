package state

import (
	"context"
	"fmt"
	"time"
)

// ReadableFormat says how a saved plan's readable rendering is written.
type ReadableFormat string

const (
	ReadableNone  ReadableFormat = ""
	ReadableJSON  ReadableFormat = "json"
	ReadableHuman ReadableFormat = "human"
)

// PlanKey names one saved plan of a Stack.
type PlanKey struct {
	Namespace string
	Stack     string
	// ID is the plan id the Stack's status and spec.approvePlan carry.
	ID string
}

// PartID is the ID of part n (from 1) of a record kept in plan records of
// a bounded size: id itself, then id-part-2, id-part-3... (a state the
// state server could not take, kept by the controller for push-state).
func PartID(id string, n int) string {
	if n <= 1 {
		return id
	}
	return fmt.Sprintf("%s-part-%d", id, n)
}

// Validate checks that every part is set and printable, without slashes.
func (k PlanKey) Validate() error {
	for _, p := range []struct{ name, value string }{{"namespace", k.Namespace}, {"stack", k.Stack}, {"plan id", k.ID}} {
		if err := validatePart(p.name, p.value); err != nil {
			return err
		}
	}
	return nil
}

// String renders the key as namespace/stack/id.
func (k PlanKey) String() string { return k.Namespace + "/" + k.Stack + "/" + k.ID }

// PlanMeta describes a saved plan without its bytes.
type PlanMeta struct {
	Key PlanKey
	// Digest is "sha256:<hex>" of the plan file; ReadableDigest of the readable rendering ("" when none).
	Digest         string
	ReadableDigest string
	ReadableFormat ReadableFormat
	Size           int64
	CreatedAt      time.Time
	Migrated       *MigrationMark
	// Policy is the plan policies' decision on the plan, kept with it so
	// that whoever reviews or approves the stored plan sees it; nil when
	// no policies governed the Stack.
	Policy *PlanPolicy
}

// PlanPolicy is what the plan policies decided about a saved plan.
type PlanPolicy struct {
	// Decision is "allowed" or "denied".
	Decision string `json:"decision"`
	// Violations and Warnings are the deny and warn rules' messages.
	Violations []string `json:"violations,omitempty"`
	Warnings   []string `json:"warnings,omitempty"`
	// PoliciesDigest identifies the policies that decided.
	PoliciesDigest string `json:"policiesDigest,omitempty"`
}

// Plan is a saved plan file (`tofu plan -out`) and optionally a readable
// rendering of it (already redacted by the caller).
type Plan struct {
	PlanMeta
	Binary   []byte
	Readable []byte
}

// PlanStore keeps saved plans, which are immutable once written.
type PlanStore interface {
	// PutPlan stores a plan. Putting the same id again with the same bytes
	// succeeds; with other bytes it is a [*ConflictError]. CreatedAt is set
	// to now when zero; digests are computed by the store.
	PutPlan(ctx context.Context, plan Plan) (PlanMeta, error)
	// GetPlan returns the plan, verified against its digests, or an error
	// matching [ErrNotFound].
	GetPlan(ctx context.Context, key PlanKey) (*Plan, error)
	// DeletePlan removes a plan; a missing one is not an error.
	DeletePlan(ctx context.Context, key PlanKey) error
	// ListPlans returns the plans of one Stack, of a namespace (stack "") or
	// of every namespace (both ""), oldest first.
	ListPlans(ctx context.Context, namespace, stack string) ([]PlanMeta, error)
	// MarkPlanMigrated sets (or with nil clears) a plan's migration mark.
	MarkPlanMigrated(ctx context.Context, key PlanKey, mark *MigrationMark) error
}
