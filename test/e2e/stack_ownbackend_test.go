package e2e

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/state"
	"github.com/terrace-dev/terrace/internal/state/secrets"
)

// pgBackendStack is fileStack keeping its state in tofu's pg backend, in
// a schema of its own, connecting with the string in Secret pg-backend.
func pgBackendStack(name, path, schema, approve string, mode terracev1.DriftDetectionMode) *terracev1.Stack {
	s := fileStack(name, path, approve, mode)
	s.Spec.Backend = &terracev1.StackBackend{
		Type:   "pg",
		Config: map[string]apiextensionsv1.JSON{"schema_name": {Raw: []byte(fmt.Sprintf("%q", schema))}},
		Credentials: []terracev1.BackendCredential{{
			Env: "PG_CONN_STR", SecretKeyRef: terracev1.SecretKeyReference{Name: "pg-backend", Key: "conn_str"},
		}},
	}
	return s
}

// pgState is the state tofu's pg backend keeps for workspace in schema.
func pgState(t *testing.T, url, schema, workspace string) (string, error) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var data string
	err = conn.QueryRow(ctx, fmt.Sprintf(`SELECT data FROM %s.states WHERE name = $1`, pgx.Identifier{schema}.Sanitize()), workspace).Scan(&data)
	return data, err
}

// holdPgLock takes the advisory lock tofu's pg backend takes on a
// workspace's row, until the returned func releases it.
func holdPgLock(t *testing.T, url, schema, workspace string) func() {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	var locked bool
	query := fmt.Sprintf(`SELECT pg_try_advisory_lock(id) FROM %s.states WHERE name = $1`, pgx.Identifier{schema}.Sanitize())
	if err := conn.QueryRow(ctx, query, workspace).Scan(&locked); err != nil || !locked {
		t.Fatalf("failed to lock workspace %s: %v (locked %v)", workspace, err, locked)
	}
	return func() { _ = conn.Close(ctx) }
}

// A Stack with spec.backend keeps its state in tofu's pg backend on the
// project's PostgreSQL (the runner pod connects to it itself), never on
// Terrace's state server; plans wait for approval, releases are recorded
// and drift is reported exactly as for a Stack whose state Terrace keeps.
func TestStackKeepsStateInItsOwnPgBackend(t *testing.T) {
	e := newStackEnv(t)
	url := postgresURL(t)
	schema := "own_" + strings.ReplaceAll(e.ns, "-", "_")
	path := e.managedFile(t)
	e.create(t, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "pg-backend"}, StringData: map[string]string{"conn_str": postgresRunnerURL(t)}})
	e.allowRunnerToRead(t, "pg-backend")
	e.program(t, "files", map[string]string{"main.tf": fileModule})
	e.create(t, pgBackendStack("own", path, schema, "", terracev1.DriftDetectionWarn))

	st := e.waitStack(t, "own", stackTimeout, "a plan waiting for approval", conditionIs(terracev1.ReadyCondition, metav1.ConditionFalse, "AwaitingApproval"))
	if p := st.Status.Plan; p == nil || p.Add != 1 {
		t.Fatalf("first plan: %+v", p)
	}
	planID := st.Status.Plan.Pending
	e.updateStack(t, "own", func(s *terracev1.Stack) { s.Spec.ApprovePlan = planID })
	e.waitStack(t, "own", stackTimeout, "Ready after approval", readyAt)
	if got := readFile(t, path); got != "managed by terrace" {
		t.Fatalf("file after apply: %q", got)
	}
	data, err := pgState(t, url, schema, "default")
	if err != nil || !strings.Contains(data, "testfile_file") {
		t.Fatalf("state in PostgreSQL: %v %.200s", err, data)
	}
	_, err = secrets.New(e.c, secrets.Options{}).Get(context.Background(), state.Key{Namespace: e.ns, Stack: "own", Workspace: "default"})
	if !errors.Is(err, state.ErrNotFound) {
		t.Fatalf("Terrace's own store holds a state for the Stack: %v", err)
	}
	if rs := e.releases(t, "own"); len(rs) != 1 || rs[0].PlanID != planID {
		t.Fatalf("releases: %+v", rs)
	}

	if err := os.WriteFile(path, []byte("edited by hand"), 0o644); err != nil {
		t.Fatal(err)
	}
	st = e.waitStack(t, "own", stackTimeout, "drift reported", conditionIs(terracev1.DriftedCondition, metav1.ConditionTrue, "DriftDetected"))
	if st.Status.Plan == nil || st.Status.Plan.Change != 1 {
		t.Errorf("drift plan: %+v", st.Status.Plan)
	}
	// A lock held in the backend: the next run fails with tofu's lock
	// message in the Ready condition and status.backendLock, which
	// describe shows; runs go on once it is released, and it is cleared.
	release := holdPgLock(t, url, schema, "default")
	locked := e.waitStack(t, "own", stackTimeout, "a run that meets the backend's lock", func(s *terracev1.Stack) error {
		if c := apimeta.FindStatusCondition(s.Status.Conditions, terracev1.ReadyCondition); c == nil || !strings.Contains(c.Message, "the state is locked") {
			return fmt.Errorf("conditions: %s", conditionsText(s))
		}
		if s.Status.BackendLock == nil {
			return fmt.Errorf("no status.backendLock: %s", conditionsText(s))
		}
		return nil
	})
	if msg := locked.Status.BackendLock.Message; !strings.Contains(msg, "Error acquiring the state lock") {
		t.Errorf("status.backendLock.message %q is not tofu's account of the lock", msg)
	}
	described := terraceCLI(t, e, "describe", "own", "-n", e.ns)
	for _, want := range []string{"State lock (spec.backend): a run met it at", "tofu force-unlock", "Error acquiring the state lock"} {
		if !strings.Contains(described, want) {
			t.Errorf("describe does not show %q:\n%s", want, described)
		}
	}
	release()
	lockedAt := e.getStack(t, "own").Status.LastDriftCheckAt
	e.waitStack(t, "own", stackTimeout, "a drift check after the lock is released", func(s *terracev1.Stack) error {
		if s.Status.LastDriftCheckAt == nil || (lockedAt != nil && !s.Status.LastDriftCheckAt.After(lockedAt.Time)) {
			return fmt.Errorf("no new drift check: %s", conditionsText(s))
		}
		if s.Status.BackendLock != nil {
			return fmt.Errorf("status.backendLock is still set: %+v", s.Status.BackendLock)
		}
		return conditionIs(terracev1.DriftedCondition, metav1.ConditionTrue, "DriftDetected")(s)
	})
	if strings.Contains(controllerLog.String(), url) {
		t.Error("the controller log holds the backend's connection string")
	}
}

// Bad spec.backend input ends in a Stalled condition naming the field, and
// a TerraceConfig with allowOwnBackend: false refuses the Stack before any
// runner starts.
func TestStackOwnBackendRefusals(t *testing.T) {
	e := newStackEnv(t)
	e.program(t, "files", map[string]string{"main.tf": fileModule})
	path := e.managedFile(t)

	e.create(t, pgBackendStack("nocreds", path, "own_nocreds", terracev1.ApprovePlanAuto, terracev1.DriftDetectionDisabled))
	st := e.waitStack(t, "nocreds", stackTimeout, "Stalled: no access to the credentials", conditionIs(terracev1.StalledCondition, metav1.ConditionTrue, "BackendCredentialsForbidden"))
	if msg := conditionsText(st); !strings.Contains(msg, "spec.backend.credentials[0]") {
		t.Errorf("conditions: %s", msg)
	}
	e.allowRunnerToRead(t, "pg-backend")
	st = e.waitStack(t, "nocreds", stackTimeout, "Stalled: the Secret is missing", conditionIs(terracev1.StalledCondition, metav1.ConditionTrue, "BackendCredentialsNotFound"))
	if msg := conditionsText(st); !strings.Contains(msg, "Secret "+e.ns+"/pg-backend not found") {
		t.Errorf("conditions: %s", msg)
	}

	forbidden := false
	e.create(t, &terracev1.TerraceConfig{
		ObjectMeta: metav1.ObjectMeta{Name: terracev1.TerraceConfigName},
		Spec:       terracev1.TerraceConfigSpec{Runner: &terracev1.RunnerConfig{Policy: &terracev1.RunnerPolicy{AllowOwnBackend: &forbidden}}},
	})
	st = e.waitStack(t, "nocreds", stackTimeout, "refused by the runner policy", conditionIs(terracev1.StalledCondition, metav1.ConditionTrue, "RunnerPolicyViolation"))
	if msg := conditionsText(st); !strings.Contains(msg, "spec.backend") || !strings.Contains(msg, "allowOwnBackend: false") {
		t.Errorf("conditions: %s", msg)
	}
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a refused Stack was applied: %v", err)
	}
}
