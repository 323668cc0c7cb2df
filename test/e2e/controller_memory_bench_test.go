package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/notify"
	"github.com/terrace-dev/terrace/internal/state/secrets"
	"github.com/terrace-dev/terrace/internal/testenv"
)

// BenchmarkControllerMemoryAtRest is what the controller holds for a fleet
// at rest, apart from runs: TERRACE_BENCH_IDLE_STACKS (1000) Stacks with
// an applied Stack's status, suspended so that none runs, each with the two
// Secrets an applied Stack keeps, on an envtest API server; `terrace
// controller` as a process of its own. Once it has reconciled every Stack it reports its RSS, peak RSS and live Go heap,
// first without the notifications ConfigMap, then with it (the
// notification controller then keeps an unstructured copy of every Stack).
// `go test ./test/e2e/ -run '^$' -bench ControllerMemoryAtRest -benchtime 1x -v`.
func BenchmarkControllerMemoryAtRest(b *testing.B) {
	n := 1000
	if v := os.Getenv("TERRACE_BENCH_IDLE_STACKS"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil {
			b.Fatalf("TERRACE_BENCH_IDLE_STACKS=%s: %v", v, err)
		}
	}
	env, err := testenv.Start()
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = env.Stop() }()
	kubeconfig, err := env.Kubeconfig(b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	const fleetNS = "fleet"
	for _, ns := range []string{operatorNamespace, fleetNS} {
		if err := env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
			b.Fatal(err)
		}
	}
	created := time.Now()
	createIdleStacks(b, env.Client, fleetNS, n)
	b.Logf("%d Stacks created with an applied Stack's status and two Secrets each in %s", n, time.Since(created).Round(time.Second))

	for b.Loop() {
		without := idleControllerMemory(b, kubeconfig, n)
		cm := &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Name: notify.DefaultConfigMapName, Namespace: operatorNamespace},
			// A service nothing subscribes to: it is never called.
			Data: map[string]string{"service.webhook.unused": "url: http://127.0.0.1:9/unused\n"},
		}
		if err := env.Client.Create(ctx, cm); err != nil {
			b.Fatal(err)
		}
		with := idleControllerMemory(b, kubeconfig, n)
		if err := env.Client.Delete(ctx, cm); err != nil {
			b.Fatal(err)
		}
		for _, m := range []struct {
			name   string
			sample idleMemory
		}{{"without-notifications", without}, {"with-notifications", with}} {
			b.ReportMetric(m.sample.rss, "rss-MiB-"+m.name)
			b.ReportMetric(m.sample.peakRSS, "peak-rss-MiB-"+m.name)
			b.ReportMetric(m.sample.heap, "live-heap-MiB-"+m.name)
		}
		b.ReportMetric(with.heap/without.heap, "live-heap-ratio-with/without")
	}
}

// createIdleStacks creates n suspended Stacks in ns, each with the status
// an applied one-resource Stack has (conditions, plan, release, inventory).
func createIdleStacks(b *testing.B, c client.Client, ns string, n int) {
	b.Helper()
	ctx := context.Background()
	now := metav1.Now()
	names := make(chan int)
	errs := make(chan error, 8)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for i := range names {
				st := &terracev1.Stack{
					ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("s%d", i), Namespace: ns},
					Spec: terracev1.StackSpec{
						Source:      terracev1.StackSource{ProgramRef: &terracev1.LocalObjectReference{Name: "bench"}},
						Vars:        jsonVarsB(map[string]string{"n": strconv.Itoa(i)}),
						ApprovePlan: terracev1.ApprovePlanAuto,
						Suspend:     true,
					},
				}
				if err := c.Create(ctx, st); err != nil {
					errs <- err
					return
				}
				st.Status = appliedStatus(st.Generation, now)
				if err := c.Status().Update(ctx, st); err != nil {
					errs <- err
					return
				}
				for _, sec := range keptSecrets(st) {
					if err := c.Create(ctx, sec); err != nil {
						errs <- err
						return
					}
				}
			}
		})
	}
	for i := range n {
		select {
		case names <- i:
		case err := <-errs:
			b.Fatal(err)
		}
	}
	close(names)
	wg.Wait()
	select {
	case err := <-errs:
		b.Fatal(err)
	default:
	}
}

// keptSecrets are the two Secrets an applied Stack of the fleet keeps (its
// state index and its release), with their kind of labels, annotations,
// owner and size.
func keptSecrets(st *terracev1.Stack) []*corev1.Secret {
	owner := metav1.OwnerReference{APIVersion: terracev1.GroupVersion.String(), Kind: "Stack", Name: st.Name, UID: st.UID}
	secret := func(name, kind string, size int) *corev1.Secret {
		return &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{
				Name: name, Namespace: st.Namespace, OwnerReferences: []metav1.OwnerReference{owner},
				Labels: map[string]string{
					secrets.LabelManagedBy: "terrace", secrets.LabelStack: st.Name, secrets.LabelKind: kind, secrets.LabelWorkspace: "default",
				},
				Annotations: map[string]string{secrets.AnnotationStack: st.Name, secrets.AnnotationWorkspace: "default"},
			},
			Data: map[string][]byte{"data": []byte(strings.Repeat("x", size))},
		}
	}
	return []*corev1.Secret{
		secret("tfstate-default-"+st.Name, "state-index", 500),
		secret("terrace-release-"+st.Name+"-v1", "release", 700),
	}
}

// appliedStatus is the status of an applied Stack of the fleet benchmark's
// module (one terraform_data, one output), as the controller writes it.
func appliedStatus(generation int64, at metav1.Time) terracev1.StackStatus {
	const revision = "1@sha256:0ec72eb0fe03fe152045eed6b346e4d5453b8231e30092d3cfa410206b42cd3e"
	const inputs = "sha256:5e321654468794bfd1140846cd5155220ddcab4d271fe03edfc4ea3f13a539f4"
	cond := func(typ, status, reason, message string) metav1.Condition {
		return metav1.Condition{Type: typ, Status: metav1.ConditionStatus(status), Reason: reason, Message: message, ObservedGeneration: generation, LastTransitionTime: at}
	}
	return terracev1.StackStatus{
		ObservedGeneration: generation,
		Conditions: []metav1.Condition{
			cond(terracev1.ReadyCondition, "True", "Applied", "applied 1@sha256:0ec72eb0 (release 1)"),
			cond(terracev1.AppliedCondition, "True", "Applied", "applied "+revision),
			cond("Drifted", "False", "NoDrift", "no drift at "+at.UTC().Format(time.RFC3339)),
			cond("Planned", "True", "Planned", "plan plan-2-4fbbe9932f: +1 ~0 -0"),
		},
		LastAppliedRevision: revision, LastAttemptedRevision: revision, LastPlannedRevision: revision,
		LastAppliedInputsDigest: inputs,
		Plan:                    &terracev1.PlanStatus{ID: "plan-2-4fbbe9932f", Add: 1, InputsDigest: inputs, CreatedAt: &at},
		Outputs:                 []string{"name"},
		Release:                 &terracev1.ReleaseStatus{Revision: 1, Status: "deployed", UpdatedAt: &at, StateSerial: 1},
		LastDriftCheckAt:        &at,
		LastRun:                 "cf61zedz",
		Inventory:               &terracev1.Inventory{Count: 1, Resources: []string{"terraform_data.item"}},
	}
}

// idleMemory is a controller's memory at rest, in MiB.
type idleMemory struct{ rss, peakRSS, heap float64 }

// idleControllerMemory starts `terrace controller`, waits until it has
// reconciled n Stacks and settled, reads its memory and stops it.
func idleControllerMemory(b *testing.B, kubeconfig string, n int) idleMemory {
	b.Helper()
	addrs, err := testenv.FreeLoopbackAddrs(4)
	if err != nil {
		b.Fatal(err)
	}
	metricsAddr, artifactAddr, stateAddr, pprofAddr := addrs[0], addrs[1], addrs[2], addrs[3]
	cmd, stop := startTerraceProcess(b, []string{"controller",
		"--kubeconfig", kubeconfig, "--namespace", operatorNamespace, "--leader-elect=false", "--pprof-addr", pprofAddr,
		"--metrics-addr", metricsAddr, "--metrics-secure=false", "--health-addr", "0", "--webhook-bind-address", "0",
		"--server-ips", "127.0.0.1", "--image", "ghcr.io/terrace-dev/terrace:dev",
		"--artifact-bind-address", artifactAddr, "--artifact-base-url", "https://" + artifactAddr,
		"--state-server-bind-address", stateAddr, "--state-server-advertised-url", "https://" + stateAddr})
	defer stop()
	metricsURL := "http://" + metricsAddr + "/metrics"
	start := time.Now()
	eventually(b, 10*time.Minute, fmt.Sprintf("the controller to reconcile the %d Stacks", n), func() error {
		m, err := httpMetrics(http.DefaultClient, metricsURL, "")
		if err != nil {
			return err
		}
		if done := sumMetric(m, "controller_runtime_reconcile_total", `controller="stack"`); done < float64(n) {
			return fmt.Errorf("%.0f of %d reconciled", done, n)
		}
		return nil
	})
	b.Logf("the controller reconciled %d Stacks %s after its start", n, time.Since(start).Round(100*time.Millisecond))
	// Settled: the notification controller's informer has listed too.
	time.Sleep(10 * time.Second)
	status := fmt.Sprintf("/proc/%d/status", cmd.Process.Pid)
	const mib = 1 << 20
	profile := heapProfileText(b, pprofAddr)
	sample := idleMemory{
		rss:     float64(statusBytes(status, "VmRSS:")) / mib,
		peakRSS: float64(vmHWM(status)) / mib,
		heap:    float64(liveHeap(b, profile)) / mib,
	}
	// Where the RSS is: the binary's pages (file) against the Go heap,
	// stacks and runtime (anonymous), and what the runtime has kept.
	b.Logf("RSS %.1f MiB: anonymous %.1f, file %.1f; Go runtime: %s", sample.rss,
		float64(statusBytes(status, "RssAnon:"))/mib, float64(statusBytes(status, "RssFile:"))/mib, runtimeMemory(profile))
	return sample
}

// runtimeMemory is the Go runtime's account of a process's memory, from the
// MemStats lines of its text heap profile, in MiB.
func runtimeMemory(profile []byte) string {
	var out []string
	for _, field := range []string{"Sys", "HeapSys", "HeapInuse", "HeapIdle", "HeapReleased", "NextGC"} {
		if v, ok := memStat(profile, field); ok {
			out = append(out, fmt.Sprintf("%s %.1f", field, float64(v)/(1<<20)))
		}
	}
	return strings.Join(out, ", ")
}

// liveHeap is the Go heap a text heap profile taken right after a
// collection (heapProfileText) found: what is live, not where the
// collector's cycle happens to be.
func liveHeap(b *testing.B, profile []byte) uint64 {
	b.Helper()
	v, ok := memStat(profile, "HeapAlloc")
	if !ok {
		b.Fatal("no HeapAlloc in the controller's heap profile")
	}
	return v
}

// memStat is one runtime.MemStats field of a text heap profile.
func memStat(profile []byte, field string) (uint64, bool) {
	m := regexp.MustCompile(`(?m)^# ` + field + ` = (\d+)$`).FindSubmatch(profile)
	if m == nil {
		return 0, false
	}
	v, err := strconv.ParseUint(string(m[1]), 10, 64)
	return v, err == nil
}

// heapProfileText is the text heap profile of a process serving pprof at
// addr, taken right after a collection (gc=1).
func heapProfileText(b *testing.B, addr string) []byte {
	b.Helper()
	resp, err := http.Get("http://" + addr + "/debug/pprof/heap?debug=1&gc=1")
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		b.Fatal(err)
	}
	return body
}
