package version

import (
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
)

func TestImageReference(t *testing.T) {
	for version, want := range map[string]string{
		"v0.1.0":                           "v0.1.0",
		"dev":                              "dev",
		"v0.0.0-20261201-abcdef+dirty":     "v0.0.0-20261201-abcdef-dirty",
		"7188bc4-dirty":                    "7188bc4-dirty",
		"-odd":                             "v-odd",
		strings.Repeat("a", 200):           strings.Repeat("a", 128),
		"v1.2.3+incompatible/with:symbols": "v1.2.3-incompatible-with-symbols",
	} {
		tag := imageTag(version)
		if tag != want {
			t.Errorf("imageTag(%q) = %q, want %q", version, tag, want)
		}
		if _, err := name.NewTag(Image+":"+tag, name.StrictValidation); err != nil {
			t.Errorf("%s:%s is not a valid reference: %v", Image, tag, err)
		}
	}
	saved := Version
	t.Cleanup(func() { Version = saved })
	Version = "v9.8.7"
	if got := ImageReference(); got != "ghcr.io/terrace-dev/terrace:v9.8.7" {
		t.Errorf("ImageReference() = %q", got)
	}
}
