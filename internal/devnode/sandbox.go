package devnode

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// A pod's sandbox: its address, its directory and its volumes, set up before
// its containers start and kept current while they run.

// A volume's first retry comes after firstMountRetry, doubling up to 2 s;
// its failure is reported from the retry of reportMountFailureAfter on
// (after 150 ms of failures).
const (
	firstMountRetry         = 10 * time.Millisecond
	reportMountFailureAfter = 160 * time.Millisecond
)

// setUpSandbox gives the pod its address, directory and volumes; false
// when the pod failed or halted meanwhile.
func (w *podWorker) setUpSandbox(ctx context.Context, pod *corev1.Pod) (*volumeWriter, bool) {
	ip := hostIP
	if !pod.Spec.HostNetwork {
		var err error
		if ip, err = w.node.ips.allocate(); err != nil {
			w.fail("DevnodeError", err.Error())
			return nil, false
		}
	}
	// The first status normally waits for the sandbox (volumes written, or
	// their failure), as the kubelet reports a pod's IP with its sandbox:
	// one write where there were two a few milliseconds apart. (A pod
	// update seen meanwhile may still write it earlier.)
	now := metav1.Now()
	w.set(func(s *podState) { s.podIP, s.startTime = ip, &now })
	if err := os.MkdirAll(w.volumesDir(), 0o700); err != nil {
		w.fail("DevnodeError", fmt.Sprintf("failed to create pod directory: %v", err))
		return nil, false
	}
	if err := os.Chmod(w.podDir, 0o700); err != nil {
		w.fail("DevnodeError", fmt.Sprintf("failed to protect pod directory: %v", err))
		return nil, false
	}
	volumes := newVolumeWriter(w.node.client, pod, ip, w.volumesDir())
	// A Secret made right after its pod (a runner's TLS Secret) is
	// usually there a few milliseconds later: retry soon, then back off,
	// as the kubelet does (from 500 ms). The failure goes into the status
	// only once it outlasts the first retries, so a Secret that is merely
	// late costs a GET, not a status write.
	retry := firstMountRetry
	for {
		err := volumes.writeAll(ctx)
		if err == nil {
			break
		}
		var unsupported *unsupportedError
		if errors.As(err, &unsupported) {
			w.fail(unsupported.reason, unsupported.message)
			return nil, false
		}
		if retry >= reportMountFailureAfter {
			w.update(func(s *podState) {
				for _, c := range append(append([]*containerState(nil), s.initContainers...), s.containers...) {
					c.waitingReason, c.waitingMessage = "ContainerCreating", "MountVolume.SetUp failed: "+err.Error()
				}
			})
		}
		if w.wait(retry) {
			return nil, false
		}
		retry = min(2*retry, 2*time.Second)
	}
	w.update(func(s *podState) {
		s.sandboxReady = true
		for _, c := range s.containers {
			c.waitingMessage = ""
		}
	})
	return volumes, true
}

// refreshVolumes keeps the volumes current while the pod runs.
func (w *podWorker) refreshVolumes(ctx context.Context, volumes *volumeWriter) {
	ticker := time.NewTicker(volumeRefresh)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
		volumes.pod = w.latest()
		if err := volumes.writeAll(ctx); err != nil && ctx.Err() == nil {
			w.node.log.Info("failed to refresh volumes", "pod", w.key, "error", err.Error())
		}
	}
}
