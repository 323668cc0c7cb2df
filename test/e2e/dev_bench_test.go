package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/terrace-dev/terrace/internal/devcluster"
	"github.com/terrace-dev/terrace/internal/testenv"
)

// BenchmarkTerraceDevStartup measures `terrace dev` from start to a printed
// KUBECONFIG (control plane, the real node Ready, CoreDNS and Terrace from
// config/default Available) against the bare control plane (etcd,
// kube-apiserver, kube-controller-manager and the CRDs, devcluster.Start)
// started in the same run: the ratio is what the node and the install add
// on top of the API server nothing can do without. Once started, it also
// reports pod start (creation to Ready) over 20 pods, and the resident
// memory of terrace dev and of each process of the cluster (-v prints them).
//
//	go test ./test/e2e/ -run '^$' -bench TerraceDevStartup -benchtime 3x -v
func BenchmarkTerraceDevStartup(b *testing.B) {
	tools, err := testenv.FindTools()
	if err != nil {
		b.Fatal(err)
	}
	crds := testenv.RepoRoot() + "/config/crd/bases"
	var dev, bare time.Duration
	var podStarts []time.Duration
	runs := 0
	for b.Loop() {
		runs++
		p := startTerraceDev(b, b.TempDir())
		dev += p.startup
		podStarts = append(podStarts, measurePodStarts(b, p.kubeconfig, 20)...)
		if runs == 1 {
			logProcessMemory(b, p.cmd.Process.Pid)
		}
		p.interrupt(b)

		begin := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), devcluster.StartupTimeout)
		c, err := devcluster.Start(ctx, devcluster.Options{BinDir: tools.KubebuilderAssets, Dir: b.TempDir(), CRDDirs: []string{crds}})
		cancel()
		if err != nil {
			b.Fatal(err)
		}
		bare += time.Since(begin)
		if err := c.Stop(); err != nil {
			b.Fatal(err)
		}
	}
	n := float64(runs)
	b.ReportMetric(dev.Seconds()/n, "dev-s")
	b.ReportMetric(bare.Seconds()/n, "control-plane-s")
	b.ReportMetric(dev.Seconds()/bare.Seconds(), "dev/control-plane")
	slices.Sort(podStarts)
	b.ReportMetric(podStarts[len(podStarts)/2].Seconds(), "pod-start-p50-s")
	b.ReportMetric(podStarts[len(podStarts)*95/100].Seconds(), "pod-start-p95-s")
}

// measurePodStarts creates count pods of the Terrace image at once and
// returns, for each, the time from its creation to Ready.
func measurePodStarts(b *testing.B, kubeconfig string, count int) []time.Duration {
	b.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		b.Fatal(err)
	}
	cs := kubernetes.NewForConfigOrDie(cfg)
	ctx := context.Background()
	eventually(b, 30*time.Second, "the default ServiceAccount", func() error {
		_, err := cs.CoreV1().ServiceAccounts("default").Get(ctx, "default", metav1.GetOptions{})
		return err
	})
	created := map[string]time.Time{}
	for i := range count {
		name := fmt.Sprintf("start-%d", i)
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{
				Name: "main", Image: terraceImage, Args: []string{"dev", "pod-fixture", "--listen=$(POD_IP):8080"},
			}}},
		}
		created[name] = time.Now()
		if _, err := cs.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			b.Fatal(err)
		}
	}
	var starts []time.Duration
	ready := map[string]bool{}
	eventually(b, 2*time.Minute, "every pod to be Ready", func() error {
		pods, err := cs.CoreV1().Pods("default").List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		for i := range pods.Items {
			p := &pods.Items[i]
			if _, ours := created[p.Name]; !ours || ready[p.Name] || !podReady(p) {
				continue
			}
			ready[p.Name] = true
			starts = append(starts, time.Since(created[p.Name]))
		}
		if len(ready) < count {
			return fmt.Errorf("%d of %d Ready", len(ready), count)
		}
		return nil
	})
	logPodStartSteps(b, cs, created)
	return starts
}

// logPodStartSteps logs, for each pod created at the times given, when the
// kubelet reported each step of its start: scheduled, sandbox ready (its
// network attached), container started, Ready. The API's times have a
// resolution of a second; the slowest pods say which step they waited on.
func logPodStartSteps(b *testing.B, cs kubernetes.Interface, created map[string]time.Time) {
	b.Helper()
	pods, err := cs.CoreV1().Pods("default").List(context.Background(), metav1.ListOptions{})
	if err != nil {
		b.Fatal(err)
	}
	var lines []string
	for _, p := range pods.Items {
		c, ours := created[p.Name]
		if !ours {
			continue
		}
		at := func(t metav1.Time) string {
			if t.IsZero() {
				return "   -"
			}
			return fmt.Sprintf("%4.0f", t.Sub(c.Truncate(time.Second)).Seconds())
		}
		cond := map[corev1.PodConditionType]metav1.Time{}
		for _, pc := range p.Status.Conditions {
			cond[pc.Type] = pc.LastTransitionTime
		}
		var started metav1.Time
		for _, st := range p.Status.ContainerStatuses {
			if st.State.Running != nil {
				started = st.State.Running.StartedAt
			}
		}
		lines = append(lines, fmt.Sprintf("%s  %s %s %s  %s", at(cond[corev1.PodReady]), at(cond[corev1.PodScheduled]), at(cond[corev1.PodReadyToStartContainers]), at(started), p.Name))
	}
	slices.Sort(lines)
	b.Logf("pod start steps, seconds from creation (Ready; scheduled, sandbox ready, container started):\n%s", strings.Join(lines, "\n"))
}

// logProcessMemory logs the resident memory of pid and of each process under
// it, by command name.
func logProcessMemory(b *testing.B, pid int) {
	b.Helper()
	byName := map[string]int64{}
	for _, p := range append([]int{pid}, descendants(pid)...) {
		status, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(p), "status"))
		if err != nil {
			continue
		}
		var name string
		var rssKiB int64
		for _, line := range strings.Split(string(status), "\n") {
			if v, ok := strings.CutPrefix(line, "Name:"); ok {
				name = strings.TrimSpace(v)
			}
			if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
				rssKiB, _ = strconv.ParseInt(strings.Fields(v)[0], 10, 64)
			}
		}
		if p == pid {
			name = "terrace dev"
		}
		byName[name] += rssKiB
	}
	names := make([]string, 0, len(byName))
	for n := range byName {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		b.Logf("RSS %-28s %7.1f MiB", n, float64(byName[n])/1024)
	}
}
