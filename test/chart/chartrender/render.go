// Package chartrender renders charts/terrace with the Helm Go library, as
// `helm template -n terrace-system terrace charts/terrace` does, for the
// chart's own tests and for installing it on the dev cluster (test/e2e).
// It lives under test/ so that only tests compile Helm.
package chartrender

import (
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"strings"

	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
)

// Namespace is where the chart is installed in the tests and the README.
const Namespace = "terrace-system"

// Load loads the chart from a checkout rooted at repoRoot.
func Load(repoRoot string) (*chart.Chart, error) {
	ch, err := loader.Load(filepath.Join(repoRoot, "charts", "terrace"))
	if err != nil {
		return nil, fmt.Errorf("failed to load the chart: %w", err)
	}
	return ch, nil
}

// Render renders the chart with vals into its objects (without the CRDs of
// its crds/ folder, which Helm installs on its own).
func Render(repoRoot string, vals map[string]any) ([]*unstructured.Unstructured, error) {
	ch, err := Load(repoRoot)
	if err != nil {
		return nil, err
	}
	install := action.NewInstall(&action.Configuration{})
	install.DryRun, install.ClientOnly, install.Replace = true, true, true
	install.ReleaseName, install.Namespace = "terrace", Namespace
	install.KubeVersion = &chartutil.KubeVersion{Version: "v1.37.2", Major: "1", Minor: "37"}
	rel, err := install.Run(ch, vals)
	if err != nil {
		return nil, fmt.Errorf("failed to render the chart: %w", err)
	}
	return Decode(rel.Manifest)
}

// Decode splits a multi-document YAML stream into objects.
func Decode(manifest string) ([]*unstructured.Unstructured, error) {
	var out []*unstructured.Unstructured
	dec := utilyaml.NewYAMLOrJSONDecoder(strings.NewReader(manifest), 4096)
	for {
		var raw map[string]any
		if err := dec.Decode(&raw); err != nil {
			if errors.Is(err, io.EOF) {
				return out, nil
			}
			return nil, fmt.Errorf("failed to decode: %w", err)
		}
		if len(raw) > 0 {
			out = append(out, &unstructured.Unstructured{Object: raw})
		}
	}
}
