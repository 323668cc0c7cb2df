package devnode

import (
	"context"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// A pod deleted with no grace period waits for its delete event before
// devnode deletes the object itself: it ends the wait at once, and without
// it devnode goes on (the object is still there).
func TestAForcedDeleteWaitsForItsDeleteEvent(t *testing.T) {
	newWorker := func() *podWorker {
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns", UID: "u"},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "main", Image: "terrace"}}},
		}
		return newPodWorker(&Node{log: logr.Discard()}, pod)
	}

	w := newWorker()
	time.AfterFunc(20*time.Millisecond, w.forget)
	start := time.Now()
	if !w.awaitRemoval(context.Background()) {
		t.Fatal("the delete event did not end the wait with the object gone")
	}
	if waited := time.Since(start); waited >= forcedDeleteWait {
		t.Fatalf("waited %s for an event that came after 20ms", waited)
	}

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if newWorker().awaitRemoval(ctx) {
		t.Fatal("a pod whose delete event never came was taken for gone")
	}
}
