package backend

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/settings"
	"github.com/terrace-dev/terrace/internal/state/secrets"
)

// A namespace's state lives in one backend at a time. Which one is recorded
// in the namespace itself, in a small Secret, so that a TerraceConfig that
// now asks for another backend is a migration to carry out, never a new,
// empty backend silently used instead.
const (
	// LocationSecretName is the record's name in each namespace with state.
	LocationSecretName = "terrace-state-location"
	// LocationSecretType marks the record.
	LocationSecretType corev1.SecretType = "terrace.dev/state-location.v1"
	// locationKey holds the backend name.
	locationKey = "backend"
	// componentLocation is the record's app.kubernetes.io/component.
	componentLocation = "state-location"
)

// Location says where a namespace's state, plans and releases are
// (Current) and where its TerraceConfig wants them (Desired); while they
// differ a migration is pending and runs must wait.
type Location = settings.StateLocation

// Locate returns where namespace's data is. Without a record (a namespace
// new to Terrace, or state kept before records existed) it looks for
// state in the backends it can open and records what it finds.
func (b *Backends) Locate(ctx context.Context, namespace string) (Location, error) {
	eff, err := b.resolve(ctx, namespace)
	if err != nil {
		return Location{}, fmt.Errorf("failed to resolve the settings of namespace %s: %w", namespace, err)
	}
	return b.locate(ctx, namespace, eff)
}

func (b *Backends) locate(ctx context.Context, namespace string, eff settings.Effective) (Location, error) {
	desired := eff.StateBackend
	if desired == "" {
		desired = settings.DefaultStateBackend
	}
	current, found, err := b.readLocation(ctx, namespace)
	if err != nil {
		return Location{}, err
	}
	if !found {
		current, err = b.discover(ctx, namespace, eff, desired)
		if err != nil {
			return Location{}, err
		}
		if err := b.SetLocation(ctx, namespace, current); err != nil {
			return Location{}, err
		}
	}
	return Location{Current: current, Desired: desired}, nil
}

// LocationTrust is how long a location record read is used before it is
// read again. Every state request and run asks for its namespace's stores;
// without this each would read the record from the API server. This
// process's own changes (SetLocation, ForgetEmptyLocation) take effect at
// once; another replica's migration is seen within this time, and until
// then the migration's source refuses writes, so nothing is lost.
const LocationTrust = 5 * time.Second

// cachedLocation is a location record as read at a time.
type cachedLocation struct {
	backend terracev1.StateBackend
	readAt  time.Time
}

func (b *Backends) readLocation(ctx context.Context, namespace string) (terracev1.StateBackend, bool, error) {
	b.mu.Lock()
	cached, ok := b.locations[namespace]
	b.mu.Unlock()
	if ok && time.Since(cached.readAt) < LocationTrust {
		return cached.backend, true, nil
	}
	v, found, err := b.readLocationRecord(ctx, namespace)
	if err == nil && found {
		b.rememberLocation(namespace, v)
	}
	return v, found, err
}

// rememberLocation caches namespace's location; "" forgets it.
func (b *Backends) rememberLocation(namespace string, backend terracev1.StateBackend) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if backend == "" {
		delete(b.locations, namespace)
		return
	}
	b.locations[namespace] = cachedLocation{backend: backend, readAt: time.Now()}
}

func (b *Backends) readLocationRecord(ctx context.Context, namespace string) (terracev1.StateBackend, bool, error) {
	rec := &corev1.Secret{}
	err := b.client.Get(ctx, types.NamespacedName{Namespace: namespace, Name: LocationSecretName}, rec)
	switch {
	case apierrors.IsNotFound(err):
		return "", false, nil
	case err != nil:
		return "", false, fmt.Errorf("failed to read the state location record %s/%s: %w", namespace, LocationSecretName, err)
	}
	v := terracev1.StateBackend(rec.Data[locationKey])
	if v != terracev1.StateBackendSecrets && v != terracev1.StateBackendPostgres {
		return "", false, fmt.Errorf("%w: the state location record %s/%s names an unknown backend %q; set its key %q to secrets or postgres, where the namespace's state is", ErrMisconfigured, namespace, LocationSecretName, v, locationKey)
	}
	return v, true, nil
}

// SetLocation records that namespace's data is in backend.
func (b *Backends) SetLocation(ctx context.Context, namespace string, backend terracev1.StateBackend) error {
	rec := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: LocationSecretName, Labels: map[string]string{
			secrets.LabelManagedBy: secrets.ManagedByTerrace, "app.kubernetes.io/component": componentLocation,
		}},
		Type: LocationSecretType,
		Data: map[string][]byte{locationKey: []byte(backend)},
	}
	err := b.client.Create(ctx, rec)
	if apierrors.IsAlreadyExists(err) {
		existing := &corev1.Secret{}
		if err := b.client.Get(ctx, types.NamespacedName{Namespace: namespace, Name: LocationSecretName}, existing); err != nil {
			return fmt.Errorf("failed to read the state location record of %s: %w", namespace, err)
		}
		existing.Data = rec.Data
		err = b.client.Update(ctx, existing)
	}
	if err != nil {
		b.rememberLocation(namespace, "")
		return fmt.Errorf("failed to record that the state of namespace %s is in %s: %w", namespace, backend, err)
	}
	b.rememberLocation(namespace, backend)
	return nil
}

// discover finds where a namespace without a record keeps its state: in a
// backend holding states not marked migrated away. It prefers the desired
// backend, so a namespace with nothing stored starts there. With no other
// backend to look in (Secrets desired, no PostgreSQL ever configured) the
// answer is the desired one whatever it holds, and nothing is listed: a
// namespace's first Stack starts its run a List sooner.
func (b *Backends) discover(ctx context.Context, namespace string, eff settings.Effective, desired terracev1.StateBackend) (terracev1.StateBackend, error) {
	other := terracev1.StateBackendSecrets
	if desired == terracev1.StateBackendSecrets {
		other = terracev1.StateBackendPostgres
		if eff.NamedPostgresConnection == nil {
			return desired, nil // no way to look there, and never configured
		}
	}
	if has, err := b.holdsState(ctx, namespace, eff, desired); err != nil || has {
		return desired, err
	}
	has, err := b.holdsState(ctx, namespace, eff, other)
	if err != nil {
		return "", fmt.Errorf("failed to look for existing state of namespace %s in %s: %w", namespace, other, err)
	}
	if has {
		return other, nil
	}
	return desired, nil
}

// holdsState reports whether backend has a state of namespace that was not
// migrated away.
func (b *Backends) holdsState(ctx context.Context, namespace string, eff settings.Effective, backend terracev1.StateBackend) (bool, error) {
	set, release, err := b.OpenBackend(ctx, namespace, eff, backend)
	if err != nil {
		return false, err
	}
	defer release()
	keys, err := set.States.List(ctx, namespace)
	if err != nil {
		return false, err
	}
	for _, key := range keys {
		mark, err := set.States.Migrated(ctx, key)
		if err != nil {
			return false, err
		}
		if mark == nil {
			return true, nil
		}
	}
	return false, nil
}

// OpenBackend opens namespace's stores in the given backend with the
// namespace's other settings (encryption, history, the named PostgreSQL
// connection). It bypasses the location record: it is for migrations.
// Call release when done with the stores, so an unused pool can close.
func (b *Backends) OpenBackend(ctx context.Context, namespace string, eff settings.Effective, backend terracev1.StateBackend) (set *Set, release func(), err error) {
	opened, err := b.open(ctx, namespace, storedIn(eff, backend))
	if err != nil {
		return nil, nil, err
	}
	return opened.set, opened.release, nil
}

// storedIn returns eff with its storage in backend: the other settings
// (encryption, history) stay, and PostgreSQL is reached through the
// connection the config names, whatever backend it now asks for.
func storedIn(eff settings.Effective, backend terracev1.StateBackend) settings.Effective {
	if eff.StateBackend == backend {
		return eff
	}
	eff.StateBackend = backend
	eff.PostgresConnection = nil
	if backend == terracev1.StateBackendPostgres {
		eff.PostgresConnection = eff.NamedPostgresConnection
	}
	return eff
}

// errNoConnection explains a migration away from postgres without a connection.
var errNoConnection = errors.New("the postgres connection is no longer named")

// checkLocation makes sure eff can open where the data is.
func checkLocation(namespace string, loc Location, eff settings.Effective) error {
	if loc.Current == terracev1.StateBackendPostgres && eff.NamedPostgresConnection == nil {
		return fmt.Errorf("%w: the state of namespace %s is in postgres but %v: keep spec.state.postgres.connectionSecretRef in the TerraceConfig until its state has moved to %s", ErrMisconfigured, namespace, errNoConnection, loc.Desired)
	}
	return nil
}

// ForgetEmptyLocation removes namespace's location record once its backend
// holds no state any more (its last Stack was destroyed), so a namespace
// Terrace no longer manages keeps nothing of it. The next Stack there is
// located afresh.
func (b *Backends) ForgetEmptyLocation(ctx context.Context, namespace string) error {
	set, err := b.For(ctx, namespace)
	if err != nil || set.Location.Pending() {
		return err
	}
	keys, err := set.States.List(ctx, namespace)
	if err != nil || len(keys) > 0 {
		return err
	}
	rec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: LocationSecretName}}
	b.rememberLocation(namespace, "")
	if err := b.client.Delete(ctx, rec); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("failed to remove the state location record of %s: %w", namespace, err)
	}
	b.forget(namespace)
	return nil
}
