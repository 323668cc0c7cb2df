package release

import (
	"context"
	"fmt"
)

// DefaultLimit is how many releases a Stack keeps when not told.
const DefaultLimit = 10

// History records releases of Stacks in a Store and keeps their statuses
// and count in order.
type History struct {
	Store Store
	// Limit bounds the records kept per Stack (default DefaultLimit). The
	// deployed record is never pruned.
	Limit int
}

// Record stores r as the Stack's next revision (r.Revision is ignored) and
// returns it. When r is deployed, the previously deployed revisions become
// superseded. Records over the limit are removed, oldest first.
func (h History) Record(ctx context.Context, r Release) (*Release, error) {
	all, err := h.Store.ListReleases(ctx, r.Namespace, r.Stack)
	if err != nil {
		return nil, err
	}
	r.Revision = 1
	if n := len(all); n > 0 {
		r.Revision = all[n-1].Revision + 1
	}
	r.Outputs = HoldBack(r.Outputs, r.SecretInputs)
	r.SecretInputs = nil
	r.Migrated = nil
	if err := r.Validate(); err != nil {
		return nil, err
	}
	if err := h.Store.CreateRelease(ctx, &r); err != nil {
		return nil, fmt.Errorf("failed to record release %d of %s/%s: %w", r.Revision, r.Namespace, r.Stack, err)
	}
	if r.Status == StatusDeployed {
		for i := range all {
			if all[i].Status != StatusDeployed {
				continue
			}
			all[i].Status = StatusSuperseded
			if err := h.Store.UpdateRelease(ctx, &all[i]); err != nil {
				return nil, fmt.Errorf("failed to mark release %d of %s/%s superseded: %w", all[i].Revision, r.Namespace, r.Stack, err)
			}
		}
	}
	if err := h.prune(ctx, append(all, r)); err != nil {
		return nil, err
	}
	return &r, nil
}

func (h History) prune(ctx context.Context, all []Release) error {
	limit := h.Limit
	if limit <= 0 {
		limit = DefaultLimit
	}
	excess := len(all) - limit
	for i := 0; i < len(all) && excess > 0; i++ {
		if all[i].Status == StatusDeployed {
			continue
		}
		if err := h.Store.DeleteRelease(ctx, all[i].Namespace, all[i].Stack, all[i].Revision); err != nil {
			return fmt.Errorf("failed to prune release %d of %s/%s: %w", all[i].Revision, all[i].Namespace, all[i].Stack, err)
		}
		excess--
	}
	return nil
}

// List returns a Stack's releases, oldest first.
func (h History) List(ctx context.Context, namespace, stack string) ([]Release, error) {
	return h.Store.ListReleases(ctx, namespace, stack)
}

// Latest returns the newest release of a Stack, or nil when it has none.
func (h History) Latest(ctx context.Context, namespace, stack string) (*Release, error) {
	all, err := h.Store.ListReleases(ctx, namespace, stack)
	if err != nil || len(all) == 0 {
		return nil, err
	}
	return &all[len(all)-1], nil
}

// Deployed returns the deployed release of a Stack, or nil when none is.
func (h History) Deployed(ctx context.Context, namespace, stack string) (*Release, error) {
	all, err := h.Store.ListReleases(ctx, namespace, stack)
	if err != nil {
		return nil, err
	}
	for i := len(all) - 1; i >= 0; i-- {
		if all[i].Status == StatusDeployed {
			return &all[i], nil
		}
	}
	return nil, nil
}

// DeleteAll removes every release of a Stack, e.g. when it is deleted.
func (h History) DeleteAll(ctx context.Context, namespace, stack string) error {
	all, err := h.Store.ListReleases(ctx, namespace, stack)
	if err != nil {
		return err
	}
	for _, r := range all {
		if err := h.Store.DeleteRelease(ctx, namespace, stack, r.Revision); err != nil {
			return err
		}
	}
	return nil
}

// DeleteAllInNamespace removes every release of every Stack in a namespace.
func (h History) DeleteAllInNamespace(ctx context.Context, namespace string) error {
	all, err := h.Store.ListReleases(ctx, namespace, "")
	if err != nil {
		return err
	}
	for _, r := range all {
		if err := h.Store.DeleteRelease(ctx, r.Namespace, r.Stack, r.Revision); err != nil {
			return err
		}
	}
	return nil
}
