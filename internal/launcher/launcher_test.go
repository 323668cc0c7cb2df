package launcher

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/pki"
)

func TestStartCreatesPodAndSecretAndConnects(t *testing.T) {
	f := newFixture(t)
	ch := f.startAsync(context.Background(), f.spec("r1"))
	pod := f.waitForPod("r1")

	// The Secret holds the run's leaf and is owned by the pod from its creation.
	secret := f.secret("r1")
	if secret.Type != corev1.SecretTypeTLS || len(secret.Data["ca.crt"]) == 0 {
		t.Fatalf("Secret type %s keys %d, want kubernetes.io/tls with ca.crt", secret.Type, len(secret.Data))
	}
	leaf, err := pki.LeafFromSecretData(secret.Data)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := leaf.Certificate()
	if id, _ := pki.IdentityFromCertificate(cert); id != pki.RunnerIdentity(f.stack.Namespace, "web", "r1") {
		t.Errorf("leaf identity = %s", id)
	}
	if uid := pki.PodUIDFromCertificate(cert); uid != string(pod.UID) {
		t.Errorf("leaf bound to pod %q, want the run's pod %s", uid, pod.UID)
	}
	if d := time.Until(cert.NotAfter); d < 30*time.Minute || d > 24*time.Hour {
		t.Errorf("leaf valid for %s, want the run's deadline plus a margin", d)
	}
	for k, v := range map[string]string{LabelStack: "web", LabelRun: "r1", LabelComponent: ComponentRunnerTLS, LabelManagedBy: "terrace"} {
		if secret.Labels[k] != v {
			t.Errorf("Secret label %s = %q", k, secret.Labels[k])
		}
	}
	if o := secret.OwnerReferences; len(o) != 1 || o[0].Kind != "Pod" || o[0].UID != pod.UID || o[0].Controller == nil || !*o[0].Controller {
		t.Errorf("Secret owners = %+v, want the pod alone", o)
	}

	if pod.Spec.ServiceAccountName != "deployer" || pod.OwnerReferences[0].UID != f.stack.UID || pod.Labels[LabelRun] != "r1" {
		t.Errorf("pod = sa %q owners %+v labels %v", pod.Spec.ServiceAccountName, pod.OwnerReferences, pod.Labels)
	}

	// The container runs but the runner does not answer yet: Start keeps waiting.
	f.setStatus("r1", running("127.0.0.1", false))
	select {
	case r := <-ch:
		t.Fatalf("Start returned before the runner answered: %v", r.err)
	case <-time.After(300 * time.Millisecond):
	}

	// Once the runner answers over mutual TLS, Start returns: it does not
	// wait for the pod's readiness probe (the pod is never reported Ready here).
	f.serveRunner(secret, f.nextPodIP())
	res := f.await(ch, 20*time.Second)
	if res.err != nil {
		t.Fatalf("Start: %v", res.err)
	}
	run := res.run
	if run.PodIP() != "127.0.0.1" || run.ID() != "r1" || run.Err() != nil || run.StartDuration() <= 0 {
		t.Errorf("run = ip %q id %q err %v start %s", run.PodIP(), run.ID(), run.Err(), run.StartDuration())
	}
	ctx, cancel := context.WithTimeout(run.Context(), 5*time.Second)
	defer cancel()
	if err := run.Client().Health(ctx); err != nil {
		t.Fatalf("Health over mutual TLS: %v", err)
	}

	if err := run.Close(context.Background()); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if !errors.Is(run.Err(), ErrClosed) {
		t.Errorf("Err after Close = %v", run.Err())
	}
	f.podGone("r1")
	f.secretGone("r1")
}

func TestDeathIsNoticed(t *testing.T) {
	tests := []struct {
		name       string
		kill       func(f *fixture, run *Run)
		wantReason string
		wantCode   int32
	}{
		{"OOM killed", func(f *fixture, run *Run) { f.setStatus(run.ID(), failed("", "OOMKilled", 137)) }, "OOMKilled", 137},
		{"exited", func(f *fixture, run *Run) { f.setStatus(run.ID(), failed("", "Error", 2)) }, "Error", 2},
		{"evicted", func(f *fixture, run *Run) { f.setStatus(run.ID(), failed("Evicted", "Error", 137)) }, "Evicted", 137},
		{"container terminated while the pod still runs", func(f *fixture, run *Run) {
			f.setStatus(run.ID(), func(s *corev1.PodStatus) {
				s.ContainerStatuses[0].State = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{Reason: "Error", ExitCode: 1, FinishedAt: metav1.Now()}}
			})
		}, "Error", 1},
		{"deleted", func(f *fixture, run *Run) {
			if err := f.cs.CoreV1().Pods(run.Pod().Namespace).Delete(context.Background(), run.Pod().Name, metav1.DeleteOptions{}); err != nil {
				f.t.Fatal(err)
			}
		}, "Deleted", -1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t)
			run := f.startReady(f.spec("r1"))
			call, cancel := context.WithCancel(run.Context())
			defer cancel()
			tt.kill(f, run)
			term := waitDone(t, run)
			if term.Reason != tt.wantReason {
				t.Errorf("reason = %s, want %s (%v)", term.Reason, tt.wantReason, term)
			}
			if tt.wantCode >= 0 && (term.ExitCode == nil || *term.ExitCode != tt.wantCode) {
				t.Errorf("exit code = %v, want %d", term.ExitCode, tt.wantCode)
			}
			// Calls made under the run's context are aborted.
			if call.Err() == nil {
				t.Error("a context derived from Run.Context() is still live")
			}
			if err := run.Close(context.Background()); err != nil {
				t.Fatal(err)
			}
			f.podGone("r1")
			f.secretGone("r1")
		})
	}
}

func TestStartFailsWhenThePodFailsOrNeverGetsReady(t *testing.T) {
	t.Run("failed while starting", func(t *testing.T) {
		f := newFixture(t)
		ch := f.startAsync(context.Background(), f.spec("r1"))
		f.waitForPod("r1")
		f.setStatus("r1", func(s *corev1.PodStatus) {
			s.Phase, s.Reason, s.Message = corev1.PodFailed, "Evicted", "The node was low on resource: ephemeral-storage."
		})
		res := f.await(ch, noticeWithin)
		var term *TerminatedError
		if !errors.As(res.err, &term) || term.Reason != "Evicted" || !strings.Contains(res.err.Error(), "low on resource") {
			t.Fatalf("err = %v, want the pod's reason and message", res.err)
		}
		f.podGone("r1")
		f.secretGone("r1")
	})
	t.Run("start timeout names what the pod waits for", func(t *testing.T) {
		f := newFixture(t, func(o *Options) { o.StartTimeout = 2 * time.Second })
		ch := f.startAsync(context.Background(), f.spec("r1"))
		f.waitForPod("r1")
		f.setStatus("r1", func(s *corev1.PodStatus) {
			s.Phase = corev1.PodPending
			s.ContainerStatuses = []corev1.ContainerStatus{{Name: containerName, Image: "x", State: corev1.ContainerState{
				Waiting: &corev1.ContainerStateWaiting{Reason: "ImagePullBackOff", Message: "Back-off pulling image"},
			}}}
		})
		res := f.await(ch, 10*time.Second)
		if res.err == nil || !strings.Contains(res.err.Error(), "ImagePullBackOff") {
			t.Fatalf("err = %v, want the waiting reason", res.err)
		}
		f.podGone("r1")
		f.secretGone("r1")
	})
	t.Run("caller gives up", func(t *testing.T) {
		f := newFixture(t)
		ctx, cancel := context.WithCancel(context.Background())
		ch := f.startAsync(ctx, f.spec("r1"))
		f.waitForPod("r1")
		cancel()
		res := f.await(ch, noticeWithin)
		if !errors.Is(res.err, context.Canceled) {
			t.Fatalf("err = %v, want context.Canceled", res.err)
		}
		f.podGone("r1")
		f.secretGone("r1")
	})
}

func TestStartRefusesARunnerWithAnotherIdentity(t *testing.T) {
	f := newFixture(t, func(o *Options) { o.StartTimeout = 3 * time.Second })
	ch := f.startAsync(context.Background(), f.spec("r1"))
	f.waitForPod("r1")
	// A runner holding a valid certificate of the same CA, but for another run.
	other, err := f.authority.Issue(pki.LeafRequest{Identity: pki.RunnerIdentity(f.stack.Namespace, "web", "r0"), Validity: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	ip := f.nextPodIP()
	f.serveRunner(&corev1.Secret{Data: other.SecretData()}, ip)
	f.setStatus("r1", running(ip, true))
	res := f.await(ch, 10*time.Second)
	if res.err == nil || !strings.Contains(res.err.Error(), "does not answer over mutual TLS as "+string(pki.RunnerIdentity(f.stack.Namespace, "web", "r1"))) {
		t.Fatalf("err = %v, want a refused identity", res.err)
	}
	f.podGone("r1")
}

func TestStartRejectedPodLeavesNoSecret(t *testing.T) {
	f := newFixture(t)
	spec := f.spec("r1")
	// Passes the launcher's checks; the API server refuses the volume's name.
	spec.Stack = f.stack.DeepCopy()
	spec.Stack.Spec.Runner = &terracev1.RunnerPodTemplate{Volumes: []corev1.Volume{{
		Name: "Not_A_DNS_Label", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}},
	}}}
	_, err := f.launcher.Start(context.Background(), spec)
	if !errors.Is(err, ErrInvalidSpec) {
		t.Fatalf("err = %v, want ErrInvalidSpec", err)
	}
	f.secretGone("r1")
	// The run ID is free again.
	run := f.startReady(f.spec("r1"))
	if run.Err() != nil {
		t.Fatal(run.Err())
	}
}

// A run whose commands all returned (MarkIdle) has its pod deleted at once;
// one cut short leaves the pod its termination grace, in which the node
// stops the runner, which interrupts a tofu still running, and then removes
// the pod object itself.
func TestCloseDeletesAnIdleRunsPodAtOnce(t *testing.T) {
	for _, idle := range []bool{true, false} {
		t.Run(fmt.Sprintf("idle=%v", idle), func(t *testing.T) {
			f := newFixture(t)
			run := f.startReady(f.spec("r1"))
			ctx := context.Background()
			// Bound to a node, a pod deleted with a grace period stays
			// until that node's kubelet removes it (envtest has none).
			binding := &corev1.Binding{
				ObjectMeta: metav1.ObjectMeta{Name: run.Pod().Name},
				Target:     corev1.ObjectReference{Kind: "Node", Name: "node-a"},
			}
			if err := f.cs.CoreV1().Pods(run.Pod().Namespace).Bind(ctx, binding, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			if idle {
				run.MarkIdle()
			}
			seen := f.recordPodEvents(run.Pod().Name)
			if err := run.Close(ctx); err != nil {
				t.Fatal(err)
			}
			pod, err := f.cs.CoreV1().Pods(run.Pod().Namespace).Get(ctx, run.Pod().Name, metav1.GetOptions{})
			switch {
			case idle && !apierrors.IsNotFound(err):
				t.Fatalf("the idle run's pod is still there after Close (err %v, deletion %v)", err, pod.DeletionTimestamp)
			case !idle && err != nil:
				// Seen once in CI, never since: say what the pod went
				// through, so the next failure names its cause.
				t.Fatalf("the pod of a run not idle is gone at once: %v; its events since it was bound: %s", err, seen())
			case !idle && (pod.DeletionTimestamp == nil || pod.DeletionGracePeriodSeconds == nil || *pod.DeletionGracePeriodSeconds != int64(terminationGrace/time.Second)):
				t.Fatalf("the pod of a run not idle: deletion %v, grace %v; want a graceful delete of %s", pod.DeletionTimestamp, pod.DeletionGracePeriodSeconds, terminationGrace)
			}
		})
	}
}

// A pull request's run: its pod's certificate is the read-only identity,
// the controller expects that identity, and it never takes a warm pod.
func TestReadOnlyRunCarriesTheReadOnlyIdentity(t *testing.T) {
	f := newFixture(t)
	spec := f.spec("pr-7-a")
	spec.ReadOnly = true
	ch := f.startAsync(context.Background(), spec)
	f.waitForPod("pr-7-a")
	secret := f.secret("pr-7-a")
	leaf, err := pki.LeafFromSecretData(secret.Data)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := leaf.Certificate()
	want := pki.ReadOnlyRunnerIdentity(f.stack.Namespace, "web", "pr-7-a")
	if id, _ := pki.IdentityFromCertificate(cert); id != want {
		t.Fatalf("leaf identity = %s, want %s", id, want)
	}
	f.serveRunner(secret, f.nextPodIP())
	f.setStatus("pr-7-a", running("127.0.0.1", false))
	res := f.await(ch, 20*time.Second)
	if res.err != nil {
		t.Fatalf("Start: %v", res.err)
	}
	if res.run.Identity() != want {
		t.Errorf("run identity = %s, want %s", res.run.Identity(), want)
	}
	if err := res.run.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	f.podGone("pr-7-a")
}
