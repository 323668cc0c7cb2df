package v1alpha1_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/testenv"
)

var env *testenv.Env

func TestMain(m *testing.M) { testenv.Main(m, &env) }

const goodDigest = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

func program(files map[string]terracev1.ProgramFile) *terracev1.Program {
	return &terracev1.Program{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "p-"},
		Spec:       terracev1.ProgramSpec{Files: files},
	}
}

func stack(mutate func(*terracev1.StackSpec)) *terracev1.Stack {
	s := &terracev1.Stack{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "s-"},
		Spec: terracev1.StackSpec{
			Source: terracev1.StackSource{ProgramRef: &terracev1.LocalObjectReference{Name: "net"}},
		},
	}
	if mutate != nil {
		mutate(&s.Spec)
	}
	return s
}

func config(name string, mutate func(*terracev1.TerraceConfigSpec)) *terracev1.TerraceConfig {
	c := &terracev1.TerraceConfig{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if mutate != nil {
		mutate(&c.Spec)
	}
	return c
}

func dur(s string) *metav1.Duration {
	d, err := time.ParseDuration(s)
	if err != nil {
		// Durations the schema must refuse cannot be built from time.Duration;
		// they are sent through unstructured objects below.
		panic(err)
	}
	return &metav1.Duration{Duration: d}
}

// TestSchemaRefusesInvalidObjects sends invalid objects to the real API
// server and expects each to be refused with a message naming the field.
func TestSchemaRefusesInvalidObjects(t *testing.T) {
	ns := env.Namespace(t)
	cases := []struct {
		name      string
		obj       client.Object
		wantField string
		wantWords string
	}{
		{"program without files", program(map[string]terracev1.ProgramFile{}), "spec.files", "should have at least 1 properties"},
		{"program absolute path", program(map[string]terracev1.ProgramFile{"/etc/passwd": "x"}), "spec.files", "relative paths"},
		{"program dot-dot segment", program(map[string]terracev1.ProgramFile{"modules/../../main.tf": "x"}), "spec.files", "relative paths"},
		{"program leading dot-dot", program(map[string]terracev1.ProgramFile{"../main.tf": "x"}), "spec.files", "relative paths"},
		{"program empty segment", program(map[string]terracev1.ProgramFile{"modules//main.tf": "x"}), "spec.files", "relative paths"},
		{"program trailing slash", program(map[string]terracev1.ProgramFile{"modules/": "x"}), "spec.files", "relative paths"},
		{"stack without source", stack(func(s *terracev1.StackSpec) { s.Source = terracev1.StackSource{} }), "spec.source", "exactly one of programRef, sourceRef, url and git"},
		{"stack with two sources", stack(func(s *terracev1.StackSpec) {
			s.Source.URL, s.Source.Digest = "https://example.com/m.tar.gz", goodDigest
		}), "spec.source", "exactly one of programRef, sourceRef, url and git"},
		{"stack git and programRef", stack(func(s *terracev1.StackSpec) {
			s.Source.Git = &terracev1.GitSource{URL: "https://git.example/team/infra.git"}
		}), "spec.source", "exactly one of programRef, sourceRef, url and git"},
		{"stack git file url", stack(func(s *terracev1.StackSpec) {
			s.Source = terracev1.StackSource{Git: &terracev1.GitSource{URL: "file:///etc"}}
		}), "spec.source.git.url", "should match"},
		{"stack git branch and tag", stack(func(s *terracev1.StackSpec) {
			s.Source = terracev1.StackSource{Git: &terracev1.GitSource{URL: "https://git.example/a.git", Ref: &terracev1.GitRef{Branch: "main", Tag: "v1"}}}
		}), "spec.source.git.ref", "set one of branch, tag, semver and commit"},
		{"stack git short commit", stack(func(s *terracev1.StackSpec) {
			s.Source = terracev1.StackSource{Git: &terracev1.GitSource{URL: "https://git.example/a.git", Ref: &terracev1.GitRef{Commit: "abc123"}}}
		}), "spec.source.git.ref.commit", "should match"},
		{"stack git unknown forge", stack(func(s *terracev1.StackSpec) {
			s.Source = terracev1.StackSource{Git: &terracev1.GitSource{URL: "https://git.example/a.git", PullRequests: &terracev1.GitPullRequests{Enabled: true, Provider: "bitbucket", SecretRef: terracev1.LocalObjectReference{Name: "forge"}}}}
		}), "spec.source.git.pullRequests.provider", "Unsupported value"},
		{"stack url without digest", stack(func(s *terracev1.StackSpec) {
			s.Source = terracev1.StackSource{URL: "https://example.com/m.tar.gz"}
		}), "spec.source", "url requires digest"},
		{"stack bad digest", stack(func(s *terracev1.StackSpec) {
			s.Source = terracev1.StackSource{URL: "https://example.com/m.tar.gz", Digest: "md5:abc"}
		}), "spec.source.digest", "should match"},
		{"stack url not http", stack(func(s *terracev1.StackSpec) {
			s.Source = terracev1.StackSource{URL: "file:///etc/passwd", Digest: goodDigest}
		}), "spec.source.url", "should match"},
		{"stack sourceRef unknown kind", stack(func(s *terracev1.StackSpec) {
			s.Source = terracev1.StackSource{SourceRef: &terracev1.SourceReference{Kind: "HelmChart", Name: "x"}}
		}), "spec.source.sourceRef.kind", "Unsupported value"},
		{"stack approvePlan garbage", stack(func(s *terracev1.StackSpec) { s.ApprovePlan = "yes please" }), "spec.approvePlan", "should match"},
		{"stack drift mode unknown", stack(func(s *terracev1.StackSpec) {
			s.DriftDetection = &terracev1.DriftDetection{Mode: "sometimes"}
		}), "spec.driftDetection.mode", "Unsupported value"},
		{"stack varsFrom unknown kind", stack(func(s *terracev1.StackSpec) {
			s.VarsFrom = []terracev1.VarsReference{{Kind: "Pod", Name: "x"}}
		}), "spec.varsFrom[0].kind", "Unsupported value"},
		{"stack workspace with slash", stack(func(s *terracev1.StackSpec) { s.Workspace = "a/b" }), "spec.workspace", "should match"},
		{"stack path escaping", stack(func(s *terracev1.StackSpec) { s.Path = "../other" }), "spec.path", "may not contain '..'"},
		{"stack readable plan unknown", stack(func(s *terracev1.StackSpec) { s.StoreReadablePlan = "yaml" }), "spec.storeReadablePlan", "Unsupported value"},
		{"stack local backend", stack(func(s *terracev1.StackSpec) { s.Backend = &terracev1.StackBackend{Type: "local"} }), "spec.backend.type", "the local backend keeps state in the runner pod"},
		{"stack backend type not a name", stack(func(s *terracev1.StackSpec) { s.Backend = &terracev1.StackBackend{Type: "S3 bucket"} }), "spec.backend.type", "should match"},
		{"stack backend credential TF_ variable", stack(func(s *terracev1.StackSpec) {
			s.Backend = &terracev1.StackBackend{Type: "pg", Credentials: []terracev1.BackendCredential{{Env: "TF_VAR_x", SecretKeyRef: terracev1.SecretKeyReference{Name: "s", Key: "k"}}}}
		}), "spec.backend.credentials[0].env", "TF_* variables other than TF_HTTP_* are set by Terrace"},
		{"stack backend credential without key", stack(func(s *terracev1.StackSpec) {
			s.Backend = &terracev1.StackBackend{Type: "pg", Credentials: []terracev1.BackendCredential{{Env: "PG_CONN_STR", SecretKeyRef: terracev1.SecretKeyReference{Name: "s"}}}}
		}), "spec.backend.credentials[0].secretKeyRef", "secretKeyRef.key is required"},
		{"config not named default", config("mine", nil), "", "must be named default"},
		{"config unknown binary", config("default", func(c *terracev1.TerraceConfigSpec) {
			c.Runner = &terracev1.RunnerConfig{Binary: "pulumi"}
		}), "spec.runner.binary", "Unsupported value"},
		{"config postgres without connection", config("default", func(c *terracev1.TerraceConfigSpec) {
			c.State = &terracev1.StateConfig{Backend: terracev1.StateBackendPostgres}
		}), "spec.state", "backend postgres requires postgres.connectionSecretRef"},
		{"config unknown backend", config("default", func(c *terracev1.TerraceConfigSpec) {
			c.State = &terracev1.StateConfig{Backend: "s3"}
		}), "spec.state.backend", "Unsupported value"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tc.obj.SetNamespace(ns)
			err := env.Client.Create(context.Background(), tc.obj)
			if err == nil {
				t.Fatalf("the API server accepted an invalid object")
			}
			msg := err.Error()
			if !strings.Contains(msg, tc.wantField) || !strings.Contains(msg, tc.wantWords) {
				t.Fatalf("refusal %q does not name field %q with %q", msg, tc.wantField, tc.wantWords)
			}
		})
	}
}

// TestSchemaRefusesInvalidDurations sends durations that are not Go
// durations, which typed objects cannot express.
func TestSchemaRefusesInvalidDurations(t *testing.T) {
	ns := env.Namespace(t)
	for _, field := range []string{"interval", "retryInterval", "maxRetryInterval", "timeout"} {
		for _, value := range []string{"10 minutes", "1d", "-5m", ""} {
			obj := map[string]any{
				"apiVersion": "terrace.dev/v1alpha1", "kind": "Stack",
				"metadata": map[string]any{"generateName": "d-", "namespace": ns},
				"spec": map[string]any{
					"source": map[string]any{"programRef": map[string]any{"name": "p"}},
					field:    value,
				},
			}
			err := env.CreateUnstructured(context.Background(), obj)
			if err == nil {
				t.Errorf("%s=%q was accepted", field, value)
				continue
			}
			if !strings.Contains(err.Error(), "spec."+field) {
				t.Errorf("%s=%q refused without naming the field: %v", field, value, err)
			}
		}
	}
}

func TestSchemaAcceptsValidObjectsAndAppliesDefaults(t *testing.T) {
	ns := env.Namespace(t)
	ctx := context.Background()
	valid := []client.Object{
		program(map[string]terracev1.ProgramFile{
			"main.tf": "resource \"terraform_data\" \"x\" {}", "modules/net/main.tf": "", "vars.auto.tfvars.json": "{}",
			"templates/user-data.sh.tpl": "#!/bin/sh", ".terraform.lock.hcl": "", "a..b.tf": "",
		}),
		stack(func(s *terracev1.StackSpec) {
			s.ApprovePlan = "auto"
			s.Vars = map[string]apiextensionsv1.JSON{"n": {Raw: []byte(`3`)}, "tags": {Raw: []byte(`{"a":["b"]}`)}}
			s.Interval = dur("90s")
			s.DriftDetection = &terracev1.DriftDetection{Mode: terracev1.DriftDetectionWarn}
		}),
		stack(func(s *terracev1.StackSpec) {
			s.Source = terracev1.StackSource{URL: "https://example.com/m.tar.gz", Digest: goodDigest}
			s.ApprovePlan = "plan-3-0a1b2c3d4e"
			s.Path = "envs/prod"
		}),
		stack(func(s *terracev1.StackSpec) {
			s.Source = terracev1.StackSource{SourceRef: &terracev1.SourceReference{Kind: "GitRepository", Name: "infra"}}
		}),
		stack(func(s *terracev1.StackSpec) {
			s.Source = terracev1.StackSource{Git: &terracev1.GitSource{URL: "git@git.example:team/infra.git",
				Ref: &terracev1.GitRef{Branch: "main", Commit: "0123456789abcdef0123456789abcdef01234567"}}}
		}),
		stack(func(s *terracev1.StackSpec) {
			s.Source = terracev1.StackSource{Git: &terracev1.GitSource{URL: "https://git.example/team/infra.git",
				Ref:          &terracev1.GitRef{SemVer: ">=1.0.0 <2.0.0"},
				SecretRef:    &terracev1.LocalObjectReference{Name: "git-credentials"},
				PullRequests: &terracev1.GitPullRequests{Enabled: true, Provider: terracev1.GitProviderGitea, APIURL: "https://git.example", SecretRef: terracev1.LocalObjectReference{Name: "forge"}},
				Webhook:      &terracev1.GitWebhook{SecretRef: terracev1.LocalObjectReference{Name: "hook"}}}}
		}),
		config("default", func(c *terracev1.TerraceConfigSpec) {
			c.Runner = &terracev1.RunnerConfig{Binary: terracev1.BinaryTerraform}
			c.State = &terracev1.StateConfig{Backend: terracev1.StateBackendPostgres,
				Postgres: &terracev1.PostgresConfig{ConnectionSecretRef: terracev1.SecretKeyReference{Name: "pg"}}}
		}),
	}
	for _, obj := range valid {
		obj.SetNamespace(ns)
		if err := env.Client.Create(ctx, obj); err != nil {
			t.Fatalf("valid %T refused: %v", obj, err)
		}
	}

	var got terracev1.Stack
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(valid[1]), &got); err != nil {
		t.Fatal(err)
	}
	if got.Spec.Workspace != "default" {
		t.Errorf("workspace default: got %q", got.Spec.Workspace)
	}
	for name, d := range map[string]*metav1.Duration{"retryInterval": got.Spec.RetryInterval, "maxRetryInterval": got.Spec.MaxRetryInterval, "timeout": got.Spec.Timeout} {
		want := map[string]time.Duration{"retryInterval": 30 * time.Second, "maxRetryInterval": time.Hour, "timeout": 20 * time.Minute}[name]
		if d == nil || d.Duration != want {
			t.Errorf("%s default: got %v, want %v", name, d, want)
		}
	}
	if got.Spec.Interval == nil || got.Spec.Interval.Duration != 90*time.Second {
		t.Errorf("interval: got %v", got.Spec.Interval)
	}
	if got.Spec.StoreReadablePlan != terracev1.ReadablePlanNone {
		t.Errorf("storeReadablePlan default: got %q", got.Spec.StoreReadablePlan)
	}
	if got.Status.ObservedGeneration != -1 {
		t.Errorf("status.observedGeneration starts at %d, want -1", got.Status.ObservedGeneration)
	}
	var prog terracev1.Program
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(valid[0]), &prog); err != nil {
		t.Fatal(err)
	}
	if prog.Status.ObservedGeneration != -1 {
		t.Errorf("program status.observedGeneration starts at %d, want -1", prog.Status.ObservedGeneration)
	}
}

// TestKubectlExplain checks the published schema through kubectl, as users read it.
func TestKubectlExplain(t *testing.T) {
	dir := t.TempDir()
	kubeconfig, err := env.Kubeconfig(dir)
	if err != nil {
		t.Fatal(err)
	}
	kubectl := filepath.Join(env.Tools.KubebuilderAssets, "kubectl")
	if _, err := os.Stat(kubectl); err != nil {
		t.Fatalf("kubectl is missing: run `make tools`: %v", err)
	}
	var out []byte
	// The OpenAPI document is published a moment after the CRD is established.
	pollErr := wait.PollUntilContextTimeout(context.Background(), 500*time.Millisecond, 30*time.Second, true,
		func(context.Context) (bool, error) {
			out, err = exec.Command(kubectl, "--kubeconfig", kubeconfig, "explain", "stack.spec.source").CombinedOutput()
			return err == nil, nil
		})
	if pollErr != nil {
		t.Fatalf("kubectl explain failed: %v\n%s", err, out)
	}
	for _, want := range []string{"programRef", "sourceRef", "digest", "exactly one of"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("kubectl explain stack.spec.source lacks %q:\n%s", want, out)
		}
	}
}
