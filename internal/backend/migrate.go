package backend

import (
	"context"
	"fmt"

	"github.com/go-logr/logr"

	"github.com/terrace-dev/terrace/internal/state/migrate"
)

// MigrateNamespace moves namespace's state, plans and releases to the
// backend its TerraceConfig names, when they are elsewhere: everything is
// copied and verified (internal/state/migrate), and only then is the
// location record switched, so runs use the new backend from then on and
// the source keeps its copies, marked migrated. It does nothing when no
// migration is pending, and is safe to run again after an interruption.
//
// The caller makes sure no run is in progress in the namespace: a run's
// state lock makes the copy fail (retry later), and Stacks do not start
// runs while Set.Location.Pending().
func (b *Backends) MigrateNamespace(ctx context.Context, namespace string, log logr.Logger) (Location, migrate.Report, error) {
	eff, err := b.resolve(ctx, namespace)
	if err != nil {
		return Location{}, migrate.Report{}, fmt.Errorf("failed to resolve the settings of namespace %s: %w", namespace, err)
	}
	loc, err := b.locate(ctx, namespace, eff)
	if err != nil || !loc.Pending() {
		return loc, migrate.Report{}, err
	}
	if err := checkLocation(namespace, loc, eff); err != nil {
		return loc, migrate.Report{}, err
	}
	from, releaseFrom, err := b.OpenBackend(ctx, namespace, eff, loc.Current)
	if err != nil {
		return loc, migrate.Report{}, fmt.Errorf("failed to open the %s backend of namespace %s: %w", loc.Current, namespace, err)
	}
	defer releaseFrom()
	to, releaseTo, err := b.OpenBackend(ctx, namespace, eff, loc.Desired)
	if err != nil {
		return loc, migrate.Report{}, fmt.Errorf("failed to open the %s backend of namespace %s: %w", loc.Desired, namespace, err)
	}
	defer releaseTo()
	report, err := migrate.Migrate(ctx, migrationBackend(string(loc.Current), from), migrationBackend(string(loc.Desired), to), migrate.Options{Namespace: namespace, Log: log})
	if err != nil {
		return loc, report, err
	}
	if err := b.SetLocation(ctx, namespace, loc.Desired); err != nil {
		return loc, report, err
	}
	b.forget(namespace)
	loc.Current = loc.Desired
	return loc, report, nil
}

func migrationBackend(name string, set *Set) migrate.Backend {
	return migrate.Backend{Name: name, States: set.States, Plans: set.Plans, Releases: set.Releases}
}

// forget drops the cached stores of namespace and lets go of their pool.
func (b *Backends) forget(namespace string) {
	b.mu.Lock()
	dropped := b.sets[namespace]
	delete(b.sets, namespace)
	b.mu.Unlock()
	if dropped != nil {
		dropped.release()
	}
}
