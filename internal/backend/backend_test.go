package backend_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/backend"
	"github.com/terrace-dev/terrace/internal/settings"
	"github.com/terrace-dev/terrace/internal/state"
	"github.com/terrace-dev/terrace/internal/state/postgres"
	"github.com/terrace-dev/terrace/internal/state/postgres/pgtest"
	"github.com/terrace-dev/terrace/internal/state/secrets"
	"github.com/terrace-dev/terrace/internal/state/storetest"
	"github.com/terrace-dev/terrace/internal/testenv"
)

const operatorNamespace = "terrace-system"

var (
	env   *testenv.Env
	dbURL string
)

// The suite needs a real API server (envtest) and a real PostgreSQL
// (pgtest: TERRACE_TEST_POSTGRES_URL or a throwaway server).
func TestMain(m *testing.M) {
	os.Exit(runSuite(m))
}

func runSuite(m *testing.M) int {
	e, err := testenv.Start()
	if err != nil {
		fmt.Fprintln(os.Stderr, "testenv:", err)
		return 1
	}
	env = e
	defer func() { _ = e.Stop() }()
	url, stop, err := pgtest.Start()
	if err != nil {
		fmt.Fprintln(os.Stderr, "pgtest:", err)
		return 1
	}
	defer stop()
	dbURL = url
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: operatorNamespace}}
	if err := env.Client.Create(context.Background(), ns); err != nil {
		fmt.Fprintln(os.Stderr, "failed to create the operator namespace:", err)
		return 1
	}
	return m.Run()
}

func ctx(t testing.TB) context.Context {
	c, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return c
}

func newBackends(t testing.TB) *backend.Backends {
	t.Helper()
	r := &settings.Resolver{Reader: env.Client, OperatorNamespace: operatorNamespace, Builtin: settings.BuiltinDefaults("terrace:test")}
	b := backend.New(env.Client, r.ResolveNamespace)
	t.Cleanup(b.Close)
	return b
}

func putSecret(t testing.TB, ns, name string, data map[string][]byte) {
	t.Helper()
	s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Data: data}
	err := env.Client.Create(ctx(t), s)
	if apierrors.IsAlreadyExists(err) {
		err = env.Client.Update(ctx(t), s)
	}
	if err != nil {
		t.Fatalf("failed to write Secret %s/%s: %v", ns, name, err)
	}
}

func putConfig(t testing.TB, ns string, spec terracev1.TerraceConfigSpec) {
	t.Helper()
	cfg := &terracev1.TerraceConfig{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: terracev1.TerraceConfigName}}
	current := cfg.DeepCopy()
	err := env.Client.Get(ctx(t), client.ObjectKeyFromObject(cfg), current)
	switch {
	case apierrors.IsNotFound(err):
		cfg.Spec = spec
		err = env.Client.Create(ctx(t), cfg)
	case err == nil:
		current.Spec = spec
		err = env.Client.Update(ctx(t), current)
	}
	if err != nil {
		t.Fatalf("failed to write TerraceConfig in %s: %v", ns, err)
	}
}

func encryptionSpec(secretName string) terracev1.TerraceConfigSpec {
	return terracev1.TerraceConfigSpec{State: &terracev1.StateConfig{
		Encryption: &terracev1.EncryptionConfig{KeySecretRef: terracev1.SecretKeyReference{Name: secretName}},
	}}
}

func postgresSpec(secretName string) terracev1.TerraceConfigSpec {
	return terracev1.TerraceConfigSpec{State: &terracev1.StateConfig{
		Backend:  terracev1.StateBackendPostgres,
		Postgres: &terracev1.PostgresConfig{ConnectionSecretRef: terracev1.SecretKeyReference{Name: secretName}},
	}}
}

func stateKey(ns string) state.Key {
	return state.Key{Namespace: ns, Stack: "app", Workspace: state.DefaultWorkspace}
}

// storedStates returns the sealed bytes of every state version kept in
// ns's Secrets: in chunk Secrets, or inline in their index Secret.
func storedStates(t *testing.T, ns string) [][]byte {
	t.Helper()
	var out [][]byte
	for _, kind := range []string{secrets.KindStateChunk, secrets.KindStateIndex} {
		var list corev1.SecretList
		if err := env.Client.List(ctx(t), &list, client.InNamespace(ns), client.MatchingLabels{secrets.LabelKind: kind}); err != nil {
			t.Fatal(err)
		}
		for _, s := range list.Items {
			if kind == secrets.KindStateChunk {
				out = append(out, s.Data["chunk"])
				continue
			}
			var index struct {
				Versions []struct {
					Blob struct {
						Inline []byte `json:"inline"`
					} `json:"blob"`
				} `json:"versions"`
			}
			if err := json.Unmarshal(s.Data["index"], &index); err != nil {
				t.Fatal(err)
			}
			for _, v := range index.Versions {
				if v.Blob.Inline != nil {
					out = append(out, v.Blob.Inline)
				}
			}
		}
	}
	return out
}

var gzipMagic = []byte{0x1f, 0x8b}

func TestNamespaceWithoutConfigGetsPlainSecretsStore(t *testing.T) {
	ns := env.Namespace(t)
	b := newBackends(t)
	set, err := b.For(ctx(t), ns)
	if err != nil {
		t.Fatal(err)
	}
	if set.Effective.StateBackend != terracev1.StateBackendSecrets || set.Effective.EncryptionKey != nil {
		t.Fatalf("effective %+v, want the plain secrets backend", set.Effective)
	}
	if _, ok := set.States.(*secrets.Store); !ok {
		t.Fatalf("States is %T, want *secrets.Store", set.States)
	}
	if set.History.Limit != int(settings.DefaultHistory) {
		t.Errorf("release history limit %d, want %d", set.History.Limit, settings.DefaultHistory)
	}
	data := storetest.StateJSON("lineage-a", 1, 1, 64)
	if _, err := set.States.Put(ctx(t), stateKey(ns), data, state.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	stored := storedStates(t, ns)
	if len(stored) == 0 {
		t.Fatal("no state stored in the namespace's Secrets")
	}
	for _, c := range stored {
		if !bytes.HasPrefix(c, gzipMagic) {
			t.Errorf("an unencrypted state does not start with the gzip header")
		}
	}
}

func TestEncryptionKeyFromConfigEncryptsState(t *testing.T) {
	ns := env.Namespace(t)
	rawKey := []byte("0123456789abcdef0123456789abcdef")
	putSecret(t, ns, "state-key", map[string][]byte{"key": []byte(base64.StdEncoding.EncodeToString(rawKey))})
	putConfig(t, ns, encryptionSpec("state-key"))

	b := newBackends(t)
	set, err := b.For(ctx(t), ns)
	if err != nil {
		t.Fatal(err)
	}
	if ref := set.Effective.EncryptionKey; ref == nil || ref.Namespace != ns || ref.Name != "state-key" {
		t.Fatalf("effective encryption key %+v", ref)
	}
	data := storetest.StateJSON("lineage-e", 1, 1, 64)
	if _, err := set.States.Put(ctx(t), stateKey(ns), data, state.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	stored := storedStates(t, ns)
	if len(stored) == 0 {
		t.Fatal("no state stored in the namespace's Secrets")
	}
	plainGzip, _, err := state.Seal(data, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range stored {
		if bytes.HasPrefix(c, gzipMagic) || bytes.Equal(c, plainGzip) || bytes.Contains(c, []byte("lineage-e")) {
			t.Errorf("a state is stored unencrypted")
		}
	}
	got, err := set.States.Get(ctx(t), stateKey(ns))
	if err != nil || !bytes.Equal(got.Data, data) {
		t.Fatalf("read back %v, %v", got, err)
	}
	// Without the key the stored state cannot be read: the key really is used.
	plain := secrets.New(env.Client, secrets.Options{})
	if _, err := plain.Get(ctx(t), stateKey(ns)); err == nil || !strings.Contains(err.Error(), "encrypted") {
		t.Errorf("reading without the key: %v, want an error saying the state is encrypted", err)
	}
}

func TestOperatorDefaultKeyIsReadFromTheOperatorNamespace(t *testing.T) {
	putSecret(t, operatorNamespace, "default-key", map[string][]byte{"key": []byte("fedcba9876543210fedcba9876543210")})
	putConfig(t, operatorNamespace, encryptionSpec("default-key"))
	t.Cleanup(func() {
		_ = env.Client.Delete(context.Background(), &terracev1.TerraceConfig{ObjectMeta: metav1.ObjectMeta{Namespace: operatorNamespace, Name: terracev1.TerraceConfigName}})
	})
	ns := env.Namespace(t)
	set, err := newBackends(t).For(ctx(t), ns)
	if err != nil {
		t.Fatal(err)
	}
	if ref := set.Effective.EncryptionKey; ref == nil || ref.Namespace != operatorNamespace {
		t.Fatalf("effective encryption key %+v, want the operator namespace's Secret", ref)
	}
	if _, err := set.States.Put(ctx(t), stateKey(ns), storetest.StateJSON("l", 1, 1, 64), state.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	stored := storedStates(t, ns)
	if len(stored) == 0 {
		t.Fatal("no state stored in the namespace's Secrets")
	}
	for _, c := range stored {
		if bytes.HasPrefix(c, gzipMagic) {
			t.Error("a state is stored unencrypted")
		}
	}
}

func TestCachedUntilConfigOrSecretChanges(t *testing.T) {
	ns := env.Namespace(t)
	b := newBackends(t)
	b.SecretRecheck = time.Nanosecond // re-read the Secrets on every call
	first, err := b.For(ctx(t), ns)
	if err != nil {
		t.Fatal(err)
	}
	again, err := b.For(ctx(t), ns)
	if err != nil {
		t.Fatal(err)
	}
	if again.States != first.States {
		t.Error("an unchanged namespace got new stores")
	}

	putSecret(t, ns, "state-key", map[string][]byte{"key": []byte("0123456789abcdef0123456789abcdef")})
	putConfig(t, ns, encryptionSpec("state-key"))
	encrypted, err := b.For(ctx(t), ns)
	if err != nil {
		t.Fatal(err)
	}
	if encrypted.States == first.States || encrypted.Effective.EncryptionKey == nil {
		t.Fatal("a config change did not reopen the stores")
	}
	if cached, _ := b.For(ctx(t), ns); cached.States != encrypted.States {
		t.Error("stores were reopened although nothing changed")
	}

	putSecret(t, ns, "state-key", map[string][]byte{"key": []byte("ffffffffffffffffffffffffffffffff")})
	rotated, err := b.For(ctx(t), ns)
	if err != nil {
		t.Fatal(err)
	}
	if rotated.States == encrypted.States {
		t.Error("a changed key Secret did not reopen the stores")
	}

	// A runner-only change keeps the stores but reports the new settings.
	spec := encryptionSpec("state-key")
	spec.Runner = &terracev1.RunnerConfig{Image: "team:2"}
	putConfig(t, ns, spec)
	runnerChange, err := b.For(ctx(t), ns)
	if err != nil {
		t.Fatal(err)
	}
	if runnerChange.States != rotated.States || runnerChange.Effective.RunnerImage != "team:2" {
		t.Errorf("runner change: same stores %v, image %q", runnerChange.States == rotated.States, runnerChange.Effective.RunnerImage)
	}
}

func TestMisconfigurationIsReportedWithoutSecrets(t *testing.T) {
	b := newBackends(t)

	missing := env.Namespace(t)
	putConfig(t, missing, encryptionSpec("nope"))
	_, err := b.For(ctx(t), missing)
	if !errors.Is(err, backend.ErrMisconfigured) || !strings.Contains(err.Error(), missing+"/nope") {
		t.Errorf("missing Secret: %v", err)
	}

	shortKey := env.Namespace(t)
	putSecret(t, shortKey, "k", map[string][]byte{"key": []byte("too-short-secret")})
	putConfig(t, shortKey, encryptionSpec("k"))
	_, err = b.For(ctx(t), shortKey)
	if !errors.Is(err, backend.ErrMisconfigured) || strings.Contains(err.Error(), "too-short-secret") {
		t.Errorf("short key: %v", err)
	}

	badURL := env.Namespace(t)
	putSecret(t, badURL, "pg", map[string][]byte{"url": []byte("postgres://u:hunter2@h/db?sslmode=%zz")})
	putConfig(t, badURL, postgresSpec("pg"))
	_, err = b.For(ctx(t), badURL)
	if !errors.Is(err, backend.ErrMisconfigured) || strings.Contains(err.Error(), "hunter2") {
		t.Errorf("bad URL: %v", err)
	}
}

func TestRouterRoutesByNamespace(t *testing.T) {
	onSecrets, onPostgres := env.Namespace(t), env.Namespace(t)
	putSecret(t, onPostgres, "pg", map[string][]byte{"url": []byte(dbURL)})
	putConfig(t, onPostgres, postgresSpec("pg"))

	b := newBackends(t)
	router := &backend.Router{Backends: b}
	dataS := storetest.StateJSON("lineage-s", 1, 1, 64)
	dataP := storetest.StateJSON("lineage-p", 1, 2, 64)
	if _, err := router.Put(ctx(t), stateKey(onSecrets), dataS, state.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := router.Put(ctx(t), stateKey(onPostgres), dataP, state.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	plan := state.Plan{PlanMeta: state.PlanMeta{Key: state.PlanKey{Namespace: onPostgres, Stack: "app", ID: "p1"}}, Binary: []byte("plan bytes")}
	if _, err := router.PutPlan(ctx(t), plan); err != nil {
		t.Fatal(err)
	}

	// Each namespace reads back its own state through the router.
	for ns, want := range map[string][]byte{onSecrets: dataS, onPostgres: dataP} {
		got, err := router.Get(ctx(t), stateKey(ns))
		if err != nil || !bytes.Equal(got.Data, want) {
			t.Errorf("router get %s: %v", ns, err)
		}
	}
	// The secrets namespace's state is in its Secrets; the postgres one's is not.
	if len(storedStates(t, onSecrets)) == 0 {
		t.Error("no state Secrets in the secrets namespace")
	}
	if n := len(storedStates(t, onPostgres)); n != 0 {
		t.Errorf("%d state Secrets in the postgres namespace", n)
	}
	// The postgres namespace's state and plan are in the database.
	db, err := postgres.Open(ctx(t), dbURL, postgres.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	got, err := db.Get(ctx(t), stateKey(onPostgres))
	if err != nil || !bytes.Equal(got.Data, dataP) {
		t.Errorf("state not in PostgreSQL: %v", err)
	}
	if _, err := db.GetPlan(ctx(t), plan.Key); err != nil {
		t.Errorf("plan not in PostgreSQL: %v", err)
	}
	if _, err := db.Get(ctx(t), stateKey(onSecrets)); !errors.Is(err, state.ErrNotFound) {
		t.Errorf("the secrets namespace's state is in PostgreSQL: %v", err)
	}
	// Releases follow the namespace too.
	set, err := b.For(ctx(t), onPostgres)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := set.Releases.(*postgres.Store); !ok {
		t.Errorf("releases of the postgres namespace in %T", set.Releases)
	}

	if _, err := router.List(ctx(t), ""); err == nil {
		t.Error("listing every namespace through the router succeeded")
	}
	keys, err := router.List(ctx(t), onPostgres)
	if err != nil || len(keys) != 1 || keys[0] != stateKey(onPostgres) {
		t.Errorf("router list %s: %v %v", onPostgres, keys, err)
	}
}

func TestForFailsAfterClose(t *testing.T) {
	b := newBackends(t)
	b.Close()
	if _, err := b.For(ctx(t), env.Namespace(t)); err == nil {
		t.Error("For succeeded after Close")
	}
}

// Many callers at once (the state server serves every replica's runners)
// share one Set and do not race.
func TestConcurrentCallersShareTheStores(t *testing.T) {
	ns := env.Namespace(t)
	putSecret(t, ns, "state-key", map[string][]byte{"key": []byte("0123456789abcdef0123456789abcdef")})
	putConfig(t, ns, encryptionSpec("state-key"))
	b := newBackends(t)
	b.SecretRecheck = time.Millisecond
	router := &backend.Router{Backends: b}
	errs := make(chan error, 16)
	for i := range 16 {
		go func() {
			key := state.Key{Namespace: ns, Stack: fmt.Sprintf("s%d", i), Workspace: state.DefaultWorkspace}
			_, err := router.Put(ctx(t), key, storetest.StateJSON("l", 1, i, 64), state.PutOptions{})
			if err == nil {
				_, err = router.Get(ctx(t), key)
			}
			errs <- err
		}()
	}
	for range 16 {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
	keys, err := router.List(ctx(t), ns)
	if err != nil || len(keys) != 16 {
		t.Errorf("listed %d keys (%v), want 16", len(keys), err)
	}
}
