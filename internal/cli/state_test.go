package cli

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/terrace-dev/terrace/internal/state"
	"github.com/terrace-dev/terrace/internal/state/postgres"
	"github.com/terrace-dev/terrace/internal/state/postgres/pgtest"
	"github.com/terrace-dev/terrace/internal/state/secrets"
	"github.com/terrace-dev/terrace/internal/state/storetest"
	"github.com/terrace-dev/terrace/internal/testenv"
)

func runTerrace(t *testing.T, args ...string) (string, error) {
	t.Helper()
	cmd := NewRootCommand()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs(args)
	err := cmd.Execute()
	return out.String(), err
}

// `terrace state migrate` moves a namespace's states from Secrets to
// PostgreSQL, verified, and a second run has nothing left to do.
func TestStateMigrateCommand(t *testing.T) {
	env, err := testenv.Start()
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = env.Stop() }()
	url, stop, err := pgtest.Start()
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	kubeconfig, err := env.Kubeconfig(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	ns := env.Namespace(t)
	src := secrets.New(env.Client, secrets.Options{})
	for _, stack := range []string{"a", "b", "c"} {
		for serial := int64(1); serial <= 2; serial++ {
			if _, err := src.Put(ctx, state.Key{Namespace: ns, Stack: stack, Workspace: "default"}, storetest.StateJSON(stack, serial, 0, 500), state.PutOptions{}); err != nil {
				t.Fatal(err)
			}
		}
	}
	args := []string{"state", "migrate", "--from", "secrets", "--to", "postgres", "-n", ns, "--kubeconfig", kubeconfig, "--postgres-url", url}
	out, err := runTerrace(t, args...)
	if err != nil || !strings.Contains(out, "states 3 copied (6 versions") {
		t.Fatalf("migrate: %v\n%s", err, out)
	}
	out, err = runTerrace(t, args...)
	if err != nil || !strings.Contains(out, "states 0 copied (0 versions, 0 bytes) 3 already done") {
		t.Fatalf("second migrate: %v\n%s", err, out)
	}
	pg, err := postgres.Open(ctx, url, postgres.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer pg.Close()
	for _, stack := range []string{"a", "b", "c"} {
		key := state.Key{Namespace: ns, Stack: stack, Workspace: "default"}
		want, err := src.Get(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		got, err := pg.Get(ctx, key)
		if err != nil || got.Digest != want.Digest || got.Serial != 2 {
			t.Fatalf("postgres %s: %+v %v", key, got, err)
		}
	}
	if _, err := runTerrace(t, "state", "migrate", "--from", "secrets", "--to", "postgres", "-n", ns, "--kubeconfig", kubeconfig); err == nil || !strings.Contains(err.Error(), "--postgres-url") {
		t.Fatalf("migrate without a PostgreSQL URL: %v", err)
	}
}
