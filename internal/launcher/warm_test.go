package launcher

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/terrace-dev/terrace/internal/pki"
	"github.com/terrace-dev/terrace/internal/runnerpolicy"
)

// startWarmReady starts a warm pod and plays the kubelet and a warm runner for it.
func (f *fixture) startWarmReady() *Run {
	f.t.Helper()
	type result struct {
		run *Run
		err error
	}
	ch := make(chan result, 1)
	go func() {
		run, err := f.launcher.StartWarm(context.Background(), WarmSpec{Namespace: f.stack.Namespace, Run: RunSpec{ServiceAccountName: "deployer"}})
		ch <- result{run, err}
	}()
	var pod corev1.Pod
	f.eventually(10*time.Second, "warm pod never appeared", func(ctx context.Context) (bool, error) {
		pods, err := f.cs.CoreV1().Pods(f.stack.Namespace).List(ctx, metav1.ListOptions{LabelSelector: LabelWarmClass})
		if err != nil || len(pods.Items) == 0 {
			return false, err
		}
		pod = pods.Items[len(pods.Items)-1]
		return true, nil
	})
	var secret *corev1.Secret
	f.eventually(noticeWithin, "the warm pod's Secret, which follows the pod", func(ctx context.Context) (bool, error) {
		var err error
		secret, err = f.cs.CoreV1().Secrets(f.stack.Namespace).Get(ctx, secretName(pod.Name), metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		return err == nil, err
	})
	ip := f.nextPodIP()
	f.serveRunnerWarm(secret, ip, true)
	f.setPodStatus(pod.Name, running(ip, true))
	select {
	case res := <-ch:
		if res.err != nil {
			f.t.Fatalf("StartWarm: %v", res.err)
		}
		return res.run
	case <-time.After(20 * time.Second):
		f.t.Fatal("StartWarm did not return")
		return nil
	}
}

// TestWarmPodIsClaimedOnceWithTheRunsCredentials: a warm pod starts with
// its class identity, no owner, no deadline and no Stack; a run claims it,
// which gives it the run's labels, the Stack as owner and a deadline; it
// is never claimed again, and closing the run removes it.
func TestWarmPodIsClaimedOnceWithTheRunsCredentials(t *testing.T) {
	f := newFixture(t)
	w := f.startWarmReady()
	ctx := context.Background()
	pods := f.cs.CoreV1().Pods(f.stack.Namespace)
	pod, err := pods.Get(ctx, w.Pod().Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(pod.OwnerReferences) != 0 || pod.Spec.ActiveDeadlineSeconds != nil || pod.Labels[LabelStack] != "" || pod.Labels[LabelRun] != "" {
		t.Errorf("warm pod before its claim: owners %v, deadline %v, labels %v", pod.OwnerReferences, pod.Spec.ActiveDeadlineSeconds, pod.Labels)
	}
	if !slices.Contains(pod.Spec.Containers[0].Args, "--warm") {
		t.Errorf("warm pod's runner args %v lack --warm", pod.Spec.Containers[0].Args)
	}
	if _, _, _, ok := w.Identity().RunnerClass(); !ok {
		t.Errorf("warm pod's identity %s is not a runner class identity", w.Identity())
	}
	if _, err := w.Client().Init(ctx, nil, nil); err == nil {
		t.Error("the unclaimed warm runner accepted an operation")
	}

	run, err := f.launcher.Claim(ctx, w, f.spec(w.ID()))
	if err != nil {
		t.Fatalf("Claim: %v", err)
	}
	if err := run.Labelled(ctx); err != nil {
		t.Fatalf("Labelled: %v", err)
	}
	pod, err = pods.Get(ctx, w.Pod().Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if pod.Labels[LabelStack] != f.stack.Name || pod.Labels[LabelRun] != w.ID() {
		t.Errorf("claimed pod's labels = %v, want the Stack's and run %s", pod.Labels, w.ID())
	}
	if len(pod.OwnerReferences) != 1 || pod.OwnerReferences[0].UID != f.stack.UID {
		t.Errorf("claimed pod's owners = %v, want the Stack", pod.OwnerReferences)
	}
	if pod.Spec.ActiveDeadlineSeconds == nil {
		t.Error("claimed pod has no deadline")
	}
	if _, err := f.launcher.Claim(ctx, w, f.spec(w.ID())); err == nil {
		t.Error("a warm pod was claimed a second time")
	}
	if run.Err() != nil {
		t.Fatalf("the second claim ended the first run: %v", run.Err())
	}
	if err := run.Close(ctx); err != nil {
		t.Fatal(err)
	}
	f.gone("claimed warm pod", func(ctx context.Context) error {
		_, err := pods.Get(ctx, w.Pod().Name, metav1.GetOptions{})
		return err
	})
	f.secretGoesWithPod(w.Pod().Name)
}

// TestClaimRefusesARunOfAnotherID: the run's ID is the warm pod's (the
// state server finds the run's pod by it), and the refused pod is deleted.
func TestClaimRefusesARunOfAnotherID(t *testing.T) {
	f := newFixture(t)
	w := f.startWarmReady()
	if _, err := f.launcher.Claim(context.Background(), w, f.spec("someotherid")); err == nil {
		t.Fatal("a run of another ID claimed the warm pod")
	}
	f.gone("refused warm pod", func(ctx context.Context) error {
		_, err := f.cs.CoreV1().Pods(f.stack.Namespace).Get(ctx, w.Pod().Name, metav1.GetOptions{})
		return err
	})
}

func TestClaimRefusesAReadOnlyRun(t *testing.T) {
	f := newFixture(t)
	w := f.startWarmReady()
	spec := f.spec(w.ID())
	spec.ReadOnly = true
	if _, err := f.launcher.Claim(context.Background(), w, spec); !errors.Is(err, ErrInvalidSpec) {
		t.Fatalf("a read-only run claimed a warm pod: %v", err)
	}
}

// TestClaimChecksTheRunnerPolicy: the runner policy holds for a warm pod's
// run as for a cold one: a run whose image the policy refuses cannot claim
// it, gets ErrPolicyViolation, and the pod is deleted, never handed on.
func TestClaimChecksTheRunnerPolicy(t *testing.T) {
	f := newFixture(t)
	w := f.startWarmReady()
	onlyDefault, _ := runnerpolicy.Resolve(runnerpolicy.Layer{Source: "terrace-system/default"}, nil, "ghcr.io/terrace-dev/terrace:v1")
	spec := f.spec(w.ID())
	spec.Image, spec.Policy = "evil.example/runner:latest", &onlyDefault
	if _, err := f.launcher.Claim(context.Background(), w, spec); !errors.Is(err, ErrPolicyViolation) {
		t.Fatalf("Claim with an image the policy refuses answered %v, want ErrPolicyViolation", err)
	}
	f.gone("refused warm pod", func(ctx context.Context) error {
		_, err := f.cs.CoreV1().Pods(f.stack.Namespace).Get(ctx, w.Pod().Name, metav1.GetOptions{})
		return err
	})
}

// TestClaimFailsWhenTheRunnerRefusesTheCertificate: the pod is relabelled
// while the runner is handed the run's certificate; when the runner
// refuses it (here: claimed already, behind the launcher's back), Claim
// reports the runner's answer once the relabel is done, and the pod, now
// labelled for the run, is deleted, never used for it.
func TestClaimFailsWhenTheRunnerRefusesTheCertificate(t *testing.T) {
	f := newFixture(t)
	w := f.startWarmReady()
	ctx := context.Background()
	other, err := f.authority.Issue(pki.LeafRequest{Identity: pki.RunnerIdentity(f.stack.Namespace, f.stack.Name, "someotherrun"), Validity: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Client().Claim(ctx, other); err != nil {
		t.Fatalf("claiming the warm runner directly: %v", err)
	}
	_, err = f.launcher.Claim(ctx, w, f.spec(w.ID()))
	if err == nil || !strings.Contains(err.Error(), "already claimed") {
		t.Fatalf("Claim of a runner claimed already answered %v, want the runner's refusal", err)
	}
	f.gone("warm pod whose runner refused the claim", func(ctx context.Context) error {
		_, err := f.cs.CoreV1().Pods(f.stack.Namespace).Get(ctx, w.Pod().Name, metav1.GetOptions{})
		return err
	})
}

// TestClaimReportsAFailedRelabelThroughLabelled: Claim returns once the
// runner holds the run's certificate; a relabel the API server does not
// take (here every pod PATCH of the launcher fails) is the run's Labelled
// error, so nothing that reaches the state server starts, and closing the
// run removes the pod.
func TestClaimReportsAFailedRelabelThroughLabelled(t *testing.T) {
	f := newFixture(t, func(o *Options) {
		cfg := rest.CopyConfig(env.Config)
		cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
			return roundTripFunc(func(req *http.Request) (*http.Response, error) {
				if req.Method == http.MethodPatch && strings.Contains(req.URL.Path, "/pods/") {
					return nil, errors.New("pod patches fail in this test")
				}
				return rt.RoundTrip(req)
			})
		}
		cs, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			t.Fatal(err)
		}
		o.Client = cs
	})
	w := f.startWarmReady()
	ctx := context.Background()
	run, err := f.launcher.Claim(ctx, w, f.spec(w.ID()))
	if err != nil {
		t.Fatalf("Claim: %v", err)
	}
	if err := run.Labelled(ctx); err == nil || !strings.Contains(err.Error(), "pod patches fail in this test") {
		t.Fatalf("Labelled after a failed relabel answered %v, want the relabel's error", err)
	}
	pod, err := f.cs.CoreV1().Pods(f.stack.Namespace).Get(ctx, w.Pod().Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if pod.Labels[LabelRun] != "" || len(pod.OwnerReferences) != 0 {
		t.Errorf("pod after a failed relabel: labels %v, owners %v; want the warm pod's", pod.Labels, pod.OwnerReferences)
	}
	if err := run.Close(ctx); err != nil {
		t.Fatal(err)
	}
	f.gone("warm pod whose relabel failed", func(ctx context.Context) error {
		_, err := f.cs.CoreV1().Pods(f.stack.Namespace).Get(ctx, w.Pod().Name, metav1.GetOptions{})
		return err
	})
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(req *http.Request) (*http.Response, error) { return f(req) }

// The attack: a warm pod is gone, and someone who may create pods (and
// Secrets) in its namespace creates it again under its name, with its
// labels and a copy of its TLS Secret, running a runner of their own. A
// leader adopts the warm pods it does not hold (a former leader's): the
// first pod is adopted, the one created again never is, since its
// certificate is bound to the first pod's UID. It never receives a run's
// credentials, module or variables, and it is deleted.
func TestAdoptWarmRefusesAWarmPodCreatedAgain(t *testing.T) {
	f := newFixture(t, func(o *Options) { o.StartTimeout = 3 * time.Second })
	ctx := context.Background()
	formerLeader := f.startWarmReady()
	pods, secrets := f.cs.CoreV1().Pods(f.stack.Namespace), f.cs.CoreV1().Secrets(f.stack.Namespace)
	first, err := pods.Get(ctx, formerLeader.Pod().Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	copied, err := secrets.Get(ctx, secretName(first.Name), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	leader, err := New(f.launcher.opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(leader.Stop)
	adopted, err := leader.AdoptWarm(ctx, first)
	if err != nil {
		t.Fatalf("adopting the warm pod a former leader started: %v", err)
	}
	if err := adopted.Close(ctx); err != nil {
		t.Fatal(err)
	}
	f.gone("the adopted warm pod", func(ctx context.Context) error {
		_, err := pods.Get(ctx, first.Name, metav1.GetOptions{})
		return err
	})
	_ = secrets.Delete(ctx, copied.Name, metav1.DeleteOptions{}) // garbage collection, which envtest lacks

	// The pod and its Secret, created again from the copies.
	again := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: first.Name, Namespace: first.Namespace, Labels: first.Labels, Annotations: first.Annotations}, Spec: first.Spec}
	again.Spec.NodeName = ""
	if again, err = pods.Create(ctx, again, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := secrets.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: copied.Name, Namespace: copied.Namespace, Labels: copied.Labels}, Type: copied.Type, Data: copied.Data}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	ip := f.nextPodIP()
	f.serveRunnerWarm(copied, ip, true)
	f.setPodStatus(again.Name, running(ip, true))
	if _, err := leader.AdoptWarm(ctx, again); err == nil || !strings.Contains(err.Error(), "does not answer over mutual TLS") {
		t.Fatalf("adopting a warm pod created again with a copy of the first one's Secret: %v, want refused", err)
	}
	f.gone("the warm pod created again", func(ctx context.Context) error {
		_, err := pods.Get(ctx, again.Name, metav1.GetOptions{})
		return err
	})
}
