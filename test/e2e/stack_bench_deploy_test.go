package e2e

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/devcluster"
	"github.com/terrace-dev/terrace/internal/scheme"
	"github.com/terrace-dev/terrace/internal/testenv"
	"github.com/terrace-dev/terrace/test/chart/chartrender"
)

// TERRACE_BENCH_CONTROLLER=deployment installs the controller as users
// install it: the Helm chart, unchanged but for one replica, the image's
// dev tag (the image of this checkout the dev cluster serves), the
// benchmark's run limits and a metrics reader. The controller then runs in
// its pod on the real node, and the benchmark reads its CPU time and peak
// memory from the pod's cgroups and its metrics over HTTPS with a token of
// that reader, as Prometheus would.
func benchControllerDeployment() bool { return os.Getenv("TERRACE_BENCH_CONTROLLER") == "deployment" }

// controllerDeployment is the controller the chart installed.
type controllerDeployment struct {
	node    *devcluster.Node
	cs      kubernetes.Interface
	podUID  string
	podName string
	podIP   string
	metrics string
	token   string
	http    *http.Client
	// pprofPort serves the controller's Go profiles (TERRACE_BENCH_PPROF).
	pprofPort string
}

// benchDeployment is the Deployment the benchmark installed, if any.
var benchDeployment *controllerDeployment

// benchMetricsReader is the ServiceAccount the benchmark reads the
// controller's metrics with (chart value metrics.readers).
const benchMetricsReader = "fleet-bench"

// startControllerDeployment installs the chart on the shared dev cluster
// and waits for its one controller pod to be Ready.
func startControllerDeployment(b *testing.B) *controllerDeployment {
	b.Helper()
	dev := sharedDev(b)
	stackCtl.mu.Lock()
	defer stackCtl.mu.Unlock()
	if stackCtl.ctrl != nil {
		b.Fatal("a controller already runs in the test process")
	}
	ctx := context.Background()
	c, err := client.New(dev.Cluster.Config, client.Options{Scheme: scheme.New()})
	if err != nil {
		b.Fatal(err)
	}
	cs := kubernetes.NewForConfigOrDie(dev.Cluster.Config)
	(&stackEnv{dev: dev, c: c}).installOperatorConfig(b)
	extraArgs := []any{
		// The benchmark's Stacks share one namespace: all of its runs at once.
		"--max-concurrent-runs=" + strconv.Itoa(benchConcurrency()),
		"--max-runs-per-namespace=" + strconv.Itoa(benchConcurrency()),
	}
	pprofPort := benchPprofPort(b)
	if pprofPort != "" {
		extraArgs = append(extraArgs, "--pprof-addr=:"+pprofPort)
	}
	objects, err := chartrender.Render(testenv.RepoRoot(), map[string]any{
		"image":        map[string]any{"tag": devcluster.DevTag},
		"replicaCount": 1,
		"extraArgs":    extraArgs,
		"metrics":      map[string]any{"readers": []any{map[string]any{"kind": "ServiceAccount", "name": benchMetricsReader, "namespace": operatorNamespace}}},
	})
	if err != nil {
		b.Fatal(err)
	}
	var install []devcluster.Applied
	for _, o := range objects {
		if o.GetNamespace() == "" && o.GetKind() != "ClusterRole" && o.GetKind() != "ClusterRoleBinding" {
			o.SetNamespace(operatorNamespace)
		}
		install = append(install, devcluster.Applied{Object: o, Source: "the chart"})
	}
	if pprofPort != "" {
		install = append(install, devcluster.Applied{Object: pprofNetworkPolicy(b, pprofPort), Source: "the benchmark"})
	}
	if _, err := cs.CoreV1().ServiceAccounts(operatorNamespace).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: benchMetricsReader}}, metav1.CreateOptions{}); err != nil {
		b.Fatal(err)
	}
	if err := devcluster.Apply(ctx, dev.Cluster.Config, install, func(string) {}); err != nil {
		b.Fatalf("failed to install the chart: %v", err)
	}
	tok, err := cs.CoreV1().ServiceAccounts(operatorNamespace).CreateToken(ctx, benchMetricsReader,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To(int64(6 * 3600))}}, metav1.CreateOptions{})
	if err != nil {
		b.Fatal(err)
	}
	d := &controllerDeployment{
		node: dev.Node, cs: cs, token: tok.Status.Token, pprofPort: pprofPort,
		// The controller's serving certificate is from its own CA; the
		// token is what the endpoint checks.
		http: &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}, //nolint:gosec // see above
	}
	d.findPod(b, "")
	stackCtl.ctrl = &controller{stop: func() {}, done: make(chan error, 1)}
	benchDeployment = d
	return d
}

// controllerSelector selects the chart's controller pods.
const controllerSelector = "app.kubernetes.io/name=terrace,app.kubernetes.io/component=controller"

// findPod waits for a Ready controller pod other than the one with uid
// not, and reads its metrics from then on.
func (d *controllerDeployment) findPod(b *testing.B, not string) {
	b.Helper()
	eventually(b, 3*time.Minute, "the controller pod Ready", func() error {
		pods, err := d.cs.CoreV1().Pods(operatorNamespace).List(context.Background(), metav1.ListOptions{LabelSelector: controllerSelector})
		if err != nil {
			return err
		}
		for _, p := range pods.Items {
			if podReady(&p) && p.DeletionTimestamp == nil && string(p.UID) != not {
				d.podUID = string(p.UID)
				d.podName, d.podIP = p.Name, p.Status.PodIP
				d.metrics = "https://" + net.JoinHostPort(p.Status.PodIP, "8443") + "/metrics"
				return nil
			}
		}
		return fmt.Errorf("no Ready controller pod among %d", len(pods.Items))
	})
	eventually(b, 2*time.Minute, "the controller's metrics endpoint", func() error {
		_, err := d.scrape()
		return err
	})
}

// measureResync deletes the controller's pod once n Stacks are Ready and
// measures the time until its replacement has reconciled each of them,
// which must start no run: the Stacks' status.lastRun stays as it was and
// the new controller counts no run (#42: ≤ 60 s at 10,000 Stacks).
func (d *controllerDeployment) measureResync(b *testing.B, e *stackEnv, n int) {
	b.Helper()
	ctx := context.Background()
	lastRuns := func() map[string]string {
		var stacks terracev1.StackList
		if err := e.c.List(ctx, &stacks, client.InNamespace(e.ns)); err != nil {
			b.Fatal(err)
		}
		out := map[string]string{}
		for _, s := range stacks.Items {
			out[s.Name] = s.Status.LastRun
		}
		return out
	}
	before := lastRuns()
	old := d.podUID
	start := time.Now()
	if err := d.cs.CoreV1().Pods(operatorNamespace).Delete(ctx, d.podName, metav1.DeleteOptions{}); err != nil {
		b.Fatal(err)
	}
	d.findPod(b, old)
	ready := time.Since(start)
	eventually(b, 30*time.Minute, fmt.Sprintf("the new controller to reconcile the %d Stacks", n), func() error {
		m, err := d.scrape()
		if err != nil {
			return err
		}
		if done := sumMetric(m, "controller_runtime_reconcile_total", `controller="stack"`); done < float64(n) {
			return fmt.Errorf("%.0f of %d reconciled", done, n)
		}
		return nil
	})
	resync := time.Since(start)
	d.saveHeapProfile(b, fmt.Sprintf("stacks-%d-after-restart", n))
	m, err := d.scrape()
	if err != nil {
		b.Fatal(err)
	}
	runs := sumMetric(m, "terrace_runs_total")
	changed := 0
	for name, run := range lastRuns() {
		if before[name] != run {
			changed++
		}
	}
	b.ReportMetric(resync.Seconds(), "resync-s")
	b.Logf("controller restart: a new pod Ready %.1f s after the old one's delete, the %d Stacks reconciled after %.1f s; runs started by the new controller: %.0f, Stacks whose last run changed: %d",
		ready.Seconds(), n, resync.Seconds(), runs, changed)
	if runs > 0 || changed > 0 {
		b.Errorf("the restarted controller started runs: %.0f counted, %d Stacks with a new last run", runs, changed)
	}
}

// scrape reads the controller's metrics as its readers do.
func (d *controllerDeployment) scrape() (map[string]float64, error) {
	return httpMetrics(d.http, d.metrics, d.token)
}

// cpu is the controller pod's CPU time so far.
func (d *controllerDeployment) cpu() time.Duration {
	t, _ := d.node.PodCPU(d.podUID)
	return t
}

func (d *controllerDeployment) resetPeakMemory(b *testing.B) {
	if err := d.node.ResetPodMemoryPeak(d.podUID); err != nil {
		b.Fatal(err)
	}
}

func (d *controllerDeployment) peakMemory(b *testing.B) uint64 {
	v, err := d.node.PodMemoryPeak(d.podUID)
	if err != nil {
		b.Fatal(err)
	}
	return v
}

// benchPprofPort is the port of TERRACE_BENCH_PPROF (host:port), where the
// controller pod serves Go's profiles; empty when unset.
func benchPprofPort(b *testing.B) string {
	addr := os.Getenv("TERRACE_BENCH_PPROF")
	if addr == "" {
		return ""
	}
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		b.Fatalf("TERRACE_BENCH_PPROF=%s: %v", addr, err)
	}
	return port
}

// pprofNetworkPolicy lets the benchmark reach the controller's profiles
// beside the chart's policy, which admits its servers' ports only.
func pprofNetworkPolicy(b *testing.B, port string) *unstructured.Unstructured {
	b.Helper()
	n, err := strconv.Atoi(port)
	if err != nil {
		b.Fatal(err)
	}
	np := &networkingv1.NetworkPolicy{
		TypeMeta:   metav1.TypeMeta{APIVersion: "networking.k8s.io/v1", Kind: "NetworkPolicy"},
		ObjectMeta: metav1.ObjectMeta{Name: "fleet-bench-pprof", Namespace: operatorNamespace},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app.kubernetes.io/name": "terrace", "app.kubernetes.io/component": "controller"}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
			Ingress:     []networkingv1.NetworkPolicyIngressRule{{Ports: []networkingv1.NetworkPolicyPort{{Port: ptr.To(intstr.FromInt(n))}}}},
		},
	}
	obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(np)
	if err != nil {
		b.Fatal(err)
	}
	return &unstructured.Unstructured{Object: obj}
}

// saveHeapProfile writes the controller's heap profile, when it serves
// one, to $TMPDIR/controller-heap-<name>.pprof (go tool pprof).
func (d *controllerDeployment) saveHeapProfile(b *testing.B, name string) {
	b.Helper()
	if d.pprofPort == "" {
		return
	}
	url := "http://" + net.JoinHostPort(d.podIP, d.pprofPort) + "/debug/pprof/heap"
	resp, err := d.http.Get(url)
	if err != nil {
		b.Logf("controller heap profile: %v", err)
		return
	}
	defer func() { _ = resp.Body.Close() }()
	path := filepath.Join(os.TempDir(), "controller-heap-"+name+".pprof")
	f, err := os.Create(path)
	if err == nil {
		_, err = io.Copy(f, resp.Body)
		err = errors.Join(err, f.Close())
	}
	if err != nil || resp.StatusCode != http.StatusOK {
		b.Logf("controller heap profile from %s: %s %v", url, resp.Status, err)
		return
	}
	b.Logf("controller heap profile: go tool pprof -sample_index=inuse_space %s", path)
}
