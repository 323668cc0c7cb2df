package e2e

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/state"
	"github.com/terrace-dev/terrace/internal/state/postgres"
	"github.com/terrace-dev/terrace/internal/state/postgres/pgtest"
	"github.com/terrace-dev/terrace/internal/state/secrets"
)

// sharedPostgres is one real PostgreSQL for the tests that need it,
// started on first use and stopped when the package's tests end. The
// controller reaches it through its unix socket (url); runner pods, for a
// Stack's own pg backend, on the host's end of the node's link (tcpURL).
var sharedPostgres struct {
	once        sync.Once
	url, tcpURL string
	stop        func()
	err         error
}

func startSharedPostgres(t testing.TB) {
	t.Helper()
	sharedPostgres.once.Do(func() {
		if url := os.Getenv(pgtest.EnvURL); url != "" {
			sharedPostgres.url, sharedPostgres.tcpURL = url, url
			return
		}
		var srv *pgtest.Server
		srv, sharedPostgres.err = pgtest.StartListening(sharedPostgresDir(), hostPorts(t, sharedDev(t), 1)[0])
		if sharedPostgres.err == nil {
			sharedPostgres.url, sharedPostgres.tcpURL, sharedPostgres.stop = srv.URL, srv.TCPURL, srv.Stop
		}
	})
	if sharedPostgres.err != nil {
		t.Fatal(sharedPostgres.err)
	}
}

// postgresURL connects to the shared PostgreSQL from this host.
func postgresURL(t testing.TB) string {
	t.Helper()
	startSharedPostgres(t)
	return sharedPostgres.url
}

// postgresRunnerURL connects to the shared PostgreSQL from runner pods.
func postgresRunnerURL(t testing.TB) string {
	t.Helper()
	startSharedPostgres(t)
	return sharedPostgres.tcpURL
}

func stopSharedPostgres() {
	if sharedPostgres.stop != nil {
		sharedPostgres.stop()
	}
}

// Switching a namespace's TerraceConfig from Secrets to PostgreSQL moves
// the applied Stack's state there before any run uses it: the next plan
// finds the resources it manages (no changes, no new release) instead of
// starting from an empty state.
func TestStackStateMovesWithTheConfiguredBackend(t *testing.T) {
	e := newStackEnv(t)
	url := postgresURL(t)
	path := e.managedFile(t)
	e.program(t, "files", map[string]string{"main.tf": fileModule})
	e.create(t, fileStack("moving", path, terracev1.ApprovePlanAuto, terracev1.DriftDetectionDisabled))
	e.waitStack(t, "moving", stackTimeout, "Ready on Secrets", readyAt)
	before, _ := e.stateOf(t, "moving")

	e.create(t, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "pg"}, StringData: map[string]string{"url": url}})
	e.create(t, &terracev1.TerraceConfig{
		ObjectMeta: metav1.ObjectMeta{Name: terracev1.TerraceConfigName},
		Spec: terracev1.TerraceConfigSpec{State: &terracev1.StateConfig{
			Backend:  terracev1.StateBackendPostgres,
			Postgres: &terracev1.PostgresConfig{ConnectionSecretRef: terracev1.SecretKeyReference{Name: "pg"}},
		}},
	})
	eventually(t, stackTimeout, "the TerraceConfig to report the move verified", func() error {
		var cfg terracev1.TerraceConfig
		if err := e.c.Get(context.Background(), client.ObjectKey{Namespace: e.ns, Name: terracev1.TerraceConfigName}, &cfg); err != nil {
			return err
		}
		sb := cfg.Status.StateBackend
		if sb == nil || sb.Current != terracev1.StateBackendPostgres || sb.Phase != "Verified" || sb.Migrated != 1 || sb.Total != 1 {
			return fmt.Errorf("status.stateBackend = %+v", sb)
		}
		return nil
	})

	// The state is in PostgreSQL, byte for byte; the Secrets copy is kept and marked.
	db, err := postgres.Open(context.Background(), url, postgres.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	key := state.Key{Namespace: e.ns, Stack: "moving", Workspace: "default"}
	moved, err := db.Get(context.Background(), key)
	if err != nil {
		t.Fatalf("state not in PostgreSQL: %v", err)
	}
	if moved.Serial != before.Serial || moved.Lineage != before.Lineage || string(moved.Data) != string(before.Data) {
		t.Fatalf("moved state differs: serial %d/%d lineage %s/%s", moved.Serial, before.Serial, moved.Lineage, before.Lineage)
	}
	if mark, err := secrets.New(e.c, secrets.Options{}).Migrated(context.Background(), key); err != nil || mark == nil {
		t.Fatalf("the Secrets copy is not marked migrated: %v %v", mark, err)
	}

	// The next run plans against the moved state.
	requested := time.Now().UTC().Format(time.RFC3339Nano)
	e.updateStack(t, "moving", func(s *terracev1.Stack) {
		s.Annotations = map[string]string{terracev1.ReconcileRequestAnnotation: requested}
	})
	st := e.waitStack(t, "moving", stackTimeout, "a run on PostgreSQL", func(s *terracev1.Stack) error {
		if s.Status.LastHandledReconcileAt != requested {
			return fmt.Errorf("request not handled yet")
		}
		return readyAt(s)
	})
	if c := conditionIs(terracev1.PlannedCondition, metav1.ConditionTrue, "NoChanges")(st); c != nil {
		t.Errorf("the run after the move planned changes, as if the state were lost: %v; conditions: %s", c, conditionsText(st))
	}
	if st.Status.Release == nil || st.Status.Release.Revision != 1 {
		t.Errorf("release after the move: %+v", st.Status.Release)
	}
	if got := readFile(t, path); got != "managed by terrace" {
		t.Errorf("file after the move: %q", got)
	}
}
