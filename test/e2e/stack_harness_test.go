package e2e

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/devcluster"
	"github.com/terrace-dev/terrace/internal/image"
	"github.com/terrace-dev/terrace/internal/operator"
	"github.com/terrace-dev/terrace/internal/readiness"
	"github.com/terrace-dev/terrace/internal/scheme"
	"github.com/terrace-dev/terrace/internal/testenv"
)

// operatorNamespace holds the controller's CA and the default TerraceConfig.
const operatorNamespace = "terrace-system"

// controllerLog collects everything every controller started by the tests
// logs (runner lines included), to check that no secret ever reaches it.
var controllerLog = &testenv.SyncBuffer{}

// captureControllerLog sends controller-runtime's log to controllerLog. It
// must run before anything logs: controller-runtime replaces a logger that
// is not set within 30 s of first use with one that drops every line.
func captureControllerLog() {
	ctrl.SetLogger(funcr.New(func(prefix, args string) {
		fmt.Fprintln(controllerLog, prefix, args)
	}, funcr.Options{Verbosity: 1}))
}

// controller is a Terrace controller running in the test process against
// the dev cluster, as `terrace dev` runs it.
type controller struct {
	stop context.CancelFunc
	done chan error
	// stateURL is where runners reach the controller's state server.
	stateURL string
	// webhookURL is where the controller receives forges' webhooks
	// (POST /hooks/{namespace}), on the node's link as its other servers.
	webhookURL string
}

// stackEnv is what a Stack test needs: the dev cluster, clients, a
// controller and a namespace of its own.
type stackEnv struct {
	dev *devcluster.Dev
	cs  kubernetes.Interface
	c   client.Client
	ns  string
}

var stackCtl struct {
	mu   sync.Mutex
	ctrl *controller
}

// newStackEnv returns the shared dev cluster with a running controller and
// a fresh namespace for one test.
func newStackEnv(t testing.TB) *stackEnv {
	t.Helper()
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("controller log (last 60 lines):\n%s", lastLines(controllerLog.String(), 60))
		}
	})
	dev := sharedDev(t)
	cs, err := kubernetes.NewForConfig(dev.Cluster.Config)
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.New(dev.Cluster.Config, client.Options{Scheme: scheme.New()})
	if err != nil {
		t.Fatal(err)
	}
	env := &stackEnv{dev: dev, cs: cs, c: c}
	stackCtl.mu.Lock()
	if stackCtl.ctrl == nil {
		env.installOperatorConfig(t)
		stackCtl.ctrl = startController(t, dev)
	}
	stackCtl.mu.Unlock()
	env.ns = testNamespace(t, cs)
	return env
}

// installOperatorConfig creates the operator namespace and the default
// TerraceConfig that points runners at the tools `make tools` built, the
// way an operator of a real cluster would configure an image.
func (e *stackEnv) installOperatorConfig(t testing.TB) {
	t.Helper()
	ctx := context.Background()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: operatorNamespace}}
	if err := e.c.Create(ctx, ns); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	tools, err := testenv.FindTools()
	if err != nil {
		t.Fatal(err)
	}
	// Runner pods run tofu from the image, as in a cluster, and install
	// the test provider from the mirror baked into it (devOptions).
	testenv.RequireTofu(t)
	var env []corev1.EnvVar
	if tools.ProviderMirror != "" {
		env = append(env, corev1.EnvVar{Name: "TERRACE_PROVIDER_MIRROR", Value: image.ProviderMirrorDir})
	}
	cfg := &terracev1.TerraceConfig{
		ObjectMeta: metav1.ObjectMeta{Name: terracev1.TerraceConfigName, Namespace: operatorNamespace},
		Spec:       terracev1.TerraceConfigSpec{Runner: &terracev1.RunnerConfig{Env: env}},
	}
	if err := e.c.Create(ctx, cfg); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
}

// controllerEventsAddress is the --events-address of the controllers
// startController starts (notifications_test.go sets it, and restarts).
var controllerEventsAddress string

// controllerRuns, when set, is the --max-concurrent-runs and
// --max-runs-per-namespace of the controller startController starts (the
// benchmark's concurrency).
var controllerRuns int

// startController runs the controller until stopController or the end of
// the package's tests.
func startController(t testing.TB, dev *devcluster.Dev) *controller {
	t.Helper()
	ports := hostPorts(t, dev, 3)
	opts := operator.LocalOptions(operatorNamespace, ports[0], ports[1])
	opts.WebhookAddr = ports[2]
	opts.MaxConcurrentRuns = 8
	if controllerRuns > 0 {
		opts.MaxConcurrentRuns, opts.MaxRunsPerNamespace = controllerRuns, controllerRuns
	}
	// Flux artifacts come from the tests' artifact server on the node's
	// link, as from source-controller's Service; every other host stays
	// refused (tenancy tests).
	opts.SourceArtifactHosts = []string{fluxArtifactAddress(t)}
	// Namespace configs of these tests may use the shared PostgreSQL, as an
	// operator would allow its database server.
	opts.PostgresAllowedHosts = []string{sharedPostgresHost(t)}
	opts.EventsAddress = controllerEventsAddress
	mgr, err := operator.NewManager(dev.Cluster.Config, opts)
	if err != nil {
		t.Fatalf("failed to create the controller: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	c := &controller{stop: cancel, done: make(chan error, 1), stateURL: opts.State.AdvertisedURL, webhookURL: "http://" + opts.WebhookAddr}
	go func() { c.done <- mgr.Start(ctx) }()
	return c
}

// restartController stops the running controller and starts a new one.
func restartController(t *testing.T, dev *devcluster.Dev) {
	t.Helper()
	stackCtl.mu.Lock()
	defer stackCtl.mu.Unlock()
	if c := stackCtl.ctrl; c != nil {
		c.stop()
		select {
		case err := <-c.done:
			if err != nil {
				t.Fatalf("controller stopped with an error: %v", err)
			}
		case <-time.After(2 * time.Minute):
			t.Fatal("controller did not stop within 2 minutes")
		}
	}
	stackCtl.ctrl = startController(t, dev)
}

// hostPorts returns n free addresses on the host's end of the node's link,
// where runner pods reach servers of this process.
func hostPorts(t testing.TB, dev *devcluster.Dev, n int) []string {
	t.Helper()
	ports, err := devcluster.FreePorts(dev.Node.HostIP(), n)
	if err != nil {
		t.Fatal(err)
	}
	var addrs []string
	for _, p := range ports {
		addrs = append(addrs, net.JoinHostPort(dev.Node.HostIP(), fmt.Sprint(p)))
	}
	return addrs
}

// create creates obj in the test's namespace.
func (e *stackEnv) create(t testing.TB, obj client.Object) {
	t.Helper()
	obj.SetNamespace(e.ns)
	if err := e.c.Create(context.Background(), obj); err != nil {
		t.Fatalf("failed to create %T %s: %v", obj, obj.GetName(), err)
	}
}

// allowRunnerToRead lets the namespace's default ServiceAccount, which
// runner pods run as, get the named Secrets: Terrace reads varsFrom objects
// only when the runner's ServiceAccount may.
func (e *stackEnv) allowRunnerToRead(t testing.TB, secrets ...string) {
	t.Helper()
	e.allowRunnerToGet(t, "secrets", secrets...)
}

// update changes a Stack with retries on conflict.
func (e *stackEnv) updateStack(t testing.TB, name string, change func(*terracev1.Stack)) {
	t.Helper()
	eventually(t, 30*time.Second, "updating Stack "+name, func() error {
		var s terracev1.Stack
		if err := e.c.Get(context.Background(), client.ObjectKey{Namespace: e.ns, Name: name}, &s); err != nil {
			return err
		}
		change(&s)
		return e.c.Update(context.Background(), &s)
	})
}

func (e *stackEnv) getStack(t testing.TB, name string) *terracev1.Stack {
	t.Helper()
	var s terracev1.Stack
	if err := e.c.Get(context.Background(), client.ObjectKey{Namespace: e.ns, Name: name}, &s); err != nil {
		t.Fatal(err)
	}
	return &s
}

// waitStack waits until check accepts the Stack, and fails with the Stack's
// conditions when it does not.
func (e *stackEnv) waitStack(t testing.TB, name string, timeout time.Duration, what string, check func(*terracev1.Stack) error) *terracev1.Stack {
	t.Helper()
	var last terracev1.Stack
	eventually(t, timeout, fmt.Sprintf("Stack %s: %s", name, what), func() error {
		if err := e.c.Get(context.Background(), client.ObjectKey{Namespace: e.ns, Name: name}, &last); err != nil {
			return err
		}
		if err := check(&last); err != nil {
			return fmt.Errorf("%w; conditions: %s", err, conditionsText(&last))
		}
		return nil
	})
	return &last
}

// readyAt accepts a Stack that is Ready at its current generation.
func readyAt(s *terracev1.Stack) error {
	ready, why, err := readiness.ReadyAtGeneration(s)
	if err != nil {
		return err
	}
	if !ready {
		return fmt.Errorf("not Ready at generation %d: %s", s.Generation, why)
	}
	return nil
}

// conditionIs accepts a Stack whose condition t has status and reason.
func conditionIs(t string, status metav1.ConditionStatus, reason string) func(*terracev1.Stack) error {
	return func(s *terracev1.Stack) error {
		for _, c := range s.Status.Conditions {
			if c.Type == t && c.Status == status && (reason == "" || c.Reason == reason) && c.ObservedGeneration == s.Generation {
				return nil
			}
		}
		return fmt.Errorf("condition %s is not %s/%s", t, status, reason)
	}
}

func conditionsText(s *terracev1.Stack) string {
	var parts []string
	for _, c := range s.Status.Conditions {
		parts = append(parts, fmt.Sprintf("%s=%s (%s: %s)", c.Type, c.Status, c.Reason, c.Message))
	}
	return strings.Join(parts, "; ")
}

// writeProgram creates or replaces a Program's files.
func (e *stackEnv) program(t testing.TB, name string, files map[string]string) {
	t.Helper()
	ctx := context.Background()
	pf := map[string]terracev1.ProgramFile{}
	for k, v := range files {
		pf[k] = terracev1.ProgramFile(v)
	}
	var p terracev1.Program
	err := e.c.Get(ctx, client.ObjectKey{Namespace: e.ns, Name: name}, &p)
	if apierrors.IsNotFound(err) {
		e.create(t, &terracev1.Program{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: terracev1.ProgramSpec{Files: pf}})
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	p.Spec.Files = pf
	if err := e.c.Update(ctx, &p); err != nil {
		t.Fatal(err)
	}
}

// repoFile reads a file of the checkout.
func repoFile(t testing.TB, rel string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), rel))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
