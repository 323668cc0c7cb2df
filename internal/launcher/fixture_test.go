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
	"k8s.io/client-go/util/retry"
	ctrl "sigs.k8s.io/controller-runtime"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/pki"
	"github.com/terrace-dev/terrace/internal/runner/server"
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

// nextPodIP hands out a loopback address per runner, where the fixture's
// in-process runners listen.
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

// recordPodEvents watches the named pod from now on; the function returned
// stops the watch and describes each event it saw (type, phase, node,
// deletion timestamp and grace), for a failure message.
func (f *fixture) recordPodEvents(name string) func() string {
	f.t.Helper()
	w, err := f.cs.CoreV1().Pods(f.stack.Namespace).Watch(context.Background(), metav1.ListOptions{
		FieldSelector: "metadata.name=" + name,
	})
	if err != nil {
		f.t.Fatal(err)
	}
	var events []string
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ev := range w.ResultChan() {
			pod, ok := ev.Object.(*corev1.Pod)
			if !ok {
				events = append(events, fmt.Sprintf("%s %T", ev.Type, ev.Object))
				continue
			}
			events = append(events, fmt.Sprintf("%s(rv %s phase %s node %q deletion %v grace %v)", ev.Type, pod.ResourceVersion,
				pod.Status.Phase, pod.Spec.NodeName, pod.DeletionTimestamp, ptrValue(pod.DeletionGracePeriodSeconds)))
		}
	}()
	f.t.Cleanup(w.Stop)
	return func() string {
		time.Sleep(200 * time.Millisecond) // let the last events arrive
		w.Stop()
		<-done
		return strings.Join(events, ", ")
	}
}

func ptrValue(p *int64) any {
	if p == nil {
		return nil
	}
	return *p
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
	f.setPodStatus(PodName(f.stack.Name, runID), mutate)
}

// setPodStatus is setStatus by the pod's name.
func (f *fixture) setPodStatus(name string, mutate func(*corev1.PodStatus)) {
	f.t.Helper()
	pods := f.cs.CoreV1().Pods(f.stack.Namespace)
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		pod, err := pods.Get(context.Background(), name, metav1.GetOptions{})
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
	f.serveRunnerWarm(secret, ip, false)
}

// serveRunnerWarm is serveRunner, as a warm runner when warm is set.
func (f *fixture) serveRunnerWarm(secret *corev1.Secret, ip string, warm bool) {
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
	srv, err := server.New(server.Config{
		Executor: executor, Certificate: certs, Trust: certs,
		BackendLeaf: func() (*pki.Leaf, error) { return pki.LoadLeafFiles(dir) },
		Log:         logr.Discard(),
		Warm:        warm,
	})
	if err != nil {
		f.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(ctx, lis) }()
	f.t.Cleanup(func() { cancel(); <-done })
}

// secret returns the run's TLS Secret, which follows its pod.
func (f *fixture) secret(runID string) *corev1.Secret {
	f.t.Helper()
	var s *corev1.Secret
	f.eventually(noticeWithin, "the run's Secret", func(ctx context.Context) (bool, error) {
		var err error
		s, err = f.cs.CoreV1().Secrets(f.stack.Namespace).Get(ctx, secretName(PodName(f.stack.Name, runID)), metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		return err == nil, err
	})
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

// secretGone waits until the run's TLS Secret is gone or goes with its
// pod, which is gone: owned by that pod alone, so the garbage collector
// (not run by envtest) removes it.
func (f *fixture) secretGone(runID string) {
	f.t.Helper()
	f.secretGoesWithPod(PodName(f.stack.Name, runID))
}

// secretGoesWithPod is secretGone for the pod podName.
func (f *fixture) secretGoesWithPod(podName string) {
	f.t.Helper()
	f.eventually(noticeWithin, "the runner Secret is neither gone nor the deleted pod's", func(ctx context.Context) (bool, error) {
		s, err := f.cs.CoreV1().Secrets(f.stack.Namespace).Get(ctx, secretName(podName), metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return true, nil
		}
		if err != nil {
			return false, err
		}
		o := s.OwnerReferences
		if len(o) != 1 || o[0].Kind != "Pod" || o[0].Name != podName {
			return false, nil
		}
		_, err = f.cs.CoreV1().Pods(f.stack.Namespace).Get(ctx, o[0].Name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
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
