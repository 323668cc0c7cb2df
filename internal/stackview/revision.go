package stackview

import (
	"regexp"
	"strings"
)

// digestPattern matches a sha256 or sha1 digest anywhere in a text, keeping
// its first 8 hex digits as Flux does (main@sha1:e3f62017): enough to tell
// revisions apart by eye.
var digestPattern = regexp.MustCompile(`\b(sha256|sha1):([0-9a-f]{8})[0-9a-f]{24,56}\b`)

// ShortRevision shortens every digest in s to its first 8 hex digits:
// "1@sha256:e3f62017…" becomes "1@sha256:e3f62017". Listings and condition
// messages use it; describe, -o wide and -o yaml keep the full digest.
func ShortRevision(s string) string {
	return digestPattern.ReplaceAllString(s, "${1}:${2}")
}

// SplitRevision parses a Git revision as Flux writes it, "<name>@sha1:<40
// hex>" or "sha1:<40 hex>"; both are "" for anything else.
func SplitRevision(revision string) (name, hash string) {
	if i := strings.LastIndex(revision, "sha1:"); i >= 0 {
		name, hash = strings.TrimSuffix(revision[:i], "@"), revision[i+len("sha1:"):]
	}
	if len(hash) != 40 {
		return "", ""
	}
	return name, hash
}
