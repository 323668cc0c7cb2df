package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/launcher"
	"github.com/terrace-dev/terrace/internal/testenv"
)

// benchModule is what both sides of the comparison apply.
const benchModule = `
variable "n" { type = number }
locals { name = "bench-${var.n}" }
resource "terraform_data" "item" { input = local.name }
output "name" { value = terraform_data.item.output }
`

// benchConcurrency is the controller's --max-concurrent-runs in the
// benchmark and the parallelism of the direct applies:
// TERRACE_BENCH_CONCURRENCY, 4 by default (issue #42's measure).
func benchConcurrency() int {
	if n, err := strconv.Atoi(os.Getenv("TERRACE_BENCH_CONCURRENCY")); err == nil && n > 0 {
		return n
	}
	return 4
}

// BenchmarkStackToReady compares, in one run, the time from creating N
// Stacks to all Ready against running the same `tofu init && tofu apply`
// directly N times with the same parallelism, with and without warm
// runners (spec.runner.warm in the namespace's TerraceConfig; the warm
// pods are ready before the clock starts). Run it with
//
//	go test ./test/e2e/ -run '^$' -bench StackToReady -benchtime 1x
//
// It reports seconds for both, their ratio, the test process's peak Go
// heap (the controller runs in this process) and, when the benchmark
// started the controller itself, the controller's API requests per Stack
// (the warm pool's included), and the CPU time per Stack of each part (the
// control plane's processes, the runner pods with their tofu, this
// process) against the direct applies' (cpu-ratio): on few cores both
// sides are bound by CPU. With -v it logs the runner's own log of the
// first Stack's run, which says where that run's time went.
// TERRACE_BENCH_STACKS=1000 runs that fleet size instead (make fleet).
// TERRACE_BENCH_CONTROLLER=process runs the built controller as its own
// process and reports its peak RSS (stack_bench_process_test.go);
// TERRACE_BENCH_CONTROLLER=deployment installs it with the Helm chart and
// reports its pod's CPU and peak memory (stack_bench_deploy_test.go);
// TERRACE_BENCH_CONCURRENCY=N sets the runs at once on both sides (4);
// every mode reports the accounting of stack_bench_account_test.go;
// TERRACE_BENCH_TRACE=1 logs each API request of a 1-Stack run in order,
// then its state server requests;
// TERRACE_BENCH_WARM=N measures only with N warm runners (0: cold only);
// TERRACE_BENCH_PROFILE=DIR writes kube-apiserver's CPU profile there.
func BenchmarkStackToReady(b *testing.B) {
	switch {
	case benchControllerDeployment():
		startControllerDeployment(b)
	case benchControllerProcess():
		startControllerProcess(b)
	default:
		startCountedController(b)
	}
	sizes := []int{1, 100}
	if n, err := strconv.Atoi(os.Getenv("TERRACE_BENCH_STACKS")); err == nil && n > 0 {
		sizes = []int{n}
	}
	for _, n := range sizes {
		warms := []int{0, min(n, benchConcurrency())}
		if w, err := strconv.Atoi(os.Getenv("TERRACE_BENCH_WARM")); err == nil && w >= 0 {
			warms = []int{min(n, w)}
		}
		for _, warm := range warms {
			b.Run(fmt.Sprintf("stacks=%d/warm=%d", n, warm), func(b *testing.B) {
				for i := 0; i < b.N; i++ {
					benchStacksOnce(b, n, warm)
				}
			})
		}
	}
}

// benchStacksOnce is one measurement of n Stacks against n direct applies.
func benchStacksOnce(b *testing.B, n, warm int) {
	waitNoNamespaceTerminating(b)
	directCPU := childrenCPU()
	direct, directDone := directApplies(b, n, benchConcurrency())
	directCPU = childrenCPU() - directCPU
	e := newStackEnv(b)
	defer e.removeStacks(b, n) // before the next iteration, with -benchtime Nx too
	var logs *podLogCollector
	if n == 1 {
		logs = collectPodLogs(b, e.cs, e.ns, "runner")
	}
	e.prepareBench(b, warm)
	e.programReady(b)
	calls, kinds := controllerRequests.Load(), requestKinds.snapshot()
	requestKinds.takeTrace()
	rss := startRSSPeak()
	var processCalls float64
	anonPeak := func() uint64 { return 0 }
	if p := benchController; p != nil {
		p.resetPeakRSS()
		anonPeak = p.sampleAnonPeak()
		processCalls = mustRequests(b, p)
	}
	if d := benchDeployment; d != nil {
		d.resetPeakMemory(b)
	}
	served := clusterRequests(b, e.cs)
	resetControlPlanePeaks(e)
	accountBefore := sampleAccount(b, e)
	cpuBefore := sampleCPU(e)
	profiled := profileAPIServer(b, e, fmt.Sprintf("stacks-%d-warm-%d", n, warm), direct)
	logStart := len(controllerLog.String())
	terrace, terraceDone, peak := e.stacksToReady(b, n)
	// A run's pod goes, and its runner reports what it cost, just after
	// its Stack is Ready: its CPU and its figures count once it is gone.
	e.waitRunPodsGone(b)
	reportCPU(b, cpuBefore, sampleCPU(e), directCPU, n)
	reportAccount(b, e, accountBefore, sampleAccount(b, e), n)
	reportControlPlanePeaks(b, e)
	profiled()
	b.ReportMetric(logClusterRequests(b, served, clusterRequests(b, e.cs), n), "cluster-requests/stack")
	// Also in the log: a benchmark that fails afterwards prints no metrics.
	b.Logf("%d Stacks Ready in %.1f s, direct tofu in %.1f s: %.2f×", n, terrace.Seconds(), direct.Seconds(), terrace.Seconds()/direct.Seconds())
	b.ReportMetric(direct.Seconds(), "direct-s")
	b.ReportMetric(terrace.Seconds(), "terrace-s")
	b.ReportMetric(terrace.Seconds()/direct.Seconds(), "ratio")
	if d := benchDeployment; d != nil {
		// The controller in its pod: the most memory the kernel charged it.
		peak := float64(d.peakMemory(b)) / (1 << 20)
		b.Logf("the controller pod's peak memory: %.1f MiB", peak)
		b.ReportMetric(peak, "controller-peak-mem-MiB")
		d.saveHeapProfile(b, fmt.Sprintf("stacks-%d", n))
	}
	if p := benchController; p != nil {
		// The controller as a process of its own: its RSS and requests.
		b.ReportMetric(float64(p.peakRSS())/(1<<20), "controller-peak-rss-MiB")
		b.ReportMetric(float64(anonPeak())/(1<<20), "controller-peak-anon-MiB")
		b.ReportMetric((mustRequests(b, p)-processCalls)/float64(n), "api-calls/stack")
	} else if benchDeployment == nil {
		b.ReportMetric(float64(peak)/(1<<20), "peak-heap-MiB")
		b.ReportMetric(float64(rss())/(1<<20), "process-peak-rss-MiB")
	}
	if countingRequests.Load() {
		b.ReportMetric(float64(controllerRequests.Load()-calls)/float64(n), "api-calls/stack")
		logRequestKinds(b, kinds, n)
	}
	if trace := requestKinds.takeTrace(); n == 1 && len(trace) > 0 {
		b.Logf("API requests in order:\n%s", strings.Join(trace, "\n"))
		logStateRequests(b, controllerLog.String()[logStart:])
	}
	if n > 1 {
		path := filepath.Join(plotDir(), fmt.Sprintf("fleet-%d-stacks-ready.png", n))
		title := fmt.Sprintf("%d Stacks Ready over time, %d warm runners, at most %d at once", n, warm, benchConcurrency())
		if err := writeReadyPlot(path, title, readyCurve{"Terrace", terraceBlue, terraceDone}, readyCurve{"direct tofu init && apply", directOrange, directDone}); err != nil {
			b.Errorf("plot: %v", err)
		} else {
			b.Logf("plot of Stacks Ready over time: %s", path)
		}
	}
	if n == 1 {
		reportTofuShare(b, logRunnerLog(b, e, logs, warm > 0), terrace, direct)
		logRunPhases(b, e)
	}
	if d := benchDeployment; d != nil && n > 1 {
		d.measureResync(b, e, n)
	}
}

// logStateRequests logs the state server's requests (method, answer and
// time in the server) from the part of the controller's log a lone run
// wrote, in order: with the API requests, where tofu's backend waits.
func logStateRequests(b *testing.B, log string) {
	b.Helper()
	var lines []string
	for _, l := range strings.Split(log, "\n") {
		if strings.Contains(l, `"msg"="state request"`) {
			lines = append(lines, "    "+stateRequestFields.ReplaceAllString(l, ""))
		}
	}
	b.Logf("state requests in order:\n%s", strings.Join(lines, "\n"))
}

// stateRequestFields are the parts of a state request's log line the
// trace leaves out.
var stateRequestFields = regexp.MustCompile(`^.*"msg"="state request" |"state"="[^"]*" |"identity"="[^"]*" `)

// reportTofuShare splits a lone run's time, from its runner's log, into
// the runner's tofu operations and everything outside them. The ratio
// swings with tofu's own time on a shared machine; the time outside tofu
// is what Terrace adds, and varies much less.
func reportTofuShare(b *testing.B, runnerLog []string, terrace, direct time.Duration) {
	b.Helper()
	tofu, ok := runnerTofuTime(runnerLog)
	if !ok {
		b.Logf("the runner's log names no init or apply operation (yet): no tofu share reported")
		return
	}
	b.ReportMetric(tofu.Seconds(), "runner-tofu-s")
	b.ReportMetric(tofu.Seconds()/direct.Seconds(), "tofu-ratio")
	b.ReportMetric(float64((terrace-tofu).Microseconds())/1000, "outside-tofu-ms")
}

// runnerOperation is a runner log line that says an operation finished.
var runnerOperation = regexp.MustCompile(`"msg"="operation finished" "op"="([a-z-]+)".* "duration"="([^"]+)"`)

// runnerTofuTime adds up the runner's operations that run tofu (all but
// the module's fetch or upload), as its log reports them, past a duration
// it cannot read; false when there are none.
func runnerTofuTime(lines []string) (time.Duration, bool) {
	var total time.Duration
	found := false
	for _, line := range lines {
		m := runnerOperation.FindStringSubmatch(line)
		if m == nil || m[1] == "fetch" || m[1] == "upload" {
			continue
		}
		d, err := time.ParseDuration(m[2])
		if err != nil {
			continue
		}
		total += d
		found = true
	}
	return total, found
}

// logRunPhases logs the Applied event of the first Stack, which says where
// its run's time went (pod, fetch, init, plan, apply, outputs).
func logRunPhases(b *testing.B, e *stackEnv) {
	b.Helper()
	var events corev1.EventList
	if err := e.c.List(context.Background(), &events, client.InNamespace(e.ns)); err != nil {
		b.Fatal(err)
	}
	for _, ev := range events.Items {
		if ev.InvolvedObject.Name == "s0" && ev.Reason == "Applied" {
			b.Logf("s0 %s: %s", ev.Reason, ev.Message)
		}
	}
}

// logRunnerLog logs what the runner of the first Stack's last run printed
// (from logs, which followed the namespace's runner pods): "serving", then
// each operation and phase with its duration; a warm runner's log is that
// of the warm pod its run claimed. Only the run status.lastRun names: a
// retried run's earlier pod would count its tofu twice. It returns the
// lines it logged.
func logRunnerLog(b *testing.B, e *stackEnv, logs *podLogCollector, warm bool) []string {
	b.Helper()
	run := e.getStack(b, "s0").Status.LastRun
	pod := launcher.PodName("s0", run)
	if warm {
		pod = launcher.WarmPodName(run)
	}
	var kept []string
	for _, line := range strings.Split(logs.get(pod), "\n") {
		if strings.Contains(line, "serving") || strings.Contains(line, "claimed") || strings.Contains(line, "operation") || strings.Contains(line, "phase") {
			kept = append(kept, line)
		}
	}
	b.Logf("runner log of pod %s:\n%s", pod, strings.Join(kept, "\n"))
	return kept
}

// directApplies runs tofu init && apply n times, parallel at most par, and
// returns the time of all and when each was done.
func directApplies(b *testing.B, n, par int) (time.Duration, []time.Duration) {
	b.Helper()
	tofu, err := testenv.FindTools()
	if err != nil {
		b.Fatal(err)
	}
	root := b.TempDir()
	cli := filepath.Join(root, "cli.tfrc")
	if err := os.WriteFile(cli, nil, 0o600); err != nil {
		b.Fatal(err)
	}
	start := time.Now()
	sem := make(chan struct{}, par)
	var wg sync.WaitGroup
	errs := make(chan error, n)
	doneAt := make(chan time.Duration, n)
	for i := range n {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			dir := filepath.Join(root, fmt.Sprint(i))
			if err := os.MkdirAll(dir, 0o700); err != nil {
				errs <- err
				return
			}
			if err := os.WriteFile(filepath.Join(dir, "main.tf"), []byte(benchModule), 0o600); err != nil {
				errs <- err
				return
			}
			for _, args := range [][]string{{"init", "-input=false"}, {"apply", "-auto-approve", "-input=false", fmt.Sprintf("-var=n=%d", i)}} {
				cmd := exec.Command(tofu.Tofu, args...)
				cmd.Dir = dir
				cmd.Env = append(os.Environ(), "CHECKPOINT_DISABLE=1", "TF_CLI_CONFIG_FILE="+cli)
				if out, err := cmd.CombinedOutput(); err != nil {
					errs <- fmt.Errorf("tofu %s: %v: %s", args[0], err, out)
					return
				}
			}
			doneAt <- time.Since(start)
		}()
	}
	wg.Wait()
	total := time.Since(start)
	close(errs)
	close(doneAt)
	for err := range errs {
		b.Fatal(err)
	}
	var done []time.Duration
	for d := range doneAt {
		done = append(done, d)
	}
	return total, done
}

// prepareBench makes the namespace's Program and, with warm, a
// TerraceConfig asking for that many warm runners, and waits until they are
// ready, as a namespace that has been in use would be.
func (e *stackEnv) prepareBench(b *testing.B, warm int) {
	b.Helper()
	e.program(b, "bench", map[string]string{"main.tf": benchModule})
	if warm == 0 {
		return
	}
	e.create(b, &terracev1.TerraceConfig{
		ObjectMeta: metav1.ObjectMeta{Name: terracev1.TerraceConfigName},
		Spec:       terracev1.TerraceConfigSpec{Runner: &terracev1.RunnerConfig{Warm: ptr.To(int32(warm))}},
	})
	eventually(b, 5*time.Minute, "the warm runners", func() error {
		var pods corev1.PodList
		if err := e.c.List(context.Background(), &pods, client.InNamespace(e.ns), client.HasLabels{launcher.LabelWarmClass}); err != nil {
			return err
		}
		ready := 0
		for i := range pods.Items {
			if podReady(&pods.Items[i]) {
				ready++
			}
		}
		if ready < warm {
			return fmt.Errorf("%d of %d warm runners ready", ready, warm)
		}
		return nil
	})
}

// programReady waits until the Program's artifact is ready: before the
// clock starts and the requests are counted, as a Flux source would be.
func (e *stackEnv) programReady(b *testing.B) {
	b.Helper()
	eventually(b, 2*time.Minute, "the Program's artifact", func() error {
		var p terracev1.Program
		if err := e.c.Get(context.Background(), client.ObjectKey{Namespace: e.ns, Name: "bench"}, &p); err != nil {
			return err
		}
		if p.Status.Artifact == nil {
			return fmt.Errorf("no artifact yet")
		}
		return nil
	})
}

func mustRequests(b *testing.B, p *controllerProcess) float64 {
	b.Helper()
	n, err := p.requests()
	if err != nil {
		b.Fatal(err)
	}
	return n
}

// waitNoNamespaceTerminating waits until the namespaces of earlier
// measurements are gone: their deletion (pods, Secrets, the warm pool's
// pods) would share the machine with this one.
func waitNoNamespaceTerminating(b *testing.B) {
	cs := kubernetes.NewForConfigOrDie(sharedDev(b).Cluster.Config)
	eventually(b, 3*time.Minute, "earlier namespaces deleted", func() error {
		list, err := cs.CoreV1().Namespaces().List(context.Background(), metav1.ListOptions{})
		if err != nil {
			return err
		}
		for _, ns := range list.Items {
			if ns.Status.Phase == corev1.NamespaceTerminating {
				return fmt.Errorf("namespace %s is still being deleted", ns.Name)
			}
		}
		return nil
	})
}

// removeStacks deletes the namespace's n Stacks and waits until they are
// gone, before the next measurement starts: the deletion of 100 Stacks
// (finalizers, their Secrets) overlapped the next one's clock and added its
// requests to that one's count. The wait reads one Stack and the count of
// the rest, not every Stack, at each look, and gives up only when the count
// stops going down.
func (e *stackEnv) removeStacks(b *testing.B, n int) {
	ctx := context.Background()
	// kube-apiserver ends a deletecollection of thousands of Stacks at its
	// one-minute timeout, and the Stacks it had not reached yet stay (4,564
	// of 10,000 did); the timeout may also reach the client as a reset HTTP/2
	// stream. Either way the deletion is asked for again while Stacks are
	// left that it did not go on with, and only a stall fails the benchmark.
	deleteAll := func() {
		if err := e.c.DeleteAllOf(ctx, &terracev1.Stack{}, client.InNamespace(e.ns)); err != nil {
			b.Logf("deleting the Stacks (asked again while some are left): %v", err)
		}
	}
	deleteAll()
	const stall = 5 * time.Minute
	left, lastProgress, lastDelete := int64(n), time.Now(), time.Now()
	for {
		var page terracev1.StackList
		if err := e.c.List(ctx, &page, client.InNamespace(e.ns), client.Limit(1)); err != nil {
			b.Logf("counting the Stacks left: %v", err)
		} else {
			now := int64(len(page.Items)) + ptr.Deref(page.RemainingItemCount, 0)
			if now == 0 {
				return
			}
			if now < left {
				left, lastProgress = now, time.Now()
			}
		}
		switch stalled := time.Since(lastProgress); {
		case stalled > stall:
			b.Errorf("%d Stacks left, none deleted for %s", left, stall)
			return
		case stalled > time.Minute && time.Since(lastDelete) > time.Minute:
			deleteAll()
			lastDelete = time.Now()
		}
		time.Sleep(2 * time.Second)
	}
}

// stacksToReady creates n Stacks of one Program and waits until all are Ready.
func (e *stackEnv) stacksToReady(b *testing.B, n int) (time.Duration, []time.Duration, uint64) {
	b.Helper()
	var peak uint64
	stopSampling := sampleHeap(&peak)
	defer stopSampling()
	waitReady := e.watchAllReady(b, n)
	start := time.Now()
	// After the watch is up (a new client and connection, ~10 ms), as
	// the clock is.
	b.Logf("clock starts at %s", start.Format("15:04:05.000"))
	for i := range n {
		s := &terracev1.Stack{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("s%d", i), Namespace: e.ns},
			Spec: terracev1.StackSpec{
				Source:         terracev1.StackSource{ProgramRef: &terracev1.LocalObjectReference{Name: "bench"}},
				Vars:           jsonVarsB(map[string]string{"n": fmt.Sprint(i)}),
				ApprovePlan:    terracev1.ApprovePlanAuto,
				DriftDetection: &terracev1.DriftDetection{Mode: terracev1.DriftDetectionDisabled},
			},
		}
		created := time.Now()
		if err := e.c.Create(context.Background(), s); err != nil {
			b.Fatal(err)
		}
		if tracingRequests && n == 1 {
			b.Logf("the Stack's create took %s", time.Since(created).Round(100*time.Microsecond))
		}
	}
	// 20 minutes and a second a Stack: 1000 Stacks took 9 minutes.
	end, firsts := waitReady(20*time.Minute + time.Duration(n)*time.Second)
	b.Logf("clock stops at %s", end.Format("15:04:05.000"))
	done := make([]time.Duration, len(firsts))
	for i, t := range firsts {
		done[i] = t.Sub(start)
	}
	return end.Sub(start), done, peak
}

// sampleHeap records the peak Go heap in use until the returned func is called.
func sampleHeap(peak *uint64) func() {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		var m runtime.MemStats
		for {
			runtime.ReadMemStats(&m)
			if m.HeapInuse > *peak {
				*peak = m.HeapInuse
			}
			select {
			case <-done:
				return
			case <-tick.C:
			}
		}
	}()
	return func() { close(done); wg.Wait() }
}

func jsonVarsB(vars map[string]string) map[string]apiextensionsv1.JSON {
	out := map[string]apiextensionsv1.JSON{}
	for k, v := range vars {
		out[k] = apiextensionsv1.JSON{Raw: []byte(v)}
	}
	return out
}

// startRSSPeak resets the process's peak RSS (VmHWM; the controller runs
// in this process, with the registry and the test itself) and returns a func
// that reads it.
func startRSSPeak() func() uint64 {
	_ = os.WriteFile("/proc/self/clear_refs", []byte("5"), 0o600)
	return func() uint64 { return vmHWM("/proc/self/status") }
}
