package e2e

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// terraceImage is the Terrace image: the dev cluster pushes the build of
// this checkout as terrace-dev/terrace:dev to its registry, which the
// node's containerd pulls ghcr.io (every registry) from.
const terraceImage = "ghcr.io/terrace-dev/terrace:dev"

// linkListener listens on a free port of the host's end of the shared dev
// node's link: the host address runner pods reach (the dev node's network
// reaches nothing else on the host).
func linkListener(t testing.TB) net.Listener {
	t.Helper()
	l, err := net.Listen("tcp", net.JoinHostPort(sharedDev(t).Node.HostIP(), "0"))
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// newLinkServer starts an HTTP test server on the link (linkListener),
// closed when the test ends.
func newLinkServer(t testing.TB, h http.Handler) *httptest.Server {
	t.Helper()
	srv := httptest.NewUnstartedServer(h)
	_ = srv.Listener.Close()
	srv.Listener = linkListener(t)
	srv.Start()
	t.Cleanup(srv.Close)
	return srv
}

// eventually polls cond every 100 ms until it returns nil or timeout
// passes, then fails the test with cond's last error.
func eventually(t testing.TB, timeout time.Duration, what string, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	ticker := time.NewTicker(100 * time.Millisecond)
	defer ticker.Stop()
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s: %v", timeout, what, err)
		}
		<-ticker.C
	}
}

// testNamespace creates a namespace for one test, waits for its default
// ServiceAccount (pods are refused without it) and deletes it afterwards.
func testNamespace(t testing.TB, cs kubernetes.Interface) string {
	t.Helper()
	ctx := context.Background()
	ns, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "e2e-"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("failed to create namespace: %v", err)
	}
	t.Cleanup(func() { _ = cs.CoreV1().Namespaces().Delete(context.Background(), ns.Name, metav1.DeleteOptions{}) })
	eventually(t, 30*time.Second, "the default ServiceAccount", func() error {
		_, err := cs.CoreV1().ServiceAccounts(ns.Name).Get(ctx, "default", metav1.GetOptions{})
		return err
	})
	return ns.Name
}

// waitPod polls a pod until check accepts it.
func waitPod(t *testing.T, cs kubernetes.Interface, ns, name string, timeout time.Duration, what string, check func(*corev1.Pod) error) *corev1.Pod {
	t.Helper()
	var pod *corev1.Pod
	eventually(t, timeout, fmt.Sprintf("pod %s/%s: %s", ns, name, what), func() error {
		p, err := cs.CoreV1().Pods(ns).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		pod = p
		return check(p)
	})
	return pod
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func waitGone(t *testing.T, timeout time.Duration, what string, get func() error) {
	t.Helper()
	eventually(t, timeout, what, func() error {
		err := get()
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return err
		}
		return fmt.Errorf("still there")
	})
}

// httpGet fetches http://addr/path with a short timeout.
func httpGet(addr, path string) (string, error) {
	client := &http.Client{Timeout: 2 * time.Second}
	resp, err := client.Get("http://" + addr + path)
	if err != nil {
		return "", err
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("GET %s: %s: %s", path, resp.Status, body)
	}
	return string(body), nil
}

// podLogs reads a container's log through the API server (as kubectl logs does).
func podLogs(ctx context.Context, cs kubernetes.Interface, ns, pod string, opts *corev1.PodLogOptions) (string, error) {
	data, err := cs.CoreV1().Pods(ns).GetLogs(pod, opts).DoRaw(ctx)
	return string(data), err
}

func hostPort(ip string, port int) string { return net.JoinHostPort(ip, strconv.Itoa(port)) }

// parseStat returns the parent pid and state from /proc/<pid>/stat.
func parseStat(stat string) (ppid int, state string) {
	// The command name is in parentheses and may contain spaces.
	end := strings.LastIndex(stat, ")")
	if end < 0 {
		return 0, ""
	}
	fields := strings.Fields(stat[end+1:])
	if len(fields) < 2 {
		return 0, ""
	}
	ppid, _ = strconv.Atoi(fields[1])
	return ppid, fields[0]
}

// descendants lists the live processes below pid.
func descendants(pid int) []int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	children := map[int][]int{}
	for _, e := range entries {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		ppid, state := parseStat(string(stat))
		if state != "Z" {
			children[ppid] = append(children[ppid], p)
		}
	}
	var out []int
	queue := []int{pid}
	for len(queue) > 0 {
		next := queue[0]
		queue = queue[1:]
		for _, c := range children[next] {
			out = append(out, c)
			queue = append(queue, c)
		}
	}
	return out
}

// containerPid returns the host PID of the first process of a container
// (containerd://<id>) on the dev node: the process in the container's
// cgroup whose parent is not (the shim is outside it).
func containerPid(containerID string) (int, error) {
	id := strings.TrimPrefix(containerID, "containerd://")
	if id == "" || id == containerID {
		return 0, fmt.Errorf("container id %q is not containerd's", containerID)
	}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0, err
	}
	in := map[int]bool{}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if cg, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cgroup")); err == nil && strings.Contains(string(cg), id) {
			in[pid] = true
		}
	}
	for pid := range in {
		stat, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
		if err != nil {
			continue
		}
		if ppid, _ := parseStat(string(stat)); !in[ppid] {
			return pid, nil
		}
	}
	return 0, fmt.Errorf("no process in the cgroup of container %s", id)
}

// processesMentioning lists live processes whose command line contains s.
func processesMentioning(s string) []string {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var out []string
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || !strings.Contains(string(cmdline), s) || !alive(pid) {
			continue
		}
		out = append(out, fmt.Sprintf("%d: %s", pid, strings.ReplaceAll(string(cmdline), "\x00", " ")))
	}
	return out
}

// devLinkOf names the host end of the node link (tdev<slot>) of the dev
// cluster whose API server is at apiServerURL: kube-apiserver listens on
// that end, 10.<slot>.255.1. Other tests' dev clusters come and go beside
// a test's own, so a test checks its own link, never a count of them.
func devLinkOf(tb testing.TB, apiServerURL string) string {
	tb.Helper()
	u, err := url.Parse(apiServerURL)
	if err != nil {
		tb.Fatal(err)
	}
	ip := net.ParseIP(u.Hostname()).To4()
	if ip == nil || ip[0] != 10 || ip[2] != 255 || ip[3] != 1 {
		tb.Fatalf("API server %s is not on a dev cluster's node link (10.<slot>.255.1)", apiServerURL)
	}
	return "tdev" + strconv.Itoa(int(ip[1]))
}

// devLink is a dev cluster's node link: its name, and its interface index,
// which tells it from a link of the same name that another cluster, given
// the same slot after this one ended, makes at once.
type devLink struct {
	name  string
	index string
}

// devLinkOfCluster is the node link of the dev cluster whose API server is
// at apiServerURL, as it is now; the test fails when it is not there.
func devLinkOfCluster(tb testing.TB, apiServerURL string) devLink {
	tb.Helper()
	name := devLinkOf(tb, apiServerURL)
	link, ok := findDevLink(name)
	if !ok {
		tb.Fatalf("the node's link %s is not there", name)
	}
	return link
}

// findDevLink reads the link named name; ok is false when there is none.
func findDevLink(name string) (devLink, bool) {
	index, err := os.ReadFile(filepath.Join("/sys/class/net", name, "ifindex"))
	if err != nil {
		return devLink{}, false
	}
	return devLink{name: name, index: strings.TrimSpace(string(index))}, true
}

// exists says whether this very link (by name and index) is still there.
func (l devLink) exists() bool {
	now, ok := findDevLink(l.name)
	return ok && now.index == l.index
}

// devClusterLogs returns the last lines of what a stopped dev cluster in dir
// logged that explains a slow or failed run: the kubelet, and the
// controller's and runner pods' containers (their logs stay on disk).
func devClusterLogs(dir string) string {
	var b strings.Builder
	paths, _ := filepath.Glob(filepath.Join(dir, "node", "logs", "pods", "*", "*", "*.log"))
	paths = append([]string{filepath.Join(dir, "node", "logs", "kubelet.log")}, paths...)
	for _, path := range paths {
		if strings.Contains(path, "kube-system_") {
			continue
		}
		data, err := os.ReadFile(path)
		if err != nil {
			continue
		}
		lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
		fmt.Fprintf(&b, "--- %s (last %d lines)\n%s\n", path, min(len(lines), 30), strings.Join(lines[max(0, len(lines)-30):], "\n"))
	}
	return b.String()
}

// ownClusterTest marks a test that starts a dev cluster of its own
// (startTerraceDev, startOwnDev) and touches nothing shared: such tests run
// in parallel with each other (go test -parallel, 2 on two cores) once the
// tests of the shared cluster are done, since they mostly wait on their
// clusters' pods.
func ownClusterTest(t *testing.T) {
	t.Helper()
	t.Parallel()
}
