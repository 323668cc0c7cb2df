package httpbackend_test

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/launcher"
	"github.com/terrace-dev/terrace/internal/scheme"
	"github.com/terrace-dev/terrace/internal/state/httpbackend"
)

// runRegistry plays the controller's part in the fixture: it records a
// Stack's current run and creates and deletes runner pods, the objects
// httpbackend.StackRuns decides from. The cache and the live reader are
// the same fake client here; StackRuns' cache fallback is tested on its own.
type runRegistry struct {
	client  client.Client
	checker *httpbackend.StackRuns
}

func newRunRegistry(t *testing.T) *runRegistry {
	t.Helper()
	c := fake.NewClientBuilder().WithScheme(scheme.New()).Build()
	return &runRegistry{client: c, checker: &httpbackend.StackRuns{Stacks: c, Pods: c, Live: c}}
}

// startRun makes runID the Stack's current run, with a runner pod, as
// announceRun and the launcher do.
func (r *runRegistry) startRun(t *testing.T, ns, stack, runID string) {
	t.Helper()
	ctx := context.Background()
	st := &terracev1.Stack{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: stack}}
	err := r.client.Get(ctx, client.ObjectKeyFromObject(st), st)
	switch {
	case apierrors.IsNotFound(err):
		st.Status.CurrentRun = runID
		err = r.client.Create(ctx, st)
	case err == nil:
		st.Status.CurrentRun = runID
		err = r.client.Update(ctx, st)
	}
	if err != nil {
		t.Fatal(err)
	}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: launcher.PodName(stack, runID), Labels: map[string]string{
		launcher.LabelManagedBy: launcher.ManagedByTerrace, launcher.LabelComponent: launcher.ComponentRunner,
		launcher.LabelStack: launcher.StackLabelValue(stack), launcher.LabelRun: runID,
	}}}
	if err := r.client.Create(ctx, pod); err != nil {
		t.Fatal(err)
	}
}

// endRun deletes the run's runner pod, as the launcher does when a run ends.
func (r *runRegistry) endRun(t *testing.T, ns, stack, runID string) {
	t.Helper()
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: launcher.PodName(stack, runID)}}
	if err := r.client.Delete(context.Background(), pod); err != nil {
		t.Fatal(err)
	}
}

// retain marks the run's pod kept for debugging, as Retain does at the end of a run.
func (r *runRegistry) retain(t *testing.T, ns, stack, runID string) {
	t.Helper()
	pod := &corev1.Pod{}
	if err := r.client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: launcher.PodName(stack, runID)}, pod); err != nil {
		t.Fatal(err)
	}
	pod.Annotations = map[string]string{launcher.AnnotationRetained: "true"}
	if err := r.client.Update(context.Background(), pod); err != nil {
		t.Fatal(err)
	}
}
