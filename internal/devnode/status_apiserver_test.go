package devnode

import (
	"context"
	"net/http"
	"sync/atomic"
	"testing"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/terrace-dev/terrace/internal/testenv"
)

// countedRequests counts the requests of a client.
type countedRequests struct {
	next http.RoundTripper
	n    *atomic.Int64
}

func (c countedRequests) RoundTrip(r *http.Request) (*http.Response, error) {
	c.n.Add(1)
	return c.next.RoundTrip(r)
}

// heldFirstPatch holds a client's first PATCH until release closes, having
// closed held.
type heldFirstPatch struct {
	next          http.RoundTripper
	patches       *atomic.Int64
	held, release chan struct{}
}

func (h heldFirstPatch) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Method == http.MethodPatch && h.patches.Add(1) == 1 {
		close(h.held)
		<-h.release
	}
	return h.next.RoundTrip(r)
}

// TestStatusWritesAgainstTheAPIServer checks, on a real kube-apiserver,
// that devnode writes a pod's status as one patch per change: none for an
// older copy of the pod, none of a conflict after another writer's change,
// nothing to another pod of the same name.
func TestStatusWritesAgainstTheAPIServer(t *testing.T) {
	env, err := testenv.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	var requests atomic.Int64
	cfg := rest.CopyConfig(env.Config)
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper { return countedRequests{next: rt, n: &requests} }
	cs := kubernetes.NewForConfigOrDie(cfg)
	ctx := context.Background()
	ns := env.Namespace(t)

	newPod := func(t *testing.T, name string) (*corev1.Pod, *podWorker) {
		t.Helper()
		pod, err := cs.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "main", Image: "terrace"}}},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		w := newPodWorker(&Node{client: cs, log: logr.Discard()}, pod)
		return pod, w
	}
	writes := func(t *testing.T, w *podWorker) int64 {
		t.Helper()
		before := requests.Load()
		if err := w.writeStatus(ctx); err != nil {
			t.Fatal(err)
		}
		return requests.Load() - before
	}
	sandboxUp := func(w *podWorker) {
		now := metav1.Now()
		w.update(func(s *podState) { s.podIP, s.startTime, s.sandboxReady = "127.0.0.9", &now, true })
	}

	t.Run("one patch per change, none for an older copy of the pod", func(t *testing.T) {
		created, w := newPod(t, "changes")
		sandboxUp(w)
		if n := writes(t, w); n != 1 {
			t.Fatalf("the first status took %d requests, want 1", n)
		}
		// The watch may deliver the pod as it was before that write: its
		// conditions have no transition times yet. Nothing changed.
		w.observe(created)
		if n := writes(t, w); n != 0 {
			t.Fatalf("an older copy of the pod made %d requests, want none", n)
		}
		w.update(func(s *podState) {
			now := metav1.Now()
			s.containers[0].runningSince, s.containers[0].pid, s.containers[0].started = &now, 42, true
		})
		if n := writes(t, w); n != 1 {
			t.Fatalf("the container's start took %d requests, want 1", n)
		}
		got, err := cs.CoreV1().Pods(ns).Get(ctx, "changes", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if got.Status.Phase != corev1.PodRunning || got.Status.PodIP != "127.0.0.9" || got.Status.ContainerStatuses[0].State.Running == nil {
			t.Fatalf("status not written: %+v", got.Status)
		}
	})

	t.Run("another writer's change costs no conflict and is kept", func(t *testing.T) {
		_, w := newPod(t, "relabelled")
		sandboxUp(w)
		if n := writes(t, w); n != 1 {
			t.Fatalf("the first status took %d requests, want 1", n)
		}
		// A claim relabels the pod; a readiness gate's owner sets its condition.
		if _, err := cs.CoreV1().Pods(ns).Patch(ctx, "relabelled", types.StrategicMergePatchType, []byte(`{"metadata":{"labels":{"run":"r1"}}}`), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
		gated, err := cs.CoreV1().Pods(ns).Patch(ctx, "relabelled", types.StrategicMergePatchType, []byte(`{"status":{"conditions":[{"type":"example.com/gate","status":"True"}]}}`), metav1.PatchOptions{}, "status")
		if err != nil {
			t.Fatal(err)
		}
		// Another writer's condition is theirs: devnode has nothing to write.
		w.observe(gated)
		if n := writes(t, w); n != 0 {
			t.Fatalf("another writer's condition made devnode write %d times, want none", n)
		}
		w.update(func(s *podState) {
			s.containers[0].terminated(&corev1.ContainerStateTerminated{ExitCode: 0, Reason: "Completed"})
			s.containers[0].final = true
		})
		if n := writes(t, w); n != 1 {
			t.Fatalf("the status after another writer's change took %d requests, want 1 (no conflict, no re-read)", n)
		}
		got, err := cs.CoreV1().Pods(ns).Get(ctx, "relabelled", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if got.Status.Phase != corev1.PodSucceeded || got.Labels["run"] != "r1" {
			t.Fatalf("phase %s, labels %v", got.Status.Phase, got.Labels)
		}
		if c := conditionOf(got.Status, "example.com/gate"); c.Status != corev1.ConditionTrue {
			t.Fatalf("the gate's condition was lost: %+v", got.Status.Conditions)
		}
	})

	t.Run("a write under way when the worker stops is sent once", func(t *testing.T) {
		// A pod's deletion ends its worker while the terminated status is
		// being written; the cleanup then writes the final status. Cutting
		// the first write off would leave devnode unsure it was applied,
		// and the same patch would go twice.
		_, w := newPod(t, "stopping")
		var patches atomic.Int64
		hold := heldFirstPatch{patches: &patches, held: make(chan struct{}), release: make(chan struct{})}
		held := rest.CopyConfig(env.Config)
		held.WrapTransport = func(rt http.RoundTripper) http.RoundTripper { hold.next = rt; return hold }
		w.node = &Node{client: kubernetes.NewForConfigOrDie(held), log: logr.Discard()}
		stop, loopDone := make(chan struct{}), make(chan struct{})
		go func() {
			defer close(loopDone)
			w.statusLoop(ctx, stop)
		}()
		sandboxUp(w)
		<-hold.held
		close(stop)
		close(hold.release)
		<-loopDone
		if err := w.writeStatus(ctx); err != nil {
			t.Fatal(err)
		}
		if n := patches.Load(); n != 1 {
			t.Fatalf("the status went in %d patches, want 1", n)
		}
		got, err := cs.CoreV1().Pods(ns).Get(ctx, "stopping", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if got.Status.PodIP != "127.0.0.9" {
			t.Fatalf("status not written: %+v", got.Status)
		}
	})

	t.Run("nothing is written to another pod of the same name", func(t *testing.T) {
		_, w := newPod(t, "replaced")
		zero := int64(0)
		if err := cs.CoreV1().Pods(ns).Delete(ctx, "replaced", metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
			t.Fatal(err)
		}
		successor, _ := newPod(t, "replaced")
		sandboxUp(w)
		if err := w.writeStatus(ctx); err != nil {
			t.Fatalf("a write for a pod that is gone must end quietly: %v", err)
		}
		got, err := cs.CoreV1().Pods(ns).Get(ctx, "replaced", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if got.UID != successor.UID || got.Status.PodIP != "" || got.Status.StartTime != nil {
			t.Fatalf("the old pod's status was written to its successor: %+v", got.Status)
		}
	})
	t.Run("a pod deleted without a grace period is written no more", func(t *testing.T) {
		_, w := newPod(t, "forced")
		sandboxUp(w)
		if n := writes(t, w); n != 1 {
			t.Fatalf("the first status took %d requests, want 1", n)
		}
		zero := int64(0)
		if err := cs.CoreV1().Pods(ns).Delete(ctx, "forced", metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
			t.Fatal(err)
		}
		// The watch shows the pod marked for deletion with no grace period
		// (the API server then removes it): a final status or delete
		// would only be refused.
		deleted := w.latest().DeepCopy()
		now := metav1.Now()
		deleted.DeletionTimestamp, deleted.DeletionGracePeriodSeconds = &now, &zero
		w.observe(deleted)
		w.update(func(s *podState) {
			s.containers[0].terminated(&corev1.ContainerStateTerminated{ExitCode: 137, Reason: "Error"})
			s.containers[0].final = true
		})
		if n := writes(t, w); n != 0 {
			t.Fatalf("the stopped pod's status took %d requests, want none", n)
		}
		// Its delete event says the object is gone: nothing deletes it.
		w.forget()
		w.mu.Lock()
		deletes := w.deleteObj && !w.removed()
		w.mu.Unlock()
		if deletes {
			t.Fatal("devnode would delete a pod object the API server already removed")
		}
	})
	t.Run("a pod a finalizer holds after a delete without grace is deleted by devnode", func(t *testing.T) {
		pod, w := newPod(t, "held")
		pod.Finalizers = []string{"example.com/hold"}
		if _, err := cs.CoreV1().Pods(ns).Update(ctx, pod, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_, _ = cs.CoreV1().Pods(ns).Patch(ctx, "held", types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`), metav1.PatchOptions{})
		})
		zero := int64(0)
		if err := cs.CoreV1().Pods(ns).Delete(ctx, "held", metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
			t.Fatal(err)
		}
		held, err := cs.CoreV1().Pods(ns).Get(ctx, "held", metav1.GetOptions{})
		if err != nil {
			t.Fatalf("the finalizer did not hold the pod: %v", err)
		}
		// No delete event comes while the finalizer holds the object:
		// devnode stops the pod and removes the object as a kubelet would.
		w.observe(held)
		w.mu.Lock()
		deletes := w.deleteObj && !w.removed()
		w.mu.Unlock()
		if !deletes {
			t.Fatal("devnode would leave a pod object that its delete event never removed")
		}
	})
}
