package launcher

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"
	ctrl "sigs.k8s.io/controller-runtime"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/pki"
	"github.com/terrace-dev/terrace/internal/runner"
	"github.com/terrace-dev/terrace/internal/runphase"
	"github.com/terrace-dev/terrace/internal/testenv"
	"github.com/terrace-dev/terrace/internal/tf"
)

var env *testenv.Env

func TestMain(m *testing.M) {
	ctrl.SetLogger(logr.Discard())
	testenv.Main(m, &env)
}

// noticeWithin is how quickly a dead runner must be noticed.
const noticeWithin = 5 * time.Second

// fixture is one test's namespace, Stack, launcher and runner listener.
type fixture struct {
	t         *testing.T
	cs        kubernetes.Interface
	authority *pki.Authority
	launcher  *Launcher
	stack     *terracev1.Stack
	// grpc holds the runner port on 127.0.0.1 for the first runner; later
	// runners listen on 127.0.0.2, .3, ... (holding it keeps the port free there too).
	grpc   net.Listener
	port   int
	nextIP int
}

// nextPodIP hands out a loopback address per runner, as devnode does.
func (f *fixture) nextPodIP() string {
	f.nextIP++
	return fmt.Sprintf("127.0.0.%d", f.nextIP)
}

func newFixture(t *testing.T, mutate ...func(*Options)) *fixture {
	t.Helper()
	cs, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	authority, err := pki.NewAuthority(pki.DefaultCAValidity)
	if err != nil {
		t.Fatal(err)
	}
	ns := env.Namespace(t)
	ctx := context.Background()
	if _, err := cs.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "deployer"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	stack := &terracev1.Stack{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: ns},
		Spec: terracev1.StackSpec{Source: terracev1.StackSource{
			URL: "https://example.com/m.tar.gz", Digest: "sha256:" + strings.Repeat("0", 64),
		}},
	}
	if err := env.Client.Create(ctx, stack); err != nil {
		t.Fatal(err)
	}
	grpc, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = grpc.Close() })
	opts := Options{
		Client:       cs,
		Authority:    authority,
		DefaultImage: "ghcr.io/terrace-dev/terrace:test",
		GRPCPort:     int32(grpc.Addr().(*net.TCPAddr).Port),
		StartTimeout: 30 * time.Second,
	}
	for _, m := range mutate {
		m(&opts)
	}
	l, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.Stop)
	return &fixture{t: t, cs: cs, authority: authority, launcher: l, stack: stack, grpc: grpc, port: int(opts.GRPCPort)}
}

func (f *fixture) spec(runID string) RunSpec {
	return RunSpec{Stack: f.stack, RunID: runID, ServiceAccountName: "deployer"}
}

// eventually polls cond until it holds or timeout passes.
func (f *fixture) eventually(timeout time.Duration, what string, cond func(ctx context.Context) (bool, error)) {
	f.t.Helper()
	if err := wait.PollUntilContextTimeout(context.Background(), 20*time.Millisecond, timeout, true, cond); err != nil {
		f.t.Fatalf("%s: %v", what, err)
	}
}

// waitForPod returns the run's pod once it exists.
func (f *fixture) waitForPod(runID string) *corev1.Pod {
	f.t.Helper()
	var pod *corev1.Pod
	f.eventually(10*time.Second, "runner pod never appeared", func(ctx context.Context) (bool, error) {
		p, err := f.cs.CoreV1().Pods(f.stack.Namespace).Get(ctx, PodName(f.stack.Name, runID), metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		pod = p
		return err == nil, err
	})
	return pod
}

// setStatus plays the kubelet: it rewrites the pod's status.
func (f *fixture) setStatus(runID string, mutate func(*corev1.PodStatus)) {
	f.t.Helper()
	pods := f.cs.CoreV1().Pods(f.stack.Namespace)
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		pod, err := pods.Get(context.Background(), PodName(f.stack.Name, runID), metav1.GetOptions{})
		if err != nil {
			return err
		}
		mutate(&pod.Status)
		_, err = pods.UpdateStatus(context.Background(), pod, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		f.t.Fatalf("failed to update pod status: %v", err)
	}
}

func running(ip string, ready bool) func(*corev1.PodStatus) {
	return func(s *corev1.PodStatus) {
		cond := corev1.ConditionFalse
		if ready {
			cond = corev1.ConditionTrue
		}
		now := metav1.Now()
		s.Phase = corev1.PodRunning
		s.PodIP = ip
		s.PodIPs = []corev1.PodIP{{IP: ip}}
		s.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: cond, LastTransitionTime: now}}
		s.ContainerStatuses = []corev1.ContainerStatus{{
			Name: containerName, Ready: ready, Image: "ghcr.io/terrace-dev/terrace:test", ImageID: "x",
			State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: now}},
		}}
	}
}

func failed(podReason, containerReason string, exitCode int32) func(*corev1.PodStatus) {
	return func(s *corev1.PodStatus) {
		now := metav1.Now()
		s.Phase = corev1.PodFailed
		s.Reason = podReason
		s.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionFalse, LastTransitionTime: now}}
		s.ContainerStatuses = []corev1.ContainerStatus{{
			Name: containerName, Image: "ghcr.io/terrace-dev/terrace:test", ImageID: "x",
			State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{Reason: containerReason, ExitCode: exitCode, StartedAt: now, FinishedAt: now}},
		}}
	}
}

// serveRunner starts a real runner server on ip and the fixture's port with
// the certificate the launcher put in the run's Secret, read from files as
// the runner in the pod reads its mounted Secret.
func (f *fixture) serveRunner(secret *corev1.Secret, ip string) {
	f.t.Helper()
	lis := f.grpc
	if ip != "127.0.0.1" {
		var err error
		if lis, err = net.Listen("tcp", net.JoinHostPort(ip, strconv.Itoa(f.port))); err != nil {
			f.t.Fatal(err)
		}
	}
	dir := f.t.TempDir()
	for k, v := range secret.Data {
		if err := os.WriteFile(filepath.Join(dir, k), v, 0o600); err != nil {
			f.t.Fatal(err)
		}
	}
	certs, err := pki.NewFileSource(dir)
	if err != nil {
		f.t.Fatal(err)
	}
	executor, err := tf.New(tf.Config{BinaryPath: testenv.RequireTofu(f.t), WorkDir: filepath.Join(dir, "work")})
	if err != nil {
		f.t.Fatal(err)
	}
	srv, err := runner.NewServer(runner.Config{
		Executor: executor, Certificate: certs, Trust: certs,
		BackendLeaf: func() (*pki.Leaf, error) { return pki.LoadLeafFiles(dir) },
		Log:         logr.Discard(),
	})
	if err != nil {
		f.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(ctx, lis) }()
	f.t.Cleanup(func() { cancel(); <-done })
}

func (f *fixture) secret(runID string) *corev1.Secret {
	f.t.Helper()
	s, err := f.cs.CoreV1().Secrets(f.stack.Namespace).Get(context.Background(), secretName(PodName(f.stack.Name, runID)), metav1.GetOptions{})
	if err != nil {
		f.t.Fatalf("failed to get the run's Secret: %v", err)
	}
	return s
}

type startResult struct {
	run *Run
	err error
}

func (f *fixture) startAsync(ctx context.Context, spec RunSpec) <-chan startResult {
	ch := make(chan startResult, 1)
	go func() {
		run, err := f.launcher.Start(ctx, spec)
		ch <- startResult{run, err}
	}()
	return ch
}

func (f *fixture) await(ch <-chan startResult, timeout time.Duration) startResult {
	f.t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(timeout):
		f.t.Fatalf("Start did not return within %s", timeout)
		return startResult{}
	}
}

// startReady starts a run and plays the kubelet and the runner until it is ready.
func (f *fixture) startReady(spec RunSpec) *Run {
	f.t.Helper()
	ch := f.startAsync(context.Background(), spec)
	f.playKubelet(spec.RunID)
	res := f.await(ch, 20*time.Second)
	if res.err != nil {
		f.t.Fatalf("Start: %v", res.err)
	}
	f.t.Cleanup(func() { _ = res.run.Close(context.Background()) })
	return res.run
}

// playKubelet runs a real runner for the run and reports its pod ready.
func (f *fixture) playKubelet(runID string) {
	f.t.Helper()
	f.waitForPod(runID)
	ip := f.nextPodIP()
	f.serveRunner(f.secret(runID), ip)
	f.setStatus(runID, running(ip, true))
}

func (f *fixture) gone(what string, get func(ctx context.Context) error) {
	f.t.Helper()
	f.eventually(10*time.Second, what+" still exists", func(ctx context.Context) (bool, error) {
		err := get(ctx)
		if apierrors.IsNotFound(err) {
			return true, nil
		}
		return false, err
	})
}

func (f *fixture) podGone(runID string) {
	f.t.Helper()
	f.gone("runner pod", func(ctx context.Context) error {
		_, err := f.cs.CoreV1().Pods(f.stack.Namespace).Get(ctx, PodName(f.stack.Name, runID), metav1.GetOptions{})
		return err
	})
}

func (f *fixture) secretGone(runID string) {
	f.t.Helper()
	f.gone("runner Secret", func(ctx context.Context) error {
		_, err := f.cs.CoreV1().Secrets(f.stack.Namespace).Get(ctx, secretName(PodName(f.stack.Name, runID)), metav1.GetOptions{})
		return err
	})
}

func waitDone(t *testing.T, run *Run) *TerminatedError {
	t.Helper()
	select {
	case <-run.Done():
	case <-time.After(noticeWithin):
		t.Fatalf("the runner's death was not noticed within %s", noticeWithin)
	}
	var term *TerminatedError
	if !errors.As(run.Err(), &term) {
		t.Fatalf("Err() = %v, want a *TerminatedError", run.Err())
	}
	if !errors.As(context.Cause(run.Context()), &term) {
		t.Fatalf("context cause = %v, want a *TerminatedError", context.Cause(run.Context()))
	}
	return term
}

func TestStartCreatesPodAndSecretAndConnects(t *testing.T) {
	f := newFixture(t)
	ch := f.startAsync(context.Background(), f.spec("r1"))
	pod := f.waitForPod("r1")

	// The Secret exists before the pod, holds the run's leaf and ends up owned by the pod.
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
	if d := time.Until(cert.NotAfter); d < 30*time.Minute || d > 24*time.Hour {
		t.Errorf("leaf valid for %s, want the run's deadline plus a margin", d)
	}
	for k, v := range map[string]string{LabelStack: "web", LabelRun: "r1", LabelComponent: ComponentRunnerTLS, LabelManagedBy: "terrace"} {
		if secret.Labels[k] != v {
			t.Errorf("Secret label %s = %q", k, secret.Labels[k])
		}
	}
	f.eventually(10*time.Second, "the pod never became the Secret's owner", func(ctx context.Context) (bool, error) {
		s, err := f.cs.CoreV1().Secrets(f.stack.Namespace).Get(ctx, secret.Name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		o := s.OwnerReferences
		return len(o) == 1 && o[0].Kind == "Pod" && o[0].UID == pod.UID, nil
	})

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
			s.Phase, s.Reason, s.Message = corev1.PodFailed, "UnsupportedImage", "devnode runs only the terrace image"
		})
		res := f.await(ch, noticeWithin)
		var term *TerminatedError
		if !errors.As(res.err, &term) || term.Reason != "UnsupportedImage" || !strings.Contains(res.err.Error(), "devnode runs only") {
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

// formerRun is a run that another Launcher (a former controller) started
// and never closed.
func (f *fixture) formerRun(runID string) startResult {
	f.t.Helper()
	former, err := New(f.launcher.opts)
	if err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(former.Stop)
	ch := make(chan startResult, 1)
	go func() {
		run, err := former.Start(context.Background(), f.spec(runID))
		ch <- startResult{run, err}
	}()
	f.playKubelet(runID)
	res := f.await(ch, 20*time.Second)
	if res.err != nil {
		f.t.Fatal(res.err)
	}
	return res
}

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
	secret, err := f.cs.CoreV1().Secrets(other.Namespace).Get(ctx, secretName(pod.Name), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
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

// requestLog records the API requests of a client.
type requestLog struct {
	mu    sync.Mutex
	calls []string
	next  http.RoundTripper
}

func (l *requestLog) RoundTrip(r *http.Request) (*http.Response, error) {
	verb := r.Method
	collection := strings.HasSuffix(r.URL.Path, "/pods") || strings.HasSuffix(r.URL.Path, "/secrets")
	switch {
	case r.Method == http.MethodGet && r.URL.Query().Get("watch") == "true":
		verb = "WATCH"
	case r.Method == http.MethodGet && collection:
		verb = "LIST"
	}
	l.mu.Lock()
	l.calls = append(l.calls, verb+" "+r.URL.Path)
	l.mu.Unlock()
	return l.next.RoundTrip(r)
}

func (l *requestLog) count(prefix string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, c := range l.calls {
		if strings.HasPrefix(c, prefix) {
			n++
		}
	}
	return n
}

// TestRunsListNothing: runs share the launcher's one watch of runner pods;
// starting and closing runs lists nothing, whatever the namespace holds.
func TestRunsListNothing(t *testing.T) {
	log := &requestLog{}
	cfg := rest.CopyConfig(env.Config)
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { log.next = rt; return log })
	counted, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
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
	// Per run: create the Secret and the pod, hand the Secret over, delete both.
	if n := len(log.calls) - log.count("LIST") - log.count("WATCH"); n != 3*5 {
		t.Errorf("%d other requests for three runs, want 5 a run:\n%s", n, strings.Join(log.calls, "\n"))
	}
}
