package devcluster

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// Tool versions `make tools` builds (hack/tools/build.sh); the cache layout
// below mirrors that script.
const (
	KubernetesVersion = "v1.37.2"
	OpenTofuVersion   = "v1.12.6"
	CoreDNSVersion    = "v1.15.0"
	CNIPluginsVersion = "v1.10.0"
)

// ToolsCacheDir is where hack/tools/build.sh puts the binaries:
// $TERRACE_TOOLS_DIR, else $XDG_CACHE_HOME/terrace/tools, else
// ~/.cache/terrace/tools.
func ToolsCacheDir() string {
	if d := os.Getenv("TERRACE_TOOLS_DIR"); d != "" {
		return d
	}
	if d := os.Getenv("XDG_CACHE_HOME"); d != "" {
		return filepath.Join(d, "terrace", "tools")
	}
	home, _ := os.UserHomeDir()
	return filepath.Join(home, ".cache", "terrace", "tools")
}

// FindBinDir returns the directory with etcd, kube-apiserver and
// kube-controller-manager: $KUBEBUILDER_ASSETS, else the `make tools` cache.
// It builds nothing.
func FindBinDir() (string, error) {
	dirs := []string{filepath.Join(ToolsCacheDir(), "kubebuilder-assets-"+KubernetesVersion)}
	if d := os.Getenv("KUBEBUILDER_ASSETS"); d != "" {
		dirs = append([]string{d}, dirs...)
	}
	for _, d := range dirs {
		if hasControlPlane(d) {
			return d, nil
		}
	}
	return "", fmt.Errorf("no control-plane binaries (etcd, kube-apiserver, kube-controller-manager) in %s: run `make tools` (a cold build takes ~25 minutes) or set KUBEBUILDER_ASSETS", strings.Join(dirs, " or "))
}

func hasControlPlane(dir string) bool {
	for _, b := range []string{"etcd", "kube-apiserver", "kube-controller-manager"} {
		if info, err := os.Stat(filepath.Join(dir, b)); err != nil || info.IsDir() {
			return false
		}
	}
	return true
}

// FindTofu returns the tofu binary: $TERRACE_TOFU, tofu on PATH, else the
// `make tools` cache; empty when there is none.
func FindTofu() string {
	if t := os.Getenv("TERRACE_TOFU"); t != "" {
		return t
	}
	if t, err := exec.LookPath("tofu"); err == nil {
		return t
	}
	t := filepath.Join(ToolsCacheDir(), "tofu-"+OpenTofuVersion, "tofu")
	if _, err := os.Stat(t); err == nil {
		return t
	}
	return ""
}
