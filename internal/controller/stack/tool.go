package stack

import (
	"context"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"

	runnerv1 "github.com/terrace-dev/terrace/proto/terrace/runner/v1"
)

// runnerContainerName is the runner pod's main container (internal/launcher names it so).
const runnerContainerName = "runner"

// runTool is what applied a release: the tofu/terraform version the runner
// reported at init and the runner image, by digest when known.
type runTool struct {
	version string
	image   string
}

// podSession is a run whose runner pod can be named (launcher runs).
type podSession interface {
	Pod() types.NamespacedName
}

// observedPodSession is a run that knows its pod's latest status from a
// watch (launcher runs).
type observedPodSession interface {
	ObservedPod() *corev1.Pod
}

// runTool reads the version from the init result and the image from the
// runner pod's status, as the launcher's watch saw it or, when that does
// not say yet which image runs, from the API server; what cannot be read stays empty (the
// release is still recorded).
func (r *Reconciler) runTool(ctx context.Context, sess runSession, init *runnerv1.InitResult) runTool {
	tool := runTool{version: init.GetVersion()}
	if observed, ok := sess.(observedPodSession); ok {
		if pod := observed.ObservedPod(); pod != nil {
			if reportedImage(pod) {
				tool.image = runnerImage(pod)
				return tool
			}
		}
	}
	named, ok := sess.(podSession)
	if !ok || r.APIReader == nil {
		return tool
	}
	pod := &corev1.Pod{}
	if err := r.APIReader.Get(ctx, named.Pod(), pod); err != nil {
		ctrl.LoggerFrom(ctx).V(1).Info("could not read the runner pod for its image digest", "error", err.Error())
		return tool
	}
	tool.image = runnerImage(pod)
	return tool
}

// runnerImage is the runner container's image as repository@sha256:digest
// when the node reported a digest (ImageID), else its image reference.
func runnerImage(pod *corev1.Pod) string {
	for _, c := range pod.Status.ContainerStatuses {
		if c.Name != runnerContainerName {
			continue
		}
		if at := strings.LastIndex(c.ImageID, "@sha256:"); at >= 0 {
			repo := c.ImageID[:at]
			if i := strings.Index(repo, "://"); i >= 0 {
				repo = repo[i+3:] // docker-pullable://repo@sha256:...
			}
			return repo + c.ImageID[at:]
		}
		return c.Image
	}
	for _, c := range pod.Spec.Containers {
		if c.Name == runnerContainerName {
			return c.Image
		}
	}
	return ""
}

// reportedImage says the node reported which image the runner container
// runs (its ImageID), which does not change while the container lives.
func reportedImage(pod *corev1.Pod) bool {
	for _, c := range pod.Status.ContainerStatuses {
		if c.Name == runnerContainerName {
			return c.ImageID != ""
		}
	}
	return false
}
