package devnode

import (
	"fmt"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// hostIP is the node's address: every pod shares the host's loopback.
const hostIP = "127.0.0.1"

// containerState is what devnode knows about one container; computeStatus
// turns it into a ContainerStatus.
type containerState struct {
	name  string
	image string
	// imageID is the pulled image's repository@digest.
	imageID string
	// restartCount counts restarts after the first start.
	restartCount int32
	// runningSince is set while the process runs.
	runningSince *metav1.Time
	pid          int
	// started: the startup probe passed (or there is none) in this run.
	started bool
	// ready: the readiness probe passes (or there is none) in this run.
	ready bool
	// last and previous terminations, most recent first.
	last, previous *corev1.ContainerStateTerminated
	// final: the container will not run again.
	final bool
	// waiting explains why the container is not running when it will be.
	waitingReason, waitingMessage string
}

func (c *containerState) everStarted() bool { return c.runningSince != nil || c.last != nil }

// terminated records the end of a run.
func (c *containerState) terminated(t *corev1.ContainerStateTerminated) {
	c.previous, c.last = c.last, t
	c.runningSince, c.pid, c.ready, c.started = nil, 0, false, false
}

func (c *containerState) status() corev1.ContainerStatus {
	// The status is written outside the worker's lock: it shares nothing
	// with the state.
	started := c.started
	imageID := c.imageID
	if imageID == "" {
		imageID = "devnode://" + imageRepository(c.image) // the host binary, or not pulled yet
	}
	s := corev1.ContainerStatus{
		Name:         c.name,
		Image:        c.image,
		ImageID:      imageID,
		RestartCount: c.restartCount,
		Ready:        c.ready,
		Started:      &started,
	}
	switch {
	case c.runningSince != nil:
		s.ContainerID = fmt.Sprintf("devnode://%d", c.pid)
		s.State.Running = &corev1.ContainerStateRunning{StartedAt: *c.runningSince}
		s.LastTerminationState.Terminated = c.last.DeepCopy()
	case c.final && c.last != nil:
		s.ContainerID = c.last.ContainerID
		s.State.Terminated = c.last.DeepCopy()
		s.LastTerminationState.Terminated = c.previous.DeepCopy()
	default:
		reason := c.waitingReason
		if reason == "" {
			reason = "ContainerCreating"
		}
		s.State.Waiting = &corev1.ContainerStateWaiting{Reason: reason, Message: c.waitingMessage}
		s.LastTerminationState.Terminated = c.last.DeepCopy()
	}
	return s
}

// podState is what devnode knows about one pod.
type podState struct {
	podIP     string
	startTime *metav1.Time
	// sandboxReady: IP assigned and volumes written.
	sandboxReady bool
	// initialized: every init container succeeded.
	initialized bool
	// failReason/failMessage make the pod Failed for good (unsupported
	// image, deadline exceeded, an init container failed for good).
	failReason, failMessage string
	initContainers          []*containerState
	containers              []*containerState
}

func newPodState(pod *corev1.Pod) *podState {
	s := &podState{initialized: len(pod.Spec.InitContainers) == 0}
	for _, c := range pod.Spec.InitContainers {
		s.initContainers = append(s.initContainers, &containerState{name: c.Name, image: c.Image, waitingReason: "PodInitializing"})
	}
	for _, c := range pod.Spec.Containers {
		s.containers = append(s.containers, &containerState{name: c.Name, image: c.Image})
	}
	return s
}

// phase follows the kubelet: Pending until every container has started,
// Running while any container runs or will run again, then Succeeded or
// Failed.
func (s *podState) phase() corev1.PodPhase {
	if s.failReason != "" {
		return corev1.PodFailed
	}
	if !s.initialized {
		return corev1.PodPending
	}
	running, pending, failed := false, false, false
	for _, c := range s.containers {
		switch {
		case c.runningSince != nil:
			running = true
		case !c.everStarted():
			pending = true
		case !c.final:
			running = true // restarting
		case c.last.ExitCode != 0:
			failed = true
		}
	}
	switch {
	case pending && !running:
		return corev1.PodPending
	case running || pending:
		return corev1.PodRunning
	case failed:
		return corev1.PodFailed
	default:
		return corev1.PodSucceeded
	}
}

// ownedConditions are the pod conditions devnode sets; others (readiness
// gates, DisruptionTarget) belong to other writers.
var ownedConditions = map[corev1.PodConditionType]bool{
	corev1.PodReadyToStartContainers: true,
	corev1.PodInitialized:            true,
	corev1.PodReady:                  true,
	corev1.ContainersReady:           true,
	corev1.PodScheduled:              true,
}

// computeStatus derives the pod status from the state, keeping conditions
// devnode does not own and the transition times of conditions whose status
// did not change. written is the status devnode wrote last (nil before its
// first write): its own conditions' times come from there, since the pod
// object may be an older watch event that does not show that write yet,
// and a time read from it would differ from the one written, for a write
// that changes nothing else.
func computeStatus(pod *corev1.Pod, s *podState, written *corev1.PodStatus, now metav1.Time) corev1.PodStatus {
	phase := s.phase()
	status := corev1.PodStatus{
		Phase:     phase,
		HostIP:    hostIP,
		HostIPs:   []corev1.HostIP{{IP: hostIP}},
		StartTime: s.startTime.DeepCopy(),
		QOSClass:  pod.Status.QOSClass,
		Reason:    s.failReason,
		Message:   s.failMessage,
	}
	if s.podIP != "" {
		status.PodIP = s.podIP
		status.PodIPs = []corev1.PodIP{{IP: s.podIP}}
	}
	for _, c := range s.initContainers {
		status.InitContainerStatuses = append(status.InitContainerStatuses, c.status())
	}
	for _, c := range s.containers {
		status.ContainerStatuses = append(status.ContainerStatuses, c.status())
	}

	previous := map[corev1.PodConditionType]corev1.PodCondition{}
	for _, c := range pod.Status.Conditions {
		previous[c.Type] = c
		if !ownedConditions[c.Type] {
			status.Conditions = append(status.Conditions, c)
		}
	}
	if written != nil {
		for _, c := range written.Conditions {
			if ownedConditions[c.Type] {
				previous[c.Type] = c
			}
		}
	}
	for _, c := range s.conditions(pod, phase == corev1.PodSucceeded || phase == corev1.PodFailed) {
		if p, ok := previous[c.Type]; ok && p.Status == c.Status {
			c.LastTransitionTime = p.LastTransitionTime
		} else {
			c.LastTransitionTime = now
		}
		status.Conditions = append(status.Conditions, c)
	}
	sort.SliceStable(status.Conditions, func(i, j int) bool { return status.Conditions[i].Type < status.Conditions[j].Type })
	return status
}

// conditions are devnode's own conditions of the pod, without times.
func (s *podState) conditions(pod *corev1.Pod, terminal bool) []corev1.PodCondition {
	var unready []string
	for _, c := range s.containers {
		if !c.ready {
			unready = append(unready, c.name)
		}
	}
	sort.Strings(unready)
	containersReady := condition(corev1.ContainersReady, len(unready) == 0 && !terminal, "ContainersNotReady",
		fmt.Sprintf("containers with unready status: [%s]", strings.Join(unready, " ")))
	gatesOK, gatesMsg := readinessGates(pod)
	ready := condition(corev1.PodReady, len(unready) == 0 && !terminal && gatesOK, "ContainersNotReady", containersReady.Message)
	if len(unready) == 0 && !gatesOK {
		ready.Reason, ready.Message = "ReadinessGatesNotReady", gatesMsg
	}
	if terminal {
		containersReady.Reason, containersReady.Message = "PodCompleted", ""
		ready.Reason, ready.Message = "PodCompleted", ""
	}
	var notInit []string
	for _, c := range s.initContainers {
		if c.last == nil || c.last.ExitCode != 0 {
			notInit = append(notInit, c.name)
		}
	}
	initialized := condition(corev1.PodInitialized, s.initialized, "ContainersNotInitialized",
		fmt.Sprintf("containers with incomplete status: [%s]", strings.Join(notInit, " ")))
	return []corev1.PodCondition{
		condition(corev1.PodReadyToStartContainers, s.sandboxReady && !terminal, "", ""),
		initialized,
		ready,
		containersReady,
		condition(corev1.PodScheduled, true, "", ""),
	}
}

// ownedPart is status without the conditions of other writers: what
// devnode writes, and compares with what it wrote.
func ownedPart(status corev1.PodStatus) corev1.PodStatus {
	out := *status.DeepCopy()
	out.Conditions = nil
	for _, c := range status.Conditions {
		if ownedConditions[c.Type] {
			out.Conditions = append(out.Conditions, *c.DeepCopy())
		}
	}
	return out
}

func condition(t corev1.PodConditionType, ok bool, reason, message string) corev1.PodCondition {
	if ok {
		return corev1.PodCondition{Type: t, Status: corev1.ConditionTrue}
	}
	return corev1.PodCondition{Type: t, Status: corev1.ConditionFalse, Reason: reason, Message: message}
}

// readinessGates reports whether every readiness gate's condition is True.
func readinessGates(pod *corev1.Pod) (bool, string) {
	var missing []string
	for _, g := range pod.Spec.ReadinessGates {
		ok := false
		for _, c := range pod.Status.Conditions {
			if c.Type == g.ConditionType && c.Status == corev1.ConditionTrue {
				ok = true
			}
		}
		if !ok {
			missing = append(missing, string(g.ConditionType))
		}
	}
	if len(missing) == 0 {
		return true, ""
	}
	return false, fmt.Sprintf("corresponding condition of pod readiness gate %q does not exist or is not True", strings.Join(missing, ", "))
}
