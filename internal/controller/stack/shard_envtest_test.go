package stack

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrlconfig "sigs.k8s.io/controller-runtime/pkg/config"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/backend"
	"github.com/terrace-dev/terrace/internal/controller/outcome"
	"github.com/terrace-dev/terrace/internal/settings"
)

// shardKey is Flux's sharding label, which the chart's shards select on.
const shardKey = "sharding.fluxcd.io/key"

// mainShardSelector is the main controller's --watch-label-selector in a
// sharded install: every Stack no shard is named for.
var mainShardSelector = func() labels.Selector {
	sel, err := labels.Parse("!" + shardKey)
	if err != nil {
		panic(err)
	}
	return sel
}()

// slowApplyModule's apply marks that it started, sleeps, then counts
// itself: the test moves the Stack while it sleeps, and the count says
// how often the resource was really created.
const slowApplyModule = `
variable "dir" { type = string }
resource "terraform_data" "slow" {
  provisioner "local-exec" {
    command = "touch ${var.dir}/started && sleep 4 && echo applied >> ${var.dir}/applied"
  }
}
output "done" { value = terraform_data.slow.id }
`

// shardRegistry knows which shard's runner runs each run, as the runner
// pods' terrace.dev/shard label tells the real controller.
type shardRegistry struct {
	mu      sync.Mutex
	live    map[string]string // namespace/stack → shard of its live run
	started map[string]int    // shard → runs started
	overlap bool              // two runs of one Stack at once
	waited  atomic.Int64      // times a shard found another's run going on
}

// testShardRuns is one shard's runStarter: the suite's in-process runners,
// recorded in the registry.
type testShardRuns struct {
	shard string
	reg   *shardRegistry
}

func (s testShardRuns) Start(ctx context.Context, req runRequest) (runSession, error) {
	key := req.Stack.Namespace + "/" + req.Stack.Name
	s.reg.mu.Lock()
	if s.reg.live[key] != "" {
		s.reg.overlap = true
	}
	s.reg.live[key] = s.shard
	s.reg.started[s.shard]++
	s.reg.mu.Unlock()
	sess, err := suite.runs.Start(ctx, req)
	if err != nil {
		s.reg.end(key)
		return nil, err
	}
	return &shardSession{processSession: sess.(*processSession), end: func() { s.reg.end(key) }}, nil
}

func (s testShardRuns) Cleanup(ctx context.Context, namespace, stack string) error {
	return suite.runs.Cleanup(ctx, namespace, stack)
}

// OtherShardRun implements shardRuns, as the launcher does from the pods.
func (s testShardRuns) OtherShardRun(_ context.Context, namespace, stack, runID string) (string, error) {
	s.reg.mu.Lock()
	defer s.reg.mu.Unlock()
	if owner := s.reg.live[namespace+"/"+stack]; owner != "" && owner != s.shard {
		s.reg.waited.Add(1)
		return "runner-" + runID, nil
	}
	return "", nil
}

func (r *shardRegistry) end(key string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.live, key)
}

type shardSession struct {
	*processSession
	end func()
}

func (s *shardSession) Close(ctx context.Context) error {
	defer s.end()
	return s.processSession.Close(ctx)
}

// startShard runs a Stack controller whose cache holds the Stacks
// selected by shardKey=name only, as `terrace controller
// --watch-label-selector sharding.fluxcd.io/key=<name>` does.
func startShard(t *testing.T, name string, reg *shardRegistry) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	env := suite.env
	sel := labels.SelectorFromSet(labels.Set{shardKey: name})
	mgr, err := ctrl.NewManager(env.Config, ctrl.Options{
		Scheme: env.Scheme, Metrics: metricsserver.Options{BindAddress: "0"}, HealthProbeBindAddress: "0",
		Client:     client.Options{Cache: &client.CacheOptions{DisableFor: []client.Object{&corev1.Secret{}}}},
		Cache:      cache.Options{ByObject: map[client.Object]cache.ByObject{&terracev1.Stack{}: {Label: sel}}},
		Controller: ctrlconfig.Controller{SkipNameValidation: ptrTo(true)},
	})
	if err != nil {
		t.Fatal(err)
	}
	resolver := &settings.Resolver{Reader: mgr.GetClient(), OperatorNamespace: suiteOperatorNS, Builtin: settings.BuiltinDefaults("ghcr.io/terrace-dev/terrace:test")}
	backends := backend.New(mgr.GetClient(), resolver.ResolveNamespace)
	if err := mgr.Add(backends); err != nil {
		t.Fatal(err)
	}
	r := &Reconciler{
		Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Recorder: suite.events,
		Configs: resolver, Runs: testShardRuns{shard: name, reg: reg}, Stores: backends,
		// Every shard's runners use one state server: it answers any
		// shard's run while that run is its Stack's status.currentRun.
		Options: Options{OperatorNamespace: suiteOperatorNS, StateServerURL: suite.stateURL, MaxConcurrentReconciles: 2,
			DependencyRequeue: time.Second, MaxStateBytes: suiteMaxStateBytes, MaxRunTimeout: suiteMaxRunTimeout, Sharded: true},
	}
	if err := r.SetupWithManager(ctx, mgr); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := mgr.Start(ctx); err != nil {
			t.Errorf("shard %s: %v", name, err)
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
	if !mgr.GetCache().WaitForCacheSync(ctx) {
		t.Fatalf("shard %s: cache did not sync", name)
	}
}

// TestStackMovedBetweenShardsMidRunLosesNothing moves a Stack from one
// controller shard to another by its sharding label while its apply runs.
// The shard it left drops it from its cache but lets its run finish (the
// resource is created once, its state saved); the shard it joined waits
// for that run instead of announcing its own, which would cut the running
// tofu off from its state, then converges: Ready, with the output, and a
// plan that finds nothing left to create. The main controller (the suite's,
// `!sharding.fluxcd.io/key`) never touches it.
func TestStackMovedBetweenShardsMidRunLosesNothing(t *testing.T) {
	e := newSuiteEnv(t)
	reg := &shardRegistry{live: map[string]string{}, started: map[string]int{}}
	startShard(t, "shard1", reg)
	startShard(t, "shard2", reg)

	dir := t.TempDir()
	e.stack("moved", slowApplyModule, map[string]string{"dir": dir}, func(st *terracev1.Stack) {
		st.Labels = map[string]string{shardKey: "shard1"}
		st.Spec.ApprovePlan = "auto"
	})
	deadline := time.Now().Add(time.Minute)
	for {
		if _, err := os.Stat(filepath.Join(dir, "started")); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("shard1's apply never started; events %v", suite.events.reasons(e.ns, "moved"))
		}
		time.Sleep(50 * time.Millisecond)
	}
	running := e.waitFor("moved", "running on shard1", func(st *terracev1.Stack) bool { return st.Status.CurrentRun != "" })
	firstRun := running.Status.CurrentRun
	e.update("moved", func(st *terracev1.Stack) { st.Labels[shardKey] = "shard2" })

	st := e.waitFor("moved", "Ready on shard2", func(st *terracev1.Stack) bool {
		ready := outcome.Get(st, terracev1.ReadyCondition)
		return ready != nil && ready.Status == "True" && ready.ObservedGeneration == st.Generation && st.Status.ObservedGeneration == st.Generation &&
			st.Status.CurrentRun != firstRun
	})
	applied, err := os.ReadFile(filepath.Join(dir, "applied"))
	if err != nil {
		t.Fatalf("shard1's apply never finished: %v", err)
	}
	if n := strings.Count(string(applied), "applied"); n != 1 {
		t.Errorf("the resource was created %d times, want once: shard1's apply must finish and its state be kept", n)
	}
	if !slices.Contains(st.Status.Outputs, "done") {
		t.Errorf("outputs %v, want done", st.Status.Outputs)
	}
	reg.mu.Lock()
	defer reg.mu.Unlock()
	if reg.overlap {
		t.Error("two runs of the Stack ran at once")
	}
	if reg.waited.Load() == 0 {
		t.Error("shard2 never waited for shard1's run: the move did not happen mid-run, or shard2 started a run over it")
	}
	if reg.started["shard1"] != 1 || reg.started["shard2"] < 1 {
		t.Errorf("runs started: %v; want one by shard1 (before the move) and shard2's after", reg.started)
	}
	if len(reg.live) != 0 {
		t.Errorf("runs still open: %v", reg.live)
	}
	t.Logf("runs started %v; shard2 waited %d times for shard1's run %s", reg.started, reg.waited.Load(), firstRun)
}
