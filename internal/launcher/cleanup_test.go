package launcher

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/runphase"
)

func TestCleanupRemovesLeftovers(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	// A former controller (another Launcher) left a run mid-way.
	orphan := f.formerRun("old")
	// A Secret whose pod was never created (crash between the two creations).
	half := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "web-runner-half-tls", Namespace: f.stack.Namespace, Labels: runLabels("web", "half", ComponentRunnerTLS)}}
	if _, err := f.cs.CoreV1().Secrets(f.stack.Namespace).Create(ctx, half, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// A state Secret of the same Stack must survive.
	state := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "tfstate", Namespace: f.stack.Namespace, Labels: map[string]string{LabelStack: "web", LabelManagedBy: "terrace"}}}
	if _, err := f.cs.CoreV1().Secrets(f.stack.Namespace).Create(ctx, state, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	// This Launcher's own live run is kept.
	mine := f.startAsync(ctx, f.spec("new"))
	f.playKubelet("new")
	current := f.await(mine, 20*time.Second)
	if current.err != nil {
		t.Fatal(current.err)
	}
	defer func() { _ = current.run.Close(ctx) }()

	if err := f.launcher.Cleanup(ctx, f.stack.Namespace, "web"); err != nil {
		t.Fatalf("Cleanup: %v", err)
	}
	f.podGone("old")
	f.secretGone("old")
	f.secretGone("half")
	// The former controller's run learns its runner is gone.
	if term := waitDone(t, orphan.run); term.Reason != "Deleted" {
		t.Errorf("orphan reason = %s", term.Reason)
	}
	if _, err := f.cs.CoreV1().Secrets(f.stack.Namespace).Get(ctx, "tfstate", metav1.GetOptions{}); err != nil {
		t.Errorf("Cleanup touched a state Secret: %v", err)
	}
	if _, err := f.cs.CoreV1().Pods(f.stack.Namespace).Get(ctx, current.run.Pod().Name, metav1.GetOptions{}); err != nil {
		t.Errorf("Cleanup removed the live run's pod: %v", err)
	}
	if current.run.Err() != nil {
		t.Errorf("live run ended: %v", current.run.Err())
	}
	_ = orphan.run.Close(ctx)
}

func TestRetain(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	retained := func(runID string) RunSpec {
		s := f.spec(runID)
		s.Retain = true
		return s
	}
	first := f.startReady(retained("one"))
	if err := first.Close(ctx); err != nil {
		t.Fatal(err)
	}
	pod, err := f.cs.CoreV1().Pods(f.stack.Namespace).Get(ctx, first.Pod().Name, metav1.GetOptions{})
	if err != nil || pod.Annotations[AnnotationRetained] != "true" {
		t.Fatalf("retained pod = %v, %v", pod.GetAnnotations(), err)
	}
	f.secret("one")
	// Cleanup leaves retained pods alone.
	if err := f.launcher.Cleanup(ctx, f.stack.Namespace, "web"); err != nil {
		t.Fatal(err)
	}
	if _, err := f.cs.CoreV1().Pods(f.stack.Namespace).Get(ctx, first.Pod().Name, metav1.GetOptions{}); err != nil {
		t.Fatalf("Cleanup removed a retained pod: %v", err)
	}
	f.secret("one")

	// The next retained run replaces it: one retained pod per Stack.
	second := f.startReady(retained("two"))
	if err := second.Close(ctx); err != nil {
		t.Fatal(err)
	}
	f.podGone("one")
	f.secretGone("one")
	if _, err := f.cs.CoreV1().Pods(f.stack.Namespace).Get(ctx, second.Pod().Name, metav1.GetOptions{}); err != nil {
		t.Fatalf("the latest retained pod is gone: %v", err)
	}
}

func TestCleanupRunRemovesWhatAnUncleanStopLeft(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	orphan := f.formerRun("old")
	defer func() { _ = orphan.run.Close(ctx) }()
	// The Secret of a run whose pod was never created (the controller
	// stopped between the two creations), named after its run.
	half := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: secretName(PodName("web", "half")), Namespace: f.stack.Namespace, Labels: runLabels("web", "half", ComponentRunnerTLS)}}
	if _, err := f.cs.CoreV1().Secrets(f.stack.Namespace).Create(ctx, half, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	mine := f.startReady(f.spec("new"))

	f.eventually(10*time.Second, "the orphan is not among the leftovers", func(ctx context.Context) (bool, error) {
		ids, err := f.launcher.Leftovers(ctx, f.stack.Namespace, "web")
		return len(ids) == 1 && ids[0] == "old", err
	})
	if err := f.launcher.CleanupRun(ctx, f.stack.Namespace, "web", "half"); err != nil {
		t.Fatalf("CleanupRun: %v", err)
	}
	f.podGone("old")
	f.secretGone("old")
	f.secretGone("half")
	if term := waitDone(t, orphan.run); term.Reason != "Deleted" {
		t.Errorf("orphan reason = %s", term.Reason)
	}
	if mine.Err() != nil {
		t.Errorf("live run ended: %v", mine.Err())
	}
	f.eventually(10*time.Second, "leftovers remain after CleanupRun", func(ctx context.Context) (bool, error) {
		ids, err := f.launcher.Leftovers(ctx, f.stack.Namespace, "web")
		return len(ids) == 0, err
	})
}

// TestRunsShareOneWatch starts runs of several Stacks at once: each learns
// of its own pod's death, and only of its own.
func TestRunsShareOneWatch(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	other := &terracev1.Stack{
		ObjectMeta: metav1.ObjectMeta{Name: "api", Namespace: f.stack.Namespace},
		Spec:       f.stack.Spec,
	}
	if err := env.Client.Create(ctx, other); err != nil {
		t.Fatal(err)
	}
	web := f.startReady(f.spec("r1"))
	apiSpec := f.spec("r1")
	apiSpec.Stack = other
	ch := f.startAsync(ctx, apiSpec)
	pod := func() *corev1.Pod {
		var p *corev1.Pod
		f.eventually(10*time.Second, "the api runner pod never appeared", func(ctx context.Context) (bool, error) {
			got, err := f.cs.CoreV1().Pods(other.Namespace).Get(ctx, PodName("api", "r1"), metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				return false, nil
			}
			p = got
			return err == nil, err
		})
		return p
	}()
	// The Secret follows its pod.
	var secret *corev1.Secret
	f.eventually(10*time.Second, "the api runner's Secret never appeared", func(ctx context.Context) (bool, error) {
		got, err := f.cs.CoreV1().Secrets(other.Namespace).Get(ctx, secretName(pod.Name), metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		secret = got
		return err == nil, err
	})
	ip := f.nextPodIP()
	f.serveRunner(secret, ip)
	pods := f.cs.CoreV1().Pods(other.Namespace)
	pod.Status = corev1.PodStatus{}
	running(ip, false)(&pod.Status)
	if _, err := pods.UpdateStatus(ctx, pod, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	res := f.await(ch, 20*time.Second)
	if res.err != nil {
		t.Fatalf("Start of the second Stack's run: %v", res.err)
	}
	api := res.run
	defer func() { _ = api.Close(ctx) }()

	if err := pods.Delete(ctx, api.Pod().Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if term := waitDone(t, api); term.Reason != "Deleted" {
		t.Errorf("reason = %s", term.Reason)
	}
	if web.Err() != nil {
		t.Errorf("the other Stack's run ended with it: %v", web.Err())
	}
}

// TestRunsListNothing: runs share the launcher's one watch of runner pods;
// starting and closing runs lists nothing, whatever the namespace holds.
func TestRunsListNothing(t *testing.T) {
	log, counted := countedClient(t)
	f := newFixture(t, func(o *Options) { o.Client = counted })
	for _, id := range []string{"r1", "r2", "r3"} {
		spec := f.spec(id)
		spec.Timings = &runphase.Timings{}
		run := f.startReady(spec)
		if d, ok := spec.Timings.Get(runphase.Pod); !ok || d != run.StartDuration() {
			t.Errorf("pod phase = %s (%v), want the start duration %s", d, ok, run.StartDuration())
		}
		if err := run.Close(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	// The shared watch starts with a streamed list (one WATCH) or, where
	// the server cannot stream one, a LIST and a WATCH: both cluster-wide.
	shared := log.count("LIST /api/v1/pods") + log.count("WATCH /api/v1/pods")
	if all := log.count("LIST") + log.count("WATCH"); shared < 1 || shared > 2 || all != shared {
		t.Errorf("%d Lists and watches for three runs, want only the shared watch's:\n%s", all, strings.Join(log.calls, "\n"))
	}
	// Per run: create the pod and its Secret, owned by the pod, and delete
	// the pod (the Secret goes with it).
	if n := len(log.calls) - log.count("LIST") - log.count("WATCH"); n != 3*3 {
		t.Errorf("%d other requests for three runs, want 3 a run:\n%s", n, strings.Join(log.calls, "\n"))
	}
}

// TestRunsWatchOnlyTheListedNamespaces: restricted to namespaces (the
// controller's --watch-namespaces, where the namespaced install mode binds
// its rights), the shared watch of runner pods is made in each of them and
// never cluster-wide, where the controller may not list pods at all; a run
// still starts and learns of its pod's death, and a namespace outside the
// list is answered with an error, not an empty list.
func TestRunsWatchOnlyTheListedNamespaces(t *testing.T) {
	log, counted := countedClient(t)
	f := newFixture(t, func(o *Options) { o.Client = counted })
	other := env.Namespace(t)
	opts := f.launcher.opts
	opts.Namespaces = []string{f.stack.Namespace, other}
	restricted, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(restricted.Stop)
	f.launcher.Stop()
	f.launcher = restricted

	run := f.startReady(f.spec("r1"))
	if err := f.cs.CoreV1().Pods(f.stack.Namespace).Delete(context.Background(), run.Pod().Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if term := waitDone(t, run); term.Reason != "Deleted" {
		t.Errorf("reason = %s, want Deleted", term.Reason)
	}
	if _, err := restricted.ActiveRuns(context.Background(), "kube-system"); err == nil || !strings.Contains(err.Error(), "--watch-namespaces") {
		t.Errorf("ActiveRuns of an unwatched namespace: %v, want an error naming --watch-namespaces", err)
	}

	if all := log.count("LIST /api/v1/pods") + log.count("WATCH /api/v1/pods"); all != 0 {
		t.Errorf("%d cluster-wide Lists or watches of pods:\n%s", all, strings.Join(log.calls, "\n"))
	}
	for _, ns := range opts.Namespaces {
		if n := log.count("LIST /api/v1/namespaces/"+ns+"/pods") + log.count("WATCH /api/v1/namespaces/"+ns+"/pods"); n < 1 {
			t.Errorf("no watch of runner pods in %s:\n%s", ns, strings.Join(log.calls, "\n"))
		}
	}
}

// countedClient is a client of the test API server whose requests log records.
func countedClient(t *testing.T) (*requestLog, kubernetes.Interface) {
	t.Helper()
	log := &requestLog{}
	cfg := rest.CopyConfig(env.Config)
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { log.next = rt; return log })
	counted, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return log, counted
}
