package httpbackend_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/uuid"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/launcher"
	"github.com/terrace-dev/terrace/internal/scheme"
)

// runRegistry plays the controller's part in the fixture: it records a
// Stack's current run and creates and deletes runner pods, the objects
// launcher.StackRuns decides from. The cache and the live reader are
// the same fake client here; StackRuns' cache fallback is tested on its own.
type runRegistry struct {
	client  client.Client
	checker *launcher.StackRuns
}

func newRunRegistry(t *testing.T) *runRegistry {
	t.Helper()
	c := fake.NewClientBuilder().WithScheme(scheme.New()).Build()
	return &runRegistry{client: c, checker: &launcher.StackRuns{Stacks: c, Pods: c, Live: c}}
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
	if err := r.client.Create(ctx, runnerPod(ns, stack, runID, runPodUID(ns, stack, runID))); err != nil {
		t.Fatal(err)
	}
}

// startPullRequestRun records runID as the plan-only run of pull request
// number in the Stack's status.pullRequests, with a runner pod.
func (r *runRegistry) startPullRequestRun(t *testing.T, ns, stack string, number int64, runID string) {
	t.Helper()
	ctx := context.Background()
	st := &terracev1.Stack{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: stack}}
	if err := r.client.Get(ctx, client.ObjectKeyFromObject(st), st); err != nil {
		t.Fatal(err)
	}
	st.Status.PullRequests = append(st.Status.PullRequests, terracev1.PullRequestPlan{Number: number, RunID: runID, Status: terracev1.PullRequestPlanPending})
	if err := r.client.Update(ctx, st); err != nil {
		t.Fatal(err)
	}
	if err := r.client.Create(ctx, runnerPod(ns, stack, runID, runPodUID(ns, stack, runID))); err != nil {
		t.Fatal(err)
	}
}

// runnerPod is the runner pod of a run as the launcher makes it.
func runnerPod(ns, stack, runID string, uid types.UID) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: launcher.PodName(stack, runID), UID: uid, Labels: map[string]string{
		launcher.LabelManagedBy: launcher.ManagedByTerrace, launcher.LabelComponent: launcher.ComponentRunner,
		launcher.LabelStack: launcher.StackLabelValue(stack), launcher.LabelRun: runID,
	}}}
}

// runPodUID is the UID the API server gave the runner pod of a run: the
// same in every registry of a test (a cache and the API server see one pod).
func runPodUID(ns, stack, runID string) types.UID {
	sum := sha256.Sum256([]byte(ns + "/" + stack + "/" + runID))
	h := hex.EncodeToString(sum[:16])
	return types.UID(h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:32])
}

// podUID is the UID of the runner pod of a run, cold or claimed warm, ""
// when it has none: what the launcher binds the run's certificate to.
func (r *runRegistry) podUID(t *testing.T, ns, stack, runID string) string {
	t.Helper()
	for _, name := range []string{launcher.PodName(stack, runID), launcher.WarmPodName(runID)} {
		pod := &corev1.Pod{}
		err := r.client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, pod)
		if err == nil {
			return string(pod.UID)
		}
		if !apierrors.IsNotFound(err) {
			t.Fatal(err)
		}
	}
	return ""
}

// recreatePod is the attack: the run's pod is deleted and created again
// under its name, with its labels (and, outside this registry, a copy of
// its TLS Secret). The API server gives the new pod another UID.
func (r *runRegistry) recreatePod(t *testing.T, ns, stack, runID string) {
	t.Helper()
	ctx := context.Background()
	pod := runnerPod(ns, stack, runID, "")
	if err := r.client.Delete(ctx, pod); err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	pod.UID = uuid.NewUUID()
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
