package cli

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/launcher"
)

func runnerPod(name, stack string, owner types.UID, phase corev1.PodPhase, created time.Time) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: "team", Name: name, CreationTimestamp: metav1.NewTime(created),
			Labels: map[string]string{
				launcher.LabelManagedBy: launcher.ManagedByTerrace, launcher.LabelComponent: launcher.ComponentRunner,
				launcher.LabelStack: launcher.StackLabelValue(stack), launcher.LabelRun: name,
			},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: terracev1.GroupVersion.String(), Kind: "Stack", Name: stack, UID: owner}},
		},
		Status: corev1.PodStatus{Phase: phase},
	}
}

// logs shows the first; --previous the second.
func TestRunnerPodsPutTheRunningPodFirstThenTheNewest(t *testing.T) {
	stack := &terracev1.Stack{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "web", UID: "uid-web"}}
	t0 := time.Date(2026, 3, 1, 10, 0, 0, 0, time.UTC)
	oldDone := runnerPod("web-runner-1", "web", "uid-web", corev1.PodSucceeded, t0)
	newerFailed := runnerPod("web-runner-3", "web", "uid-web", corev1.PodFailed, t0.Add(2*time.Hour))
	running := runnerPod("web-runner-2", "web", "uid-web", corev1.PodRunning, t0.Add(time.Hour))
	// Same name, earlier Stack (another UID), newest of all: never chosen.
	formerStack := runnerPod("web-runner-9", "web", "uid-old", corev1.PodRunning, t0.Add(3*time.Hour))
	otherStack := runnerPod("db-runner-1", "db", "uid-db", corev1.PodRunning, t0.Add(4*time.Hour))
	unlabelled := runnerPod("web-debug", "web", "uid-web", corev1.PodRunning, t0.Add(5*time.Hour))
	unlabelled.Labels = nil

	tests := []struct {
		name string
		pods []*corev1.Pod
		want string
	}{
		{"running wins over newer finished", []*corev1.Pod{oldDone, newerFailed, running, formerStack, otherStack, unlabelled}, "web-runner-2,web-runner-3,web-runner-1"},
		{"newest finished", []*corev1.Pod{oldDone, newerFailed, formerStack}, "web-runner-3,web-runner-1"},
		{"none of this Stack", []*corev1.Pod{formerStack, otherStack, unlabelled}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cs := fake.NewClientset()
			for _, p := range tt.pods {
				if _, err := cs.CoreV1().Pods(p.Namespace).Create(context.Background(), p, metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			pods, err := runnerPods(context.Background(), cs, stack)
			if err != nil {
				t.Fatal(err)
			}
			var names []string
			for _, p := range pods {
				names = append(names, p.Name)
			}
			got := strings.Join(names, ",")
			if got != tt.want {
				t.Fatalf("picked %q, want %q", got, tt.want)
			}
		})
	}
}

func TestLogsSaysWhyNoRunnerPodExists(t *testing.T) {
	env, _ := apiServer(t)
	ns := env.Namespace(t)
	newStack(t, ns, "web", nil, readyAt(4))
	_, _, err := verb(t, "logs", "web", "-n", ns)
	mustFail(t, err, "no runner pod exists for Stack "+ns+"/web", "spec.runner.retain: true", "last outcome: Ready=True Applied: applied main@sha1:abc (release 4)")
	_, _, err = verb(t, "logs", "web", "-n", ns, "--previous")
	mustFail(t, err, "no runner pod exists for Stack "+ns+"/web")

	// One kept pod: it is the latest, and there is none before it.
	cs := kubernetes.NewForConfigOrDie(env.Config)
	stack := getStack(t, ns, "web")
	pod := runnerPod("web-runner-1", "web", stack.UID, corev1.PodSucceeded, time.Now())
	pod.Namespace = ns
	pod.Spec.Containers = []corev1.Container{{Name: runnerContainer, Image: "terrace"}}
	if _, err := cs.CoreV1().Pods(ns).Create(context.Background(), pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	_, _, err = verb(t, "logs", "web", "-n", ns, "--previous")
	mustFail(t, err, "has no runner pod before web-runner-1", "spec.runner.retain: true")

	_, _, err = verb(t, "logs", "gone", "-n", ns)
	mustFail(t, err, "Stack "+ns+"/gone not found in namespace "+ns)
}
