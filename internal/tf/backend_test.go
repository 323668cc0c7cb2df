package tf

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/terrace-dev/terrace/internal/state/postgres/pgtest"
	"github.com/terrace-dev/terrace/internal/testenv"
)

// ownBackendModule declares a backend of its own, which the Stack's replaces.
const ownBackendModule = `
terraform {
  backend "s3" {
    bucket = "never-used"
  }
}
resource "terraform_data" "thing" { input = "kept in postgres" }
output "thing" { value = terraform_data.thing.output }
`

func pgBackend(url string) *OwnBackend {
	return &OwnBackend{
		Type:   "pg",
		Config: []byte(`{"schema_name": "own_${backend}_test"}`),
		Credentials: []BackendCredential{
			{Env: "PG_CONN_STR", Value: url},
			{Env: "GOOGLE_APPLICATION_CREDENTIALS", Value: "credential-file-content-0451", AsFile: true},
		},
	}
}

// A Stack's own backend replaces the module's backend block: the state is
// in PostgreSQL (a second work dir plans no changes), the credentials are
// environment and 0600 files only, and never in what the runner logs.
func TestOwnBackendKeepsStateInPostgres(t *testing.T) {
	tofu := testenv.RequireTofu(t)
	url, stop, err := pgtest.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	first := newTestExecutor(t, tofu, append(os.Environ(), "HOME="+t.TempDir()), "")
	writeModule(t, first, map[string]string{"main.tf": ownBackendModule})
	var logs strings.Builder
	logf := func(_ Stream, line string) { logs.WriteString(line + "\n") }
	if _, err := first.Init(ctx, InitOptions{OwnBackend: pgBackend(url)}, logf); err != nil {
		t.Fatalf("init: %v", err)
	}
	plan, err := first.Plan(ctx, PlanOptions{}, logf)
	if err != nil || !plan.HasChanges {
		t.Fatalf("plan: %v %+v", err, plan)
	}
	if err := first.Apply(ctx, plan.PlanID, logf); err != nil {
		t.Fatalf("apply: %v", err)
	}
	if _, err := os.Stat(filepath.Join(first.SourceDir(), "terraform.tfstate")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a local state file was written: %v", err)
	}
	credFile := filepath.Join(first.WorkDir(), backendCredentialsDir, "GOOGLE_APPLICATION_CREDENTIALS")
	if fi, err := os.Stat(credFile); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("credential file: %v %v", err, fi)
	}
	if env := first.environment(); env["GOOGLE_APPLICATION_CREDENTIALS"] != credFile || env["PG_CONN_STR"] != url {
		t.Errorf("environment: GOOGLE_APPLICATION_CREDENTIALS=%q PG_CONN_STR=%q", env["GOOGLE_APPLICATION_CREDENTIALS"], env["PG_CONN_STR"])
	}
	if masked := first.Redactor().String("conn " + url + " file credential-file-content-0451"); strings.Contains(masked, url) || strings.Contains(masked, "0451") {
		t.Errorf("credentials not redacted: %q", masked)
	}
	if strings.Contains(logs.String(), url) {
		t.Error("the logs hold the connection string")
	}

	second := newTestExecutor(t, tofu, append(os.Environ(), "HOME="+t.TempDir()), "")
	writeModule(t, second, map[string]string{"main.tf": ownBackendModule})
	if _, err := second.Init(ctx, InitOptions{OwnBackend: pgBackend(url)}, nil); err != nil {
		t.Fatalf("init of a second work dir: %v", err)
	}
	again, err := second.Plan(ctx, PlanOptions{}, nil)
	if err != nil || again.HasChanges {
		t.Fatalf("a second work dir does not find the state in PostgreSQL: %v %+v", err, again)
	}
	if _, err := second.Init(ctx, InitOptions{OwnBackend: pgBackend(url), Workspace: "blue"}, nil); err != nil {
		t.Fatalf("init of workspace blue: %v", err)
	}
	blue, err := second.Plan(ctx, PlanOptions{}, nil)
	if err != nil || !blue.HasChanges {
		t.Fatalf("workspace blue shares the default workspace's state: %v %+v", err, blue)
	}
}

func TestOwnBackendRefusesBadInput(t *testing.T) {
	e := newTestExecutor(t, "/bin/true", nil, "")
	writeModule(t, e, map[string]string{"main.tf": ""})
	dir := e.SourceDir()
	for name, opts := range map[string]InitOptions{
		"the local backend":      {OwnBackend: &OwnBackend{Type: "local"}},
		"a type that is no name": {OwnBackend: &OwnBackend{Type: "s3; rm"}},
		"config not an object":   {OwnBackend: &OwnBackend{Type: "s3", Config: []byte(`["a"]`)}},
		"a TF_ variable":         {OwnBackend: &OwnBackend{Type: "s3", Credentials: []BackendCredential{{Env: "TF_CLI_CONFIG_FILE", Value: "/x"}}}},
		"PATH":                   {OwnBackend: &OwnBackend{Type: "s3", Credentials: []BackendCredential{{Env: "PATH", Value: "/x"}}}},
		"not a variable name":    {OwnBackend: &OwnBackend{Type: "s3", Credentials: []BackendCredential{{Env: "A=B", Value: "x"}}}},
		"both backends":          {OwnBackend: &OwnBackend{Type: "s3"}, HTTPBackend: &HTTPBackend{Address: "https://x"}},
		"a type over 32":         {OwnBackend: &OwnBackend{Type: "s" + strings.Repeat("3", maxBackendTypeLen)}},
		"a variable over 128":    {OwnBackend: &OwnBackend{Type: "s3", Credentials: []BackendCredential{{Env: "A" + strings.Repeat("B", maxEnvNameLen), Value: "x"}}}},
	} {
		if err := e.configureBackend(dir, opts); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("%s: err = %v", name, err)
		}
	}
	longest := InitOptions{OwnBackend: &OwnBackend{Type: strings.Repeat("s", maxBackendTypeLen), Credentials: []BackendCredential{{Env: strings.Repeat("A", maxEnvNameLen), Value: "x"}}}}
	if err := e.configureBackend(dir, longest); err != nil {
		t.Errorf("a type of 32 and a variable of 128 characters are refused: %v", err)
	}
	if err := e.configureBackend(dir, InitOptions{OwnBackend: &OwnBackend{Type: "s3", Credentials: []BackendCredential{{Env: "TF_HTTP_PASSWORD", Value: "x"}}}}); err != nil {
		t.Errorf("TF_HTTP_ credentials (the http backend's own) are refused: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, ownBackendOverrideFile)); err != nil {
		t.Fatalf("override not written: %v", err)
	}
	if err := e.configureBackend(dir, InitOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, ownBackendOverrideFile)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a stale override is left: %v", err)
	}
}

func TestEscapeTemplates(t *testing.T) {
	got := escapeTemplates(map[string]any{"a${x}": []any{"%{if}", 1.5, true}, "b": "plain"})
	m := got.(map[string]any)
	if l := m["a$${x}"].([]any); l[0] != "%%{if}" || l[1] != 1.5 || l[2] != true || m["b"] != "plain" {
		t.Errorf("escaped: %#v", got)
	}
}
