package release

import (
	"context"
	"errors"
	"fmt"

	"github.com/terrace-dev/terrace/internal/state"
)

// Previous is what the caller knows of a Stack's newest record, from the
// Stack's status.release: its revision (0 for none) and whether it is the
// deployed one.
type Previous struct {
	Revision int
	Deployed bool
}

// RecordAfter stores r as the revision after prev without listing the
// Stack's records: a create, the supersede of prev, and the prune of the
// record Limit revisions back. The listing of Record is left for what the
// status cannot tell: a create that finds its revision taken (the status
// was behind, its patch lost) and a deployed release after a failed one
// (which earlier record is deployed is not known).
func (h History) RecordAfter(ctx context.Context, r Release, prev Previous) (*Release, error) {
	if r.Status == StatusDeployed && prev.Revision > 0 && !prev.Deployed {
		return h.Record(ctx, r)
	}
	r.Revision = prev.Revision + 1
	r.Outputs = HoldBack(r.Outputs, r.SecretInputs)
	r.SecretInputs = nil
	r.Migrated = nil
	if err := r.Validate(); err != nil {
		return nil, err
	}
	err := h.Store.CreateRelease(ctx, &r)
	var conflict *state.ConflictError
	if errors.As(err, &conflict) && conflict.Reason == state.ConflictExists {
		return h.Record(ctx, r)
	}
	if err != nil {
		return nil, fmt.Errorf("failed to record release %d of %s/%s: %w", r.Revision, r.Namespace, r.Stack, err)
	}
	if r.Status == StatusDeployed && prev.Revision > 0 {
		if err := h.supersede(ctx, r.Namespace, r.Stack, prev.Revision); err != nil {
			return nil, err
		}
	}
	if err := h.pruneBefore(ctx, &r, prev); err != nil {
		return nil, err
	}
	return &r, nil
}

// supersede marks one record superseded, if it is deployed.
func (h History) supersede(ctx context.Context, namespace, stack string, revision int) error {
	old, err := h.Store.GetRelease(ctx, namespace, stack, revision)
	if errors.Is(err, state.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	if old.Status != StatusDeployed {
		return nil
	}
	old.Status = StatusSuperseded
	if err := h.Store.UpdateRelease(ctx, old); err != nil {
		return fmt.Errorf("failed to mark release %d of %s/%s superseded: %w", revision, namespace, stack, err)
	}
	return nil
}

// pruneBefore removes the record Limit revisions before r, keeping the
// count at Limit one record at a time. The deployed record is never
// removed: after a failed release it may be that old, and is looked at
// first unless prev says it is newer.
func (h History) pruneBefore(ctx context.Context, r *Release, prev Previous) error {
	limit := h.Limit
	if limit <= 0 {
		limit = DefaultLimit
	}
	old := r.Revision - limit
	if old < 1 {
		return nil
	}
	deployedIsNewer := r.Status == StatusDeployed || (prev.Deployed && prev.Revision > old)
	if !deployedIsNewer {
		rec, err := h.Store.GetRelease(ctx, r.Namespace, r.Stack, old)
		if errors.Is(err, state.ErrNotFound) {
			return nil
		}
		if err != nil {
			return err
		}
		if rec.Status == StatusDeployed {
			return nil
		}
	}
	if err := h.Store.DeleteRelease(ctx, r.Namespace, r.Stack, old); err != nil {
		return fmt.Errorf("failed to prune release %d of %s/%s: %w", old, r.Namespace, r.Stack, err)
	}
	return nil
}
