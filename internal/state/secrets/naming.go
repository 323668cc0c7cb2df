package secrets

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
)

// Labels and annotations on every Secret Terrace stores state, plans and releases in.
const (
	LabelManagedBy    = "app.kubernetes.io/managed-by"
	ManagedByTerrace  = "terrace"
	LabelStack        = "terrace.dev/stack"
	LabelKind         = "terrace.dev/kind"
	LabelWorkspace    = "terrace.dev/workspace"
	LabelStateVersion = "terrace.dev/state-version"
	LabelPlan         = "terrace.dev/plan"
	LabelRevision     = "terrace.dev/revision"
	LabelStatus       = "terrace.dev/status"

	// AnnotationStack, AnnotationWorkspace and AnnotationPlan carry the full
	// names when a label value had to be shortened.
	AnnotationStack     = "terrace.dev/stack-name"
	AnnotationWorkspace = "terrace.dev/workspace-name"
	AnnotationPlan      = "terrace.dev/plan-id"
	// AnnotationMigrated holds a MigrationMark as JSON.
	AnnotationMigrated = "terrace.dev/migrated"

	KindStateIndex = "state-index"
	KindStateChunk = "state-chunk"
	KindPlanIndex  = "plan-index"
	KindPlanChunk  = "plan-chunk"
	KindRelease    = "release"
)

// LabelValue returns value when it is a valid label value, otherwise a
// shortened form with a hash suffix; the full value goes in an annotation.
func LabelValue(value string) string {
	if len(validation.IsValidLabelValue(value)) == 0 {
		return value
	}
	return truncatedWithHash(sanitize(value), 63)
}

// ObjectName joins prefix and parts with dots into a valid Secret name,
// shortening it with a hash suffix when the parts do not fit or contain
// characters a name may not have. Distinct inputs give distinct names.
func ObjectName(prefix string, parts ...string) string {
	name := prefix + "." + strings.Join(parts, ".")
	clean := true
	for _, p := range parts {
		if len(validation.IsDNS1123Label(p)) != 0 {
			clean = false
		}
	}
	if clean && len(name) <= 253 {
		return name
	}
	safe := make([]string, len(parts))
	for i, p := range parts {
		safe[i] = sanitize(p)
	}
	// The hash covers the raw parts, so "a_b" and "a-b" never collide.
	return truncatedWithHash(prefix+"."+strings.Join(safe, "."), 253, append([]string{prefix}, parts...)...)
}

func truncatedWithHash(s string, max int, hashed ...string) string {
	if len(hashed) == 0 {
		hashed = []string{s}
	}
	sum := sha256.Sum256([]byte(strings.Join(hashed, "\x00")))
	suffix := hex.EncodeToString(sum[:6])
	keep := max - len(suffix) - 1
	if len(s) > keep {
		s = s[:keep]
	}
	s = strings.TrimRight(s, ".-")
	return s + "-" + suffix
}

// sanitize lowercases and replaces what a DNS-1123 name may not hold with '-'.
func sanitize(s string) string {
	b := []byte(strings.ToLower(s))
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '.') {
			b[i] = '-'
		}
	}
	out := strings.Trim(string(b), ".-")
	if out == "" {
		out = "x"
	}
	return out
}
