// Package e2e runs Terrace end to end on the dev cluster (internal/devcluster):
// a real control plane and a real node (containerd, runc, the kubelet,
// kube-proxy, CoreDNS) in namespaces of its own, running the Terrace image
// built once from this checkout for the whole package.
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

// terraceBinary is built from this checkout in TestMain; the dev clusters
// build their Terrace image from it.
var terraceBinary string

// sharedEnv is one dev cluster for the tests that only need pods; it starts
// on first use and stops when the package's tests end.
var sharedEnv struct {
	once sync.Once
	dev  *devcluster.Dev
	dir  string
	err  error
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

// sharedDev returns the package's dev cluster (devOptions), starting it on
// first use.
func sharedDev(t testing.TB) *devcluster.Dev {
	t.Helper()
	sharedEnv.once.Do(func() {
		tools, err := testenv.FindTools()
		if err != nil {
			sharedEnv.err = err
			return
		}
		if sharedEnv.dir, err = os.MkdirTemp("", "terrace-e2e-dev-"); err != nil {
			sharedEnv.err = err
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), devcluster.StartupTimeout)
		defer cancel()
		opts := devOptions(tools, sharedEnv.dir, "e2e-node")
		opts.Profiling = os.Getenv("TERRACE_BENCH_PROFILE") != ""
		sharedEnv.dev, sharedEnv.err = devcluster.StartDev(ctx, opts)
	})
	if sharedEnv.err != nil {
		t.Fatalf("failed to start the dev cluster: %v", sharedEnv.err)
	}
	return sharedEnv.dev
}

// busybox is Debian's static busybox (hack/install-deps.sh installs it):
// the shell the tests' modules run in local-exec provisioners.
const busybox = "/bin/busybox"

// devOptions start a dev cluster in dir with the CRDs installed and the
// Terrace image of this checkout in its registry, under DevTag, its version
// and tags, with the test provider's mirror and a shell baked in (as a
// team's runner image FROM Terrace's carries its providers and the tools
// its provisioners run); the tests run or install the controller
// themselves.
func devOptions(tools testenv.Tools, dir, nodeName string, tags ...string) devcluster.DevOptions {
	return devcluster.DevOptions{
		Dir:            dir,
		BinDir:         tools.KubebuilderAssets,
		CRDDirs:        []string{filepath.Join(testenv.RepoRoot(), "config", "crd", "bases")},
		TerraceBinary:  terraceBinary,
		Tofu:           tools.Tofu,
		ProviderMirror: tools.ProviderMirror,
		Shell:          busybox,
		ImageTags:      tags,
		NodeName:       nodeName,
	}
}

// startOwnDev starts a dev cluster for one test, as sharedDev does (the
// CRDs installed, the Terrace image in its registry, under tags too) and
// stops it when the test ends.
func startOwnDev(ctx context.Context, t *testing.T, nodeName string, tags ...string) *devcluster.Dev {
	t.Helper()
	tools, err := testenv.FindTools()
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "terrace-e2e-"+nodeName+"-")
	if err != nil {
		t.Fatal(err)
	}
	dev, err := devcluster.StartDev(ctx, devOptions(tools, dir, nodeName, tags...))
	if err != nil {
		_ = os.RemoveAll(dir)
		t.Fatalf("failed to start the dev cluster: %v", err)
	}
	t.Cleanup(func() {
		if err := dev.Stop(); err != nil {
			t.Errorf("failed to stop the dev cluster: %v", err)
		}
		_ = os.RemoveAll(dir)
	})
	return dev
}

// stopSharedDev stops the shared cluster and checks that none of its
// processes, control plane, node or containers, outlived it.
func stopSharedDev() error {
	dev := sharedEnv.dev
	if dev == nil {
		return nil
	}
	pids := append(dev.Cluster.Pids(), dev.Node.Pids()...)
	if len(pids) > len(dev.Cluster.Pids()) {
		// Shims and containers are descendants of the node's init.
		pids = append(pids, descendants(dev.Node.Pids()[0])...)
	}
	if err := dev.Stop(); err != nil {
		return fmt.Errorf("failed to stop the dev cluster: %w", err)
	}
	defer func() { _ = os.RemoveAll(sharedEnv.dir) }()
	for _, pid := range pids {
		if alive(pid) {
			return fmt.Errorf("process %d outlived the dev cluster", pid)
		}
	}
	if left := processesMentioning(sharedEnv.dir); len(left) > 0 {
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
