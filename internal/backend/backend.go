// Package backend opens the state, plan and release stores of a namespace
// as its effective TerraceConfig says (Secrets or PostgreSQL, with or without
// encryption) and caches them. Router serves every namespace from its own
// stores, which is what the Terraform http state server needs.
//
//	resolver := &settings.Resolver{Reader: mgr.GetClient(), OperatorNamespace: ns, Builtin: settings.BuiltinDefaults(image)}
//	backends := backend.New(mgr.GetClient(), resolver.ResolveNamespace)
//	_ = mgr.Add(backends)                 // closes PostgreSQL pools on shutdown
//	set, err := backends.For(ctx, stack.Namespace)
//	// errors.Is(err, backend.ErrMisconfigured): terminal, the user must fix the config or its Secrets
//	store := &backend.Router{Backends: backends} // a state.Store + state.PlanStore for every namespace
package backend

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/settings"
	"github.com/terrace-dev/terrace/internal/state"
	"github.com/terrace-dev/terrace/internal/state/postgres"
	"github.com/terrace-dev/terrace/internal/state/release"
	"github.com/terrace-dev/terrace/internal/state/secrets"
)

// The stores keep state, plans and releases in Secrets and read the key and
// connection Secrets TerraceConfigs name.
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get;list;watch;create;update;patch;delete

// ErrMisconfigured is matched (errors.Is) by For's errors that only a change
// of the TerraceConfig or its Secrets can fix: a missing Secret or key, an
// invalid encryption key or connection string. Callers treat it as terminal.
var ErrMisconfigured = errors.New("state backend misconfigured")

// DefaultSecretRecheck is how long an opened Set is trusted before the
// Secrets it was opened with are read again to notice a changed value.
const DefaultSecretRecheck = 30 * time.Second

// Set is the stores of one namespace.
type Set struct {
	States   state.Store
	Plans    state.PlanStore
	Releases release.Store
	// History records releases with the namespace's history limit.
	History release.History
	// Effective is the namespace's resolved settings the stores follow.
	Effective settings.Effective
	// Location says which backend these stores are in (Current) and which
	// the config asks for. While a migration is pending no run may start.
	Location Location
}

// ResolveFunc returns the effective settings of a namespace; usually
// (*settings.Resolver).ResolveNamespace.
type ResolveFunc func(ctx context.Context, namespace string) (settings.Effective, error)

// Backends opens and caches a Set per namespace. It is safe for concurrent
// use. Close it (or add it to the manager, which closes it on shutdown) to
// release PostgreSQL connections.
type Backends struct {
	client  client.Client
	resolve ResolveFunc
	// SecretRecheck overrides DefaultSecretRecheck; set before first use.
	SecretRecheck time.Duration
	// PostgresHosts refuses PostgreSQL servers the operator does not
	// allow, before any connection; nil allows any (the controller always
	// sets one). Set before first use.
	PostgresHosts *settings.PostgresHostPolicy

	mu        sync.Mutex
	sets      map[string]*cachedSet
	locations map[string]cachedLocation
	pools     *poolCache
	closed    bool
}

// SetPoolCloseGrace overrides DefaultPoolCloseGrace; call before first use.
func (b *Backends) SetPoolCloseGrace(d time.Duration) { b.pools.grace = d }

// cachedSet is a Set with what it was opened from.
type cachedSet struct {
	set *Set
	// storageHash is Effective.StorageHash at opening.
	storageHash string
	// secretVersions are the resourceVersions of the Secrets read.
	secretVersions map[types.NamespacedName]string
	checkedAt      time.Time
	// release lets go of the PostgreSQL pool the stores use (a no-op for Secrets).
	release func()
}

// New returns Backends reading Secrets (state, plans, releases, keys and
// connection strings) through c, which should not cache Secrets (the
// manager's client, configured so, or an uncached client).
func New(c client.Client, resolve ResolveFunc) *Backends {
	return &Backends{client: c, resolve: resolve, sets: map[string]*cachedSet{}, locations: map[string]cachedLocation{}, pools: newPoolCache(DefaultPoolCloseGrace)}
}

// For returns the stores of namespace in the backend that holds its data,
// which is the one its TerraceConfig names unless a migration is pending
// (Set.Location). The result is cached and reused until the namespace's
// storage settings or location change or, checked every SecretRecheck, a
// Secret it was opened with changes.
func (b *Backends) For(ctx context.Context, namespace string) (*Set, error) {
	eff, err := b.resolve(ctx, namespace)
	if err != nil {
		return nil, fmt.Errorf("failed to resolve the settings of namespace %s: %w", namespace, err)
	}
	loc, err := b.locate(ctx, namespace, eff)
	if err != nil {
		return nil, err
	}
	if err := checkLocation(namespace, loc, eff); err != nil {
		return nil, err
	}
	set, err := b.forLocation(ctx, namespace, eff, loc.Current)
	if err != nil {
		return nil, err
	}
	set.Location = loc
	return set, nil
}

// forLocation returns the (cached) stores of namespace in backend current.
func (b *Backends) forLocation(ctx context.Context, namespace string, eff settings.Effective, current terracev1.StateBackend) (*Set, error) {
	eff = storedIn(eff, current)
	hash := eff.StorageHash()

	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil, errors.New("state backends are closed")
	}
	cached := b.sets[namespace]
	var checkedAt time.Time
	if cached != nil {
		checkedAt = cached.checkedAt
	}
	b.mu.Unlock()

	if cached != nil && cached.storageHash == hash {
		if time.Since(checkedAt) < b.recheckInterval() {
			return withEffective(cached.set, eff), nil
		}
		same, err := b.secretsUnchanged(ctx, cached.secretVersions)
		if err != nil {
			return nil, err
		}
		if same {
			b.mu.Lock()
			cached.checkedAt = time.Now()
			b.mu.Unlock()
			return withEffective(cached.set, eff), nil
		}
	}

	opened, err := b.open(ctx, namespace, eff)
	if err != nil {
		return nil, err
	}
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		opened.release()
		return nil, errors.New("state backends are closed")
	}
	replaced := b.sets[namespace]
	b.sets[namespace] = opened
	b.mu.Unlock()
	if replaced != nil {
		// The settings or a Secret changed: the old connection is no longer the configured one.
		replaced.release()
	}
	return withEffective(opened.set, eff), nil
}

// withEffective returns set carrying the latest settings (runner fields may
// have changed without touching storage).
func withEffective(set *Set, eff settings.Effective) *Set {
	c := *set
	c.Effective = eff
	return &c
}

func (b *Backends) recheckInterval() time.Duration {
	if b.SecretRecheck > 0 {
		return b.SecretRecheck
	}
	return DefaultSecretRecheck
}

// open builds the stores of namespace for eff.
func (b *Backends) open(ctx context.Context, namespace string, eff settings.Effective) (*cachedSet, error) {
	versions := map[types.NamespacedName]string{}
	var key *state.EncryptionKey
	if ref := eff.EncryptionKey; ref != nil {
		value, err := b.readSecretValue(ctx, *ref, versions)
		if err != nil {
			return nil, err
		}
		key, err = state.ParseEncryptionKey(value)
		if err != nil {
			return nil, fmt.Errorf("%w: the encryption key in Secret %s/%s key %q must be 32 bytes, raw or base64-encoded", ErrMisconfigured, ref.Namespace, ref.Name, ref.Key)
		}
	}
	history := int(eff.History)
	set := &Set{Effective: eff}
	releasePool := func() {}
	switch eff.StateBackend {
	case terracev1.StateBackendSecrets, "":
		st := secrets.New(b.client, secrets.Options{History: history, Keys: state.StaticKey(key)})
		set.States, set.Plans, set.Releases = st, st, st
	case terracev1.StateBackendPostgres:
		ref := eff.PostgresConnection
		if ref == nil {
			return nil, fmt.Errorf("%w: namespace %s uses the postgres state backend but no TerraceConfig names postgres.connectionSecretRef", ErrMisconfigured, namespace)
		}
		url, err := b.readSecretValue(ctx, *ref, versions)
		if err != nil {
			return nil, err
		}
		pool, release, err := b.pool(ctx, string(url), *ref)
		if err != nil {
			return nil, err
		}
		st, err := postgres.New(ctx, pool, postgres.Options{History: history, Keys: state.StaticKey(key)})
		if err != nil {
			release()
			return nil, fmt.Errorf("failed to open the PostgreSQL state store for namespace %s: %w", namespace, err)
		}
		releasePool = release
		set.States, set.Plans, set.Releases = st, st, st
	default:
		return nil, fmt.Errorf("%w: unknown state backend %q", ErrMisconfigured, eff.StateBackend)
	}
	set.History = release.History{Store: set.Releases, Limit: history}
	return &cachedSet{set: set, storageHash: eff.StorageHash(), secretVersions: versions, checkedAt: time.Now(), release: releasePool}, nil
}

// readSecretValue reads one Secret key and records the Secret's resourceVersion.
func (b *Backends) readSecretValue(ctx context.Context, ref settings.SecretKeyRef, versions map[types.NamespacedName]string) ([]byte, error) {
	secret := &corev1.Secret{}
	err := b.client.Get(ctx, types.NamespacedName{Namespace: ref.Namespace, Name: ref.Name}, secret)
	switch {
	case apierrors.IsNotFound(err):
		return nil, fmt.Errorf("%w: Secret %s/%s does not exist", ErrMisconfigured, ref.Namespace, ref.Name)
	case err != nil:
		return nil, fmt.Errorf("failed to read Secret %s/%s: %w", ref.Namespace, ref.Name, err)
	}
	value := secret.Data[ref.Key]
	if len(value) == 0 {
		return nil, fmt.Errorf("%w: Secret %s/%s has no key %q", ErrMisconfigured, ref.Namespace, ref.Name, ref.Key)
	}
	versions[types.NamespacedName{Namespace: ref.Namespace, Name: ref.Name}] = secret.ResourceVersion
	return value, nil
}

// secretsUnchanged reports whether every Secret still has the recorded resourceVersion.
func (b *Backends) secretsUnchanged(ctx context.Context, versions map[types.NamespacedName]string) (bool, error) {
	for name, version := range versions {
		secret := &corev1.Secret{}
		err := b.client.Get(ctx, name, secret)
		switch {
		case apierrors.IsNotFound(err):
			return false, nil
		case err != nil:
			return false, fmt.Errorf("failed to read Secret %s: %w", name, err)
		}
		if secret.ResourceVersion != version {
			return false, nil
		}
	}
	return true, nil
}

// pool returns the shared pool for a connection string, after checking
// that the config that named it may use its server, and the func that
// releases this use of it.
func (b *Backends) pool(ctx context.Context, url string, ref settings.SecretKeyRef) (*pgxpool.Pool, func(), error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		// pgx's parse errors may quote the string, password included: say less.
		return nil, nil, fmt.Errorf("%w: Secret %s/%s key %q is not a valid PostgreSQL connection string", ErrMisconfigured, ref.Namespace, ref.Name, ref.Key)
	}
	if err := b.PostgresHosts.Check(ctx, ref.Namespace, url); err != nil {
		if errors.Is(err, settings.ErrPostgresHostNotAllowed) {
			return nil, nil, fmt.Errorf("%w: Secret %s/%s key %q: %w", ErrMisconfigured, ref.Namespace, ref.Name, ref.Key, err)
		}
		return nil, nil, err
	}
	p, release, err := b.pools.acquire(ctx, url, cfg)
	if err != nil {
		return nil, nil, fmt.Errorf("failed to create the PostgreSQL pool for Secret %s/%s: %w", ref.Namespace, ref.Name, err)
	}
	return p, release, nil
}

// Close closes every PostgreSQL pool; For fails afterwards.
func (b *Backends) Close() {
	b.mu.Lock()
	b.closed = true
	clear(b.sets)
	b.mu.Unlock()
	b.pools.closeAll()
}

// Start waits for ctx to end and closes the pools: add Backends to the
// manager (mgr.Add) so they close on shutdown.
func (b *Backends) Start(ctx context.Context) error {
	<-ctx.Done()
	b.Close()
	return nil
}

// NeedLeaderElection is false: every replica serves state.
func (b *Backends) NeedLeaderElection() bool { return false }
