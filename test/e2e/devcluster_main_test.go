// Package e2e runs Terrace end to end on the dev cluster: a real control
// plane (internal/devcluster), real pods run as processes by devnode, and
// the terrace binary built once for the whole package.
package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"

	"github.com/terrace-dev/terrace/internal/devcluster"
	"github.com/terrace-dev/terrace/internal/testenv"
)

// terraceBinary is built from this checkout in TestMain; devnode runs it
// for every terrace-image container.
var terraceBinary string

// sharedEnv is one dev cluster for the tests that only need pods; it starts
// on first use and stops when the package's tests end.
var sharedEnv struct {
	once sync.Once
	dev  *devcluster.Devnode
	err  error
	pids []int
	mu   sync.Mutex
}

func TestMain(m *testing.M) {
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	captureControllerLog()
	tmp, err := os.MkdirTemp("", "terrace-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	defer func() { _ = os.RemoveAll(tmp) }()
	if terraceBinary, err = testenv.BuildTerrace(tmp); err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}

	code := m.Run()
	stopSharedPostgres()
	// TERRACE_E2E_CONTROLLER_LOG=file keeps the whole controller log of a
	// run, passing or not, for looking into a slow or flaky test.
	if path := os.Getenv("TERRACE_E2E_CONTROLLER_LOG"); path != "" {
		if err := os.WriteFile(path, []byte(controllerLog.String()), 0o600); err != nil {
			fmt.Fprintln(os.Stderr, "e2e:", err)
		}
	}
	if err := stopSharedDev(); err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		code = 1
	}
	return code
}

// sharedDev returns the package's dev cluster, starting it on first use.
func sharedDev(t testing.TB) *devcluster.Devnode {
	t.Helper()
	sharedEnv.once.Do(func() {
		tools, err := testenv.FindTools()
		if err != nil {
			sharedEnv.err = err
			return
		}
		dir, err := os.MkdirTemp("", "terrace-e2e-dev-")
		if err != nil {
			sharedEnv.err = err
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), devcluster.StartupTimeout)
		defer cancel()
		sharedEnv.dev, sharedEnv.err = devcluster.StartDevnode(ctx, devcluster.DevnodeOptions{
			Dir:           dir,
			BinDir:        tools.KubebuilderAssets,
			CRDDirs:       []string{filepath.Join(testenv.RepoRoot(), "config", "crd", "bases")},
			TerraceBinary: terraceBinary,
			NodeName:      "e2e-devnode",
			Profiling:     os.Getenv("TERRACE_BENCH_PROFILE") != "",
		})
	})
	if sharedEnv.err != nil {
		t.Fatalf("failed to start the dev cluster: %v", sharedEnv.err)
	}
	return sharedEnv.dev
}

// rememberPids records processes that must be gone once the shared cluster stops.
func rememberPids(pids ...int) {
	sharedEnv.mu.Lock()
	defer sharedEnv.mu.Unlock()
	sharedEnv.pids = append(sharedEnv.pids, pids...)
}

// stopSharedDev stops the shared cluster and checks that none of its
// processes, control plane or pods, outlived it.
func stopSharedDev() error {
	dev := sharedEnv.dev
	if dev == nil {
		return nil
	}
	pids := append(dev.Cluster.Pids(), dev.Node.Pids()...)
	pids = append(pids, sharedEnv.pids...)
	dir := filepath.Dir(dev.NodeDir)
	if err := dev.Stop(); err != nil {
		return fmt.Errorf("failed to stop the dev cluster: %w", err)
	}
	defer func() { _ = os.RemoveAll(dir) }()
	for _, pid := range pids {
		if alive(pid) {
			return fmt.Errorf("process %d outlived the dev cluster", pid)
		}
	}
	if left := processesMentioning(dir); len(left) > 0 {
		return fmt.Errorf("processes outlived the dev cluster: %v", left)
	}
	return nil
}

// alive reports whether a process exists and is not a zombie.
func alive(pid int) bool {
	if err := syscall.Kill(pid, 0); err != nil {
		return false
	}
	stat, err := os.ReadFile(filepath.Join("/proc", fmt.Sprint(pid), "stat"))
	if err != nil {
		return false
	}
	_, state := parseStat(string(stat))
	return state != "Z"
}
