package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/terrace-dev/terrace/internal/testenv"
)

// The krew manifest installs this binary as kubectl-terrace: its fields are
// the ones krew requires, and every platform's archive is of its version.
func TestKrewManifest(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "plugins", "terrace.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var plugin struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
		Metadata   struct {
			Name string `json:"name"`
		} `json:"metadata"`
		Spec struct {
			Version          string `json:"version"`
			Homepage         string `json:"homepage"`
			ShortDescription string `json:"shortDescription"`
			Description      string `json:"description"`
			Caveats          string `json:"caveats"`
			Platforms        []struct {
				Selector struct {
					MatchLabels map[string]string `json:"matchLabels"`
				} `json:"selector"`
				URI    string `json:"uri"`
				Sha256 string `json:"sha256"`
				Bin    string `json:"bin"`
				Files  []struct {
					From string `json:"from"`
					To   string `json:"to"`
				} `json:"files"`
			} `json:"platforms"`
		} `json:"spec"`
	}
	if err := yaml.UnmarshalStrict(data, &plugin); err != nil {
		t.Fatalf("plugins/terrace.yaml: %v", err)
	}
	if plugin.APIVersion != "krew.googlecontainertools.github.com/v1alpha2" || plugin.Kind != "Plugin" || plugin.Metadata.Name != "terrace" {
		t.Fatalf("not the terrace krew Plugin: %s %s %s", plugin.APIVersion, plugin.Kind, plugin.Metadata.Name)
	}
	if !strings.HasPrefix(plugin.Spec.Version, "v") || plugin.Spec.ShortDescription == "" || len(plugin.Spec.Platforms) == 0 {
		t.Fatalf("incomplete spec: %+v", plugin.Spec)
	}
	for _, p := range plugin.Spec.Platforms {
		goos, arch := p.Selector.MatchLabels["os"], p.Selector.MatchLabels["arch"]
		if want := "terrace_" + plugin.Spec.Version + "_" + goos + "_" + arch + ".tar.gz"; !strings.HasSuffix(p.URI, "/"+plugin.Spec.Version+"/"+want) {
			t.Errorf("%s/%s: uri %s, want a release archive named %s", goos, arch, p.URI, want)
		}
		if len(p.Sha256) != 64 || p.Bin != "terrace" || len(p.Files) == 0 {
			t.Errorf("%s/%s: sha256 %q, bin %q, files %v", goos, arch, p.Sha256, p.Bin, p.Files)
		}
	}
}
