// Package stack is the Stack reconciler: it resolves a Stack's source,
// configuration and inputs, and drives plan, approval, apply, drift and
// destroy runs in runner pods of the Stack's namespace.
package stack

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/tools/events"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/artifact"
	"github.com/terrace-dev/terrace/internal/artifact/artifactserver"
	"github.com/terrace-dev/terrace/internal/controller/outcome"
	"github.com/terrace-dev/terrace/internal/settings"
)

// ControllerName names the controller in events and logs.
const ControllerName = "terrace-stack-controller"

// Finalizer lets the controller destroy (or deliberately leave) a Stack's
// resources and clean up its runner pods before the Stack goes away.
const Finalizer = "terrace.dev/finalizer"

// Options configure the Stack controller.
type Options struct {
	// OperatorNamespace holds the default TerraceConfig.
	OperatorNamespace string
	// StateServerURL is the state server's base URL as runners reach it.
	StateServerURL string
	// AllowCrossNamespaceRefs permits sources and dependencies in other namespaces.
	AllowCrossNamespaceRefs bool
	// SourceArtifactHosts are the hosts Flux artifacts are downloaded
	// from (source-controller's Service); nil allows none.
	SourceArtifactHosts *artifact.HostAllowlist
	// MaxConcurrentReconciles is the number of reconcile workers (0: 4).
	MaxConcurrentReconciles int
	// MaxConcurrentRuns bounds the runs going on at once, across all
	// namespaces (0: MaxConcurrentReconciles). A run holds one of these
	// slots, not a worker (runscheduler.go).
	MaxConcurrentRuns int
	// MaxRunsPerNamespace bounds one namespace's share of them (0: all
	// but one, at least one), so that no tenant holds every slot.
	MaxRunsPerNamespace int
	// MaxRunTimeout is the longest spec.timeout a Stack may ask for
	// (0: no limit); a Stack above it is refused (RunTimeoutTooLong).
	MaxRunTimeout time.Duration
	// DependencyRequeue is how often a Stack waiting on dependencies looks again.
	DependencyRequeue time.Duration
	// MaxStateBytes is the state server's limit on a state: a plan whose
	// state would be larger is not applied (0: no limit).
	MaxStateBytes int64
	// Sharded: the controller is one shard of several
	// (--watch-label-selector), whose cache holds its own Stacks only; a
	// dependency in another shard is read from the API server.
	Sharded bool
}

// Reconciler reconciles Stacks.
type Reconciler struct {
	Client client.Client
	// APIReader reads Secrets and Flux sources uncached.
	APIReader client.Reader
	Recorder  events.EventRecorder
	Configs   *settings.Resolver
	Runs      runStarter
	Stores    storeProvider
	// Programs builds the tarballs of Programs, shared with the artifact
	// server's cache; nil builds them at every reconcile.
	Programs *artifactserver.Programs
	Options  Options
	// Now is the clock; time.Now when nil.
	Now func() time.Time

	// sources watches the Flux source kinds Stacks name (set up by SetupWithManager).
	sources *sourceWatches
	// scheduler shares the run slots among namespaces and keeps runs off
	// the workers (set up by SetupWithManager; nil runs each run in its
	// reconcile, at once).
	scheduler *runScheduler
	// cleanedHere holds the Stacks whose earlier processes' leftovers
	// (runner pods, a lock) this process has dealt with.
	cleanedHere sync.Map
	// closedHere holds, per Stack, the last run whose runner this process
	// closed (mayHaveDeadRun).
	closedHere sync.Map
}

// +kubebuilder:rbac:groups=terrace.dev,resources=stacks,verbs=get;list;watch;update
// +kubebuilder:rbac:groups=terrace.dev,resources=stacks/status,verbs=patch
// +kubebuilder:rbac:groups=terrace.dev,resources=stacks/finalizers,verbs=update
// +kubebuilder:rbac:groups=terrace.dev,resources=programs;terraceconfigs,verbs=get;list;watch
// +kubebuilder:rbac:groups=source.toolkit.fluxcd.io,resources=gitrepositories;ocirepositories;buckets,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups="",resources=configmaps,verbs=get;list;watch
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// Reconcile moves one Stack towards its desired state. It has the one
// shape every Terrace reconciler has: read, one deferred summarize and
// patch, the finalizer, then decideAndAct: the state the Stack is in
// (state.go) and its one next action (actions.go), decided again after
// each action until one ends the reconcile.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (result ctrl.Result, retErr error) {
	stack := &terracev1.Stack{}
	if err := r.Client.Get(ctx, req.NamespacedName, stack); err != nil {
		if apierrors.IsNotFound(err) {
			r.scheduler.forget(req.NamespacedName)
		}
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if outcome, done := r.scheduler.collect(stack); done {
		return outcome, nil // the Stack's run goes on, or just ended
	}
	log := ctrl.LoggerFrom(ctx).WithValues("stack", klog.KObj(stack))
	ctx = ctrl.LoggerInto(ctx, log)
	s := &scope{stack: stack, log: log, patcher: outcome.NewStatusPatcher(r.Client, stack)}
	started := time.Now()

	defer func() {
		// A panic must not be summarized as success: record it as a
		// transient failure (with its stack in the log) and retry.
		if p := recover(); p != nil {
			retErr = fmt.Errorf("internal error (panic): %v", p)
			log.Error(retErr, "reconcile panicked", "stack", string(debug.Stack()))
		}
		if errors.Is(retErr, errRunDetached) {
			result, retErr = ctrl.Result{}, nil // the run's goroutine finishes
			return
		}
		result, retErr = r.finish(ctx, s, retErr, time.Since(started))
	}()

	if !stack.DeletionTimestamp.IsZero() && !controllerutil.ContainsFinalizer(stack, Finalizer) {
		return ctrl.Result{}, nil // not ours to finish, or finished
	}
	if stack.DeletionTimestamp.IsZero() && !controllerutil.ContainsFinalizer(stack, Finalizer) {
		controllerutil.AddFinalizer(stack, Finalizer)
		if err := r.Client.Update(ctx, stack); err != nil {
			return ctrl.Result{}, fmt.Errorf("failed to add finalizer: %w", err)
		}
		// The answer is the Stack as stored: status patches start from
		// it (the snapshot's resourceVersion would conflict), and it is
		// current, so a run needs no uncached read to trust it.
		s.patcher = outcome.NewStatusPatcher(r.Client, stack)
		s.current = true
	}
	err := r.decideAndAct(ctx, s)
	if err != nil && !errors.Is(err, errRunDetached) && destroying(stack) {
		err = deletionBlocked(err)
	}
	return ctrl.Result{}, err
}

// destroying says the Stack is being deleted with a destroy due.
func destroying(stack *terracev1.Stack) bool {
	return !stack.DeletionTimestamp.IsZero() && stack.Spec.DestroyOnDelete && stack.Status.LastAppliedInputsDigest != ""
}

// finish summarizes what the actions observed into the status, patches it
// and records metrics: the one place a reconcile's outcome is decided. A
// transient failure is retried after the delay its stored count gives
// (retryBackoff of status.failures), which its Warning event names: the
// same after a controller restart. Only a failed status patch, which
// stored no count, is left to controller-runtime's backoff.
func (r *Reconciler) finish(ctx context.Context, s *scope, stepErr error, elapsed time.Duration) (ctrl.Result, error) {
	defer r.closeRun(ctx, s)
	stack := s.stack
	if stack.DeletionTimestamp != nil && !controllerutil.ContainsFinalizer(stack, Finalizer) {
		return ctrl.Result{}, stepErr // gone, or about to be: nothing to patch
	}
	if s.observed.staleCache && stepErr == nil {
		// Nothing was done; look again once the cache has caught up.
		s.log.V(1).Info("the cached Stack is behind the API server; looking again before starting a run")
		return ctrl.Result{RequeueAfter: staleCacheRetry}, nil
	}
	summary := r.summarize(ctx, s, stepErr)
	recordMetrics(stack, s, stepErr, elapsed.Seconds())
	if err := s.patcher.Patch(ctx, stack, ownedConditions...); err != nil && !apierrors.IsNotFound(err) {
		return ctrl.Result{}, errors.Join(summary.Err, fmt.Errorf("failed to patch status: %w", err))
	}
	if summary.Err != nil {
		return ctrl.Result{RequeueAfter: retryBackoff(stack, stack.Status.Failures)}, nil
	}
	return summary.Result, nil
}

func (r *Reconciler) now() time.Time {
	if r.Now != nil {
		return r.Now()
	}
	return time.Now()
}

func (r *Reconciler) resolveConfig(ctx context.Context, s *scope) error {
	eff, err := r.Configs.Resolve(ctx, s.stack)
	if err != nil {
		return fmt.Errorf("failed to resolve the TerraceConfig for %s: %w", s.stack.Namespace, err)
	}
	s.config = eff
	if err := checkRunnerPolicy(s); err != nil {
		return err
	}
	return r.checkRunnerAccess(ctx, s)
}
