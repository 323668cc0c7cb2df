package launcher_test

import (
	"context"
	"errors"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/terrace-dev/terrace/internal/launcher"
	"github.com/terrace-dev/terrace/internal/testenv"
)

// The runner pod cache's informer starts and syncs with the cache, not
// under the first run's first request (which then waited ~100 ms for the
// sync), and the cache starts no informer of anything else.
func TestRunnerPodCacheWatchesFromItsStart(t *testing.T) {
	env, err := testenv.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ns := env.Namespace(t)
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "runner", Labels: map[string]string{launcher.LabelManagedBy: launcher.ManagedByTerrace, launcher.LabelComponent: launcher.ComponentRunner}},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "runner", Image: "terrace"}}},
	}
	if err := env.Client.Create(ctx, pod); err != nil {
		t.Fatal(err)
	}

	pods, err := launcher.NewRunnerPodCache(env.Config, env.Scheme, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = pods.Start(ctx) }()
	if !pods.WaitForCacheSync(ctx) {
		t.Fatal("the cache did not sync")
	}
	meta := &metav1.PartialObjectMetadata{}
	meta.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("Pod"))
	informer, err := pods.GetInformer(ctx, meta, cache.BlockUntilSynced(false))
	if err != nil {
		t.Fatal(err)
	}
	if !informer.HasSynced() {
		t.Error("the pod informer had not synced when the cache said it had: it was started by this read")
	}
	if err := pods.Get(ctx, client.ObjectKeyFromObject(pod), meta); err != nil {
		t.Fatalf("reading the runner pod from the synced cache: %v", err)
	}
	var notCached *cache.ErrResourceNotCached
	if err := pods.Get(ctx, client.ObjectKey{Namespace: ns, Name: "x"}, &corev1.Secret{}); !errors.As(err, &notCached) {
		t.Errorf("reading a Secret through the runner pod cache: %v, want it refused as not cached", err)
	}

	// With the controller's --watch-namespaces, the cache holds the runner
	// pods of those namespaces only: a runner pod elsewhere is never seen,
	// so no run there can be current.
	watched := env.Namespace(t)
	inWatched := pod.DeepCopy()
	inWatched.Namespace, inWatched.ResourceVersion = watched, ""
	if err := env.Client.Create(ctx, inWatched); err != nil {
		t.Fatal(err)
	}
	restricted, err := launcher.NewRunnerPodCache(env.Config, env.Scheme, nil, []string{watched})
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = restricted.Start(ctx) }()
	if !restricted.WaitForCacheSync(ctx) {
		t.Fatal("the restricted cache did not sync")
	}
	if err := restricted.Get(ctx, client.ObjectKeyFromObject(inWatched), meta); err != nil {
		t.Errorf("a runner pod in the watched namespace: %v", err)
	}
	if err := restricted.Get(ctx, client.ObjectKeyFromObject(pod), meta); err == nil {
		t.Errorf("the cache restricted to %s read the runner pod in %s", watched, ns)
	}
}
