package e2e

import (
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/terrace-dev/terrace/internal/operator"
	"github.com/terrace-dev/terrace/internal/scheme"
)

// The benchmark runs the controller inside the test process, with the dev
// cluster's registry and NetworkPolicy enforcer: that process's RSS is not
// the controller's.
// TERRACE_BENCH_CONTROLLER=process runs the built `terrace controller` as
// a process of its own instead, with the options startController uses, so
// the benchmark can report the controller's own peak RSS (VmHWM of its
// /proc entry, reset before each measurement) and its API requests (from
// its rest_client_requests_total metric; the breakdown by kind needs the
// in-process controller).
func benchControllerProcess() bool { return os.Getenv("TERRACE_BENCH_CONTROLLER") == "process" }

// controllerProcess is the controller as a process of its own.
type controllerProcess struct {
	cmd     *exec.Cmd
	metrics string
}

// benchController is the process the benchmark started, if any.
var benchController *controllerProcess

// startControllerProcess starts `terrace controller` against the shared
// dev cluster and makes it the package's controller.
func startControllerProcess(b *testing.B) *controllerProcess {
	b.Helper()
	dev := sharedDev(b)
	stackCtl.mu.Lock()
	defer stackCtl.mu.Unlock()
	if stackCtl.ctrl != nil {
		b.Fatal("a controller already runs in the test process")
	}
	c, err := client.New(dev.Cluster.Config, client.Options{Scheme: scheme.New()})
	if err != nil {
		b.Fatal(err)
	}
	(&stackEnv{dev: dev, c: c}).installOperatorConfig(b)
	ports := hostPorts(b, dev, 3)
	local := operator.LocalOptions(operatorNamespace, ports[0], ports[1])
	args := []string{"controller",
		"--kubeconfig", dev.KubeconfigPath, "--namespace", operatorNamespace, "--leader-elect=false",
		// Plain HTTP on the link: the benchmark reads the metrics without a token.
		"--metrics-addr", ports[2], "--metrics-secure=false", "--health-addr", "0", "--server-ips", dev.Node.HostIP(), "--image", local.Image,
		// The benchmark's Stacks share one namespace: all of its runs at once.
		"--max-concurrent-runs", strconv.Itoa(benchConcurrency()), "--max-runs-per-namespace", strconv.Itoa(benchConcurrency()), "--source-artifact-hosts", fluxArtifactAddress(b),
		"--artifact-bind-address", ports[0], "--artifact-base-url", local.Artifact.BaseURL,
		"--state-server-bind-address", ports[1], "--state-server-advertised-url", local.State.AdvertisedURL,
		// The in-process controller's client limits (the dev cluster's config).
		"--kube-api-qps", strconv.FormatFloat(float64(dev.Cluster.Config.QPS), 'f', -1, 32), "--kube-api-burst", strconv.Itoa(dev.Cluster.Config.Burst),
	}
	if addr := os.Getenv("TERRACE_BENCH_PPROF"); addr != "" {
		args = append(args, "--pprof-addr", addr) // go tool pprof http://$addr/debug/pprof/heap
	}
	cmd, stop := startTerraceProcess(b, args)
	p := &controllerProcess{cmd: cmd, metrics: "http://" + ports[2] + "/metrics"}
	stackCtl.ctrl = &controller{stop: stop, done: make(chan error, 1), stateURL: local.State.AdvertisedURL}
	b.Cleanup(stop)
	eventually(b, 2*time.Minute, "the controller's metrics endpoint", func() error {
		_, err := p.requests()
		return err
	})
	benchController = p
	return p
}

// resetPeakRSS starts the process's VmHWM over from its current RSS.
func (p *controllerProcess) resetPeakRSS() {
	_ = os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", p.cmd.Process.Pid), []byte("5"), 0o600)
}

// peakRSS is the process's VmHWM in bytes.
func (p *controllerProcess) peakRSS() uint64 {
	return vmHWM(fmt.Sprintf("/proc/%d/status", p.cmd.Process.Pid))
}

// requests is the controller's API requests so far, by its own count.
func (p *controllerProcess) requests() (float64, error) {
	m, err := httpMetrics(http.DefaultClient, p.metrics, "")
	if err != nil {
		return 0, err
	}
	if !hasMetric(m, "rest_client_requests_total") {
		return 0, fmt.Errorf("no rest_client_requests_total at %s", p.metrics)
	}
	return sumMetric(m, "rest_client_requests_total"), nil
}

// vmHWM reads VmHWM from a /proc status file, in bytes (0 if unreadable).
func vmHWM(path string) uint64 { return statusBytes(path, "VmHWM:") }

// statusBytes reads one kB field of a /proc status file, in bytes.
func statusBytes(path, field string) uint64 {
	data, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, field); ok {
			kb, _ := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return kb << 10
		}
	}
	return 0
}

// sampleAnonPeak records the controller's largest RssAnon (its private
// memory: heap, stacks; not the pages of its binary, which VmHWM also
// counts) every 200 ms until the returned func is called, which returns it.
func (p *controllerProcess) sampleAnonPeak() func() uint64 {
	path := fmt.Sprintf("/proc/%d/status", p.cmd.Process.Pid)
	done := make(chan struct{})
	peak := make(chan uint64, 1)
	go func() {
		var most uint64
		tick := time.NewTicker(200 * time.Millisecond)
		defer tick.Stop()
		for {
			most = max(most, statusBytes(path, "RssAnon:"))
			select {
			case <-done:
				peak <- most
				return
			case <-tick.C:
			}
		}
	}()
	return func() uint64 { close(done); return <-peak }
}

// startTerraceProcess starts `terrace args...` with its output in a log
// file. stop ends it (SIGTERM, SIGKILL after a minute), and logs the
// file's last lines when b has failed; calling it again does nothing.
func startTerraceProcess(b *testing.B, args []string) (*exec.Cmd, func()) {
	b.Helper()
	logFile, err := os.Create(filepath.Join(b.TempDir(), "controller.log"))
	if err != nil {
		b.Fatal(err)
	}
	cmd := exec.Command(terraceBinary, args...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait(); _ = logFile.Close() }()
	var once sync.Once
	return cmd, func() {
		once.Do(func() {
			_ = cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-done:
			case <-time.After(time.Minute):
				_ = cmd.Process.Kill()
				<-done
			}
			if b.Failed() {
				if data, err := os.ReadFile(logFile.Name()); err == nil {
					b.Logf("%s log (last 60 lines):\n%s", args[0], lastLines(string(data), 60))
				}
			}
		})
	}
}
