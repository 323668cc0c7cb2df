// Package config reconciles TerraceConfigs: it checks the Secrets a config
// names, runs the namespace's Installations API server when spec.api asks
// for one, and moves the state of the namespaces a config governs to the
// backend it names. What a config means for a Stack (the resolved
// settings) is internal/settings.
package config

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/tools/events"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/controller/outcome"
	"github.com/terrace-dev/terrace/internal/settings"
)

// ControllerName names the controller in logs, metrics and events.
const ControllerName = "terrace-config-controller"

// Conditions of a TerraceConfig besides Ready, Reconciling and Stalled:
// one for each concern, so that the failure of one shows without hiding
// how the others went.
const (
	// SecretsReadyCondition is True when every Secret the config names
	// exists and holds a usable value.
	SecretsReadyCondition = "SecretsReady"
	// StateBackendReadyCondition is True when the state of the namespaces
	// the config governs is on the backend the config resolves to.
	StateBackendReadyCondition = "StateBackendReady"
	// APIServerReadyCondition is True when the API server's objects match
	// spec.api; it is absent while no API server is asked for.
	APIServerReadyCondition = "APIServerReady"
	// RunnerPolicyNarrowedCondition is True while part of the config's
	// runner settings does not take effect: a policy wider than the
	// operator's floor, hostPath, or a runner image or ServiceAccount the
	// policy refuses. The rest of the config works; Ready is not affected.
	RunnerPolicyNarrowedCondition = "RunnerPolicyNarrowed"
)

// Condition reasons of a TerraceConfig.
const (
	// ConfigReadyReason: every concern of the config succeeded.
	ConfigReadyReason = "ConfigReady"
	// SecretsUsableReason: every referenced Secret exists and holds a usable value.
	SecretsUsableReason = "SecretsUsable"
	// StateBackendCurrentReason: the governed state is on the configured backend.
	StateBackendCurrentReason = "StateBackendCurrent"
	// APIServerDeployedReason: the API server's objects are written.
	APIServerDeployedReason = "APIServerDeployed"
	// SecretNotFoundReason: a referenced Secret does not exist.
	SecretNotFoundReason = "SecretNotFound"
	// SecretKeyMissingReason: a referenced Secret lacks the key.
	SecretKeyMissingReason = "SecretKeyMissing"
	// InvalidEncryptionKeyReason: the key is not 32 bytes, raw or base64.
	InvalidEncryptionKeyReason = "InvalidEncryptionKey"
	// InvalidPostgresConnectionReason: the connection string does not parse.
	InvalidPostgresConnectionReason = "InvalidPostgresConnection"
	// RecoveredReason (event): the config was not Ready and is again.
	RecoveredReason = "Recovered"
	// OutsideRunnerPolicyReason: see RunnerPolicyNarrowedCondition.
	OutsideRunnerPolicyReason = "OutsideRunnerPolicy"
	// APIClustersNotAllowedReason (APIServerReady=False, Stalled): a config
	// outside the operator namespace registers clusters (spec.api.clusters),
	// which only the operator namespace's config may; they are not used.
	APIClustersNotAllowedReason = "APIClustersNotAllowed"
)

// ownedConditions are the conditions the TerraceConfig controller writes.
var ownedConditions = append(slices.Clone(outcome.KstatusConditions),
	SecretsReadyCondition, StateBackendReadyCondition, APIServerReadyCondition, RunnerPolicyNarrowedCondition)

// Reconciler reconciles TerraceConfigs. Each reconcile looks after three
// independent concerns: the Secrets the config names, the state backend
// (moving the governed namespaces' state there, verified, before any run
// uses it; progress in status.stateBackend) and the Installations API
// server of spec.api. One failing does not stop the others.
type Reconciler struct {
	Client client.Client
	// SecretReader reads referenced Secrets; pass an uncached reader (the
	// manager's API reader) so Secrets are not cached wholesale.
	SecretReader client.Reader
	Resolver     *settings.Resolver
	Recorder     events.EventRecorder
	// Migrator moves state between backends; nil reports the backend only.
	Migrator StateMigrator
	// Runs counts runs in progress, which a migration waits for.
	Runs RunCounter
	// API runs the Installations API server of configs that enable it; nil
	// leaves spec.api alone.
	API *APIServerSettings
	// PostgresHosts refuses PostgreSQL servers the operator does not allow;
	// nil allows any.
	PostgresHosts *settings.PostgresHostPolicy
	// Selector picks the TerraceConfigs this controller reconciles (a
	// shard's --watch-label-selector); nil reconciles every one. Only the
	// shard whose selector matches a namespace's config migrates that
	// namespace's state and runs its API server.
	Selector labels.Selector
	// Stacks, when set, lists Stacks (by metadata) to find the namespaces
	// a config governs: a shard's cache holds only its own Stacks, and a
	// config governs every shard's (the API reader). Nil lists the cache.
	Stacks client.Reader
}

// Options are what the TerraceConfig controller needs besides the manager.
type Options struct {
	// Resolver's Reader should be mgr.GetClient().
	Resolver *settings.Resolver
	Migrator StateMigrator
	Runs     RunCounter
	API      *APIServerSettings
	// PostgresHosts: see Reconciler.PostgresHosts.
	PostgresHosts *settings.PostgresHostPolicy
	// Selector: see Reconciler.Selector.
	Selector labels.Selector
	// Stacks: see Reconciler.Stacks.
	Stacks client.Reader
}

// +kubebuilder:rbac:groups=terrace.dev,resources=terraceconfigs,verbs=get;list;watch
// +kubebuilder:rbac:groups=terrace.dev,resources=terraceconfigs/status,verbs=patch
// +kubebuilder:rbac:groups=terrace.dev,resources=stacks,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get;list;watch
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// SetupWithManager registers the TerraceConfig controller.
func SetupWithManager(mgr ctrl.Manager, opts Options) error {
	resolver := opts.Resolver
	if resolver == nil || resolver.OperatorNamespace == "" {
		return errors.New("terraceconfig controller: a resolver with the operator namespace is required")
	}
	r := &Reconciler{
		Client:       mgr.GetClient(),
		SecretReader: mgr.GetAPIReader(),
		Resolver:     resolver,
		Recorder:     mgr.GetEventRecorder(ControllerName),
		Migrator:     opts.Migrator,
		Runs:         opts.Runs,
		API:          opts.API,

		PostgresHosts: opts.PostgresHosts,
		Selector:      opts.Selector,
		Stacks:        opts.Stacks,
	}
	return ctrl.NewControllerManagedBy(mgr).
		Named("terraceconfig").
		For(&terracev1.TerraceConfig{}, builder.WithPredicates(outcome.GenerationOrRequestChanged(), outcome.LabelsMatch(opts.Selector))).
		Watches(&terracev1.TerraceConfig{},
			handler.EnqueueRequestsFromMapFunc(configsForOperatorConfig(mgr.GetClient(), resolver.OperatorNamespace)),
			builder.WithPredicates(outcome.GenerationOrRequestChanged())).
		// A namespace config that appears, goes or changes its backend may
		// hand namespaces to (or take them from) the operator's config.
		Watches(&terracev1.TerraceConfig{},
			handler.EnqueueRequestsFromMapFunc(operatorConfigFor(resolver.OperatorNamespace)),
			builder.WithPredicates(outcome.GenerationOrRequestChanged())).
		// Metadata only: enough to notice a Secret appear or change, without
		// caching Secret contents.
		WatchesMetadata(&corev1.Secret{}, handler.EnqueueRequestsFromMapFunc(configForSecret(mgr.GetClient()))).
		// The API server's Deployment: repaired when changed or deleted by hand.
		WatchesMetadata(&appsv1.Deployment{}, handler.EnqueueRequestForOwner(mgr.GetScheme(), mgr.GetRESTMapper(), &terracev1.TerraceConfig{}, handler.OnlyControllerOwner())).
		// Its Role and RoleBinding: restored when changed or deleted by hand.
		WatchesMetadata(&rbacv1.Role{}, handler.EnqueueRequestForOwner(mgr.GetScheme(), mgr.GetRESTMapper(), &terracev1.TerraceConfig{}, handler.OnlyControllerOwner())).
		WatchesMetadata(&rbacv1.RoleBinding{}, handler.EnqueueRequestForOwner(mgr.GetScheme(), mgr.GetRESTMapper(), &terracev1.TerraceConfig{}, handler.OnlyControllerOwner())).
		Complete(r)
}

// configScope is what the steps of one reconcile share and observe.
type configScope struct {
	config   *terracev1.TerraceConfig
	previous terracev1.TerraceConfigStatus
	// effective is the namespace's resolved settings, once known.
	effective *settings.Effective
	// migration is where the governed namespaces' state is, once looked at.
	migration *terracev1.StateBackendStatus
	// apiRenewAt is when the API server's certificate is due for renewal.
	apiRenewAt time.Time
	// outcomes holds, by the condition it owns, how each concern that ran
	// ended (nil: it succeeded).
	outcomes map[string]error
	// deleting is set on the deletion path, whose error is deleteErr.
	deleting  bool
	deleteErr error
	// setupErr is a failure before the concerns could run (the finalizer).
	setupErr error
}

// step is one concern of a reconcile, or the deletion.
type step func(ctx context.Context, s *configScope) error

// concern is a step that owns a condition: it runs whether or not the
// others failed, and its outcome decides its condition.
type concern struct {
	condition string
	run       step
}

// concerns are the independent parts of a reconcile, in order.
func (r *Reconciler) concerns() []concern {
	cs := []concern{
		{StateBackendReadyCondition, r.reconcileStateBackend},
		{SecretsReadyCondition, r.checkSecrets},
	}
	if r.API != nil {
		cs = append(cs, concern{APIServerReadyCondition, r.reconcileAPI})
	}
	return cs
}

// Reconcile brings a TerraceConfig's concerns in line with its spec and
// reports each of them, and their sum as Ready, in its status.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (result ctrl.Result, retErr error) {
	obj := &terracev1.TerraceConfig{}
	if err := r.Client.Get(ctx, req.NamespacedName, obj); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if !outcome.Owns(r.Selector, obj) {
		return ctrl.Result{}, nil // another shard's
	}
	ctx = log.IntoContext(ctx, log.FromContext(ctx).WithValues("terraceconfig", klog.KObj(obj), "generation", obj.Generation))
	patcher := outcome.NewStatusPatcher(r.Client, obj)
	scope := &configScope{config: obj, previous: *obj.Status.DeepCopy(), outcomes: map[string]error{}}
	defer func() {
		out := r.summarize(ctx, scope)
		if err := patcher.Patch(ctx, obj, ownedConditions...); err != nil && !apierrors.IsNotFound(err) {
			out.Err = errors.Join(out.Err, err)
		}
		result, retErr = out.Result, out.Err
	}()
	outcome.HandleReconcileRequest(obj, &obj.Status.ReconcileRequestStatus)

	if !obj.DeletionTimestamp.IsZero() {
		scope.deleting = true
		scope.deleteErr = r.reconcileDelete(ctx, scope)
		return
	}
	if r.API != nil && apiEnabled(obj) && !controllerutil.ContainsFinalizer(obj, APIFinalizer) {
		// Before any API server object exists, so deletion can remove them.
		if scope.setupErr = r.patchFinalizer(ctx, obj, controllerutil.AddFinalizer); scope.setupErr != nil {
			return
		}
	}
	for _, c := range r.concerns() {
		scope.outcomes[c.condition] = c.run(ctx, scope)
	}
	return
}

// reconcileDelete removes the API server's objects, and then the finalizer.
// Its error reaches the status of the config, which stays until it works.
func (r *Reconciler) reconcileDelete(ctx context.Context, s *configScope) error {
	if r.API == nil {
		return nil
	}
	return r.removeAPI(ctx, s.config)
}

// patchFinalizer adds or removes the API server finalizer with a patch of
// the metadata alone, sent from a copy: the server's answer must not
// replace cfg's status, which holds this reconcile's unsent changes (such
// as lastHandledReconcileAt) until the deferred status patch. The patch
// is refused if the object changed meanwhile, so no other finalizer is lost.
func (r *Reconciler) patchFinalizer(ctx context.Context, cfg *terracev1.TerraceConfig, change func(client.Object, string) bool) error {
	changed := cfg.DeepCopy()
	if !change(changed, APIFinalizer) {
		return nil
	}
	if err := r.Client.Patch(ctx, changed, client.MergeFromWithOptions(cfg, client.MergeFromWithOptimisticLock{})); err != nil {
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("failed to update the finalizers of TerraceConfig %s/%s: %w", cfg.Namespace, cfg.Name, err)
	}
	cfg.Finalizers = changed.Finalizers
	return nil
}

// reconcileStateBackend resolves the namespace's settings (its backend may
// come from the operator namespace's config) and moves the state of the
// namespaces this config governs to the backend it names.
func (r *Reconciler) reconcileStateBackend(ctx context.Context, s *configScope) error {
	eff, err := r.Resolver.ResolveNamespace(ctx, s.config.Namespace)
	if err != nil {
		return err
	}
	s.effective = &eff
	return r.migrateState(ctx, s)
}
