package e2e

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/artifact"
	"github.com/terrace-dev/terrace/internal/cli"
	"github.com/terrace-dev/terrace/internal/devcluster"
	"github.com/terrace-dev/terrace/internal/importer"
	"github.com/terrace-dev/terrace/internal/state/migrate"
	"github.com/terrace-dev/terrace/internal/testenv"
)

// greetingModule is what the imported Terraform objects deploy (deploy/ of
// their GitRepository).
const greetingModule = `
variable "name" { type = string }
variable "greeting" {
  type    = string
  default = "hello"
}
resource "terraform_data" "greeting" { input = "${var.greeting} ${var.name}" }
output "message" { value = terraform_data.greeting.output }
`

// installTofuControllerCRD installs tofu-controller's published CRD.
func (e *stackEnv) installTofuControllerCRD(t *testing.T) {
	t.Helper()
	raw := repoFile(t, "internal/importer/testdata/tofu-controller/infra.contrib.fluxcd.io_terraforms.yaml")
	crd := &apiextensionsv1.CustomResourceDefinition{}
	if err := yaml.Unmarshal([]byte(raw), crd); err != nil {
		t.Fatal(err)
	}
	if err := devcluster.InstallCRDs(context.Background(), e.crdClient(t), []*apiextensionsv1.CustomResourceDefinition{crd}); err != nil {
		t.Fatal(err)
	}
}

// publishModule serves files as a GitRepository's artifact.
func publishModule(t *testing.T, h *artifactHost, files map[string]string) fluxArtifact {
	t.Helper()
	tree := map[string][]byte{}
	for k, v := range files {
		tree[k] = []byte(v)
	}
	data, digest, err := artifact.Build(tree)
	if err != nil {
		t.Fatal(err)
	}
	h.serve("/gitrepository/greeting.tar.gz", data)
	return fluxArtifact{URL: h.url + "/gitrepository/greeting.tar.gz", Digest: digest, Revision: "main@sha1:" + strings.TrimPrefix(digest, "sha256:")[:40]}
}

// tofuControllerState applies module with vars using real tofu and the
// local backend, and returns the state Secret tofu-controller's kubernetes
// backend would have written for the object: tfstate-default-<name>,
// the gzip'd state under "tfstate", with that backend's labels.
func tofuControllerState(t *testing.T, name, module string, vars map[string]string) *corev1.Secret {
	t.Helper()
	dir := t.TempDir()
	varsJSON, _ := json.Marshal(vars)
	for file, content := range map[string]string{"main.tf": module, "vars.tfvars.json": string(varsJSON)} {
		if err := os.WriteFile(filepath.Join(dir, file), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	tofu := testenv.RequireTofu(t)
	for _, args := range [][]string{{"init", "-input=false"}, {"apply", "-auto-approve", "-input=false", "-var-file=vars.tfvars.json"}} {
		cmd := exec.Command(tofu, args...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "CHECKPOINT_DISABLE=1", "HOME="+dir, "TF_CLI_CONFIG_FILE="+filepath.Join(dir, "none.tfrc"))
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("tofu %s: %v\n%s", args[0], err, out)
		}
	}
	raw, err := os.ReadFile(filepath.Join(dir, "terraform.tfstate"))
	if err != nil {
		t.Fatal(err)
	}
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	_, _ = zw.Write(raw)
	_ = zw.Close()
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: migrate.TofuControllerSecretName("default", name), Labels: map[string]string{
			"app.kubernetes.io/managed-by": "terraform", "tfstate": "true", "tfstateSecretSuffix": name, "tfstateWorkspace": "default",
		}},
		Data: map[string][]byte{"tfstate": gz.Bytes()},
	}
}

// terraformObject is a tofu-controller Terraform deploying deploy/ of the
// GitRepository "infra".
func (e *stackEnv) terraformObject(name string, spec map[string]any) *unstructured.Unstructured {
	spec["sourceRef"] = map[string]any{"kind": "GitRepository", "name": "infra"}
	spec["path"] = "./deploy"
	u := &unstructured.Unstructured{Object: map[string]any{"spec": spec}}
	u.SetAPIVersion(importer.TerraformAPIVersion)
	u.SetKind(importer.TerraformKind)
	u.SetName(name)
	u.SetNamespace(e.ns)
	return u
}

// createImported creates every object of a YAML stream.
func (e *stackEnv) createImported(t *testing.T, stream []byte) []string {
	t.Helper()
	var names []string
	for _, doc := range strings.Split(string(stream), "\n---\n") {
		obj := &unstructured.Unstructured{}
		if err := yaml.Unmarshal([]byte(doc), &obj.Object); err != nil {
			t.Fatalf("imported YAML: %v\n%s", err, doc)
		}
		if err := e.c.Create(context.Background(), obj); err != nil {
			t.Fatalf("failed to create the imported Stack %s: %v\n%s", obj.GetName(), err, doc)
		}
		names = append(names, obj.GetName())
	}
	return names
}

// noChangePlan accepts a Stack Ready after a plan without changes.
func noChangePlan(s *terracev1.Stack) error {
	if err := readyAt(s); err != nil {
		return err
	}
	if p := s.Status.Plan; p == nil || p.ID == "" || p.Add != 0 || p.Change != 0 || p.Destroy != 0 || p.Pending != "" {
		return fmt.Errorf("plan %+v", p)
	}
	return nil
}

// tofu-controller users import their Terraform objects (under the real
// CRD) with `terrace import tofu-controller --adopt-state`: each Stack's
// first plan finds the resources the state Secret records and changes
// nothing, whether it waits for approval, applies automatically, or writes
// outputs.
func TestImportTofuControllerAdoptsStateWithoutChanges(t *testing.T) {
	e := newStackEnv(t)
	e.installTofuControllerCRD(t)
	e.installFluxCRD(t, "GitRepository")
	art := publishModule(t, newArtifactHost(t), map[string]string{"deploy/main.tf": greetingModule})
	e.createFluxSource(t, "GitRepository", "infra", &art)

	// tofu-controller's runners run as tf-runner (its CRD's default), which
	// the Stacks keep: it is what the namespace granted the Terraform runs.
	// Only the namespace's default runner account is allowed unless a
	// config lists more, so the namespace admin lists it before importing.
	e.create(t, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "tf-runner"}})
	e.create(t, &terracev1.TerraceConfig{
		ObjectMeta: metav1.ObjectMeta{Name: terracev1.TerraceConfigName},
		Spec: terracev1.TerraceConfigSpec{Runner: &terracev1.RunnerConfig{Policy: &terracev1.RunnerPolicy{
			AllowedServiceAccounts: []string{"default", "tf-runner"},
		}}},
	})
	e.create(t, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "approvals-vars"}, StringData: map[string]string{"greeting": "hi"}})
	e.create(t, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "tf-runner-vars"}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"get"}, ResourceNames: []string{"approvals-vars"}},
	}})
	e.create(t, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "tf-runner-vars"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "tf-runner-vars"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: "tf-runner", Namespace: e.ns}},
	})
	objects := map[string]*unstructured.Unstructured{
		"approvals": e.terraformObject("approvals", map[string]any{
			"interval": "10m", "vars": []any{map[string]any{"name": "name", "value": "approvals"}},
			"varsFrom": []any{map[string]any{"kind": "Secret", "name": "approvals-vars"}},
		}),
		"drift": e.terraformObject("drift", map[string]any{
			"interval": "1m", "approvePlan": "auto", "disableDriftDetection": false, "suspend": true,
			"vars":     []any{map[string]any{"name": "name", "value": "drift"}},
			"webhooks": []any{map[string]any{"stage": "post-planning", "url": "http://policy.example/check", "testExpression": "${{ .passed }}"}},
		}),
		"outputs": e.terraformObject("outputs", map[string]any{
			"interval": "10m", "approvePlan": "auto", "disableDriftDetection": true,
			"vars":                 []any{map[string]any{"name": "name", "value": "outputs"}},
			"writeOutputsToSecret": map[string]any{"name": "outputs-out", "outputs": []any{"message"}},
			"dependsOn":            []any{map[string]any{"name": "approvals"}},
		}),
	}
	vars := map[string]map[string]string{"approvals": {"name": "approvals", "greeting": "hi"}, "drift": {"name": "drift"}, "outputs": {"name": "outputs"}}
	for name, obj := range objects {
		eventually(t, stackTimeout, "Terraform "+name+" created", func() error {
			err := e.c.Create(context.Background(), obj)
			if err != nil && !meta.IsNoMatchError(err) {
				t.Fatalf("failed to create Terraform %s: %v", name, err)
			}
			return err
		})
		e.create(t, tofuControllerState(t, name, greetingModule, vars[name]))
	}

	out := filepath.Join(t.TempDir(), "stacks.yaml")
	var stderr bytes.Buffer
	cmd := cli.NewRootCommand()
	cmd.SetArgs([]string{"import", "tofu-controller", "--kubeconfig", e.dev.Cluster.KubeconfigPath, "-n", e.ns, "--adopt-state", "-o", out})
	cmd.SetErr(&stderr)
	if err := cmd.Execute(); err != nil {
		t.Fatalf("import: %v\n%s", err, stderr.String())
	}
	report := stderr.String()
	for _, want := range []string{
		e.ns + "/drift: 1 field(s) not mapped\n  spec.webhooks: post-planning webhooks",
		e.ns + "/approvals: every field mapped", e.ns + "/outputs: every field mapped",
		e.ns + "/approvals: adopted Secret tfstate-default-approvals (serial",
	} {
		if !strings.Contains(report, want) {
			t.Errorf("report lacks %q:\n%s", want, report)
		}
	}
	stream, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	if names := e.createImported(t, stream); len(names) != 3 {
		t.Fatalf("imported %v", names)
	}

	for _, name := range []string{"approvals", "drift", "outputs"} {
		st := e.waitStack(t, name, stackTimeout, name+": Ready after a first plan without changes", noChangePlan)
		// Nothing was applied: the only release allowed is the one the
		// controller records for a state that has none (the adopted one).
		for _, r := range e.releases(t, name) {
			if r.PlanID != "" || !strings.Contains(r.Message, "state existed before any release") {
				t.Errorf("%s: the first plan was applied: %+v", name, r)
			}
		}
		var sec corev1.Secret
		if err := e.c.Get(context.Background(), client.ObjectKey{Namespace: e.ns, Name: "tfstate-default-" + name}, &sec); err != nil || sec.Annotations[migrate.AnnotationAdoptedBy] == "" {
			t.Errorf("%s: state Secret kept and annotated? %v %v", name, err, sec.Annotations)
		}
		if st.Spec.ServiceAccountName != "tf-runner" {
			t.Errorf("%s: serviceAccountName %q", name, st.Spec.ServiceAccountName)
		}
		switch name {
		case "approvals":
			if st.Spec.ApprovePlan != "" || len(st.Spec.VarsFrom) != 1 {
				t.Errorf("approvals: spec %+v", st.Spec)
			}
		case "drift":
			if st.Spec.ApprovePlan != terracev1.ApprovePlanAuto || st.Spec.DriftDetection.Mode != terracev1.DriftDetectionEnabled || st.Spec.Suspend {
				t.Errorf("drift: spec %+v", st.Spec)
			}
		case "outputs":
			if st.Spec.DriftDetection.Mode != terracev1.DriftDetectionDisabled || len(st.Spec.DependsOn) != 1 {
				t.Errorf("outputs: spec %+v", st.Spec)
			}
		}
	}
	if got := e.outputs(t, "outputs-out"); got["message"] != "hello outputs" {
		t.Errorf("outputs Secret: %v", got)
	}
}
