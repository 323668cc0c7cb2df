package e2e

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/terrace-dev/terrace/internal/devcluster"
	"github.com/terrace-dev/terrace/internal/testenv"
)

// devProcess is a `terrace dev` started as a user starts it.
type devProcess struct {
	cmd        *exec.Cmd
	stderr     *strings.Builder
	exited     chan error
	kubeconfig string
	// registry is host:port of the dev registry on loopback, where a test
	// pushes images of its own.
	registry string
	// startup is the time from start to the printed KUBECONFIG.
	startup time.Duration
}

// startTerraceDev runs `terrace dev --dir dir` and waits until it prints
// the KUBECONFIG to use; the process is killed at the end of the test if
// still there.
func startTerraceDev(tb testing.TB, dir string) *devProcess {
	tb.Helper()
	tools, err := testenv.FindTools()
	if err != nil {
		tb.Fatal(err)
	}
	cmd := exec.Command(terraceBinary, "dev", "--dir", dir, "--install", filepath.Join(testenv.RepoRoot(), "config", "default"))
	cmd.Env = append(os.Environ(), "KUBEBUILDER_ASSETS="+tools.KubebuilderAssets, "TERRACE_TOFU="+tools.Tofu)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		tb.Fatal(err)
	}
	p := &devProcess{cmd: cmd, stderr: &strings.Builder{}, exited: make(chan error, 1)}
	cmd.Stderr = p.stderr
	begin := time.Now()
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	lines := make(chan string, 100)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
		p.exited <- cmd.Wait()
	}()
	tb.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
		}
	})
	timeout := time.After(devcluster.StartupTimeout)
	for p.kubeconfig == "" {
		select {
		case line, ok := <-lines:
			if !ok {
				tb.Fatalf("terrace dev ended before it was ready: %v\n%s", <-p.exited, p.stderr.String())
			}
			if k, found := strings.CutPrefix(line, "export KUBECONFIG="); found {
				p.kubeconfig = k
			}
			if r, found := strings.CutPrefix(line, "registry: "); found {
				p.registry, _, _ = strings.Cut(r, " ")
			}
		case <-timeout:
			tb.Fatalf("terrace dev not ready after %s:\n%s", devcluster.StartupTimeout, p.stderr.String())
		}
	}
	p.startup = time.Since(begin)
	return p
}

// interrupt sends Ctrl-C and waits for a clean exit.
func (p *devProcess) interrupt(tb testing.TB) {
	tb.Helper()
	if err := p.cmd.Process.Signal(os.Interrupt); err != nil {
		tb.Fatal(err)
	}
	select {
	case err := <-p.exited:
		if err != nil {
			tb.Errorf("terrace dev exited with %v after Ctrl-C:\n%s", err, p.stderr.String())
		}
	case <-time.After(60 * time.Second):
		tb.Fatalf("terrace dev did not stop within 60 s of Ctrl-C:\n%s", p.stderr.String())
	}
}

// TestTerraceDevStartsAndLeavesNothingBehind runs the real command as a
// user would: a real node, Terrace installed from config/default. It checks
// that the controller runs from the image as the manifests say, and that
// Ctrl-C stops every process it started, containers included, and removes
// the node's link. How fast it starts is BenchmarkTerraceDevStartup's to say.
func TestTerraceDevStartsAndLeavesNothingBehind(t *testing.T) {
	// A dev cluster of its own: runs beside the others like it, after
	// the tests of the shared cluster (ownClusterTest).
	ownClusterTest(t)
	dir := t.TempDir()
	dev := startTerraceDev(t, dir)
	cmd, kubeconfig := dev.cmd, dev.kubeconfig
	t.Logf("terrace dev ready in %s", dev.startup.Round(100*time.Millisecond))
	if kubeconfig != filepath.Join(dir, "kubeconfig") {
		t.Errorf("kubeconfig at %s, want %s", kubeconfig, filepath.Join(dir, "kubeconfig"))
	}

	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	cs := kubernetes.NewForConfigOrDie(cfg)
	ctx := context.Background()
	eventually(t, 30*time.Second, "the default ServiceAccount", func() error {
		_, err := cs.CoreV1().ServiceAccounts("default").Get(ctx, "default", metav1.GetOptions{})
		return err
	})
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "server"},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{
			Name: "main", Image: terraceImage, Args: []string{"dev", "pod-fixture", "--listen=$(POD_IP):8080"},
		}}},
	}
	if _, err := cs.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitPod(t, cs, "default", "server", 60*time.Second, "Running", func(p *corev1.Pod) error {
		if !podReady(p) {
			return fmt.Errorf("phase %s", p.Status.Phase)
		}
		return nil
	})

	controller, err := cs.AppsV1().Deployments("terrace-system").Get(ctx, "terrace-controller", metav1.GetOptions{})
	if err != nil || controller.Status.AvailableReplicas < 1 {
		t.Fatalf("terrace dev returned before the controller from config/default was Available: %v, %+v", err, controller.Status)
	}
	link := devLinkOfCluster(t, cfg.Host)
	// The pods' containers are children of containerd's shims, which the
	// node's init adopts: all of them descend from terrace dev.
	children := descendants(cmd.Process.Pid)
	// etcd, kube-apiserver, kube-controller-manager, kube-scheduler, the
	// node's init, containerd, kubelet, kube-proxy, and the pods' processes.
	if len(children) < 10 {
		t.Fatalf("expected at least 10 processes under terrace dev, found %v", children)
	}
	dev.interrupt(t)
	if link.exists() {
		t.Errorf("the node's link %s (index %s) outlived terrace dev", link.name, link.index)
	}
	for _, pid := range children {
		if alive(pid) {
			t.Errorf("child process %d outlived terrace dev", pid)
		}
	}
	if left := processesMentioning(dir); len(left) > 0 {
		t.Errorf("processes outlived terrace dev: %v", left)
	}
	if err := syscall.Kill(cmd.Process.Pid, 0); err == nil {
		t.Errorf("terrace dev (pid %d) is still there", cmd.Process.Pid)
	}
}

// TestTerraceDevKilledLeavesNothingBehind kills terrace dev with SIGKILL,
// which it cannot handle: the node's init dies with it (Pdeathsig), and with
// the init the kernel ends every process of the node's PID namespace,
// containers included, and the network namespace with the node's link.
func TestTerraceDevKilledLeavesNothingBehind(t *testing.T) {
	// A dev cluster of its own: runs beside the others like it, after
	// the tests of the shared cluster (ownClusterTest).
	ownClusterTest(t)
	dir := t.TempDir()
	dev := startTerraceDev(t, dir)
	cfg, err := clientcmd.BuildConfigFromFlags("", dev.kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	link := devLinkOfCluster(t, cfg.Host)
	children := descendants(dev.cmd.Process.Pid)
	if err := dev.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-dev.exited
	eventually(t, 15*time.Second, "every process of the dev cluster to end", func() error {
		var left []int
		for _, pid := range children {
			if alive(pid) {
				left = append(left, pid)
			}
		}
		if len(left) > 0 {
			return fmt.Errorf("%d of %d processes are still running: %v", len(left), len(children), left)
		}
		if link.exists() {
			return fmt.Errorf("the node's link %s (index %s) is still there", link.name, link.index)
		}
		return nil
	})
}

// TestTerraceDevDemoAppliesExamplesAndReportsResults runs `terrace dev
// --demo` over the repository's examples, as `make demo` does: the
// controller installed from config/default must make the Program and Stack Ready, and the
// terminal must show progress and results only (under 40 lines), with the
// full log in a file whose path it prints.
func TestTerraceDevDemoAppliesExamplesAndReportsResults(t *testing.T) {
	tools, err := testenv.FindTools()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	dir := t.TempDir()
	root := testenv.RepoRoot()
	cmd := exec.CommandContext(ctx, terraceBinary, "dev", "--demo", "--demo-timeout=150s", "--dir", dir,
		"--examples", filepath.Join(root, "examples"), "--install", filepath.Join(root, "config", "default"))
	cmd.Env = append(os.Environ(), "KUBEBUILDER_ASSETS="+tools.KubebuilderAssets, "TERRACE_TOFU="+tools.Tofu)
	var terminal testenv.SyncBuffer // stdout and stderr interleaved, as a user sees them
	cmd.Stdout, cmd.Stderr = &terminal, &terminal
	if err := cmd.Run(); err != nil {
		t.Fatalf("terrace dev --demo failed: %v\n%s\n%s", err, terminal.String(), devClusterLogs(dir))
	}
	out := terminal.String()
	logPath := filepath.Join(dir, "terrace-dev.log")
	for _, want := range []string{
		"full log: " + logPath,
		"applied Namespace demo",
		"Program demo/web-app: Current",
		"Stack demo/web-app: Current",
		"  digest   sha256:",
		"web-demo-app",
		"demo: 6 of 6 objects Ready, 0 failed",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("demo output lacks %q:\n%s", want, out)
		}
	}
	if lines := strings.Count(out, "\n"); lines >= 40 {
		t.Errorf("the demo printed %d lines, want under 40:\n%s", lines, out)
	}
	if strings.Contains(out, "demo-token-do-not-print") {
		t.Errorf("the demo printed the Secret's value:\n%s", out)
	}
	logText, err := os.ReadFile(logPath)
	if err != nil {
		t.Fatalf("the full log: %v", err)
	}
	for _, want := range []string{"node ready", "cluster DNS ready", "pushed the Terrace image"} {
		if !strings.Contains(string(logText), want) {
			t.Errorf("the full log lacks %q", want)
		}
		if strings.Contains(out, want) {
			t.Errorf("the terminal shows the log line %q without -v", want)
		}
	}
}
