package launcher

// How a runner pod ended, as its status says.

import (
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/terrace-dev/terrace/internal/runnerbin"
)

// TerminatedError says how a runner pod ended before its run was closed.
type TerminatedError struct {
	// Pod is namespace/name of the runner pod.
	Pod string
	// Reason is the container's or the pod's reason: OOMKilled, Error,
	// Completed, Evicted, DeadlineExceeded, Deleted, ...
	Reason string
	// ExitCode of the runner container; nil when it never ran or is unknown.
	ExitCode *int32
	// Message is the pod's or container's own message, if any.
	Message string
}

func (e *TerminatedError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "runner pod %s stopped: %s", e.Pod, e.Reason)
	if e.ExitCode != nil {
		fmt.Fprintf(&b, " (exit code %d)", *e.ExitCode)
	}
	if e.Message != "" {
		b.WriteString(": ")
		b.WriteString(e.Message)
	}
	return b.String()
}

// neverStarts are waiting reasons no retry can cure.
var neverStarts = map[string]bool{"InvalidImageName": true, "ErrImageNeverPull": true}

// withRunnerHint says what to do when the runtime could not start the
// runner binary: an image from before terrace-runner, or one of the user's
// own that lacks it.
func withRunnerHint(message string) string {
	if !strings.Contains(message, runnerbin.ImagePath) {
		return message
	}
	return message + " (runner pods start " + runnerbin.ImagePath + ": use the Terrace image of the controller's version, " +
		"or build the runner image FROM it, or link terrace-runner to terrace in it)"
}

// terminated says how the pod ended, or nil while the runner can still run.
func terminated(name string, pod *corev1.Pod, deleted bool) *TerminatedError {
	if pod == nil || deleted {
		return &TerminatedError{Pod: name, Reason: "Deleted", Message: "the runner pod was deleted"}
	}
	var container *corev1.ContainerStatus
	for i := range pod.Status.ContainerStatuses {
		if pod.Status.ContainerStatuses[i].Name == containerName {
			container = &pod.Status.ContainerStatuses[i]
		}
	}
	term := &TerminatedError{Pod: name, Reason: pod.Status.Reason, Message: pod.Status.Message}
	if container != nil {
		t := container.State.Terminated
		if t == nil {
			t = container.LastTerminationState.Terminated
		}
		if t != nil {
			term.ExitCode = &t.ExitCode
			// The pod's reason (Evicted, DeadlineExceeded) explains a
			// container's SIGKILL better than "Error"; OOMKilled is clearest.
			if term.Reason == "" || t.Reason == "OOMKilled" {
				term.Reason = t.Reason
			}
			if term.Message == "" {
				term.Message = withRunnerHint(strings.TrimSpace(t.Message))
			}
			if t.Reason == "OOMKilled" && term.Message == "" {
				term.Message = oomHint(pod)
			}
			if term.Reason == "" {
				term.Reason = "Terminated"
			}
			return term
		}
		if w := container.State.Waiting; w != nil && neverStarts[w.Reason] {
			term.Reason, term.Message = w.Reason, w.Message
			return term
		}
	}
	switch {
	case pod.Status.Phase == corev1.PodFailed || pod.Status.Phase == corev1.PodSucceeded:
		if term.Reason == "" {
			term.Reason = string(pod.Status.Phase)
		}
		return term
	case pod.DeletionTimestamp != nil:
		return &TerminatedError{Pod: name, Reason: "Deleted", Message: "the runner pod is being deleted"}
	}
	return nil
}

// oomHint says what a runner container the out-of-memory killer stopped
// needs: the runner itself died (when only tofu is killed, the runner says
// so in the failed command's error).
func oomHint(pod *corev1.Pod) string {
	limit := "its memory limit"
	for _, c := range pod.Spec.Containers {
		if q, ok := c.Resources.Limits[corev1.ResourceMemory]; c.Name == containerName && ok {
			limit = fmt.Sprintf("its memory limit (%d MiB)", q.Value()>>20)
		}
	}
	return "killed by the kernel's out-of-memory killer: " + limit + " is too low for this run; raise spec.runner.resources.limits.memory (or the TerraceConfig's runner resources)"
}
