package devcluster_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/terrace-dev/terrace/internal/devcluster"
	"github.com/terrace-dev/terrace/internal/testenv"
)

func binDir(t *testing.T) string {
	t.Helper()
	tools, err := testenv.FindTools()
	if err != nil {
		t.Fatal(err)
	}
	return tools.KubebuilderAssets
}

func TestClusterRunsControllersAndStopsCleanly(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	begin := time.Now()
	c, err := devcluster.Start(ctx, devcluster.Options{
		BinDir:  binDir(t),
		CRDDirs: []string{filepath.Join(testenv.RepoRoot(), "config", "crd", "bases")},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("control plane with CRDs up in %s", time.Since(begin).Round(time.Millisecond))
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			_ = c.Stop()
		}
	})

	// The kubeconfig on disk works on its own.
	cfg, err := clientcmd.BuildConfigFromFlags("", c.KubeconfigPath)
	if err != nil {
		t.Fatal(err)
	}
	cs := kubernetes.NewForConfigOrDie(cfg)
	if _, err := cs.Discovery().RESTClient().Get().AbsPath("/apis/terrace.dev/v1alpha1").DoRaw(ctx); err != nil {
		t.Fatalf("terrace.dev/v1alpha1 is not served: %v", err)
	}

	// The garbage collector removes a dependent once its owner is gone.
	owner, err := cs.CoreV1().ConfigMaps("default").Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{GenerateName: "owner-"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	dep, err := cs.CoreV1().Secrets("default").Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{
		GenerateName:    "dependent-",
		OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "ConfigMap", Name: owner.Name, UID: owner.UID}},
	}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := cs.CoreV1().ConfigMaps("default").Delete(ctx, owner.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(ctx, t, "the dependent Secret to be collected", func() bool {
		_, err := cs.CoreV1().Secrets("default").Get(ctx, dep.Name, metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	})

	// A new namespace gets its ServiceAccount and CA bundle from the controllers.
	ns, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "t-"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(ctx, t, "the default ServiceAccount and kube-root-ca.crt", func() bool {
		_, err1 := cs.CoreV1().ServiceAccounts(ns.Name).Get(ctx, "default", metav1.GetOptions{})
		cm, err2 := cs.CoreV1().ConfigMaps(ns.Name).Get(ctx, "kube-root-ca.crt", metav1.GetOptions{})
		return err1 == nil && err2 == nil && cm.Data["ca.crt"] == string(c.CACertPEM)
	})

	pids := c.Pids()
	if len(pids) != 3 {
		t.Fatalf("expected 3 control-plane processes, got %v", pids)
	}
	dir := c.Dir
	if err := c.Stop(); err != nil {
		t.Fatal(err)
	}
	stopped = true
	for _, pid := range pids {
		if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
			t.Errorf("process %d is still there after Stop (kill 0: %v)", pid, err)
		}
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("temporary directory %s was not removed: %v", dir, err)
	}
}

func TestCrashedStartReportsLastLogLines(t *testing.T) {
	// A real kube-apiserver given a flag it does not know exits at once.
	real := binDir(t)
	bins := t.TempDir()
	for _, b := range []string{"etcd", "kube-controller-manager"} {
		if err := os.Symlink(filepath.Join(real, b), filepath.Join(bins, b)); err != nil {
			t.Fatal(err)
		}
	}
	wrapper := "#!/bin/sh\nexec " + filepath.Join(real, "kube-apiserver") + " --no-such-flag \"$@\"\n"
	if err := os.WriteFile(filepath.Join(bins, "kube-apiserver"), []byte(wrapper), 0o755); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dir := t.TempDir()
	c, err := devcluster.Start(ctx, devcluster.Options{BinDir: bins, Dir: dir})
	if err == nil {
		_ = c.Stop()
		t.Fatal("start succeeded with a broken kube-apiserver")
	}
	msg := err.Error()
	if !strings.Contains(msg, "kube-apiserver exited") || !strings.Contains(msg, "no-such-flag") {
		t.Fatalf("error does not name the failing process and its log: %v", err)
	}
	// etcd was started before the failure and must be gone.
	assertNoProcessUsing(t, dir)
}

func TestMissingBinaryTellsToRunMakeTools(t *testing.T) {
	_, err := devcluster.Start(context.Background(), devcluster.Options{BinDir: t.TempDir()})
	if err == nil || !strings.Contains(err.Error(), "make tools") {
		t.Fatalf("expected advice to run make tools, got %v", err)
	}
}

// assertNoProcessUsing fails when a process has dir on its command line.
func assertNoProcessUsing(t *testing.T, dir string) {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		if strings.Contains(string(cmdline), dir) {
			t.Errorf("process %s still runs: %s", e.Name(), strings.ReplaceAll(string(cmdline), "\x00", " "))
		}
	}
}

func waitFor(ctx context.Context, t *testing.T, what string, cond func() bool) {
	t.Helper()
	ticker := time.NewTicker(100 * time.Millisecond)
	defer ticker.Stop()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("timed out waiting for %s", what)
		case <-ticker.C:
		}
	}
}
