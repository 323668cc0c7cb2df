package cli

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func runImportCommand(t *testing.T, args ...string) (string, string, error) {
	t.Helper()
	var out, errOut bytes.Buffer
	cmd := NewRootCommand()
	cmd.SetOut(&out)
	cmd.SetErr(&errOut)
	cmd.SetArgs(append([]string{"import", "tofu-controller", "--kubeconfig", filepath.Join(t.TempDir(), "missing")}, args...))
	err := cmd.Execute()
	return out.String(), errOut.String(), err
}

func writeManifest(t *testing.T, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "terraform.yaml")
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// Manifests convert without a cluster (the runner policy then is not
// checked, and the command says so); the namespace comes from -n.
func TestImportFromFilesWithoutACluster(t *testing.T) {
	path := writeManifest(t, `
apiVersion: infra.contrib.fluxcd.io/v1alpha2
kind: Terraform
metadata: {name: web}
spec:
  interval: 5m
  approvePlan: auto
  path: ./infra
  sourceRef: {kind: GitRepository, name: repo}
  force: true
`)
	out, errOut, err := runImportCommand(t, "-f", path, "-n", "team")
	if err != nil {
		t.Fatalf("import: %v\n%s", err, errOut)
	}
	for _, want := range []string{"kind: Stack", "name: web", "namespace: team", "approvePlan: auto", "path: infra", "# NOT MAPPED spec.force:"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if !strings.Contains(errOut, "team/web: no cluster to read the runner policy from") || !strings.Contains(errOut, "team/web: 1 field(s) not mapped") {
		t.Errorf("stderr:\n%s", errOut)
	}
}

func TestImportRefusesBadInput(t *testing.T) {
	for name, tc := range map[string]struct {
		args []string
		want string
	}{
		"adoption needs a cluster": {[]string{"-f", writeManifest(t, "kind: Terraform\n"), "--adopt-state"}, "failed to load the kubeconfig"},
		"no objects":               {[]string{"-f", writeManifest(t, "---\n")}, "no Terraform objects found"},
		"a v1alpha1 object": {[]string{"-f", writeManifest(t, "apiVersion: infra.contrib.fluxcd.io/v1alpha1\nkind: Terraform\nmetadata: {name: old}\nspec: {}\n")},
			"only v1alpha2 Terraform objects are imported"},
		"not YAML":     {[]string{"-f", writeManifest(t, "spec: [\n")}, "terraform.yaml"},
		"missing file": {[]string{"-f", filepath.Join(t.TempDir(), "none.yaml")}, "no such file"},
	} {
		t.Run(name, func(t *testing.T) {
			_, _, err := runImportCommand(t, tc.args...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want it to contain %q", err, tc.want)
			}
		})
	}
}
