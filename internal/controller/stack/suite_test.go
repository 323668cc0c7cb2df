package stack

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/artifact/artifactserver"
	"github.com/terrace-dev/terrace/internal/backend"
	"github.com/terrace-dev/terrace/internal/pki"
	"github.com/terrace-dev/terrace/internal/runner"
	"github.com/terrace-dev/terrace/internal/runner/server"
	"github.com/terrace-dev/terrace/internal/settings"
	"github.com/terrace-dev/terrace/internal/state/httpbackend"
	"github.com/terrace-dev/terrace/internal/testenv"
	"github.com/terrace-dev/terrace/internal/tf"
)

// The envtest suite runs the real Stack reconciler in a manager against a
// real API server, with real runners: each run starts an in-process runner
// server (real tofu, mutual TLS, the real state server and Secrets stores).
// Only the runner pod is left out: the launcher has tests of its own
// (and the real node's in the end-to-end tier), and the end-to-end tier runs the whole path.
var suite struct {
	env      *testenv.Env
	events   *eventLog
	runs     *processRuns
	stateURL string
	// stateFaults sits between the state server and the stores.
	stateFaults *stateServerFaults
	// hooks let a test act on one Stack's status patches and runners.
	hooks suiteHooks
	// walks keeps the states and actions each Stack went through, read
	// from the controller's log.
	walks walkLog
}

const suiteOperatorNS = "terrace-system"

// suiteMaxStateBytes is the suite's state server limit, far above the
// scenarios' states but for the one that goes over it.
const suiteMaxStateBytes = 256 << 10

func TestMain(m *testing.M) {
	os.Exit(runSuite(m))
}

func runSuite(m *testing.M) int {
	e, err := testenv.Start()
	if err != nil {
		fmt.Fprintln(os.Stderr, "testenv:", err)
		return 1
	}
	suite.env = e
	defer func() { _ = e.Stop() }()
	ctrl.SetLogger(funcr.NewJSON(suite.walks.record, funcr.Options{Verbosity: 1}))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := startSuiteManager(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return m.Run()
}

// startSuiteManager starts the manager with the Stack reconciler, the
// stores and the state server, as internal/operator wires them.
func startSuiteManager(ctx context.Context) error {
	env := suite.env
	if err := createNamespace(ctx, env.Client, suiteOperatorNS); err != nil {
		return err
	}
	mgr, err := ctrl.NewManager(env.Config, ctrl.Options{
		Scheme:                 env.Scheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Client:                 client.Options{Cache: &client.CacheOptions{DisableFor: []client.Object{&corev1.Secret{}}}},
		// The suite's controller is the main shard: the sharding test's
		// Stacks, labelled for its own shards, are not its own.
		Cache: cache.Options{ByObject: map[client.Object]cache.ByObject{&terracev1.Stack{}: {Label: mainShardSelector}}},
	})
	if err != nil {
		return fmt.Errorf("failed to create manager: %w", err)
	}
	authority, err := pki.NewAuthority(pki.DefaultCAValidity)
	if err != nil {
		return err
	}
	resolver := &settings.Resolver{Reader: mgr.GetClient(), OperatorNamespace: suiteOperatorNS, Builtin: settings.BuiltinDefaults("ghcr.io/terrace-dev/terrace:test")}
	backends := backend.New(mgr.GetClient(), resolver.ResolveNamespace)
	if err := mgr.Add(backends); err != nil {
		return err
	}
	serving, err := authority.Issue(pki.LeafRequest{Identity: pki.ControllerIdentity, Validity: 24 * time.Hour, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}})
	if err != nil {
		return err
	}
	servingCert, err := serving.TLSCertificate()
	if err != nil {
		return err
	}
	suite.stateFaults = &stateServerFaults{Router: &backend.Router{Backends: backends}}
	state := httpbackend.NewServer(httpbackend.Options{ListenAddress: "127.0.0.1:0", MaxStateBytes: suiteMaxStateBytes}, suite.stateFaults,
		currentRunChecker{live: mgr.GetAPIReader()}, pki.ServerTLSConfig(pki.StaticCertificate(servingCert), pki.TrustFunc(authority.TrustPool), nil))
	if err := state.Listen(); err != nil {
		return err
	}
	if err := mgr.Add(state); err != nil {
		return err
	}
	suite.stateURL = "https://" + state.Addr().String()
	tofu, mirror := env.Tools.Tofu, env.Tools.ProviderMirror
	if tofu == "" {
		return errors.New("no tofu binary: run `make tools`")
	}
	suite.events = &eventLog{}
	suite.runs = &processRuns{authority: authority, controller: pki.StaticCertificate(servingCert), tofu: tofu, mirror: mirror, workRoot: filepath.Join(os.TempDir(), fmt.Sprintf("terrace-stack-suite-%d", os.Getpid()))}
	r := &Reconciler{
		Client: hookedClient{mgr.GetClient()}, APIReader: mgr.GetAPIReader(), Recorder: suite.events,
		Configs: resolver, Runs: suite.runs, Stores: backends, Programs: artifactserver.NewPrograms(artifactserver.DefaultCacheBytes),
		Options: Options{OperatorNamespace: suiteOperatorNS, StateServerURL: suite.stateURL, MaxConcurrentReconciles: 4, DependencyRequeue: time.Second, MaxStateBytes: suiteMaxStateBytes, MaxRunTimeout: suiteMaxRunTimeout},
	}
	if err := r.SetupWithManager(ctx, mgr); err != nil {
		return err
	}
	go func() {
		if err := mgr.Start(ctx); err != nil {
			fmt.Fprintln(os.Stderr, "manager:", err)
		}
	}()
	if !mgr.GetCache().WaitForCacheSync(ctx) {
		return errors.New("cache did not sync")
	}
	return nil
}

func createNamespace(ctx context.Context, c client.Client, name string) error {
	ns := &corev1.Namespace{}
	ns.Name = name
	return c.Create(ctx, ns)
}

// currentRunChecker admits a runner while its run is its Stack's
// status.currentRun (read live). The controller's own checker also asks
// for the run's pod, by the UID its certificate is bound to, which these
// in-process runners do not have.
type currentRunChecker struct{ live client.Reader }

func (c currentRunChecker) IsCurrentRun(ctx context.Context, namespace, stack, runID, _ string) (bool, error) {
	var st terracev1.Stack
	if err := c.live.Get(ctx, client.ObjectKey{Namespace: namespace, Name: stack}, &st); err != nil {
		return false, client.IgnoreNotFound(err)
	}
	return st.Status.CurrentRun == runID, nil
}

func (c currentRunChecker) IsCurrentPullRequestRun(ctx context.Context, namespace, stack, runID, _ string) (bool, error) {
	var st terracev1.Stack
	if err := c.live.Get(ctx, client.ObjectKey{Namespace: namespace, Name: stack}, &st); err != nil {
		return false, client.IgnoreNotFound(err)
	}
	return slices.ContainsFunc(st.Status.PullRequests, func(p terracev1.PullRequestPlan) bool { return p.RunID == runID }), nil
}

// processRuns starts each run's runner as a gRPC server in this process,
// with its own work directory and a certificate for the run's identity.
type processRuns struct {
	authority  *pki.Authority
	controller pki.CertificateSource
	tofu       string
	mirror     string
	workRoot   string

	mu sync.Mutex
	// killNext counts, per namespace/stack, the next runs whose runner
	// dies at its first streaming call (Fetch, Init, Plan...).
	killNext map[string]int
	started  atomic.Int64
}

// killNextRuns makes the next n runs of namespace/stack lose their runner
// at their first call, as a runner pod killed mid-run does.
func (p *processRuns) killNextRuns(namespace, stack string, n int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.killNext == nil {
		p.killNext = map[string]int{}
	}
	p.killNext[namespace+"/"+stack] = n
}

func (p *processRuns) takeKill(key string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.killNext[key] > 0 {
		p.killNext[key]--
		return true
	}
	return false
}

func (p *processRuns) Start(ctx context.Context, req runRequest) (runSession, error) {
	p.started.Add(1)
	st := req.Stack
	id := pki.RunnerIdentity(st.Namespace, st.Name, req.RunID)
	leaf, err := p.authority.Issue(pki.LeafRequest{Identity: id, Validity: time.Hour, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}})
	if err != nil {
		return nil, err
	}
	cert, err := leaf.TLSCertificate()
	if err != nil {
		return nil, err
	}
	workDir := filepath.Join(p.workRoot, st.Namespace, st.Name, req.RunID)
	executor, err := tf.New(tf.Config{BinaryPath: p.tofu, WorkDir: workDir, ProviderMirror: p.mirror, InterruptGrace: 10 * time.Second})
	if err != nil {
		return nil, err
	}
	srv, err := server.New(server.Config{
		Executor: executor, Certificate: pki.StaticCertificate(cert), Trust: pki.TrustFunc(p.authority.TrustPool),
		BackendLeaf: func() (*pki.Leaf, error) { return leaf, nil }, Log: logr.Discard(),
	})
	if err != nil {
		return nil, err
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	runCtx, died := context.WithCancelCause(context.Background())
	sess := &processSession{id: req.RunID, ctx: runCtx, died: died, stack: st.Namespace + "/" + st.Name}
	suite.hooks.sessionOpened(sess)
	var opts []grpc.ServerOption
	if p.takeKill(st.Namespace + "/" + st.Name) {
		opts = append(opts, killOnFirstCall(sess))
	}
	g := srv.GRPCServer(opts...)
	sess.stop = g.Stop
	go func() { _ = g.Serve(lis) }()
	cl, err := runner.Dial(ctx, lis.Addr().String(), runner.ClientTLSConfig(p.controller, pki.TrustFunc(p.authority.TrustPool), id))
	if err != nil {
		g.Stop()
		return nil, err
	}
	sess.client = cl
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := cl.WaitReady(wctx); err != nil {
		_ = sess.Close(ctx)
		return nil, fmt.Errorf("runner not ready: %w", err)
	}
	suite.hooks.runnerStarted(st.Namespace, st.Name)
	return sess, nil
}

// Cleanup has no pods to remove: every in-process runner is stopped by
// its session's Close. The suite counts the calls.
func (p *processRuns) Cleanup(_ context.Context, namespace, stack string) error {
	suite.hooks.cleanedUp(namespace, stack)
	return nil
}

// processSession is one in-process runner.
type processSession struct {
	id     string
	client *runner.Client
	ctx    context.Context
	died   context.CancelCauseFunc
	stop   func()
	killed atomic.Bool
	// idle is set by MarkIdle (the run's commands all returned).
	idle atomic.Bool
	// stack is namespace/name, for the suite's hooks.
	stack string
}

func (s *processSession) ID() string               { return s.id }
func (s *processSession) Client() *runner.Client   { return s.client }
func (s *processSession) Context() context.Context { return s.ctx }

func (s *processSession) MarkIdle() { s.idle.Store(true) }

func (s *processSession) Died() error {
	if s.killed.Load() {
		return errors.New("the runner process was killed (test)")
	}
	return nil
}

func (s *processSession) Close(context.Context) error {
	suite.hooks.sessionClosed(s)
	s.died(nil)
	if s.client != nil {
		_ = s.client.Close()
	}
	if s.stop != nil {
		s.stop()
	}
	return nil
}

// killOnFirstCall stops the runner at the first call it gets, as a runner
// pod killed mid-run: the call fails, the session reports the death.
func killOnFirstCall(sess *processSession) grpc.ServerOption {
	kill := func() error {
		if sess.killed.CompareAndSwap(false, true) {
			sess.died(errors.New("runner killed"))
			go sess.stop()
		}
		return status.Error(codes.Unavailable, "the runner is gone")
	}
	return grpc.ChainStreamInterceptor(func(any, grpc.ServerStream, *grpc.StreamServerInfo, grpc.StreamHandler) error {
		return kill()
	})
}
