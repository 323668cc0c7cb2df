package config

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/controller/reconcile"
	"github.com/terrace-dev/terrace/internal/runnerpolicy"
	"github.com/terrace-dev/terrace/internal/settings"
	"github.com/terrace-dev/terrace/internal/state"
)

// ControllerName names the controller in logs, metrics and events.
const ControllerName = "terrace-config-controller"

// Condition reasons of a TerraceConfig.
const (
	// ConfigReadyReason: every referenced Secret exists and holds a usable value.
	ConfigReadyReason = "ConfigReady"
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

	// RunnerPolicyNarrowedCondition is True while part of the config's
	// runner settings does not take effect: a policy wider than the
	// operator's floor, hostPath, or a runner image or ServiceAccount the
	// policy refuses. The rest of the config works; Ready is not affected.
	RunnerPolicyNarrowedCondition = "RunnerPolicyNarrowed"
	// OutsideRunnerPolicyReason: see RunnerPolicyNarrowedCondition.
	OutsideRunnerPolicyReason = "OutsideRunnerPolicy"
)

// ownedConditions are the conditions the TerraceConfig controller writes.
var ownedConditions = append(slices.Clone(reconcile.KstatusConditions), RunnerPolicyNarrowedCondition)

// Reconciler checks TerraceConfigs and, when a config names another state
// backend, moves the state of the namespaces it governs there (verified,
// before any run uses it), reporting progress in status.stateBackend. It
// does not run the Installations API server.
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
	}
	return ctrl.NewControllerManagedBy(mgr).
		Named("terraceconfig").
		For(&terracev1.TerraceConfig{}, builder.WithPredicates(reconcile.GenerationOrRequestChanged())).
		Watches(&terracev1.TerraceConfig{},
			handler.EnqueueRequestsFromMapFunc(configsForOperatorConfig(mgr.GetClient(), resolver.OperatorNamespace)),
			builder.WithPredicates(reconcile.GenerationOrRequestChanged())).
		// A namespace config that appears, goes or changes its backend may
		// hand namespaces to (or take them from) the operator's config.
		Watches(&terracev1.TerraceConfig{},
			handler.EnqueueRequestsFromMapFunc(operatorConfigFor(resolver.OperatorNamespace)),
			builder.WithPredicates(reconcile.GenerationOrRequestChanged())).
		// Metadata only: enough to notice a Secret appear or change, without
		// caching Secret contents.
		WatchesMetadata(&corev1.Secret{}, handler.EnqueueRequestsFromMapFunc(configForSecret(mgr.GetClient()))).
		// The API server's Deployment: repaired when changed or deleted by hand.
		WatchesMetadata(&appsv1.Deployment{}, handler.EnqueueRequestForOwner(mgr.GetScheme(), mgr.GetRESTMapper(), &terracev1.TerraceConfig{}, handler.OnlyControllerOwner())).
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
}

type step func(ctx context.Context, s *configScope) error

// Reconcile checks the config's Secret references and records the
// namespace's effective state backend.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (result ctrl.Result, retErr error) {
	obj := &terracev1.TerraceConfig{}
	if err := r.Client.Get(ctx, req.NamespacedName, obj); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if !obj.DeletionTimestamp.IsZero() {
		// Namespaced objects go with the config (owner references); the
		// API server's cluster-scoped binding is removed here.
		if r.API != nil && controllerutil.ContainsFinalizer(obj, APIFinalizer) {
			return ctrl.Result{}, r.removeAPI(ctx, obj)
		}
		return ctrl.Result{}, nil
	}
	ctx = log.IntoContext(ctx, log.FromContext(ctx).WithValues("terraceconfig", klog.KObj(obj), "generation", obj.Generation))
	patcher := reconcile.NewStatusPatcher(r.Client, obj)
	scope := &configScope{config: obj, previous: *obj.Status.DeepCopy()}

	var stepErr error
	defer func() {
		out := r.summarize(ctx, scope, stepErr)
		if err := patcher.Patch(ctx, obj, ownedConditions...); err != nil && !apierrors.IsNotFound(err) {
			out.Err = errors.Join(out.Err, err)
		}
		result, retErr = out.Result, out.Err
	}()

	reconcile.HandleReconcileRequest(obj, &obj.Status.ReconcileRequestStatus)
	for _, s := range []step{r.resolve, r.checkSecrets, r.reconcileAPI, r.migrateState} {
		if stepErr = s(ctx, scope); stepErr != nil {
			return
		}
	}
	return
}

// resolve computes the namespace's effective settings, which may come
// partly from the operator namespace's config.
func (r *Reconciler) resolve(ctx context.Context, s *configScope) error {
	eff, err := r.Resolver.ResolveNamespace(ctx, s.config.Namespace)
	if err != nil {
		return err
	}
	s.effective = &eff
	return nil
}

// secretRef is one Secret reference of a config, with the field that made it.
type secretRef struct {
	field string
	name  string
	key   string
	// check validates the value; its error must not quote the value.
	check         func(value []byte) error
	invalidReason string
}

// secretRefs lists the Secret references the config itself makes (inherited
// ones are checked by the config that makes them).
func secretRefs(cfg *terracev1.TerraceConfig) []secretRef {
	st := cfg.Spec.State
	if st == nil {
		return nil
	}
	var refs []secretRef
	if st.Postgres != nil && st.Postgres.ConnectionSecretRef.Name != "" {
		ref := st.Postgres.ConnectionSecretRef
		refs = append(refs, secretRef{field: "spec.state.postgres.connectionSecretRef", name: ref.Name, key: settings.KeyOrDefault(ref.Key, settings.DefaultPostgresURLKey), check: checkPostgresURL, invalidReason: InvalidPostgresConnectionReason})
	}
	if st.Encryption != nil && st.Encryption.KeySecretRef.Name != "" {
		ref := st.Encryption.KeySecretRef
		refs = append(refs, secretRef{field: "spec.state.encryption.keySecretRef", name: ref.Name, key: settings.KeyOrDefault(ref.Key, settings.DefaultEncryptionKeyKey), check: checkEncryptionKey, invalidReason: InvalidEncryptionKeyReason})
	}
	return refs
}

// checkSecrets verifies that each referenced Secret exists and holds a
// usable value. Messages name Secrets and keys, never values.
func (r *Reconciler) checkSecrets(ctx context.Context, s *configScope) error {
	ns := s.config.Namespace
	for _, ref := range secretRefs(s.config) {
		secret := &corev1.Secret{}
		err := r.SecretReader.Get(ctx, types.NamespacedName{Namespace: ns, Name: ref.name}, secret)
		switch {
		case apierrors.IsNotFound(err):
			return reconcile.Terminalf(SecretNotFoundReason, "Secret %s/%s named by %s does not exist: create it with the key %q", ns, ref.name, ref.field, ref.key)
		case err != nil:
			return fmt.Errorf("failed to read Secret %s/%s named by %s: %w", ns, ref.name, ref.field, err)
		}
		value, ok := secret.Data[ref.key]
		if !ok || len(value) == 0 {
			return reconcile.Terminalf(SecretKeyMissingReason, "Secret %s/%s named by %s has no key %q: add it", ns, ref.name, ref.field, ref.key)
		}
		if err := ref.check(value); err != nil {
			return reconcile.Terminalf(ref.invalidReason, "Secret %s/%s key %q named by %s: %v", ns, ref.name, ref.key, ref.field, err)
		}
		if err := r.checkPostgresHost(ctx, ns, ref, value); err != nil {
			return err
		}
	}
	return nil
}

func checkEncryptionKey(value []byte) error {
	if _, err := state.ParseEncryptionKey(value); err != nil {
		return fmt.Errorf("the encryption key must be 32 bytes, raw or base64-encoded (it is %d bytes)", len(value))
	}
	return nil
}

func checkPostgresURL(value []byte) error {
	// pgx's parse errors may quote the string, password included: say less.
	if _, err := pgxpool.ParseConfig(string(value)); err != nil {
		return errors.New("the value is not a valid PostgreSQL connection URL or key=value string")
	}
	return nil
}

// summarize derives the status from what the steps observed.
func (r *Reconciler) summarize(ctx context.Context, s *configScope, stepErr error) reconcile.Outcome {
	cfg := s.config
	switch {
	case s.migration != nil:
		applyMigrationStatus(cfg, s.previous.StateBackend, s.migration)
	case s.effective != nil && stepErr == nil:
		cfg.Status.StateBackend = &terracev1.StateBackendStatus{Current: s.effective.StateBackend}
	}
	readyMessage := ""
	if s.effective != nil {
		readyMessage = fmt.Sprintf("state backend %s; settings from %v", s.effective.StateBackend, s.effective.Sources)
	}
	if apiEnabled(cfg) && r.API != nil && stepErr == nil {
		readyMessage += fmt.Sprintf("; API server at https://%s.%s.svc", APIName, cfg.Namespace)
	}
	r.setRunnerPolicyCondition(cfg, s)
	out := reconcile.Summarize(cfg, stepErr, ConfigReadyReason, readyMessage, 0)
	if out.Final {
		cfg.Status.ObservedGeneration = cfg.Generation
	}
	if !s.apiRenewAt.IsZero() {
		renew := max(time.Until(s.apiRenewAt), time.Second)
		if out.Result.RequeueAfter == 0 || renew < out.Result.RequeueAfter {
			out.Result.RequeueAfter = renew
		}
	}
	logger := log.FromContext(ctx)
	if stepErr != nil {
		logger.Info("terrace config not ready", "reason", reconcile.Get(cfg, terracev1.ReadyCondition).Reason, "error", stepErr.Error())
		return out
	}
	if conditionStatus(s.previous.Conditions, terracev1.ReadyCondition) == metav1.ConditionFalse {
		r.Recorder.Eventf(cfg, nil, corev1.EventTypeNormal, RecoveredReason, "Validate", "terrace config is valid again")
		logger.Info("terrace config recovered")
	}
	return out
}

// setRunnerPolicyCondition reports what of this config's runner settings
// does not take effect, with a warning event when that changes.
func (r *Reconciler) setRunnerPolicyCondition(cfg *terracev1.TerraceConfig, s *configScope) {
	if s.effective == nil {
		return
	}
	var parts []string
	source := cfg.Namespace + "/" + cfg.Name
	for _, n := range s.effective.RunnerPolicyNotes {
		if n.Source == source {
			parts = append(parts, "spec.runner.policy."+n.Message)
		}
	}
	var refused runnerpolicy.Violations
	if errors.As(s.effective.CheckConfigRunner(), &refused) {
		// Only what this config itself names: an inherited image is
		// reported by the config that names it.
		refused = slices.DeleteFunc(refused, func(v runnerpolicy.Violation) bool { return !strings.HasSuffix(v.Field, " of TerraceConfig "+source) })
		if len(refused) > 0 {
			parts = append(parts, refused.Error())
		}
	}
	if len(parts) == 0 {
		reconcile.Delete(cfg, RunnerPolicyNarrowedCondition)
		return
	}
	msg := strings.Join(parts, "; ")
	if prev := reconcile.Get(cfg, RunnerPolicyNarrowedCondition); prev == nil || prev.Message != msg {
		r.Recorder.Eventf(cfg, nil, corev1.EventTypeWarning, OutsideRunnerPolicyReason, "Validate", "%s", msg)
	}
	reconcile.MarkTrue(cfg, RunnerPolicyNarrowedCondition, OutsideRunnerPolicyReason, "%s", msg)
}

func conditionStatus(conds []metav1.Condition, t string) metav1.ConditionStatus {
	for _, c := range conds {
		if c.Type == t {
			return c.Status
		}
	}
	return ""
}
