package backend

import (
	"context"
	"errors"

	"github.com/terrace-dev/terrace/internal/state"
)

// Router is a state.Store and state.PlanStore that sends each call to the
// stores of the key's namespace, so every namespace is served from the
// backend its TerraceConfig chooses. Listing across all namespaces ("") is
// refused: each namespace may live in another backend.
type Router struct {
	Backends *Backends
}

var (
	_ state.Store            = (*Router)(nil)
	_ state.PlanStore        = (*Router)(nil)
	_ state.AdmittingGetter  = (*Router)(nil)
	_ state.LockHolderReader = (*Router)(nil)
)

// errAllNamespaces refuses a list over every namespace.
var errAllNamespaces = errors.New("listing every namespace at once is not supported by the routing store: list one namespace at a time")

func (r *Router) states(ctx context.Context, namespace string) (state.Store, error) {
	if namespace == "" {
		return nil, errAllNamespaces
	}
	set, err := r.Backends.For(ctx, namespace)
	if err != nil {
		return nil, err
	}
	return set.States, nil
}

func (r *Router) plans(ctx context.Context, namespace string) (state.PlanStore, error) {
	if namespace == "" {
		return nil, errAllNamespaces
	}
	set, err := r.Backends.For(ctx, namespace)
	if err != nil {
		return nil, err
	}
	return set.Plans, nil
}

// Get implements state.Store.
func (r *Router) Get(ctx context.Context, key state.Key) (*state.State, error) {
	st, err := r.states(ctx, key.Namespace)
	if err != nil {
		return nil, err
	}
	return st.Get(ctx, key)
}

// GetAdmitted implements state.AdmittingGetter.
func (r *Router) GetAdmitted(ctx context.Context, key state.Key, admit func(state.StateMeta) error) (*state.State, error) {
	st, err := r.states(ctx, key.Namespace)
	if err != nil {
		return nil, err
	}
	return state.GetAdmitted(ctx, st, key, admit)
}

// GetUnderOwnLock implements state.LockHolderReader through the
// namespace's store, when it is one.
func (r *Router) GetUnderOwnLock(ctx context.Context, key state.Key, owner string, admit func(state.StateMeta) error) (*state.State, bool, error) {
	st, err := r.states(ctx, key.Namespace)
	if err != nil {
		return nil, true, err
	}
	if h, ok := st.(state.LockHolderReader); ok {
		return h.GetUnderOwnLock(ctx, key, owner, admit)
	}
	return nil, false, nil
}

// StateAfterApply implements state.LockHolderReader through the
// namespace's store, when it is one.
func (r *Router) StateAfterApply(ctx context.Context, key state.Key, owner string) (*state.State, bool) {
	st, err := r.states(ctx, key.Namespace)
	if err != nil {
		return nil, false
	}
	if h, ok := st.(state.LockHolderReader); ok {
		return h.StateAfterApply(ctx, key, owner)
	}
	return nil, false
}

// Put implements state.Store.
func (r *Router) Put(ctx context.Context, key state.Key, data []byte, opts state.PutOptions) (state.StateMeta, error) {
	st, err := r.states(ctx, key.Namespace)
	if err != nil {
		return state.StateMeta{}, err
	}
	return st.Put(ctx, key, data, opts)
}

// Delete implements state.Store.
func (r *Router) Delete(ctx context.Context, key state.Key) error {
	st, err := r.states(ctx, key.Namespace)
	if err != nil {
		return err
	}
	return st.Delete(ctx, key)
}

// ListVersions implements state.Store.
func (r *Router) ListVersions(ctx context.Context, key state.Key) ([]state.StateMeta, error) {
	st, err := r.states(ctx, key.Namespace)
	if err != nil {
		return nil, err
	}
	return st.ListVersions(ctx, key)
}

// GetVersion implements state.Store.
func (r *Router) GetVersion(ctx context.Context, key state.Key, version state.Version) (*state.State, error) {
	st, err := r.states(ctx, key.Namespace)
	if err != nil {
		return nil, err
	}
	return st.GetVersion(ctx, key, version)
}

// Lock implements state.Store.
func (r *Router) Lock(ctx context.Context, key state.Key, info state.LockInfo) error {
	st, err := r.states(ctx, key.Namespace)
	if err != nil {
		return err
	}
	return st.Lock(ctx, key, info)
}

// Unlock implements state.Store.
func (r *Router) Unlock(ctx context.Context, key state.Key, id string) error {
	st, err := r.states(ctx, key.Namespace)
	if err != nil {
		return err
	}
	return st.Unlock(ctx, key, id)
}

// ForceUnlock implements state.Store.
func (r *Router) ForceUnlock(ctx context.Context, key state.Key) error {
	st, err := r.states(ctx, key.Namespace)
	if err != nil {
		return err
	}
	return st.ForceUnlock(ctx, key)
}

// GetLock implements state.Store.
func (r *Router) GetLock(ctx context.Context, key state.Key) (*state.LockInfo, error) {
	st, err := r.states(ctx, key.Namespace)
	if err != nil {
		return nil, err
	}
	return st.GetLock(ctx, key)
}

// List implements state.Store for one namespace; "" is refused.
func (r *Router) List(ctx context.Context, namespace string) ([]state.Key, error) {
	st, err := r.states(ctx, namespace)
	if err != nil {
		return nil, err
	}
	return st.List(ctx, namespace)
}

// ReplaceHistory implements state.Store.
func (r *Router) ReplaceHistory(ctx context.Context, key state.Key, versions []state.State) error {
	st, err := r.states(ctx, key.Namespace)
	if err != nil {
		return err
	}
	return st.ReplaceHistory(ctx, key, versions)
}

// Migrated implements state.Store.
func (r *Router) Migrated(ctx context.Context, key state.Key) (*state.MigrationMark, error) {
	st, err := r.states(ctx, key.Namespace)
	if err != nil {
		return nil, err
	}
	return st.Migrated(ctx, key)
}

// MarkMigrated implements state.Store.
func (r *Router) MarkMigrated(ctx context.Context, key state.Key, mark *state.MigrationMark) error {
	st, err := r.states(ctx, key.Namespace)
	if err != nil {
		return err
	}
	return st.MarkMigrated(ctx, key, mark)
}

// PutPlan implements state.PlanStore.
func (r *Router) PutPlan(ctx context.Context, plan state.Plan) (state.PlanMeta, error) {
	ps, err := r.plans(ctx, plan.Key.Namespace)
	if err != nil {
		return state.PlanMeta{}, err
	}
	return ps.PutPlan(ctx, plan)
}

// GetPlan implements state.PlanStore.
func (r *Router) GetPlan(ctx context.Context, key state.PlanKey) (*state.Plan, error) {
	ps, err := r.plans(ctx, key.Namespace)
	if err != nil {
		return nil, err
	}
	return ps.GetPlan(ctx, key)
}

// DeletePlan implements state.PlanStore.
func (r *Router) DeletePlan(ctx context.Context, key state.PlanKey) error {
	ps, err := r.plans(ctx, key.Namespace)
	if err != nil {
		return err
	}
	return ps.DeletePlan(ctx, key)
}

// ListPlans implements state.PlanStore for one namespace; "" is refused.
func (r *Router) ListPlans(ctx context.Context, namespace, stack string) ([]state.PlanMeta, error) {
	ps, err := r.plans(ctx, namespace)
	if err != nil {
		return nil, err
	}
	return ps.ListPlans(ctx, namespace, stack)
}

// MarkPlanMigrated implements state.PlanStore.
func (r *Router) MarkPlanMigrated(ctx context.Context, key state.PlanKey, mark *state.MigrationMark) error {
	ps, err := r.plans(ctx, key.Namespace)
	if err != nil {
		return err
	}
	return ps.MarkPlanMigrated(ctx, key, mark)
}
