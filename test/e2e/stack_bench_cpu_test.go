package e2e

// The CPU time each part of the dev cluster spends, for the benchmark: on
// a machine of few cores both sides of the comparison are bound by CPU, so
// where a Stack's CPU goes says what a faster run would have to take away.

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// clockTick is the unit of /proc/PID/stat's times (USER_HZ, 100 on Linux).
const clockTick = 10 * time.Millisecond

// cpuTimes is CPU time by part: the control plane's processes by name, the
// controller process when the benchmark started one, "test process" (this
// process: the registry, the NetworkPolicy enforcer, and the controller
// when it runs here), "node" (containerd, the kubelet, kube-proxy and the
// runc shims) and "pods" (every container of the node, from its cgroup:
// the runners and the tofu they start, and CoreDNS; with the controller as
// a Deployment, its pod is "controller pod" instead).
type cpuTimes map[string]time.Duration

// procCPU reads a process's own CPU time and that of its reaped children.
func procCPU(pid int) (self, children time.Duration, ok bool) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, 0, false
	}
	// The command name, in parentheses, may hold spaces: fields follow the last ')'.
	fields := strings.Fields(string(data[strings.LastIndexByte(string(data), ')')+1:]))
	if len(fields) < 15 {
		return 0, 0, false
	}
	tick := func(i int) time.Duration {
		n, _ := strconv.ParseInt(fields[i], 10, 64)
		return time.Duration(n) * clockTick
	}
	// utime, stime, cutime, cstime are fields 14–17 of stat(5); fields[0] is field 3.
	return tick(11) + tick(12), tick(13) + tick(14), true
}

func procName(pid int) string {
	comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
	if err != nil {
		return strconv.Itoa(pid)
	}
	return strings.TrimSpace(string(comm))
}

// sampleCPU reads the CPU time of every part so far.
func sampleCPU(e *stackEnv) cpuTimes {
	t := cpuTimes{}
	for _, pid := range e.dev.Cluster.Pids() {
		if self, children, ok := procCPU(pid); ok {
			t[procName(pid)] += self + children
		}
	}
	if p := benchController; p != nil {
		if self, children, ok := procCPU(p.cmd.Process.Pid); ok {
			t["controller process"] = self + children
		}
	}
	if self, _, ok := procCPU(os.Getpid()); ok {
		t["test process"] = self
	}
	// The node's processes are its init, containerd, the kubelet and
	// kube-proxy (each forked by nsenter) and their descendants (the shims
	// reparent to the init), outside the pods' cgroups, which count the
	// containers; the time of those that ended is lost (shims of finished
	// pods, little).
	seen := map[int]bool{}
	for _, top := range e.dev.Node.Pids() {
		for _, pid := range append([]int{top}, descendants(top)...) {
			if seen[pid] {
				continue
			}
			seen[pid] = true
			cg, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
			if strings.Contains(string(cg), "kubepods") {
				continue
			}
			if self, _, ok := procCPU(pid); ok {
				t["node"] += self
			}
		}
	}
	t["pods"] = e.dev.Node.PodsCPU()
	if d := benchDeployment; d != nil {
		// The controller's pod apart from the others (runners, CoreDNS).
		ctl := d.cpu()
		t["controller pod"] = ctl
		t["pods"] -= ctl
	}
	return t
}

// childrenCPU is the CPU time of this process's reaped children: the
// direct applies' tofu processes, measured around them.
func childrenCPU() time.Duration {
	_, children, _ := procCPU(os.Getpid())
	return children
}

// reportCPU logs and reports each part's CPU time per Stack between two
// samples, their sum, and the sum's ratio to the direct applies' CPU.
// The direct applies ran alone, before the cluster's work was measured.
func reportCPU(b *testing.B, before, after cpuTimes, direct time.Duration, n int) {
	b.Helper()
	perStack := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 / float64(n) }
	var total time.Duration
	var lines []string
	for _, part := range slices.Sorted(maps.Keys(after)) {
		d := after[part] - before[part]
		total += d
		lines = append(lines, fmt.Sprintf("%8.1f ms  %s", perStack(d), part))
	}
	lines = append(lines, fmt.Sprintf("%8.1f ms  all of Terrace's side", perStack(total)),
		fmt.Sprintf("%8.1f ms  direct tofu init && apply", perStack(direct)))
	b.Logf("CPU time per Stack by part:\n%s", strings.Join(lines, "\n"))
	b.ReportMetric(perStack(total), "cpu-ms/stack")
	b.ReportMetric(perStack(direct), "direct-cpu-ms/stack")
	if direct > 0 {
		b.ReportMetric(float64(total)/float64(direct), "cpu-ratio")
	}
}

// profileAPIServer, when TERRACE_BENCH_PROFILE names a directory, records
// kube-apiserver's CPU from now for about as long as the Stacks should take
// (twice the direct applies, at most devcluster.MaxAPIServerProfile), into apiserver-<name>.pprof there, and
// returns a func that waits for it. The shared cluster serves profiles only
// with that variable set (sharedDev).
func profileAPIServer(b *testing.B, e *stackEnv, name string, direct time.Duration) (wait func()) {
	dir := os.Getenv("TERRACE_BENCH_PROFILE")
	if dir == "" {
		return func() {}
	}
	path := filepath.Join(dir, "apiserver-"+name+".pprof")
	done := make(chan error, 1)
	go func() { done <- e.dev.Cluster.APIServerProfile(context.Background(), 2*direct, path) }()
	return func() {
		if err := <-done; err != nil {
			b.Error(err)
			return
		}
		b.Logf("kube-apiserver's CPU profile: go tool pprof %s", path)
	}
}
