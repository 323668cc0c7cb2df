// Package version reports what build of Terrace is running.
package version

import (
	"fmt"
	"runtime"
	"runtime/debug"
)

// Set at link time by the Makefile (-X); the module's build info fills the
// gaps for `go install` builds.
var (
	Version = ""
	Commit  = ""
)

// Image is the repository Terrace's image is published to. With the
// build's version as its tag (ImageReference) it is the image the
// controller runs the Installations API servers from, and runners when no
// TerraceConfig names another: the one binary the controller was built as.
// Bump it here if the project moves.
const Image = "ghcr.io/terrace-dev/terrace"

// ImageReference returns Image tagged with this build's version (set at
// release with -X .../version.Version=v1.2.3), e.g.
// ghcr.io/terrace-dev/terrace:v1.2.3.
func ImageReference() string {
	return Image + ":" + imageTag(Get().Version)
}

// imageTag makes a version a valid image tag: [A-Za-z0-9_.-], at most 128
// characters, not starting with '.' or '-' ("+incompatible" and "+dirty"
// build metadata become "-...").
func imageTag(version string) string {
	tag := []byte(version)
	for i, c := range tag {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '.' || c == '-') {
			tag[i] = '-'
		}
	}
	if len(tag) == 0 || tag[0] == '.' || tag[0] == '-' {
		tag = append([]byte("v"), tag...)
	}
	if len(tag) > 128 {
		tag = tag[:128]
	}
	return string(tag)
}

// Info describes a build.
type Info struct {
	Version   string `json:"version"`
	Commit    string `json:"commit"`
	GoVersion string `json:"goVersion"`
	Platform  string `json:"platform"`
}

// Get returns the running build's Info.
func Get() Info {
	info := Info{Version: Version, Commit: Commit, GoVersion: runtime.Version(), Platform: runtime.GOOS + "/" + runtime.GOARCH}
	if bi, ok := debug.ReadBuildInfo(); ok {
		if info.Version == "" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
			info.Version = bi.Main.Version
		}
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" && info.Commit == "" {
				info.Commit = s.Value
			}
		}
	}
	if info.Version == "" {
		info.Version = "dev"
	}
	if info.Commit == "" {
		info.Commit = "unknown"
	}
	return info
}

// String is the one-line form `terrace version` prints.
func (i Info) String() string {
	return fmt.Sprintf("terrace %s (commit %s, %s, %s)", i.Version, i.Commit, i.GoVersion, i.Platform)
}
