package v1alpha1_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"

	"github.com/terrace-dev/terrace/internal/testenv"
)

// Every Terrace object in examples/ (the demo's and those under its
// subdirectories, such as examples/git) is accepted by the CRDs' schema
// and CEL rules, in a namespace of the test's.
func TestExamplesAreValid(t *testing.T) {
	ns := env.Namespace(t)
	var seen int
	err := filepath.WalkDir(filepath.Join(testenv.RepoRoot(), "examples"), func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".yaml") {
			return err
		}
		raw, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(raw), 4096)
		for {
			obj := &unstructured.Unstructured{}
			if err := dec.Decode(&obj.Object); errors.Is(err, io.EOF) {
				return nil
			} else if err != nil {
				t.Fatalf("%s: %v", path, err)
			}
			if len(obj.Object) == 0 || !strings.HasPrefix(obj.GetAPIVersion(), "terrace.dev/") {
				continue
			}
			obj.SetNamespace(ns)
			if err := env.Client.Create(context.Background(), obj); err != nil {
				t.Errorf("%s: %s %s refused: %v", filepath.Base(path), obj.GetKind(), obj.GetName(), err)
			}
			seen++
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if seen < 3 {
		t.Fatalf("found %d Terrace objects in examples/, want the demo's and the Git example's", seen)
	}
}
