package backend_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/backend"
	"github.com/terrace-dev/terrace/internal/settings"
	"github.com/terrace-dev/terrace/internal/state"
	"github.com/terrace-dev/terrace/internal/state/release"
	"github.com/terrace-dev/terrace/internal/state/storetest"
)

// storeEverything writes two state versions, a saved plan and a release
// through the namespace's current stores and returns the latest state.
func storeEverything(t *testing.T, b *backend.Backends, ns string) []byte {
	t.Helper()
	set, err := b.For(ctx(t), ns)
	if err != nil {
		t.Fatal(err)
	}
	first := storetest.StateJSON("lineage-m", 1, 1, 256)
	if _, err := set.States.Put(ctx(t), stateKey(ns), first, state.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	latest := storetest.StateJSON("lineage-m", 2, 2, 256)
	if _, err := set.States.Put(ctx(t), stateKey(ns), latest, state.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	plan := state.Plan{PlanMeta: state.PlanMeta{Key: state.PlanKey{Namespace: ns, Stack: "app", ID: "plan-1-abc"}}, Binary: []byte("saved plan")}
	if _, err := set.Plans.PutPlan(ctx(t), plan); err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC().Truncate(time.Second)
	if _, err := set.History.Record(ctx(t), release.Release{Namespace: ns, Stack: "app", Revision: 1, Status: release.StatusDeployed, SourceRevision: "1@sha256:x", StartedAt: now, FinishedAt: now}); err != nil {
		t.Fatal(err)
	}
	return latest
}

// assertEverything checks that the namespace's current stores hold what
// storeEverything wrote.
func assertEverything(t *testing.T, b *backend.Backends, ns string, latest []byte, want terracev1.StateBackend) {
	t.Helper()
	set, err := b.For(ctx(t), ns)
	if err != nil {
		t.Fatal(err)
	}
	if set.Location.Current != want || set.Location.Pending() {
		t.Fatalf("location %+v, want current %s and nothing pending", set.Location, want)
	}
	got, err := set.States.Get(ctx(t), stateKey(ns))
	if err != nil || !bytes.Equal(got.Data, latest) {
		t.Fatalf("state in %s: %v", want, err)
	}
	versions, err := set.States.ListVersions(ctx(t), stateKey(ns))
	if err != nil || len(versions) != 2 {
		t.Errorf("state history in %s: %d versions, %v", want, len(versions), err)
	}
	plan, err := set.Plans.GetPlan(ctx(t), state.PlanKey{Namespace: ns, Stack: "app", ID: "plan-1-abc"})
	if err != nil || string(plan.Binary) != "saved plan" {
		t.Errorf("plan in %s: %v", want, err)
	}
	releases, err := set.History.List(ctx(t), ns, "app")
	if err != nil || len(releases) != 1 || releases[0].Revision != 1 {
		t.Errorf("releases in %s: %v %v", want, releases, err)
	}
}

func TestChangingTheBackendMovesStateOnlyWhenMigrated(t *testing.T) {
	ns := env.Namespace(t)
	putSecret(t, ns, "pg", map[string][]byte{"url": []byte(dbURL)})
	b := newBackends(t)
	latest := storeEverything(t, b, ns)

	// The config now names postgres: the stores stay where the data is,
	// and the move is pending.
	putConfig(t, ns, postgresSpec("pg"))
	set, err := b.For(ctx(t), ns)
	if err != nil {
		t.Fatal(err)
	}
	if set.Location.Current != terracev1.StateBackendSecrets || set.Location.Desired != terracev1.StateBackendPostgres || !set.Location.Pending() {
		t.Fatalf("after the config change: %+v", set.Location)
	}
	if got, err := set.States.Get(ctx(t), stateKey(ns)); err != nil || !bytes.Equal(got.Data, latest) {
		t.Fatalf("the state is not served from where it is: %v", err)
	}

	loc, report, err := b.MigrateNamespace(ctx(t), ns, logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	if loc.Current != terracev1.StateBackendPostgres || report.States != 1 || report.Versions != 2 || report.Plans != 1 || report.Releases != 1 {
		t.Fatalf("migration: %+v, %s", loc, report)
	}
	assertEverything(t, b, ns, latest, terracev1.StateBackendPostgres)

	// The Secrets copy is kept, marked, and refuses writes.
	secretsOnly, release, err := b.OpenBackend(ctx(t), ns, set.Effective, terracev1.StateBackendSecrets)
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	if mark, err := secretsOnly.States.Migrated(ctx(t), stateKey(ns)); err != nil || mark == nil || mark.To != string(terracev1.StateBackendPostgres) {
		t.Errorf("source mark: %+v %v", mark, err)
	}
	_, err = secretsOnly.States.Put(ctx(t), stateKey(ns), storetest.StateJSON("lineage-m", 3, 3, 16), state.PutOptions{})
	if !errors.Is(err, state.ErrMigrated) {
		t.Errorf("a write to the migrated source: %v", err)
	}

	// Running it again does nothing.
	if _, report, err := b.MigrateNamespace(ctx(t), ns, logr.Discard()); err != nil || report.States+report.Plans+report.Releases != 0 {
		t.Errorf("second migration: %s, %v", report, err)
	}

	// And back to Secrets, the connection still named.
	spec := postgresSpec("pg")
	spec.State.Backend = terracev1.StateBackendSecrets
	putConfig(t, ns, spec)
	if _, _, err := b.MigrateNamespace(ctx(t), ns, logr.Discard()); err != nil {
		t.Fatalf("migrating back: %v", err)
	}
	assertEverything(t, b, ns, latest, terracev1.StateBackendSecrets)
}

func TestStateKeptBeforeTheRecordIsFound(t *testing.T) {
	ns := env.Namespace(t)
	b := newBackends(t)
	storeEverything(t, b, ns)
	// An older Terrace kept no record.
	if err := env.Client.Delete(ctx(t), secretObject(ns, backend.LocationSecretName)); err != nil {
		t.Fatal(err)
	}
	putSecret(t, ns, "pg", map[string][]byte{"url": []byte(dbURL)})
	putConfig(t, ns, postgresSpec("pg"))

	loc, err := newBackends(t).Locate(ctx(t), ns)
	if err != nil {
		t.Fatal(err)
	}
	if loc.Current != terracev1.StateBackendSecrets || loc.Desired != terracev1.StateBackendPostgres {
		t.Fatalf("an empty PostgreSQL was chosen over the Secrets holding the state: %+v", loc)
	}
}

func TestStateInPostgresWithoutTheConnectionIsAClearError(t *testing.T) {
	ns := env.Namespace(t)
	putSecret(t, ns, "pg", map[string][]byte{"url": []byte(dbURL)})
	putConfig(t, ns, postgresSpec("pg"))
	b := newBackends(t)
	storeEverything(t, b, ns)

	// Back to secrets, and the connection dropped in the same edit.
	putConfig(t, ns, terracev1.TerraceConfigSpec{State: &terracev1.StateConfig{Backend: terracev1.StateBackendSecrets}})
	_, err := b.For(ctx(t), ns)
	if !errors.Is(err, backend.ErrMisconfigured) || !strings.Contains(err.Error(), "connectionSecretRef") {
		t.Fatalf("want a misconfiguration naming the connection, got %v", err)
	}
	if _, _, err := b.MigrateNamespace(ctx(t), ns, logr.Discard()); !errors.Is(err, backend.ErrMisconfigured) {
		t.Fatalf("migration without a connection: %v", err)
	}
}

func secretObject(ns, name string) *corev1.Secret {
	return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
}

func TestLocationRecordGoesWithTheLastState(t *testing.T) {
	ns := env.Namespace(t)
	b := newBackends(t)
	storeEverything(t, b, ns)
	if err := b.ForgetEmptyLocation(ctx(t), ns); err != nil {
		t.Fatal(err)
	}
	if err := env.Client.Get(ctx(t), client.ObjectKeyFromObject(secretObject(ns, backend.LocationSecretName)), &corev1.Secret{}); err != nil {
		t.Fatalf("the record went while state is left: %v", err)
	}
	set, err := b.For(ctx(t), ns)
	if err != nil {
		t.Fatal(err)
	}
	if err := set.States.Delete(ctx(t), stateKey(ns)); err != nil {
		t.Fatal(err)
	}
	if err := b.ForgetEmptyLocation(ctx(t), ns); err != nil {
		t.Fatal(err)
	}
	err = env.Client.Get(ctx(t), client.ObjectKeyFromObject(secretObject(ns, backend.LocationSecretName)), &corev1.Secret{})
	if !apierrors.IsNotFound(err) {
		t.Fatalf("the record outlived the last state: %v", err)
	}
}

// Every state request and run asks for its namespace's stores: the
// location record is read from the API server once per LocationTrust,
// and this process's own SetLocation takes effect at once.
func TestLocationRecordIsReadOncePerTrustWindow(t *testing.T) {
	ns := env.Namespace(t)
	var reads atomic.Int64
	b := backendsWith(t, interceptor.Funcs{
		Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
			if _, ok := obj.(*corev1.Secret); ok && key.Name == backend.LocationSecretName {
				reads.Add(1)
			}
			return c.Get(ctx, key, obj, opts...)
		},
	})
	if err := b.SetLocation(ctx(t), ns, terracev1.StateBackendSecrets); err != nil {
		t.Fatal(err)
	}
	before := reads.Load()
	for range 20 {
		if _, err := b.For(ctx(t), ns); err != nil {
			t.Fatal(err)
		}
	}
	if n := reads.Load() - before; n != 0 {
		t.Fatalf("20 store lookups right after SetLocation read the location record %d times, want 0", n)
	}
	// Another writer's change is seen once the trust window has passed.
	rec := &corev1.Secret{}
	if err := env.Client.Get(ctx(t), client.ObjectKey{Namespace: ns, Name: backend.LocationSecretName}, rec); err != nil {
		t.Fatal(err)
	}
	rec.Data["backend"] = []byte("postgres")
	if err := env.Client.Update(ctx(t), rec); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(backend.LocationTrust + 5*time.Second)
	for {
		loc, err := b.Locate(ctx(t), ns)
		if err != nil {
			t.Fatal(err)
		}
		if loc.Current == terracev1.StateBackendPostgres {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a changed location record was not seen after %s: %+v", backend.LocationTrust, loc)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// A namespace new to Terrace whose config wants Secrets and names no
// PostgreSQL can keep its state nowhere else: its first Locate records
// Secrets without listing the namespace's Secrets for states.
func TestFirstLocateWithNowhereElseToLookListsNothing(t *testing.T) {
	ns := env.Namespace(t)
	var lists atomic.Int64
	b := backendsWith(t, interceptor.Funcs{
		List: func(ctx context.Context, c client.WithWatch, list client.ObjectList, opts ...client.ListOption) error {
			// The stores list Secrets' metadata only.
			_, full := list.(*corev1.SecretList)
			if full || list.GetObjectKind().GroupVersionKind().Kind == "SecretList" {
				lists.Add(1)
			}
			return c.List(ctx, list, opts...)
		},
	})
	loc, err := b.Locate(ctx(t), ns)
	if err != nil {
		t.Fatal(err)
	}
	if loc.Current != terracev1.StateBackendSecrets || loc.Pending() {
		t.Fatalf("first location %+v, want secrets and nothing pending", loc)
	}
	if n := lists.Load(); n != 0 {
		t.Fatalf("the first Locate listed Secrets %d times, want none", n)
	}
	rec := &corev1.Secret{}
	if err := env.Client.Get(ctx(t), client.ObjectKey{Namespace: ns, Name: backend.LocationSecretName}, rec); err != nil || string(rec.Data["backend"]) != "secrets" {
		t.Fatalf("location record after the first Locate: %v %v", rec.Data, err)
	}
}

// backendsWith is Backends over a client of the test API server with the
// interceptor's funcs, and the settings of the operator namespace.
func backendsWith(t *testing.T, funcs interceptor.Funcs) *backend.Backends {
	t.Helper()
	watching, err := client.NewWithWatch(env.Config, client.Options{Scheme: env.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	r := &settings.Resolver{Reader: env.Client, OperatorNamespace: operatorNamespace, Builtin: settings.BuiltinDefaults("terrace:test")}
	b := backend.New(interceptor.NewClient(watching, funcs), r.ResolveNamespace)
	t.Cleanup(b.Close)
	return b
}
