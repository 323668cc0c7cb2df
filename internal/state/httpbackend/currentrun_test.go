package httpbackend_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/launcher"
)

// countingReader counts the reads that reach the API server.
type countingReader struct {
	client.Reader
	gets atomic.Int64
}

func (c *countingReader) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	c.gets.Add(1)
	return c.Reader.Get(ctx, key, obj, opts...)
}

// failingReader is a cache that has not started.
type failingReader struct{ client.Reader }

func (failingReader) Get(context.Context, client.ObjectKey, client.Object, ...client.GetOption) error {
	return errors.New("the cache is not started")
}

func TestStackRunsTrustsTheAPIServerOverItsCache(t *testing.T) {
	ctx := t.Context()
	stale, live := newRunRegistry(t), newRunRegistry(t)
	stale.startRun(t, "ns", "app", "run-1")
	live.startRun(t, "ns", "app", "run-1")
	live.endRun(t, "ns", "app", "run-1")
	live.startRun(t, "ns", "app", "run-2")
	api := &countingReader{Reader: live.client}
	runs := &launcher.StackRuns{Stacks: stale.client, Pods: stale.client, Live: api}

	// The cache still shows run-1; the API server knows run-2 started.
	if ok, err := runs.IsCurrentRun(ctx, "ns", "app", "run-2", string(runPodUID("ns", "app", "run-2"))); err != nil || !ok {
		t.Fatalf("a run the cache has not seen yet: %v %v, want current", ok, err)
	}
	// Once the cache has caught up too, the ended run is refused.
	stale.endRun(t, "ns", "app", "run-1")
	if ok, err := runs.IsCurrentRun(ctx, "ns", "app", "run-1", string(runPodUID("ns", "app", "run-1"))); err != nil || ok {
		t.Fatalf("an ended run: %v %v, want refused", ok, err)
	}
	// A refused run is refused again without asking the API server, even
	// if a pod of its name reappears (a tenant may create pods).
	stale.startRun(t, "ns", "app", "run-1")
	before := api.gets.Load()
	for range 100 {
		if ok, _ := runs.IsCurrentRun(ctx, "ns", "app", "run-1", string(runPodUID("ns", "app", "run-1"))); ok {
			t.Fatal("an ended run became current")
		}
	}
	if n := api.gets.Load() - before; n != 0 {
		t.Fatalf("100 requests with an ended run's certificate made %d API reads", n)
	}
	// A cache that cannot answer falls back to the API server.
	runs = &launcher.StackRuns{Stacks: failingReader{}, Pods: failingReader{}, Live: live.client}
	if ok, err := runs.IsCurrentRun(ctx, "ns", "app", "run-2", string(runPodUID("ns", "app", "run-2"))); err != nil || !ok {
		t.Fatalf("with the cache down: %v %v, want current", ok, err)
	}
	if ok, err := runs.IsCurrentRun(ctx, "ns", "other", "run-2", string(runPodUID("ns", "other", "run-2"))); err != nil || ok {
		t.Fatalf("a run of a Stack that does not exist: %v %v", ok, err)
	}
	// A pod of the run's name without Terrace's labels is not its runner.
	live.startRun(t, "ns", "web", "run-3")
	pod := &corev1.Pod{}
	if err := live.client.Get(ctx, client.ObjectKey{Namespace: "ns", Name: launcher.PodName("web", "run-3")}, pod); err != nil {
		t.Fatal(err)
	}
	pod.Labels = nil
	if err := live.client.Update(ctx, pod); err != nil {
		t.Fatal(err)
	}
	if ok, err := runs.IsCurrentRun(ctx, "ns", "web", "run-3", string(runPodUID("ns", "web", "run-3"))); err != nil || ok {
		t.Fatalf("a run whose pod lacks Terrace's labels: %v %v, want refused", ok, err)
	}
}

// warmPodUID is the UID of the warm pod of the tests: a claim binds the
// run's certificate to it.
const warmPodUID = "9a8b7c6d-5e4f-4a3b-8c2d-1e0f9a8b7c6d"

// TestStackRunsFindsAClaimedWarmPod: a run that claimed a warm pod is
// current while the pod (named after the run ID alone) carries its labels;
// an unclaimed warm pod of the same name makes no run current.
func TestStackRunsFindsAClaimedWarmPod(t *testing.T) {
	ctx := t.Context()
	reg := newRunRegistry(t)
	reg.startRun(t, "ns", "app", "run-0")
	st := &terracev1.Stack{}
	if err := reg.client.Get(ctx, client.ObjectKey{Namespace: "ns", Name: "app"}, st); err != nil {
		t.Fatal(err)
	}
	st.Status.CurrentRun = "warm1"
	if err := reg.client.Update(ctx, st); err != nil {
		t.Fatal(err)
	}
	warm := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: launcher.WarmPodName("warm1"), UID: warmPodUID, Labels: map[string]string{
		launcher.LabelManagedBy: launcher.ManagedByTerrace, launcher.LabelComponent: launcher.ComponentRunner, launcher.LabelWarmClass: "c1",
	}}}
	if err := reg.client.Create(ctx, warm); err != nil {
		t.Fatal(err)
	}
	if ok, err := reg.checker.IsCurrentRun(ctx, "ns", "app", "warm1", warmPodUID); err != nil || ok {
		t.Fatalf("a run whose warm pod is not claimed yet: %v %v, want refused", ok, err)
	}
	runs := &launcher.StackRuns{Stacks: reg.client, Pods: reg.client, Live: reg.client}
	warm.Labels[launcher.LabelStack], warm.Labels[launcher.LabelRun] = "app", "warm1"
	if err := reg.client.Update(ctx, warm); err != nil {
		t.Fatal(err)
	}
	if ok, err := runs.IsCurrentRun(ctx, "ns", "app", "warm1", warmPodUID); err != nil || !ok {
		t.Fatalf("a run that claimed its warm pod: %v %v, want current", ok, err)
	}
	if ok, err := runs.IsCurrentRun(ctx, "ns", "other", "warm1", warmPodUID); err != nil || ok {
		t.Fatalf("the claimed warm pod for another Stack's run: %v %v, want refused", ok, err)
	}
}

// TestStackRunsAsksForTheWarmPodTheCacheKnows: when the cache has the
// claimed warm pod but not yet the claim's labels, the API server is asked
// for the Stack and that pod only, not first for a cold pod of the run.
func TestStackRunsAsksForTheWarmPodTheCacheKnows(t *testing.T) {
	ctx := t.Context()
	cached, live := newRunRegistry(t), newRunRegistry(t)
	warmPod := func(reg *runRegistry, claimed bool) {
		labels := map[string]string{launcher.LabelManagedBy: launcher.ManagedByTerrace, launcher.LabelComponent: launcher.ComponentRunner, launcher.LabelWarmClass: "c1"}
		if claimed {
			labels[launcher.LabelStack], labels[launcher.LabelRun] = "app", "warm1"
		}
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: launcher.WarmPodName("warm1"), UID: warmPodUID, Labels: labels}}
		if err := reg.client.Create(ctx, pod); err != nil {
			t.Fatal(err)
		}
		st := &terracev1.Stack{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "app"}, Status: terracev1.StackStatus{CurrentRun: "warm1"}}
		if err := reg.client.Create(ctx, st); err != nil {
			t.Fatal(err)
		}
	}
	warmPod(cached, false)
	warmPod(live, true)
	api := &countingReader{Reader: live.client}
	runs := &launcher.StackRuns{Stacks: cached.client, Pods: cached.client, Live: api}
	if ok, err := runs.IsCurrentRun(ctx, "ns", "app", "warm1", warmPodUID); err != nil || !ok {
		t.Fatalf("a claim the cache has not seen yet: %v %v, want current", ok, err)
	}
	if n := api.gets.Load(); n != 2 {
		t.Fatalf("the API server was read %d times, want 2 (the Stack, the warm pod)", n)
	}
}

// The attack: someone who may create pods and read Secrets in the Stack's
// namespace deletes a run's pod (or waits until it is gone) and creates it
// again under its name, with its labels and a copy of its TLS Secret. The
// run's certificate is bound to the first pod's UID; the new pod has
// another, and the run is refused, by the cache and by the API server, and
// for good. A certificate bound to no pod opens nothing.
func TestStackRunsRefusesARecreatedRunnerPod(t *testing.T) {
	ctx := t.Context()
	reg := newRunRegistry(t)
	reg.startRun(t, "ns", "app", "run-1")
	issuedFor := string(runPodUID("ns", "app", "run-1"))
	runs := &launcher.StackRuns{Stacks: reg.client, Pods: reg.client, Live: reg.client}
	if ok, err := runs.IsCurrentRun(ctx, "ns", "app", "run-1", issuedFor); err != nil || !ok {
		t.Fatalf("the run from the pod its certificate was issued for: %v %v, want current", ok, err)
	}
	if ok, err := runs.IsCurrentRun(ctx, "ns", "app", "run-1", ""); err != nil || ok {
		t.Fatalf("a certificate of the run bound to no pod: %v %v, want refused", ok, err)
	}
	reg.recreatePod(t, "ns", "app", "run-1")
	if ok, err := runs.IsCurrentRun(ctx, "ns", "app", "run-1", issuedFor); err != nil || ok {
		t.Fatalf("the run's certificate once its pod was created again: %v %v, want refused", ok, err)
	}
	// Even the new pod's own UID opens nothing: the run is over.
	if ok, err := runs.IsCurrentRun(ctx, "ns", "app", "run-1", reg.podUID(t, "ns", "app", "run-1")); err != nil || ok {
		t.Fatalf("the run, with the UID of the pod created again: %v %v, want refused", ok, err)
	}
}
