package e2e

import (
	"context"
	"errors"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/launcher"
	"github.com/terrace-dev/terrace/internal/pki"
	"github.com/terrace-dev/terrace/internal/scheme"
)

// TestLauncherRunsRealRunnerPods launches runner pods on the dev node from
// this process, calls Health over mutual TLS at the pod's address, and
// checks that killing the runner process is noticed at once.
func TestLauncherRunsRealRunnerPods(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	dev := sharedDev(t)

	cs, err := kubernetes.NewForConfig(dev.Cluster.Config)
	if err != nil {
		t.Fatal(err)
	}
	crc, err := client.New(dev.Cluster.Config, client.Options{Scheme: scheme.New()})
	if err != nil {
		t.Fatal(err)
	}
	ns, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "launcher-"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().ServiceAccounts(ns.Name).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "deployer"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	stack := &terracev1.Stack{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: ns.Name},
		Spec: terracev1.StackSpec{
			Source: terracev1.StackSource{URL: "https://example.com/m.tar.gz", Digest: "sha256:" + strings.Repeat("0", 64)},
			// The launcher under test starts its runs, not the package's
			// controller.
			Suspend: true,
		},
	}
	if err := crc.Create(ctx, stack); err != nil {
		t.Fatal(err)
	}

	authority, err := pki.NewAuthority(pki.DefaultCAValidity)
	if err != nil {
		t.Fatal(err)
	}
	l, err := launcher.New(launcher.Options{
		Client: cs, Authority: authority,
		DefaultImage: "ghcr.io/terrace-dev/terrace:dev",
		StartTimeout: time.Minute,
	})
	if err != nil {
		t.Fatal(err)
	}
	// A missing ServiceAccount is refused at once, with what to do.
	_, err = l.Start(ctx, launcher.RunSpec{Stack: stack, RunID: launcher.NewRunID(), ServiceAccountName: "missing"})
	if err == nil || !strings.Contains(err.Error(), `create ServiceAccount "missing"`) {
		t.Fatalf("Start with a missing ServiceAccount: %v", err)
	}
	left, err := cs.CoreV1().Secrets(ns.Name).List(ctx, metav1.ListOptions{LabelSelector: launcher.LabelComponent + "=" + launcher.ComponentRunnerTLS})
	if err != nil || len(left.Items) != 0 {
		t.Fatalf("a refused pod left its TLS Secret behind: %v %v", left, err)
	}

	spec := launcher.RunSpec{Stack: stack, RunID: launcher.NewRunID(), ServiceAccountName: "deployer"}

	run, err := l.Start(ctx, spec)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Logf("runner %s ready at %s in %s", run.Pod(), run.PodIP(), run.StartDuration())
	_, pods, err := net.ParseCIDR(dev.Node.PodCIDR())
	if err != nil {
		t.Fatal(err)
	}
	if ip := net.ParseIP(run.PodIP()); ip == nil || !pods.Contains(ip) {
		t.Errorf("pod IP %q is not in the node's pod range %s", run.PodIP(), pods)
	}
	callCtx, callCancel := context.WithTimeout(run.Context(), 10*time.Second)
	defer callCancel()
	if err := run.Client().Health(callCtx); err != nil {
		t.Fatalf("Health over mutual TLS: %v", err)
	}

	// Kill the runner process: the run must learn it within seconds.
	runnerPid := launchedRunnerPid(t, ctx, cs, ns.Name, run.Pod().Name)
	killed := time.Now()
	if err := syscall.Kill(runnerPid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	select {
	case <-run.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the killed runner was not noticed within 10s")
	}
	var term *launcher.TerminatedError
	if !errors.As(run.Err(), &term) || term.ExitCode == nil || *term.ExitCode != 128+int32(syscall.SIGKILL) {
		t.Fatalf("Err() = %v, want exit code 137", run.Err())
	}
	t.Logf("death noticed after %s: %v", time.Since(killed), term)
	if err := callCtx.Err(); err == nil {
		t.Error("calls under the run's context were not aborted")
	}
	if err := run.Close(ctx); err != nil {
		t.Fatal(err)
	}
	launcherWaitGone(t, ctx, func(ctx context.Context) error {
		_, err := cs.CoreV1().Pods(ns.Name).Get(ctx, run.Pod().Name, metav1.GetOptions{})
		return err
	})

	// A second run starts cleanly, and Close stops its process.
	spec.RunID = launcher.NewRunID()
	second, err := l.Start(ctx, spec)
	if err != nil {
		t.Fatalf("second Start: %v", err)
	}
	if err := second.Client().Health(second.Context()); err != nil {
		t.Fatalf("second Health: %v", err)
	}
	secondPid := launchedRunnerPid(t, ctx, cs, ns.Name, second.Pod().Name)
	if err := second.Close(ctx); err != nil {
		t.Fatal(err)
	}
	launcherWaitGone(t, ctx, func(ctx context.Context) error {
		_, err := cs.CoreV1().Pods(ns.Name).Get(ctx, second.Pod().Name, metav1.GetOptions{})
		return err
	})
	if alive(secondPid) {
		t.Errorf("runner process %d still runs after Close", secondPid)
	}
}

// launchedRunnerPid is the host PID of the running runner container of pod.
func launchedRunnerPid(t *testing.T, ctx context.Context, cs kubernetes.Interface, ns, pod string) int {
	t.Helper()
	p, err := cs.CoreV1().Pods(ns).Get(ctx, pod, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, st := range p.Status.ContainerStatuses {
		if st.State.Running != nil {
			pid, err := containerPid(st.ContainerID)
			if err != nil {
				t.Fatal(err)
			}
			return pid
		}
	}
	t.Fatalf("pod %s has no running container: %+v", pod, p.Status.ContainerStatuses)
	return 0
}

func launcherWaitGone(t *testing.T, ctx context.Context, get func(context.Context) error) {
	t.Helper()
	err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		err := get(ctx)
		if apierrors.IsNotFound(err) {
			return true, nil
		}
		return false, err
	})
	if err != nil {
		t.Fatalf("object not deleted: %v", err)
	}
}
