package devcluster

import (
	"os"
	"path/filepath"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

func object(kind, group string, generation int64, status map[string]any) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{"apiVersion": group + "/v1", "kind": kind, "metadata": map[string]any{"name": "x", "generation": generation}}}
	if group == "" {
		u.SetAPIVersion("v1")
	}
	if status != nil {
		u.Object["status"] = status
	}
	return u
}

func cond(typ, status string) map[string]any {
	return map[string]any{"type": typ, "status": status, "reason": "R", "message": "m"}
}

func TestEvaluate(t *testing.T) {
	cases := []struct {
		name string
		obj  *unstructured.Unstructured
		want Health
	}{
		{"configmap", object("ConfigMap", "", 1, nil), Current},
		{"terrace object without status", object("Stack", terraceGroup, 1, nil), InProgress},
		{"ready", object("Stack", terraceGroup, 2, map[string]any{"observedGeneration": int64(2), "conditions": []any{cond("Ready", "True")}}), Current},
		{"ready for an old generation", object("Stack", terraceGroup, 3, map[string]any{"observedGeneration": int64(2), "conditions": []any{cond("Ready", "True")}}), InProgress},
		{"not ready", object("Stack", terraceGroup, 1, map[string]any{"conditions": []any{cond("Ready", "False"), cond("Reconciling", "True")}}), InProgress},
		{"stalled", object("Program", terraceGroup, 1, map[string]any{"conditions": []any{cond("Ready", "False"), cond("Stalled", "True")}}), Failed},
		{"other kind with conditions", object("Widget", "example.com", 1, map[string]any{"conditions": []any{cond("Ready", "False")}}), InProgress},
	}
	for _, c := range cases {
		if got, msg := Evaluate(c.obj); got != c.want {
			t.Errorf("%s: %s (%s), want %s", c.name, got, msg, c.want)
		}
	}
}

func TestReadManifestsSkipsKustomizeAndEmptyDocuments(t *testing.T) {
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	files := map[string]string{
		"kustomization.yaml": "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources: [a.yaml]\n",
		"a.yaml":             "---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\n---\n# only a comment\n---\napiVersion: terrace.dev/v1alpha1\nkind: Stack\nmetadata: {name: s}\n",
		"sub/b.yml":          "apiVersion: v1\nkind: Namespace\nmetadata: {name: b}\n",
		"README.md":          "not yaml",
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	objs, err := ReadManifests(dir)
	if err != nil {
		t.Fatal(err)
	}
	var kinds []string
	for _, o := range objs {
		kinds = append(kinds, o.Object.GetKind())
	}
	if len(kinds) != 3 || kinds[0] != "ConfigMap" || kinds[1] != "Stack" || kinds[2] != "Namespace" {
		t.Fatalf("read kinds %v", kinds)
	}
	// As kubectl apply -f dir: the directory's own files only.
	top, err := ReadManifestFiles(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(top) != 2 || top[0].Object.GetKind() != "ConfigMap" || top[1].Object.GetKind() != "Stack" {
		t.Fatalf("ReadManifestFiles read %d objects, want the ConfigMap and the Stack of a.yaml", len(top))
	}
}
