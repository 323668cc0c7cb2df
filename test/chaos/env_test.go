package chaos

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/devcluster"
	"github.com/terrace-dev/terrace/internal/devnode"
	"github.com/terrace-dev/terrace/internal/scheme"
	"github.com/terrace-dev/terrace/internal/state/postgres/pgtest"
	"github.com/terrace-dev/terrace/internal/testenv"
)

const (
	// operatorNamespace holds the CA Secret, the leader Lease and the
	// default TerraceConfig.
	operatorNamespace = "terrace-system"
	// runnerImage is what the controllers name; devnode pulls it from the
	// dev registry.
	runnerImage = "ghcr.io/terrace-dev/terrace:dev"
	// maxStateBytes is the controllers' --state-server-max-state-bytes: low
	// enough that the oversize fault stays cheap for tofu.
	maxStateBytes = 2 << 20
	// uploadPad is the pad of the upload-fault Stacks: a state of twice
	// that, well over uploadThreshold and under maxStateBytes.
	uploadPad = 640 << 10
	// oversizePad is the pad of the oversize fault: the input alone is
	// over maxStateBytes.
	oversizePad = maxStateBytes + 256<<10
	// nodeDiskBytes is the size of the tmpfs that holds devnode's pod
	// directories, so a runner's work directory can be filled.
	nodeDiskBytes = 768 << 20
)

// env is one dev cluster for a whole chaos test.
type env struct {
	t   testing.TB
	dir string
	// begin is when the test started: logf stamps its lines with the time
	// since, so a run's log shows where the time went.
	begin time.Time

	cluster *devcluster.Cluster
	reg     *devcluster.Registry
	c       client.Client
	cs      kubernetes.Interface
	tools   testenv.Tools

	nodeDir  string
	nodeOpts devnode.Options
	nodeMu   sync.Mutex
	node     *devnode.Node
	stopNode context.CancelFunc
	nodeDone chan error
	// nodeDiskFull is true when nodeDir is a tmpfs of its own.
	nodeOnTmpfs bool

	pgDir, pgURL string

	ctrls         *controllers
	stateProxy    *proxy
	artifactProxy *proxy
}

// startEnv starts everything and stops it when the test ends.
func startEnv(t *testing.T) *env {
	t.Helper()
	tools, err := testenv.FindTools()
	if err != nil {
		t.Fatal(err)
	}
	tofu := testenv.RequireTofu(t)
	// Not t.TempDir: devnode's and PostgreSQL's files must be readable
	// by the postgres user, and the node's tmpfs is unmounted first.
	dir, err := os.MkdirTemp("", "terrace-chaos-env-")
	if err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, dir: dir, begin: time.Now(), tools: tools, nodeDir: filepath.Join(dir, "node")}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	if err := os.MkdirAll(e.nodeDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := exec.Command("mount", "-t", "tmpfs", "-o", fmt.Sprintf("size=%d", nodeDiskBytes), "tmpfs", e.nodeDir).Run(); err == nil {
		e.nodeOnTmpfs = true
		t.Cleanup(func() { _ = exec.Command("umount", "-l", e.nodeDir).Run() })
	} else {
		t.Logf("no tmpfs for the node (%v): the disk-full fault is skipped", err)
	}

	// PostgreSQL is restarted by a crash (-m immediate): it must keep what
	// it acknowledged, as a production server does (fsync, synchronous
	// commit), not run as the fast throwaway server of the unit tests.
	t.Setenv("TERRACE_POSTGRES_DURABLE", "1")
	// The control plane, the registry with the dev image and PostgreSQL
	// start side by side: each takes seconds, more on a loaded machine.
	var wg sync.WaitGroup
	errs := make([]error, 3)
	parts := []struct {
		name  string
		start func(context.Context) error
	}{
		{"control plane", e.startControlPlane},
		{"registry and dev image", func(ctx context.Context) error { return e.startRegistry(ctx, tofu) }},
		{"PostgreSQL", e.startPostgres},
	}
	for i, part := range parts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			begin := time.Now()
			errs[i] = part.start(ctx)
			t.Logf("%s up in %s", part.name, time.Since(begin).Round(100*time.Millisecond))
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	certPEM, keyPEM, err := e.cluster.IssueServingCertificate("127.0.0.1", "localhost")
	if err != nil {
		t.Fatal(err)
	}
	e.nodeOpts = devnode.Options{
		NodeName:         "chaos-devnode",
		Dir:              e.nodeDir,
		ImageDir:         devcluster.ImageCacheDir(),
		ServingCertPEM:   certPEM,
		ServingKeyPEM:    keyPEM,
		ClientCAPEM:      e.cluster.CACertPEM,
		RegistryRewrites: map[string]string{devcluster.PublishedRegistry: e.reg.Host},
	}
	if err := e.startNode(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.stopNodeNow)

	e.installOperatorConfig(ctx)
	e.stateProxy = startProxy(t)
	e.artifactProxy = startProxy(t)
	e.ctrls = startControllers(t, e, 2)
	return e
}

// startControlPlane starts etcd, kube-apiserver and kube-controller-manager
// with the CRDs, and the harness's clients.
func (e *env) startControlPlane(ctx context.Context) error {
	var err error
	e.cluster, err = devcluster.Start(ctx, devcluster.Options{
		BinDir:  e.tools.KubebuilderAssets,
		Dir:     filepath.Join(e.dir, "cluster"),
		CRDDirs: []string{filepath.Join(testenv.RepoRoot(), "config", "crd", "bases")},
	})
	if err != nil {
		return fmt.Errorf("failed to start the control plane: %w", err)
	}
	e.t.Cleanup(func() { _ = e.cluster.Stop() })
	// The harness's own requests outlast the restarts it injects.
	cfg := harnessConfig(e.cluster.Config)
	e.cs = kubernetes.NewForConfigOrDie(cfg)
	e.c, err = client.New(cfg, client.Options{Scheme: scheme.New()})
	return err
}

// startRegistry starts the loopback registry and pushes the dev image of
// this checkout's terrace and tofu.
func (e *env) startRegistry(ctx context.Context, tofu string) error {
	var err error
	if e.reg, err = devcluster.StartRegistry(filepath.Join(e.dir, "registry"), ""); err != nil {
		return err
	}
	e.t.Cleanup(func() { _ = e.reg.Stop() })
	if _, err := e.reg.PushDevImage(ctx, devcluster.DevImage{Terrace: terraceBinary, Tofu: tofu}); err != nil {
		return fmt.Errorf("failed to push the dev image: %w", err)
	}
	return nil
}

// startPostgres starts PostgreSQL for the namespace that keeps its state there.
func (e *env) startPostgres(context.Context) error {
	var err error
	if e.pgDir, err = os.MkdirTemp("/tmp", "terrace-pg."); err != nil {
		return err
	}
	url, stopPG, err := pgtest.StartIn(e.pgDir)
	if err != nil {
		return err
	}
	e.pgURL = url
	e.t.Cleanup(stopPG)
	return nil
}

// startNode runs a devnode with e.nodeOpts until stopNodeNow.
func (e *env) startNode(ctx context.Context) error {
	e.nodeMu.Lock()
	defer e.nodeMu.Unlock()
	node, err := devnode.New(e.cluster.Config, e.nodeOpts)
	if err != nil {
		return err
	}
	// The pod processes are the node's children: a pod survives a node
	// restart only as the API object, as when a kubelet's host reboots.
	nodeCtx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- node.Run(nodeCtx) }()
	select {
	case <-node.Ready():
	case err := <-done:
		stop()
		return fmt.Errorf("devnode failed to start: %w", err)
	case <-ctx.Done():
		stop()
		return ctx.Err()
	}
	e.node, e.stopNode, e.nodeDone = node, stop, done
	// A restarted node keeps its pod addresses.
	e.nodeOpts.PodSubnet = node.PodSubnet()
	return nil
}

func (e *env) stopNodeNow() {
	e.nodeMu.Lock()
	defer e.nodeMu.Unlock()
	if e.stopNode != nil {
		e.stopNode()
		<-e.nodeDone
		e.stopNode = nil
	}
}

// restartNode stops devnode (its pods' processes go with it) and starts a
// new one under the same name, which finds the pods bound to it.
func (e *env) restartNode(ctx context.Context) error {
	e.stopNodeNow()
	// The API server may be restarting too: the node registers once it can.
	return poll(ctx, 2*time.Minute, func() error { return e.startNode(ctx) })
}

// nodePids lists the pod processes of the running devnode.
func (e *env) nodePids() []int {
	e.nodeMu.Lock()
	defer e.nodeMu.Unlock()
	if e.node == nil {
		return nil
	}
	return e.node.Pids()
}

// installOperatorConfig creates the operator namespace and the default
// TerraceConfig: runners install the test provider from the mirror `make
// tools` built, as the e2e tests configure them.
func (e *env) installOperatorConfig(ctx context.Context) {
	e.t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: operatorNamespace}}
	if err := e.c.Create(ctx, ns); err != nil && !apierrors.IsAlreadyExists(err) {
		e.t.Fatal(err)
	}
	if _, err := os.Stat(e.tools.ProviderMirror); err != nil {
		e.t.Fatalf("no test provider mirror at %q: run `make tools`", e.tools.ProviderMirror)
	}
	cfg := &terracev1.TerraceConfig{
		ObjectMeta: metav1.ObjectMeta{Name: terracev1.TerraceConfigName, Namespace: operatorNamespace},
		Spec: terracev1.TerraceConfigSpec{Runner: &terracev1.RunnerConfig{Env: []corev1.EnvVar{
			{Name: "TERRACE_PROVIDER_MIRROR", Value: e.tools.ProviderMirror},
		}}},
	}
	if err := e.c.Create(ctx, cfg); err != nil && !apierrors.IsAlreadyExists(err) {
		e.t.Fatal(err)
	}
}

// namespace creates a namespace and waits for its default ServiceAccount.
func (e *env) namespace(ctx context.Context, prefix string) (string, error) {
	ns, err := e.cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: prefix + "-"}}, metav1.CreateOptions{})
	if err != nil {
		return "", err
	}
	err = poll(ctx, time.Minute, func() error {
		_, err := e.cs.CoreV1().ServiceAccounts(ns.Name).Get(ctx, "default", metav1.GetOptions{})
		return err
	})
	return ns.Name, err
}

// createKeep creates obj; AlreadyExists is success, as it is after a retry
// whose first answer was lost (retryingTransport).
func (e *env) createKeep(ctx context.Context, obj client.Object) error {
	if err := e.c.Create(ctx, obj); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	return nil
}

// restartPostgres stops the server at once (as a crash does) and starts it
// again on the same data directory and socket.
func (e *env) restartPostgres() error {
	bins, _ := filepath.Glob("/usr/lib/postgresql/*/bin/pg_ctl")
	if len(bins) == 0 {
		return fmt.Errorf("no pg_ctl under /usr/lib/postgresql")
	}
	stop := []string{bins[len(bins)-1], "-D", filepath.Join(e.pgDir, "data"), "-m", "immediate", "-w", "stop"}
	if os.Getuid() == 0 {
		stop = append([]string{"runuser", "-u", "postgres", "--"}, stop...)
	}
	if out, err := exec.Command(stop[0], stop[1:]...).CombinedOutput(); err != nil {
		return fmt.Errorf("pg_ctl stop: %v: %s", err, out)
	}
	out, err := exec.Command("bash", filepath.Join(testenv.RepoRoot(), "hack", "postgres.sh"), "start", e.pgDir).CombinedOutput()
	if err != nil {
		return fmt.Errorf("hack/postgres.sh start: %v: %s", err, out)
	}
	return nil
}

// poll calls cond every 100 ms until it returns nil, timeout passes or
// ctx ends; the error is cond's last.
func poll(ctx context.Context, timeout time.Duration, cond func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		err := cond()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("after %s: %w", timeout, err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last: %v)", ctx.Err(), err)
		case <-time.After(pollInterval):
		}
	}
}

// pollInterval is poll's: a dozen Stacks polled every 100 ms were a
// hundred requests a second to an API server short of CPU.
const pollInterval = 250 * time.Millisecond

// killGroup SIGKILLs a pod process and everything it started (devnode puts
// each in its own process group), as the kernel's OOM killer ends a
// container.
func killGroup(pid int) error {
	if pgid, err := syscall.Getpgid(pid); err == nil && pgid == pid {
		return syscall.Kill(-pid, syscall.SIGKILL)
	}
	return syscall.Kill(pid, syscall.SIGKILL)
}

// cmdline reads a process's arguments.
func cmdline(pid int) []string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return nil
	}
	return strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
}

// logf logs with the time since the test began: where its time goes.
func (e *env) logf(format string, args ...any) {
	e.t.Helper()
	e.t.Logf("[%6.1fs] "+format, append([]any{time.Since(e.begin).Seconds()}, args...)...)
}
