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
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/devcluster"
	"github.com/terrace-dev/terrace/internal/image"
	"github.com/terrace-dev/terrace/internal/scheme"
	"github.com/terrace-dev/terrace/internal/state/postgres/pgtest"
	"github.com/terrace-dev/terrace/internal/testenv"
)

const (
	// operatorNamespace holds the CA Secret, the leader Lease and the
	// default TerraceConfig.
	operatorNamespace = "terrace-system"
	// runnerImage is what the controllers name: the image built from this
	// checkout, which the node pulls from the dev cluster's registry.
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
	// nodeDiskBytes is the size of the node's disk: a tmpfs holding the dev
	// cluster's node/ (containerd's images and containers, the kubelet's
	// pod directories, where a runner's work dir is an emptyDir) and
	// registry/ (some 700 MB and 300 MB once up), so that the disk-full
	// fault can fill it without filling the machine's.
	nodeDiskBytes = 2 << 30
)

// env is one dev cluster for a whole chaos test.
type env struct {
	t   testing.TB
	dir string
	// begin is when the test started: logf stamps its lines with the time
	// since, so a run's log shows where the time went.
	begin time.Time

	dev     *devcluster.Dev
	cluster *devcluster.Cluster
	c       client.Client
	cs      kubernetes.Interface
	tools   testenv.Tools
	// hostIP is the host's end of the node's link: where runners reach
	// the controllers (through the proxies).
	hostIP string
	// podLogDir holds every container's log (the kubelet's podLogsDir).
	podLogDir string
	// nodeOnTmpfs is true when the node's disk is a tmpfs of its own
	// (nodeDiskBytes): the disk-full fault runs only then.
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
	testenv.RequireTofu(t)
	if _, err := os.Stat(tools.ProviderMirror); err != nil {
		t.Fatalf("no test provider mirror at %q: run `make tools`", tools.ProviderMirror)
	}
	// Not t.TempDir: PostgreSQL's files must be readable by the postgres
	// user, and the node's tmpfs is unmounted first.
	dir, err := os.MkdirTemp("", "terrace-chaos-env-")
	if err != nil {
		t.Fatal(err)
	}
	// The runner (65532) writes the test provider's files under files/.
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, dir: dir, begin: time.Now(), tools: tools}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	devDir := e.mountNodeDisk()

	// PostgreSQL is restarted by a crash (-m immediate): it must keep what
	// it acknowledged, as a production server does (fsync, synchronous
	// commit), not run as the fast throwaway server of the unit tests.
	t.Setenv("TERRACE_POSTGRES_DURABLE", "1")
	// The dev cluster (control plane, registry with the image of this
	// checkout, the node, DNS) and PostgreSQL start side by side.
	var wg sync.WaitGroup
	errs := make([]error, 2)
	parts := []struct {
		name  string
		start func(context.Context) error
	}{
		{"dev cluster", func(ctx context.Context) error { return e.startDev(ctx, devDir) }},
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

	e.installOperatorConfig(ctx)
	e.stateProxy = startProxy(t, e.hostIP)
	e.artifactProxy = startProxy(t, e.hostIP)
	e.ctrls = startControllers(t, e, 2)
	return e
}

// mountNodeDisk returns the dev cluster's directory, a tmpfs of
// nodeDiskBytes when it can be mounted, unmounted when the test ends. The
// control plane's cluster/ (etcd's data) is bound there from the machine's
// disk: etcd lives on a control-plane machine, not on the node whose disk
// the disk-full fault fills.
func (e *env) mountNodeDisk() string {
	devDir := filepath.Join(e.dir, "dev")
	clusterDir := filepath.Join(e.dir, "cluster")
	for _, d := range []string{devDir, clusterDir} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			e.t.Fatal(err)
		}
	}
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", fmt.Sprintf("size=%d,mode=0700", nodeDiskBytes), "tmpfs", devDir).CombinedOutput(); err != nil {
		e.t.Logf("no tmpfs for the node's disk (%v: %s): the disk-full fault is skipped", err, out)
		return devDir
	}
	e.t.Cleanup(func() { _ = exec.Command("umount", "-l", devDir).Run() })
	if err := os.Mkdir(filepath.Join(devDir, "cluster"), 0o700); err != nil {
		e.t.Fatal(err)
	}
	if out, err := exec.Command("mount", "--bind", clusterDir, filepath.Join(devDir, "cluster")).CombinedOutput(); err != nil {
		e.t.Fatalf("failed to bind the control plane's directory: %v: %s", err, out)
	}
	e.t.Cleanup(func() { _ = exec.Command("umount", "-l", filepath.Join(devDir, "cluster")).Run() })
	e.nodeOnTmpfs = true
	return devDir
}

// startDev starts the dev cluster with the CRDs and the Terrace image of
// this checkout, the test provider's mirror baked in, as test/e2e's
// shared cluster; the controllers run as processes of the harness.
func (e *env) startDev(ctx context.Context, dir string) error {
	dev, err := devcluster.StartDev(ctx, devcluster.DevOptions{
		Dir:            dir,
		BinDir:         e.tools.KubebuilderAssets,
		CRDDirs:        []string{filepath.Join(testenv.RepoRoot(), "config", "crd", "bases")},
		TerraceBinary:  terraceBinary,
		Tofu:           e.tools.Tofu,
		ProviderMirror: e.tools.ProviderMirror,
		NodeName:       "chaos-node",
	})
	if err != nil {
		return fmt.Errorf("failed to start the dev cluster: %w", err)
	}
	e.t.Cleanup(func() {
		if err := dev.Stop(); err != nil {
			e.t.Errorf("failed to stop the dev cluster: %v", err)
		}
	})
	e.dev, e.cluster = dev, dev.Cluster
	e.hostIP, e.podLogDir = dev.Node.HostIP(), filepath.Join(dev.Node.LogDir(), "pods")
	// The harness's own requests outlast the restarts it injects.
	cfg := harnessConfig(e.cluster.Config)
	e.cs = kubernetes.NewForConfigOrDie(cfg)
	e.c, err = client.New(cfg, client.Options{Scheme: scheme.New()})
	return err
}

// startPostgres starts PostgreSQL for the namespace that keeps its state
// there. Only the controllers reach it, on its socket.
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

// rebootNode power-cycles the node (devcluster's Dev.RebootNode): every
// container dies with it, and the kubelet that boots finds the pods bound
// to it.
func (e *env) rebootNode(ctx context.Context) error {
	// The API server may be restarting too: the node comes back once it
	// can register.
	return e.dev.RebootNode(ctx)
}

// installOperatorConfig creates the operator namespace and the default
// TerraceConfig: runners install the test provider from the mirror baked
// into the dev image (startDev), as the e2e tests configure them.
func (e *env) installOperatorConfig(ctx context.Context) {
	e.t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: operatorNamespace}}
	if err := e.c.Create(ctx, ns); err != nil && !apierrors.IsAlreadyExists(err) {
		e.t.Fatal(err)
	}
	cfg := &terracev1.TerraceConfig{
		ObjectMeta: metav1.ObjectMeta{Name: terracev1.TerraceConfigName, Namespace: operatorNamespace},
		Spec: terracev1.TerraceConfigSpec{Runner: &terracev1.RunnerConfig{Env: []corev1.EnvVar{
			{Name: "TERRACE_PROVIDER_MIRROR", Value: image.ProviderMirrorDir},
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

// filesClaim is the PersistentVolumeClaim, in each workload's namespace,
// of the host directory its Stack's test provider files live in.
const filesClaim = "files"

// filesVolume gives namespace ns the host directory dir as the claim
// filesClaim, the way an administrator hands out storage: a hostPath
// PersistentVolume bound to the claim, which the runner's ServiceAccount
// may get (Terrace mounts only what it may). The runner (65532) writes
// there; the harness reads and edits what it wrote.
func (e *env) filesVolume(ctx context.Context, ns, dir string) error {
	if err := os.MkdirAll(dir, 0o777); err != nil {
		return err
	}
	if err := os.Chmod(dir, 0o777); err != nil {
		return err
	}
	size := resource.MustParse("1Mi")
	empty := ""
	pvName := "files-" + ns
	objs := []client.Object{
		&corev1.PersistentVolume{
			ObjectMeta: metav1.ObjectMeta{Name: pvName},
			Spec: corev1.PersistentVolumeSpec{
				Capacity:                      corev1.ResourceList{corev1.ResourceStorage: size},
				AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteMany},
				PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimRetain,
				ClaimRef:                      &corev1.ObjectReference{Namespace: ns, Name: filesClaim},
				PersistentVolumeSource:        corev1.PersistentVolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: dir}},
			},
		},
		&corev1.PersistentVolumeClaim{
			ObjectMeta: metav1.ObjectMeta{Name: filesClaim, Namespace: ns},
			Spec: corev1.PersistentVolumeClaimSpec{
				AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteMany},
				StorageClassName: &empty,
				VolumeName:       pvName,
				Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: size}},
			},
		},
		&rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "get-files", Namespace: ns}, Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{""}, Resources: []string{"persistentvolumeclaims"}, Verbs: []string{"get"}, ResourceNames: []string{filesClaim}},
		}},
		&rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: "get-files", Namespace: ns},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "get-files"},
			Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: "default", Namespace: ns}},
		},
	}
	for _, obj := range objs {
		if err := e.createKeep(ctx, obj); err != nil {
			return fmt.Errorf("failed to create %T %s: %w", obj, obj.GetName(), err)
		}
	}
	return poll(ctx, time.Minute, func() error {
		var pvc corev1.PersistentVolumeClaim
		if err := e.c.Get(ctx, client.ObjectKey{Namespace: ns, Name: filesClaim}, &pvc); err != nil {
			return err
		}
		if pvc.Status.Phase != corev1.ClaimBound {
			return fmt.Errorf("claim %s/%s is %s", ns, filesClaim, pvc.Status.Phase)
		}
		return nil
	})
}
