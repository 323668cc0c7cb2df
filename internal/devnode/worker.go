package devnode

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/strategicpatch"
)

// volumeRefresh is how often Secret, ConfigMap and token volumes are
// re-written while a pod runs, as the kubelet's periodic sync does.
const volumeRefresh = 30 * time.Second

// podWorker runs one pod: it lays out its files, runs its containers and
// writes its status until the pod is deleted or devnode stops.
type podWorker struct {
	node   *Node
	uid    types.UID
	key    string // namespace/name
	podDir string
	logDir string

	mu        sync.Mutex
	pod       *corev1.Pod
	state     *podState
	deadline  time.Time // when halted processes get SIGKILL
	deleteObj bool      // remove the pod object once stopped
	// forced says the pod was deleted with no grace period: it is stopped
	// at once and no status is written for it any more.
	forced  bool
	written *corev1.PodStatus

	dirty    chan struct{} // state or pod changed: write status
	haltCh   chan struct{} // containers must stop
	finishCh chan struct{} // the worker must end after stopping
	done     chan struct{} // run returned
	halt1    sync.Once
	finish1  sync.Once
	goneCh   chan struct{} // closed once the pod's delete event came: nothing deletes it
	gone1    sync.Once
}

func newPodWorker(n *Node, pod *corev1.Pod) *podWorker {
	return &podWorker{
		node:     n,
		uid:      pod.UID,
		key:      pod.Namespace + "/" + pod.Name,
		podDir:   filepath.Join(n.opts.Dir, "pods", string(pod.UID)),
		logDir:   filepath.Join(n.opts.Dir, "logs", fmt.Sprintf("%s_%s_%s", pod.Namespace, pod.Name, pod.UID)),
		pod:      pod,
		state:    newPodState(pod),
		dirty:    make(chan struct{}, 1),
		haltCh:   make(chan struct{}),
		finishCh: make(chan struct{}),
		goneCh:   make(chan struct{}),
		done:     make(chan struct{}),
	}
}

func (w *podWorker) latest() *corev1.Pod {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.pod
}

func (w *podWorker) podIP() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.state.podIP
}

func (w *podWorker) volumesDir() string { return filepath.Join(w.podDir, "volumes") }

func (w *podWorker) logPath(container string, restart int32) string {
	return filepath.Join(w.logDir, container, fmt.Sprintf("%d.log", restart))
}

// observe records a newer pod object; a deletion timestamp starts the
// graceful stop.
func (w *podWorker) observe(pod *corev1.Pod) {
	if pod.DeletionTimestamp != nil && pod.DeletionGracePeriodSeconds != nil && *pod.DeletionGracePeriodSeconds == 0 {
		// Deleted without a grace period: the API server removes the
		// object right after this update (or once its finalizers go), so
		// a final status would only be refused. Should the object still
		// be there when the pod has stopped, cleanup deletes it.
		w.mu.Lock()
		w.pod, w.forced = pod, true
		w.mu.Unlock()
		w.stop(time.Now(), true)
		return
	}
	w.mu.Lock()
	w.pod = pod
	w.mu.Unlock()
	w.markDirty()
	if pod.DeletionTimestamp != nil {
		grace := terminationGrace(pod)
		if pod.DeletionGracePeriodSeconds != nil {
			grace = time.Duration(*pod.DeletionGracePeriodSeconds) * time.Second
		}
		w.stop(time.Now().Add(grace), true)
	}
}

// forget stops the pod at once (a graceful stop already under way keeps its
// deadline) and writes nothing more about it: its object is gone from the API.
func (w *podWorker) forget() {
	w.mu.Lock()
	w.forced = true
	w.mu.Unlock()
	w.gone1.Do(func() { close(w.goneCh) })
	w.stop(time.Now(), false)
}

// forcedDeleteWait is how long a pod deleted with no grace period waits,
// once stopped, for its delete event before devnode deletes the object
// itself: the API server removes it right after the update devnode saw, so
// the event is normally milliseconds away and the delete would be refused.
const forcedDeleteWait = 2 * time.Second

// awaitRemoval waits for the delete event of a pod deleted with no grace
// period and says whether its object is gone.
func (w *podWorker) awaitRemoval(ctx context.Context) bool {
	t := time.NewTimer(forcedDeleteWait)
	defer t.Stop()
	select {
	case <-w.goneCh:
	case <-t.C:
	case <-ctx.Done():
	}
	return w.removed()
}

// removed says the pod's delete event came.
func (w *podWorker) removed() bool { return isClosed(w.goneCh) }

// isClosed says whether ch is closed, without waiting.
func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// stop halts the containers (SIGKILL at deadline) and ends the worker;
// deleteObj removes the pod object afterwards.
func (w *podWorker) stop(deadline time.Time, deleteObj bool) {
	w.mu.Lock()
	w.deleteObj = w.deleteObj || deleteObj
	w.mu.Unlock()
	w.halt(deadline)
	w.finish1.Do(func() { close(w.finishCh) })
}

// halt stops the containers without ending the worker.
func (w *podWorker) halt(deadline time.Time) {
	w.mu.Lock()
	if w.deadline.IsZero() || deadline.Before(w.deadline) {
		w.deadline = deadline
	}
	w.mu.Unlock()
	w.halt1.Do(func() { close(w.haltCh) })
}

func (w *podWorker) halted() bool { return isClosed(w.haltCh) }

func (w *podWorker) haltDeadline() time.Time {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.deadline
}

// wait sleeps for d unless the worker halts first; it reports a halt.
func (w *podWorker) wait(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-w.haltCh:
		return true
	case <-t.C:
		return false
	}
}

// update changes the state under the lock and schedules a status write.
func (w *podWorker) update(fn func(*podState)) {
	w.set(fn)
	w.markDirty()
}

// set changes the state under the lock, for the next status write.
func (w *podWorker) set(fn func(*podState)) {
	w.mu.Lock()
	fn(w.state)
	w.mu.Unlock()
}

func (w *podWorker) markDirty() {
	select {
	case w.dirty <- struct{}{}:
	default:
	}
}

// fail makes the pod Failed for good and halts it.
func (w *podWorker) fail(reason, message string) {
	w.update(func(s *podState) {
		if s.failReason != "" {
			return
		}
		s.failReason, s.failMessage = reason, message
		for _, c := range append(append([]*containerState(nil), s.initContainers...), s.containers...) {
			if !c.everStarted() {
				c.final, c.waitingReason, c.waitingMessage = true, reason, message
			}
		}
	})
	w.halt(time.Now().Add(terminationGrace(w.latest())))
}

// setFinal marks a container as not running again and returns its last
// termination.
func (w *podWorker) setFinal(st *containerState) *corev1.ContainerStateTerminated {
	var last *corev1.ContainerStateTerminated
	w.update(func(*podState) {
		st.final = true
		if st.last == nil && st.waitingReason == "" {
			st.waitingReason = "ContainerCreating"
		}
		last = st.last
	})
	return last
}

// run is the pod's lifetime on the node.
func (w *podWorker) run(ctx context.Context) {
	defer close(w.done)
	// The status loop stops between writes, never in one: a write cut off
	// may still be applied while devnode does not know it, and cleanup
	// would then send it a second time.
	statusDone, statusStop := make(chan struct{}), make(chan struct{})
	stopStatus := func() { close(statusStop) }
	go func() {
		defer close(statusDone)
		w.statusLoop(ctx, statusStop)
	}()

	pod := w.latest()
	if pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed || pod.DeletionTimestamp != nil {
		// Finished before devnode (re)started, or already being deleted:
		// nothing to run.
		stopStatus()
		<-statusDone
		<-w.finishCh
		w.cleanup(ctx)
		return
	}
	w.runContainers(ctx, pod)
	<-w.finishCh
	stopStatus()
	<-statusDone
	w.cleanup(ctx)
}

func (w *podWorker) runContainers(ctx context.Context, pod *corev1.Pod) {
	if err := w.validate(pod); err != nil {
		var unsupported *unsupportedError
		if errors.As(err, &unsupported) {
			w.fail(unsupported.reason, unsupported.message)
		} else {
			w.fail("DevnodeError", err.Error())
		}
		return
	}
	volumes, ok := w.setUpSandbox(ctx, pod)
	if !ok {
		return
	}
	refreshCtx, stopRefresh := context.WithCancel(ctx)
	defer stopRefresh()
	go w.refreshVolumes(refreshCtx, volumes)

	if pod.Spec.ActiveDeadlineSeconds != nil {
		deadline := time.AfterFunc(time.Duration(*pod.Spec.ActiveDeadlineSeconds)*time.Second, func() {
			w.fail("DeadlineExceeded", "Pod was active on the node longer than the specified deadline")
		})
		defer deadline.Stop()
	}

	initPolicy := corev1.RestartPolicyOnFailure
	if pod.Spec.RestartPolicy == corev1.RestartPolicyNever {
		initPolicy = corev1.RestartPolicyNever
	}
	for i := range pod.Spec.InitContainers {
		st := w.state.initContainers[i]
		w.update(func(*podState) { st.waitingReason = "" })
		term := w.superviseContainer(ctx, &pod.Spec.InitContainers[i], st, initPolicy, false)
		if term == nil || term.ExitCode != 0 {
			if !w.halted() {
				w.fail("InitContainerFailed", fmt.Sprintf("init container %q failed", st.name))
			}
			return
		}
	}
	w.update(func(s *podState) { s.initialized = true })

	policy := pod.Spec.RestartPolicy
	if policy == "" {
		policy = corev1.RestartPolicyAlways
	}
	var wg sync.WaitGroup
	for i := range pod.Spec.Containers {
		st := w.state.containers[i]
		wg.Add(1)
		go func() {
			defer wg.Done()
			w.superviseContainer(ctx, &pod.Spec.Containers[i], st, policy, true)
		}()
	}
	wg.Wait()
}

// validate refuses pods devnode can never run.
func (w *podWorker) validate(pod *corev1.Pod) error {
	for _, c := range pod.Spec.InitContainers {
		if c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways {
			return &unsupportedError{reason: "UnsupportedSidecar", message: fmt.Sprintf("init container %q: devnode does not run sidecar containers", c.Name)}
		}
	}
	for _, cs := range [][]corev1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
		for i := range cs {
			if !w.node.runsHostBinary(&cs[i]) {
				continue // the image decides what runs
			}
			if _, err := binaryArgs(&cs[i], w.node.opts.Images); err != nil {
				return err
			}
		}
	}
	return validateVolumes(pod)
}

// statusWriteTimeout bounds one status write, so that a stopping worker
// waits for a write under way (run) only so long when the API server hangs.
const statusWriteTimeout = 10 * time.Second

// statusLoop writes the pod status whenever it changes, until stop closes
// or ctx ends.
func (w *podWorker) statusLoop(ctx context.Context, stop <-chan struct{}) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-stop:
			return
		case <-w.dirty:
		}
		writeCtx, cancel := context.WithTimeout(ctx, statusWriteTimeout)
		err := w.writeStatus(writeCtx)
		cancel()
		if err != nil && ctx.Err() == nil {
			w.node.log.Info("failed to write pod status", "pod", w.key, "error", err.Error())
			// Try again on the next change or shortly.
			time.AfterFunc(time.Second, w.markDirty)
		}
	}
}

// writeStatus writes devnode's part of the pod status when it differs from
// what it wrote last: a strategic merge patch of the change, with the pod's
// UID as its precondition, as the kubelet patches. A patch needs no
// resourceVersion, so another writer's change to the pod (a warm runner's
// claim relabels it) costs no conflict, re-read and second write; other
// writers' conditions are neither compared nor written. A field of
// devnode's that someone else changed stays so until devnode changes it:
// nothing else writes them on the dev cluster.
func (w *podWorker) writeStatus(ctx context.Context) error {
	w.mu.Lock()
	if w.forced {
		w.mu.Unlock()
		return nil
	}
	pod, written := w.pod, w.written
	status := ownedPart(computeStatus(pod, w.state, written, metav1.Now()))
	w.mu.Unlock()
	var base corev1.PodStatus
	switch {
	case written == nil:
		base = ownedPart(pod.Status)
	case equality.Semantic.DeepEqual(*written, status):
		return nil
	default:
		base = *written
	}
	patch, err := statusPatch(w.uid, &base, &status)
	if err != nil {
		return err
	}
	updated, err := w.node.client.CoreV1().Pods(pod.Namespace).Patch(ctx, pod.Name, types.StrategicMergePatchType, patch, metav1.PatchOptions{}, "status")
	if apierrors.IsNotFound(err) || ((apierrors.IsInvalid(err) || apierrors.IsConflict(err)) && w.replaced(ctx, pod)) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("failed to update status: %w", err)
	}
	w.mu.Lock()
	w.written = &status
	if w.pod.ResourceVersion == pod.ResourceVersion {
		w.pod = updated
	}
	w.mu.Unlock()
	return nil
}

// replaced reports whether the pod of pod's name is gone or another one
// now: the API server refuses a patch whose UID precondition fails.
func (w *podWorker) replaced(ctx context.Context, pod *corev1.Pod) bool {
	current, err := w.node.client.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return true
	}
	return err == nil && current.UID != w.uid
}

// statusPatch is the strategic merge patch from status from to status to
// of the pod uid. The UID is in the patch as a precondition: the API server
// refuses to apply it to another pod of the same name.
func statusPatch(uid types.UID, from, to *corev1.PodStatus) ([]byte, error) {
	old, err := json.Marshal(corev1.Pod{Status: *from})
	if err != nil {
		return nil, err
	}
	updated, err := json.Marshal(corev1.Pod{ObjectMeta: metav1.ObjectMeta{UID: uid}, Status: *to})
	if err != nil {
		return nil, err
	}
	patch, err := strategicpatch.CreateTwoWayMergePatch(old, updated, corev1.Pod{})
	if err != nil {
		return nil, fmt.Errorf("failed to make the pod status patch: %w", err)
	}
	return patch, nil
}

// cleanup releases the pod's address and files and, after a deletion,
// writes the final status and removes the pod object.
func (w *podWorker) cleanup(ctx context.Context) {
	w.mu.Lock()
	ip, deleteObj, forced := w.state.podIP, w.deleteObj, w.forced
	w.mu.Unlock()
	deleteObj = deleteObj && !w.removed()
	if ip != "" && ip != hostIP {
		w.node.ips.release(ip)
	}
	// Volumes hold Secret data: they go with the pod. Logs stay for
	// `terrace dev logs` until the dev directory is wiped.
	if err := os.RemoveAll(w.podDir); err != nil {
		w.node.log.Info("failed to remove pod directory", "pod", w.key, "error", err.Error())
	}
	if !deleteObj || ctx.Err() != nil || (forced && w.awaitRemoval(ctx)) {
		return
	}
	if err := w.writeStatus(ctx); err != nil {
		w.node.log.V(1).Info("failed to write final status", "pod", w.key, "error", err.Error())
	}
	pod := w.latest()
	zero := int64(0)
	err := w.node.client.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{
		GracePeriodSeconds: &zero,
		Preconditions:      &metav1.Preconditions{UID: &w.uid},
	})
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		w.node.log.Info("failed to remove pod", "pod", w.key, "error", err.Error())
	}
}
