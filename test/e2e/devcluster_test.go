package e2e

import (
	"bufio"
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"

	"github.com/terrace-dev/terrace/internal/devcluster"
	"github.com/terrace-dev/terrace/internal/devnode"
	"github.com/terrace-dev/terrace/internal/testenv"
)

// fixtureDeployment serves HTTP (readiness) and gRPC health (liveness) on
// the pod's address, with a Secret in a volume and in the environment.
func fixtureDeployment(name string) *appsv1.Deployment {
	labels := map[string]string{"app": name}
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](1),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					TerminationGracePeriodSeconds: ptr.To[int64](5),
					Containers: []corev1.Container{{
						Name:  "fixture",
						Image: terraceImage,
						Args: []string{"dev", "pod-fixture",
							"--listen=$(POD_IP):8080", "--grpc-listen=$(POD_IP):8081", "--whoami",
							"--file=token=/etc/fixture/secret/token", "--file=scratch=/var/scratch/note"},
						Env: []corev1.EnvVar{
							{Name: "FROM_SECRET", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
								LocalObjectReference: corev1.LocalObjectReference{Name: name + "-data"}, Key: "token"}}},
							{Name: "MY_NAMESPACE", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.namespace"}}},
						},
						Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}, {Name: "grpc", ContainerPort: 8081}},
						VolumeMounts: []corev1.VolumeMount{
							{Name: "data", MountPath: "/etc/fixture/secret", ReadOnly: true},
							{Name: "scratch", MountPath: "/var/scratch"},
						},
						ReadinessProbe: &corev1.Probe{
							ProbeHandler:  corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/healthz", Port: intstr.FromString("http")}},
							PeriodSeconds: 1,
						},
						LivenessProbe: &corev1.Probe{
							ProbeHandler:  corev1.ProbeHandler{GRPC: &corev1.GRPCAction{Port: 8081}},
							PeriodSeconds: 1,
						},
					}},
					Volumes: []corev1.Volume{
						{Name: "data", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: name + "-data"}}},
						{Name: "scratch", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
					},
				},
			},
		},
	}
}

func TestDeploymentPodRunsReadyAndIsCollected(t *testing.T) {
	dev := sharedDev(t)
	cs := kubernetes.NewForConfigOrDie(dev.Cluster.Config)
	ns := testNamespace(t, cs)
	ctx := context.Background()

	deploy, err := cs.AppsV1().Deployments(ns).Create(ctx, fixtureDeployment("web"), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// The Secret belongs to the Deployment: the garbage collector removes it
	// with its owner. Created after the Deployment, so the pod waits for it.
	owned := metav1.OwnerReference{APIVersion: "apps/v1", Kind: "Deployment", Name: deploy.Name, UID: deploy.UID}
	if _, err := cs.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "web-data", OwnerReferences: []metav1.OwnerReference{owned}},
		Data:       map[string][]byte{"token": []byte("t0k3n")},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	// The ReplicaSet controller makes the pod, devnode binds and runs it.
	var pod corev1.Pod
	eventually(t, 60*time.Second, "a Ready pod of the Deployment", func() error {
		pods, err := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app=web"})
		if err != nil {
			return err
		}
		if len(pods.Items) != 1 {
			return fmt.Errorf("%d pods", len(pods.Items))
		}
		pod = pods.Items[0]
		if !podReady(&pod) {
			return fmt.Errorf("pod %s not Ready: phase %s, %+v", pod.Name, pod.Status.Phase, pod.Status.ContainerStatuses)
		}
		return nil
	})
	if len(pod.OwnerReferences) == 0 || pod.OwnerReferences[0].Kind != "ReplicaSet" {
		t.Fatalf("the pod was not made by a ReplicaSet: %+v", pod.OwnerReferences)
	}
	if pod.Spec.NodeName != dev.Node.Name() || pod.Status.Phase != corev1.PodRunning {
		t.Fatalf("pod on %q in phase %s", pod.Spec.NodeName, pod.Status.Phase)
	}
	ip, err := netip.ParseAddr(pod.Status.PodIP)
	if err != nil || !ip.IsLoopback() || ip == netip.MustParseAddr("127.0.0.1") {
		t.Fatalf("pod IP %q is not a pod's own loopback address", pod.Status.PodIP)
	}
	if len(pod.Status.PodIPs) != 1 || pod.Status.PodIPs[0].IP != pod.Status.PodIP {
		t.Fatalf("podIPs %+v", pod.Status.PodIPs)
	}
	for _, c := range []corev1.PodConditionType{corev1.PodScheduled, corev1.PodInitialized, corev1.ContainersReady, corev1.PodReady} {
		found := false
		for _, pc := range pod.Status.Conditions {
			found = found || (pc.Type == c && pc.Status == corev1.ConditionTrue)
		}
		if !found {
			t.Errorf("condition %s is not True: %+v", c, pod.Status.Conditions)
		}
	}

	// The pod answers on its address with what Kubernetes gave it.
	addr := hostPort(pod.Status.PodIP, 8080)
	for path, want := range map[string]string{
		"/healthz":          "ok\n",
		"/env/FROM_SECRET":  "t0k3n",
		"/env/MY_NAMESPACE": ns,
		"/env/POD_IP":       pod.Status.PodIP,
		"/file/token":       "t0k3n",
		"/whoami":           "system:serviceaccount:" + ns + ":default",
	} {
		got, err := httpGet(addr, path)
		if err != nil || got != want {
			t.Errorf("GET %s = %q, %v; want %q", path, got, err, want)
		}
	}
	// The emptyDir is the same directory the process sees.
	root, err := httpGet(addr, "/env/"+devnode.EnvPodRoot)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "var", "scratch", "note"), []byte("shared"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got, err := httpGet(addr, "/file/scratch"); err != nil || got != "shared" {
		t.Errorf("emptyDir file through the pod = %q, %v", got, err)
	}
	// Logs reach `kubectl logs` through the API server.
	logs, err := podLogs(ctx, cs, ns, pod.Name, &corev1.PodLogOptions{})
	if err != nil || !strings.Contains(logs, "serving on "+addr) {
		t.Errorf("pod logs %q, %v", logs, err)
	}

	pids := dev.Node.Pids()
	if len(pids) == 0 {
		t.Fatal("devnode reports no running process")
	}
	rememberPids(pids...)

	// Deleting the Deployment: the garbage collector removes the ReplicaSet
	// and the pod, devnode stops the process, and the owned Secret goes.
	if err := cs.AppsV1().Deployments(ns).Delete(ctx, deploy.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitGone(t, 60*time.Second, "the pod to be removed", func() error {
		_, err := cs.CoreV1().Pods(ns).Get(ctx, pod.Name, metav1.GetOptions{})
		return err
	})
	waitGone(t, 30*time.Second, "the owned Secret to be collected", func() error {
		_, err := cs.CoreV1().Secrets(ns).Get(ctx, "web-data", metav1.GetOptions{})
		return err
	})
	eventually(t, 10*time.Second, "the pod's address to stop answering", func() error {
		if _, err := httpGet(addr, "/healthz"); err == nil {
			return fmt.Errorf("%s still answers", addr)
		}
		return nil
	})
	for _, pid := range pids {
		if alive(pid) {
			t.Errorf("process %d of the deleted pod is still running", pid)
		}
	}
	rs, err := cs.AppsV1().ReplicaSets(ns).List(ctx, metav1.ListOptions{})
	if err != nil || len(rs.Items) != 0 {
		t.Errorf("ReplicaSets left: %v, %v", rs, err)
	}
}

func TestFailingPodReportsExitCodeAndLastLogLines(t *testing.T) {
	dev := sharedDev(t)
	cs := kubernetes.NewForConfigOrDie(dev.Cluster.Config)
	ns := testNamespace(t, cs)
	ctx := context.Background()

	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "fails"},
		Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyNever,
			Containers: []corev1.Container{{
				Name:                     "main",
				Image:                    terraceImage,
				Command:                  []string{"/usr/local/bin/terrace"},
				Args:                     []string{"dev", "pod-fixture", "--say=starting up", "--say=fatal: the disk is on fire", "--exit=3"},
				TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
			}},
		},
	}
	if _, err := cs.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	got := waitPod(t, cs, ns, "fails", 60*time.Second, "Failed", func(p *corev1.Pod) error {
		if p.Status.Phase != corev1.PodFailed {
			return fmt.Errorf("phase %s", p.Status.Phase)
		}
		return nil
	})
	st := got.Status.ContainerStatuses[0].State.Terminated
	if st == nil || st.ExitCode != 3 || st.Reason != "Error" {
		t.Fatalf("container state %+v, want terminated with exit code 3", got.Status.ContainerStatuses[0].State)
	}
	if !strings.Contains(st.Message, "fatal: the disk is on fire") {
		t.Errorf("termination message %q lacks the last log line", st.Message)
	}
	logs, err := podLogs(ctx, cs, ns, "fails", &corev1.PodLogOptions{TailLines: ptr.To[int64](1)})
	if err != nil || logs != "fatal: the disk is on fire\n" {
		t.Errorf("last log line through the API = %q, %v", logs, err)
	}
	path, err := devnode.FindLog(dev.NodeDir, ns, "fails", "", false)
	if err != nil {
		t.Fatal(err)
	}
	if data, err := os.ReadFile(path); err != nil || !strings.Contains(string(data), "starting up\nfatal") {
		t.Errorf("log file %s = %q, %v", path, data, err)
	}

	// With OnFailure the same container is restarted and its earlier run's
	// log stays reachable.
	pod.Name, pod.Spec.RestartPolicy = "restarts", corev1.RestartPolicyOnFailure
	if _, err := cs.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	got = waitPod(t, cs, ns, "restarts", 60*time.Second, "restarted", func(p *corev1.Pod) error {
		if len(p.Status.ContainerStatuses) == 0 || p.Status.ContainerStatuses[0].RestartCount < 1 {
			return fmt.Errorf("not restarted yet: %+v", p.Status.ContainerStatuses)
		}
		return nil
	})
	if got.Status.Phase != corev1.PodRunning {
		t.Errorf("a restarting pod is in phase %s", got.Status.Phase)
	}
	last := got.Status.ContainerStatuses[0].LastTerminationState.Terminated
	if last == nil || last.ExitCode != 3 {
		t.Errorf("last termination %+v", got.Status.ContainerStatuses[0].LastTerminationState)
	}
	prev, err := podLogs(ctx, cs, ns, "restarts", &corev1.PodLogOptions{Previous: true})
	if err != nil || !strings.Contains(prev, "the disk is on fire") {
		t.Errorf("previous run's log = %q, %v", prev, err)
	}
}

// TestUnknownImageIsErrImagePull: devnode pulls images like a kubelet, so
// a tag its registry does not have leaves the pod Pending with
// ErrImagePull, then ImagePullBackOff, and never runs anything.
func TestUnknownImageIsErrImagePull(t *testing.T) {
	dev := sharedDev(t)
	cs := kubernetes.NewForConfigOrDie(dev.Cluster.Config)
	ns := testNamespace(t, cs)
	ctx := context.Background()
	const missing = "ghcr.io/terrace-dev/terrace:no-such-tag"
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "missing"},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "main", Image: missing, Args: []string{"dev", "pod-fixture", "--say=ran"}}}},
	}
	if _, err := cs.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	waitPod(t, cs, ns, "missing", 60*time.Second, "ErrImagePull, then ImagePullBackOff", func(p *corev1.Pod) error {
		if p.Status.Phase != corev1.PodPending {
			t.Fatalf("phase %s, want Pending", p.Status.Phase)
		}
		if len(p.Status.ContainerStatuses) == 1 {
			st := p.Status.ContainerStatuses[0]
			if st.State.Running != nil || st.State.Terminated != nil || st.LastTerminationState.Terminated != nil {
				t.Fatalf("the container of a missing image ran: %+v", st)
			}
			if w := st.State.Waiting; w != nil {
				if w.Reason == devnode.ReasonErrImagePull || w.Reason == devnode.ReasonImagePullBackOff {
					if !strings.Contains(w.Message, missing) {
						t.Fatalf("%s message %q does not name the image", w.Reason, w.Message)
					}
				}
				seen[w.Reason] = true
			}
		}
		if !seen[devnode.ReasonErrImagePull] || !seen[devnode.ReasonImagePullBackOff] {
			return fmt.Errorf("waiting reasons seen: %v", seen)
		}
		return nil
	})
	if err := cs.CoreV1().Pods(ns).Delete(ctx, "missing", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitGone(t, 30*time.Second, "the pod to be removed", func() error {
		_, err := cs.CoreV1().Pods(ns).Get(ctx, "missing", metav1.GetOptions{})
		return err
	})
}

func TestDeletionKillsAProcessThatIgnoresSIGTERMAfterTheGracePeriod(t *testing.T) {
	dev := sharedDev(t)
	cs := kubernetes.NewForConfigOrDie(dev.Cluster.Config)
	ns := testNamespace(t, cs)
	ctx := context.Background()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "stubborn"},
		Spec: corev1.PodSpec{
			TerminationGracePeriodSeconds: ptr.To[int64](2),
			Containers: []corev1.Container{{
				Name: "main", Image: terraceImage,
				Args: []string{"dev", "pod-fixture", "--listen=$(POD_IP):8080", "--ignore-sigterm"},
				ReadinessProbe: &corev1.Probe{
					ProbeHandler:  corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromInt32(8080)}},
					PeriodSeconds: 1,
				},
			}},
		},
	}
	if _, err := cs.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	running := waitPod(t, cs, ns, "stubborn", 60*time.Second, "Ready", func(p *corev1.Pod) error {
		if !podReady(p) {
			return fmt.Errorf("not ready: %+v", p.Status.ContainerStatuses)
		}
		return nil
	})
	var pid int
	fmt.Sscanf(running.Status.ContainerStatuses[0].ContainerID, "devnode://%d", &pid)
	if !alive(pid) {
		t.Fatalf("container id %q does not name a live process", running.Status.ContainerStatuses[0].ContainerID)
	}
	rememberPids(pid)
	begin := time.Now()
	if err := cs.CoreV1().Pods(ns).Delete(ctx, "stubborn", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitGone(t, 30*time.Second, "the pod to be removed", func() error {
		_, err := cs.CoreV1().Pods(ns).Get(ctx, "stubborn", metav1.GetOptions{})
		return err
	})
	if took := time.Since(begin); took < 2*time.Second {
		t.Errorf("pod removed after %s, before its 2 s grace period", took)
	}
	if alive(pid) {
		t.Errorf("process %d survived the grace period", pid)
	}
}

// devProcess is a `terrace dev` started as a user starts it.
type devProcess struct {
	cmd        *exec.Cmd
	stderr     *strings.Builder
	exited     chan error
	kubeconfig string
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
	links := devLinks(t)
	// The pods' containers are children of containerd's shims, which the
	// node's init adopts: all of them descend from terrace dev.
	children := descendants(cmd.Process.Pid)
	// etcd, kube-apiserver, kube-controller-manager, kube-scheduler, the
	// node's init, containerd, kubelet, kube-proxy, and the pods' processes.
	if len(children) < 10 {
		t.Fatalf("expected at least 10 processes under terrace dev, found %v", children)
	}
	dev.interrupt(t)
	if left := devLinks(t); len(left) >= len(links) {
		t.Errorf("the node's link outlived terrace dev: before %v, after %v", links, left)
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
	dir := t.TempDir()
	dev := startTerraceDev(t, dir)
	links := devLinks(t)
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
		if now := devLinks(t); len(now) >= len(links) {
			return fmt.Errorf("the node's link is still there: %v", now)
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

func TestInitContainersAndActiveDeadline(t *testing.T) {
	dev := sharedDev(t)
	cs := kubernetes.NewForConfigOrDie(dev.Cluster.Config)
	ns := testNamespace(t, cs)
	ctx := context.Background()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "deadline"},
		Spec: corev1.PodSpec{
			ActiveDeadlineSeconds: ptr.To[int64](3),
			RestartPolicy:         corev1.RestartPolicyNever,
			InitContainers: []corev1.Container{{
				Name: "init", Image: terraceImage, Args: []string{"dev", "pod-fixture", "--say=init done"},
			}},
			Containers: []corev1.Container{{
				Name: "main", Image: terraceImage, Args: []string{"dev", "pod-fixture", "--listen=$(POD_IP):8080"},
			}},
		},
	}
	if _, err := cs.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	running := waitPod(t, cs, ns, "deadline", 30*time.Second, "Running after its init container", func(p *corev1.Pod) error {
		if p.Status.Phase != corev1.PodRunning {
			return fmt.Errorf("phase %s", p.Status.Phase)
		}
		return nil
	})
	initState := running.Status.InitContainerStatuses[0].State.Terminated
	if initState == nil || initState.ExitCode != 0 || initState.Reason != "Completed" {
		t.Errorf("init container state %+v", running.Status.InitContainerStatuses[0].State)
	}
	if logs, err := podLogs(ctx, cs, ns, "deadline", &corev1.PodLogOptions{Container: "init"}); err != nil || logs != "init done\n" {
		t.Errorf("init container log %q, %v", logs, err)
	}
	failed := waitPod(t, cs, ns, "deadline", 30*time.Second, "Failed after its deadline", func(p *corev1.Pod) error {
		if p.Status.Phase != corev1.PodFailed {
			return fmt.Errorf("phase %s", p.Status.Phase)
		}
		return nil
	})
	if failed.Status.Reason != "DeadlineExceeded" {
		t.Errorf("reason %q, message %q", failed.Status.Reason, failed.Status.Message)
	}
	if st := failed.Status.ContainerStatuses[0].State.Terminated; st == nil {
		t.Errorf("main container not terminated: %+v", failed.Status.ContainerStatuses[0].State)
	}
	if _, err := httpGet(hostPort(running.Status.PodIP, 8080), "/healthz"); err == nil {
		t.Error("the pod still answers after its deadline")
	}
}
