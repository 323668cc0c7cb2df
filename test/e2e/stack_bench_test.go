package e2e

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/scheme"
	"github.com/terrace-dev/terrace/internal/testenv"
)

// benchModule is what both sides of the comparison apply.
const benchModule = `
variable "n" { type = number }
locals { name = "bench-${var.n}" }
resource "terraform_data" "item" { input = local.name }
output "name" { value = terraform_data.item.output }
`

// benchConcurrency is the controller's --max-concurrent-runs in these
// tests (startController) and the parallelism of the direct applies.
const benchConcurrency = 8

// BenchmarkStackToReady compares, in one run, the time from creating N
// Stacks to all Ready against running the same `tofu init && tofu apply`
// directly N times with the same parallelism. Run it with
//
//	go test ./test/e2e/ -run '^$' -bench StackToReady -benchtime 1x
//
// It reports seconds for both, their ratio, the test process's peak Go
// heap (the controller runs in this process) and, when the benchmark
// started the controller itself, the controller's API requests per Stack.
// With -v it logs the runner's own log of the first Stack's run, which
// says where that run's time went.
func BenchmarkStackToReady(b *testing.B) {
	startCountedController(b)
	for _, n := range []int{1, 50} {
		b.Run(fmt.Sprintf("stacks=%d", n), func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				direct := directApplies(b, n, benchConcurrency)
				calls := controllerRequests.Load()
				terrace, peak, e := stacksToReady(b, n)
				b.ReportMetric(direct.Seconds(), "direct-s")
				b.ReportMetric(terrace.Seconds(), "terrace-s")
				b.ReportMetric(terrace.Seconds()/direct.Seconds(), "ratio")
				b.ReportMetric(float64(peak)/(1<<20), "peak-heap-MiB")
				if countingRequests.Load() {
					b.ReportMetric(float64(controllerRequests.Load()-calls)/float64(n), "api-calls/stack")
				}
				if n == 1 {
					logRunnerLog(b, e, "s0")
				}
			}
		})
	}
}

// controllerRequests counts the API requests of a controller started by
// startCountedController (a watch counts once).
var (
	controllerRequests atomic.Int64
	countingRequests   atomic.Bool
)

type countingTransport struct{ next http.RoundTripper }

func (c countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	controllerRequests.Add(1)
	return c.next.RoundTrip(r)
}

// startCountedController starts the shared controller, unless a test
// already did, with a client configuration that counts its requests.
func startCountedController(b *testing.B) {
	b.Helper()
	dev := sharedDev(b)
	stackCtl.mu.Lock()
	defer stackCtl.mu.Unlock()
	if stackCtl.ctrl != nil {
		return
	}
	c, err := client.New(dev.Cluster.Config, client.Options{Scheme: scheme.New()})
	if err != nil {
		b.Fatal(err)
	}
	(&stackEnv{dev: dev, c: c}).installOperatorConfig(b)
	counted := *dev
	cluster := *dev.Cluster
	cluster.Config = rest.CopyConfig(dev.Cluster.Config)
	cluster.Config.Wrap(func(rt http.RoundTripper) http.RoundTripper { return countingTransport{rt} })
	counted.Cluster = &cluster
	stackCtl.ctrl = startController(b, &counted)
	countingRequests.Store(true)
}

// logRunnerLog logs what the runner of a Stack's run printed (devnode
// keeps the logs of deleted pods): "serving", then each operation and
// phase with its duration.
func logRunnerLog(b *testing.B, e *stackEnv, stack string) {
	b.Helper()
	files, _ := filepath.Glob(filepath.Join(e.dev.NodeDir, "logs", e.ns+"_"+stack+"-runner-*", "runner", "*.log"))
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			b.Fatal(err)
		}
		var kept []string
		for _, line := range strings.Split(string(data), "\n") {
			if strings.Contains(line, "serving") || strings.Contains(line, "operation") || strings.Contains(line, "phase") {
				kept = append(kept, line)
			}
		}
		b.Logf("runner log %s:\n%s", filepath.Base(filepath.Dir(filepath.Dir(f))), strings.Join(kept, "\n"))
	}
}

// directApplies runs tofu init && apply n times, parallel at most par.
func directApplies(b *testing.B, n, par int) time.Duration {
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
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
	return time.Since(start)
}

// stacksToReady creates n Stacks of one Program and waits until all are Ready.
func stacksToReady(b *testing.B, n int) (time.Duration, uint64, *stackEnv) {
	b.Helper()
	e := newStackEnv(b)
	e.program(b, "bench", map[string]string{"main.tf": benchModule})
	// The Program's artifact is ready before the clock starts, as a Flux source would be.
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
	var peak uint64
	stopSampling := sampleHeap(&peak)
	defer stopSampling()
	start := time.Now()
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
		if err := e.c.Create(context.Background(), s); err != nil {
			b.Fatal(err)
		}
	}
	eventually(b, 20*time.Minute, "every Stack Ready", func() error {
		var list terracev1.StackList
		if err := e.c.List(context.Background(), &list, client.InNamespace(e.ns)); err != nil {
			return err
		}
		ready := 0
		for i := range list.Items {
			if readyAt(&list.Items[i]) == nil {
				ready++
			}
		}
		if ready != n {
			return fmt.Errorf("%d of %d Ready", ready, n)
		}
		return nil
	})
	return time.Since(start), peak, e
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
