package e2e

// What one measurement's Stacks cost besides time (issue #42's accounting):
// the tofu processes their runners started and the CPU of those and of the
// runners (the controller's terrace_runner_cpu_seconds_total and
// terrace_tofu_processes_total, which every finished run's runner
// reports), the controller's API requests, the growth of etcd's database
// and the Secrets each Stack keeps. The direct side starts two tofu
// processes per Stack and writes a local state file.

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/terrace-dev/terrace/internal/launcher"
)

// account is one reading of what the accounting compares.
type account struct {
	controller map[string]float64 // the controller's metrics
	etcdDB     float64            // etcd's database size, bytes
	etcdWAL    float64            // bytes etcd wrote to its log so far
}

// resetControlPlanePeaks starts the peak RSS of etcd and kube-apiserver
// over from their RSS now.
func resetControlPlanePeaks(e *stackEnv) {
	for _, pid := range e.dev.Cluster.Pids() {
		_ = os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", pid), []byte("5"), 0o600)
	}
}

// reportControlPlanePeaks reports the peak RSS of etcd and kube-apiserver
// since resetControlPlanePeaks.
func reportControlPlanePeaks(b *testing.B, e *stackEnv) {
	for _, pid := range e.dev.Cluster.Pids() {
		switch name := procName(pid); name {
		case "etcd", "kube-apiserver":
			peak := float64(vmHWM(fmt.Sprintf("/proc/%d/status", pid))) / (1 << 20)
			b.Logf("%s's peak RSS: %.0f MiB", name, peak)
			b.ReportMetric(peak, name+"-peak-rss-MiB")
		}
	}
}

func sampleAccount(b *testing.B, e *stackEnv) account {
	b.Helper()
	m, err := controllerMetrics()
	if err != nil {
		b.Fatalf("failed to read the controller's metrics: %v", err)
	}
	etcd, err := httpMetrics(http.DefaultClient, e.dev.Cluster.EtcdURL+"/metrics", "")
	if err != nil {
		b.Fatalf("failed to read etcd's metrics: %v", err)
	}
	return account{controller: m, etcdDB: sumMetric(etcd, "etcd_mvcc_db_total_size_in_bytes"), etcdWAL: sumMetric(etcd, "etcd_disk_wal_write_bytes_total")}
}

// reportAccount logs and reports the accounting of n Stacks between two
// readings, once all are Ready.
func reportAccount(b *testing.B, e *stackEnv, before, after account, n int) {
	b.Helper()
	per := func(name string, labels ...string) float64 {
		return (sumMetric(after.controller, name, labels...) - sumMetric(before.controller, name, labels...)) / float64(n)
	}
	tofuProcs := per("terrace_tofu_processes_total")
	tofuCPU := per("terrace_runner_cpu_seconds_total", `part="tofu"`) * 1000
	runnerCPU := per("terrace_runner_cpu_seconds_total", `part="runner"`) * 1000
	apiCalls := per("rest_client_requests_total")
	etcdGrowth := (after.etcdDB - before.etcdDB) / float64(n) / 1024
	etcdWritten := (after.etcdWAL - before.etcdWAL) / float64(n) / 1024
	secrets, secretBytes := namespaceSecrets(b, e)
	if benchDeployment != nil {
		b.ReportMetric(apiCalls, "api-calls/stack")
	}
	b.ReportMetric(tofuProcs, "tofu-processes/stack")
	b.ReportMetric(tofuCPU, "tofu-cpu-ms/stack")
	b.ReportMetric(runnerCPU, "runner-cpu-ms/stack")
	b.ReportMetric(etcdGrowth, "etcd-db-growth-KiB/stack")
	b.ReportMetric(etcdWritten, "etcd-written-KiB/stack")
	b.ReportMetric(float64(secretBytes)/float64(n)/1024, "secret-KiB/stack")
	lines := []string{
		fmt.Sprintf("%8.2f  tofu processes started (direct: 2)", tofuProcs),
		fmt.Sprintf("%8.1f  ms of CPU in those tofu processes and their providers", tofuCPU),
		fmt.Sprintf("%8.1f  ms of CPU in the runner processes", runnerCPU),
		fmt.Sprintf("%8.2f  API requests of the controller", apiCalls),
		fmt.Sprintf("%8.1f  KiB written to etcd's log, the whole cluster's writes", etcdWritten),
		fmt.Sprintf("%8.1f  KiB of etcd database growth (%.1f MiB to %.1f MiB)", etcdGrowth, before.etcdDB/(1<<20), after.etcdDB/(1<<20)),
		fmt.Sprintf("%8.2f  Secrets kept, %.1f KiB of data (%d in the namespace, %d bytes)", float64(secrets)/float64(n), float64(secretBytes)/float64(n)/1024, secrets, secretBytes),
	}
	b.Logf("per Stack:\n%s", strings.Join(lines, "\n"))
}

// namespaceSecrets counts the Secrets of the benchmark's namespace and the
// bytes of their data: state, release records, outputs.
func namespaceSecrets(b *testing.B, e *stackEnv) (count, bytes int) {
	b.Helper()
	var secrets corev1.SecretList
	if err := e.c.List(context.Background(), &secrets, client.InNamespace(e.ns)); err != nil {
		b.Fatal(err)
	}
	for _, s := range secrets.Items {
		count++
		for _, v := range s.Data {
			bytes += len(v)
		}
	}
	return count, bytes
}

// waitRunPodsGone waits until no pod of a run is left in the namespace
// (the warm pool's unclaimed pods stay).
func (e *stackEnv) waitRunPodsGone(b *testing.B) {
	b.Helper()
	eventually(b, 2*time.Minute, "the runs' pods gone", func() error {
		var pods corev1.PodList
		if err := e.c.List(context.Background(), &pods, client.InNamespace(e.ns), client.HasLabels{launcher.LabelRun}); err != nil {
			return err
		}
		if len(pods.Items) > 0 {
			return fmt.Errorf("%d run pods left, such as %s", len(pods.Items), pods.Items[0].Name)
		}
		return nil
	})
}
