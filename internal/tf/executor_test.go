package tf

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/terrace-dev/terrace/internal/testenv"
)

func newTestExecutor(t *testing.T, binaryPath string, env []string, mirror string) *Executor {
	t.Helper()
	e, err := New(Config{BinaryPath: binaryPath, WorkDir: filepath.Join(t.TempDir(), "work"), Env: env, ProviderMirror: mirror})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return e
}

func writeModule(t *testing.T, e *Executor, files map[string]string) {
	t.Helper()
	for name, content := range files {
		p := filepath.Join(e.SourceDir(), name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func TestVariablesGoOnlyThroughAPrivateVarFile(t *testing.T) {
	e := newTestExecutor(t, "/bin/true", nil, "")
	writeModule(t, e, map[string]string{
		"variables.tf":  "variable \"token\" {\n  sensitive = true\n  default = \"declared-default-token\"\n}\nvariable \"plain\" {}\n",
		"prod.tfvars":   "token = \"from-var-file-token\"\n",
		"ignored.tf.go": "not a tf file",
	})
	e.moduleDir = e.SourceDir()
	files, cleanup, err := e.prepareVariables(Variables{
		JSON:      []byte(`{"token": "from-request-token", "plain": "visible-value", "db": {"password": "nested-from-secret"}}`),
		Sensitive: []string{"db"},
		Files:     []string{"prod.tfvars"},
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(files) != 2 || files[0] != filepath.Join(e.SourceDir(), "prod.tfvars") {
		t.Fatalf("var files = %v, want the source's file first and the written one last", files)
	}
	written := files[1]
	if filepath.Dir(written) != filepath.Join(e.WorkDir(), "vars") {
		t.Errorf("var file %s is not in the work dir's vars directory", written)
	}
	fi, err := os.Stat(written)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("var file mode = %v, want 0600", fi.Mode().Perm())
	}
	data, _ := os.ReadFile(written)
	var got map[string]any
	if err := json.Unmarshal(data, &got); err != nil || got["plain"] != "visible-value" {
		t.Errorf("var file content %s", data)
	}
	line := e.redactor.String("from-request-token from-var-file-token declared-default-token nested-from-secret visible-value")
	if strings.Count(line, Redacted) != 4 || !strings.Contains(line, "visible-value") {
		t.Errorf("redactor did not learn exactly the sensitive values: %q", line)
	}
	cleanup()
	if _, err := os.Stat(written); !os.IsNotExist(err) {
		t.Errorf("var file not removed after the command: %v", err)
	}
	if _, _, err := e.prepareVariables(Variables{Files: []string{"../../etc/passwd"}}); err == nil {
		t.Errorf("a var file outside the source was accepted")
	}
}

func TestEnvironmentIsTheRunnersOwn(t *testing.T) {
	e := newTestExecutor(t, "/bin/true", []string{"PATH=/usr/bin", "TF_VAR_token=from-env", "TF_LOG=TRACE", "TF_WORKSPACE=prod", "TF_CLI_CONFIG_FILE=/etc/evil.tfrc", "TF_HTTP_PASSWORD=x", "AWS_REGION=eu-west-1"}, "/mirror dir")
	env := e.environment()
	for _, k := range []string{"TF_VAR_token", "TF_LOG", "TF_WORKSPACE", "TF_HTTP_PASSWORD"} {
		if _, ok := env[k]; ok {
			t.Errorf("%s reached tofu's environment", k)
		}
	}
	if env["AWS_REGION"] != "eu-west-1" || env["PATH"] != "/usr/bin" {
		t.Errorf("the pod's own environment was not passed on: %v", env)
	}
	if env["CHECKPOINT_DISABLE"] != "1" || env["TF_CLI_CONFIG_FILE"] != filepath.Join(e.WorkDir(), "cli.tfrc") || env["TMPDIR"] != e.TempDir() {
		t.Errorf("runner settings missing: %v", env)
	}
	cfg, err := os.ReadFile(env["TF_CLI_CONFIG_FILE"])
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(cfg), `path = "/mirror dir"`) || !strings.Contains(string(cfg), "disable_checkpoint = true") {
		t.Errorf("CLI config:\n%s", cfg)
	}
}

func TestTofuSeesNeitherEnvVariablesNorRegistries(t *testing.T) {
	tofu := testenv.RequireTofu(t)
	mirror := t.TempDir()
	home := t.TempDir()
	env := append(os.Environ(), "TF_VAR_name=from-the-environment", "HOME="+home)
	e := newTestExecutor(t, tofu, env, mirror)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	writeModule(t, e, map[string]string{"main.tf": "variable \"name\" {\n  default = \"the-default\"\n}\noutput \"name\" {\n  value = var.name\n}\n"})
	if _, err := e.Init(ctx, InitOptions{}, nil); err != nil {
		t.Fatalf("init: %v", err)
	}
	plan, err := e.Plan(ctx, PlanOptions{}, nil)
	if err != nil {
		t.Fatalf("plan: %v", err)
	}
	if err := e.Apply(ctx, plan.PlanID, nil); err != nil {
		t.Fatalf("apply: %v", err)
	}
	outs, err := e.Outputs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if string(outs["name"].Value) != `"the-default"` {
		t.Errorf("output name = %s: a TF_VAR_ of the runner's environment reached tofu", outs["name"].Value)
	}

	if left, _ := os.ReadDir(home); len(left) != 0 {
		t.Errorf("tofu wrote into HOME, outside the work dir: %v", left)
	}

	if err := e.ResetSource(); err != nil {
		t.Fatal(err)
	}
	writeModule(t, e, map[string]string{"main.tf": "terraform {\n  required_providers {\n    thing = {\n      source = \"example.com/test/thing\"\n    }\n  }\n}\n"})
	_, err = e.Init(ctx, InitOptions{}, nil)
	if err == nil || !strings.Contains(err.Error(), mirror) {
		t.Fatalf("init of a provider missing from the mirror answered %v, want an error naming the mirror %s", err, mirror)
	}
}

func TestPluginSocketDirStaysShort(t *testing.T) {
	deep := filepath.Join(t.TempDir(), strings.Repeat("nested-directory/", 8))
	if err := os.MkdirAll(deep, 0o700); err != nil {
		t.Fatal(err)
	}
	got := pluginSocketDir(deep)
	if len(got) > maxPluginSocketDirLen {
		t.Fatalf("socket dir %q is %d bytes, over the limit", got, len(got))
	}
	short := t.TempDir()
	if len(short) <= maxPluginSocketDirLen && pluginSocketDir(short) != short {
		t.Fatalf("a short writable dir %q was not kept", short)
	}
}

func TestPlanIDsAreBounded(t *testing.T) {
	e := newTestExecutor(t, "/bin/true", nil, "")
	for _, id := range []string{"plan-1", "a", strings.Repeat("p", maxPlanIDLen), "v1.2_x"} {
		if _, err := e.planPath(id); err != nil {
			t.Errorf("plan id %q refused: %v", id, err)
		}
	}
	for _, id := range []string{"", ".", "..", "a/b", "a b", strings.Repeat("p", maxPlanIDLen+1)} {
		if _, err := e.planPath(id); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("plan id %q: err = %v, want ErrInvalidArgument", id, err)
		}
	}
}
