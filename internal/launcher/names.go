package launcher

// What runner pods and their Secrets are called and labelled.

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
)

// Labels and annotations on runner pods and their TLS Secrets.
const (
	LabelManagedBy   = "app.kubernetes.io/managed-by"
	ManagedByTerrace = "terrace"
	LabelComponent   = "app.kubernetes.io/component"
	// ComponentRunner marks runner pods, ComponentRunnerTLS their Secrets,
	// so selectors never reach the state Secrets that share terrace.dev/stack.
	ComponentRunner    = "runner"
	ComponentRunnerTLS = "runner-tls"
	// LabelStack holds StackLabelValue(stack name); LabelRun the run ID.
	LabelStack = "terrace.dev/stack"
	LabelRun   = "terrace.dev/run"
	// LabelShard holds the ID of the controller shard that started a
	// runner pod (Options.Shard); an unsharded controller sets none.
	LabelShard = "terrace.dev/shard"
	// AnnotationRetained marks a pod kept after its run (retain); Cleanup
	// leaves it alone.
	AnnotationRetained = "terrace.dev/retained"
)

// StackLabelValue is the value of the terrace.dev/stack label for a Stack:
// the name itself when it is a valid label value, otherwise a shortened form
// with a hash suffix (the same rule as the state Secrets use).
func StackLabelValue(name string) string {
	if len(validation.IsValidLabelValue(name)) == 0 {
		return name
	}
	return truncatedWithHash(name, validation.LabelValueMaxLength)
}

// PodName is the runner pod's name for a run: "<stack>-runner-<runID>",
// the Stack part shortened with a hash when the whole would exceed 63 characters.
func PodName(stack, runID string) string {
	suffix := "-runner-" + runID
	base := strings.ReplaceAll(stack, ".", "-")
	if len(base)+len(suffix) > validation.DNS1123LabelMaxLength {
		base = truncatedWithHash(stack, validation.DNS1123LabelMaxLength-len(suffix))
	}
	return base + suffix
}

// secretName is the run's TLS Secret, named after its pod.
func secretName(podName string) string { return podName + "-tls" }

func truncatedWithHash(s string, limit int) string {
	sum := sha256.Sum256([]byte(s))
	suffix := hex.EncodeToString(sum[:6])
	keep := limit - len(suffix) - 1
	if len(s) > keep {
		s = s[:keep]
	}
	s = strings.TrimRight(strings.ReplaceAll(s, ".", "-"), "-")
	return s + "-" + suffix
}

// runLabels are the labels terrace puts on a run's pod and Secret.
func runLabels(stack, runID, component string) map[string]string {
	return map[string]string{
		LabelManagedBy: ManagedByTerrace,
		LabelComponent: component,
		LabelStack:     StackLabelValue(stack),
		LabelRun:       runID,
	}
}

// withShard adds the Launcher's shard to a runner pod's labels.
func (l *Launcher) withShard(labels map[string]string) map[string]string {
	if l.opts.Shard != "" {
		labels[LabelShard] = l.opts.Shard
	}
	return labels
}
