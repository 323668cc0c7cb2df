package devnode

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func term(code int32) *corev1.ContainerStateTerminated {
	return &corev1.ContainerStateTerminated{ExitCode: code}
}

func TestPhase(t *testing.T) {
	now := metav1.Now()
	cases := []struct {
		name  string
		state podState
		want  corev1.PodPhase
	}{
		{"not started", podState{initialized: true, containers: []*containerState{{}}}, corev1.PodPending},
		{"init pending", podState{containers: []*containerState{{runningSince: &now}}}, corev1.PodPending},
		{"running", podState{initialized: true, containers: []*containerState{{runningSince: &now}}}, corev1.PodRunning},
		{"one running one not yet", podState{initialized: true, containers: []*containerState{{runningSince: &now}, {}}}, corev1.PodRunning},
		{"restarting", podState{initialized: true, containers: []*containerState{{last: term(1)}}}, corev1.PodRunning},
		{"succeeded", podState{initialized: true, containers: []*containerState{{last: term(0), final: true}}}, corev1.PodSucceeded},
		{"failed", podState{initialized: true, containers: []*containerState{{last: term(0), final: true}, {last: term(3), final: true}}}, corev1.PodFailed},
		{"one failed other running", podState{initialized: true, containers: []*containerState{{last: term(3), final: true}, {runningSince: &now}}}, corev1.PodRunning},
		{"devnode failure", podState{failReason: ReasonUnsupportedImage, containers: []*containerState{{}}}, corev1.PodFailed},
	}
	for _, c := range cases {
		if got := c.state.phase(); got != c.want {
			t.Errorf("%s: phase %s, want %s", c.name, got, c.want)
		}
	}
}

func conditionOf(s corev1.PodStatus, t corev1.PodConditionType) corev1.PodCondition {
	for _, c := range s.Conditions {
		if c.Type == t {
			return c
		}
	}
	return corev1.PodCondition{}
}

func TestComputeStatus(t *testing.T) {
	earlier := metav1.NewTime(metav1.Now().Add(-60e9))
	now := metav1.Now()
	pod := &corev1.Pod{
		Spec: corev1.PodSpec{ReadinessGates: []corev1.PodReadinessGate{{ConditionType: "example.com/gate"}}},
		Status: corev1.PodStatus{Conditions: []corev1.PodCondition{
			{Type: corev1.PodScheduled, Status: corev1.ConditionTrue, LastTransitionTime: earlier},
			{Type: "example.com/gate", Status: corev1.ConditionFalse},
		}},
	}
	st := &podState{podIP: "127.0.0.5", initialized: true, sandboxReady: true, containers: []*containerState{
		{name: "main", image: "terrace", runningSince: &now, pid: 42, started: true, ready: true, restartCount: 1, last: term(2)},
	}}
	s := computeStatus(pod, st, nil, now)
	if s.Phase != corev1.PodRunning || s.PodIP != "127.0.0.5" || len(s.PodIPs) != 1 || s.HostIP != hostIP {
		t.Fatalf("unexpected status %+v", s)
	}
	cs := s.ContainerStatuses[0]
	if cs.State.Running == nil || cs.LastTerminationState.Terminated == nil || cs.LastTerminationState.Terminated.ExitCode != 2 || cs.RestartCount != 1 || !cs.Ready {
		t.Fatalf("unexpected container status %+v", cs)
	}
	if c := conditionOf(s, corev1.ContainersReady); c.Status != corev1.ConditionTrue {
		t.Errorf("ContainersReady %+v", c)
	}
	if c := conditionOf(s, corev1.PodReady); c.Status != corev1.ConditionFalse || c.Reason != "ReadinessGatesNotReady" {
		t.Errorf("Ready must wait for the readiness gate: %+v", c)
	}
	if c := conditionOf(s, "example.com/gate"); c.Type == "" {
		t.Error("a condition devnode does not own was dropped")
	}
	if c := conditionOf(s, corev1.PodScheduled); !c.LastTransitionTime.Equal(&earlier) {
		t.Errorf("an unchanged condition lost its transition time: %+v", c)
	}

	st.containers[0].terminated(term(3))
	st.containers[0].final = true
	s = computeStatus(pod, st, nil, now)
	if s.Phase != corev1.PodFailed {
		t.Fatalf("phase %s", s.Phase)
	}
	cs = s.ContainerStatuses[0]
	if cs.State.Terminated == nil || cs.State.Terminated.ExitCode != 3 || cs.LastTerminationState.Terminated.ExitCode != 2 {
		t.Fatalf("unexpected container status %+v", cs)
	}
	if c := conditionOf(s, corev1.PodReady); c.Reason != "PodCompleted" {
		t.Errorf("Ready after completion: %+v", c)
	}
}
