package e2e

import (
	"context"
	"errors"
	"net"
	"path/filepath"
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
	"github.com/terrace-dev/terrace/internal/devcluster"
	"github.com/terrace-dev/terrace/internal/launcher"
	"github.com/terrace-dev/terrace/internal/pki"
	"github.com/terrace-dev/terrace/internal/scheme"
	"github.com/terrace-dev/terrace/internal/testenv"
)

// TestLauncherRunsRealRunnerPods launches runner pods on a dev cluster of
// its own (real control plane, devnode running the terrace binary, so the
// node's only processes are this test's runners), calls Health over mutual
// TLS, and checks that killing the runner process is noticed at once.
func TestLauncherRunsRealRunnerPods(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	tofu := testenv.RequireTofu(t)

	dev, err := devcluster.StartDevnode(ctx, devcluster.DevnodeOptions{
		Dir:           t.TempDir(),
		TerraceBinary: terraceBinary,
		CRDDirs:       []string{filepath.Join(testenv.RepoRoot(), "config", "crd", "bases")},
		PodEnv:        []corev1.EnvVar{{Name: "TERRACE_RUNNER_BINARY_PATH", Value: tofu}},
	})
	if err != nil {
		t.Fatalf("failed to start the dev cluster: %v", err)
	}
	t.Cleanup(func() { _ = dev.Stop() })

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
		Spec: terracev1.StackSpec{Source: terracev1.StackSource{
			URL: "https://example.com/m.tar.gz", Digest: "sha256:" + strings.Repeat("0", 64),
		}},
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
	if ip := net.ParseIP(run.PodIP()); ip == nil || !ip.IsLoopback() {
		t.Errorf("pod IP %q is not a devnode loopback address", run.PodIP())
	}
	callCtx, callCancel := context.WithTimeout(run.Context(), 10*time.Second)
	defer callCancel()
	if err := run.Client().Health(callCtx); err != nil {
		t.Fatalf("Health over mutual TLS: %v", err)
	}

	// Kill the runner process: the run must learn it within seconds.
	pids := dev.Node.Pids()
	if len(pids) != 1 {
		t.Fatalf("devnode runs %d processes, want the one runner", len(pids))
	}
	killed := time.Now()
	if err := syscall.Kill(pids[0], syscall.SIGKILL); err != nil {
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
	if err := second.Close(ctx); err != nil {
		t.Fatal(err)
	}
	launcherWaitGone(t, ctx, func(ctx context.Context) error {
		_, err := cs.CoreV1().Pods(ns.Name).Get(ctx, second.Pod().Name, metav1.GetOptions{})
		return err
	})
	if pids := dev.Node.Pids(); len(pids) != 0 {
		t.Errorf("processes still running after Close: %v", pids)
	}
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
