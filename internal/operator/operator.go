package operator

import (
	"context"
	"fmt"
	"net"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrlconfig "sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/artifact"
	"github.com/terrace-dev/terrace/internal/artifact/artifactserver"
	"github.com/terrace-dev/terrace/internal/backend"
	"github.com/terrace-dev/terrace/internal/controller/config"
	"github.com/terrace-dev/terrace/internal/controller/program"
	"github.com/terrace-dev/terrace/internal/controller/stack"
	"github.com/terrace-dev/terrace/internal/launcher"
	"github.com/terrace-dev/terrace/internal/notify"
	"github.com/terrace-dev/terrace/internal/pki"
	"github.com/terrace-dev/terrace/internal/pki/casecret"
	"github.com/terrace-dev/terrace/internal/scheme"
	"github.com/terrace-dev/terrace/internal/settings"
	"github.com/terrace-dev/terrace/internal/state/httpbackend"
	"github.com/terrace-dev/terrace/internal/warmpool"
	"github.com/terrace-dev/terrace/internal/webhook"
)

// Run starts the controller process against cfg and blocks until ctx ends.
func Run(ctx context.Context, cfg *rest.Config, opts Options) error {
	mgr, err := NewManager(cfg, opts)
	if err != nil {
		return err
	}
	return mgr.Start(ctx)
}

// NewManager builds the manager with everything the controller runs, ready
// to Start. Tests use it to run the real controller against envtest.
func NewManager(cfg *rest.Config, opts Options) (ctrl.Manager, error) {
	ctx := context.Background()
	// A wrong namespace list stops the controller before it touches anything.
	namespaces, err := opts.WatchedNamespaces()
	if err != nil {
		return nil, err
	}
	shard, err := opts.shard()
	if err != nil {
		return nil, err
	}
	mgrScheme := scheme.New()
	// The CA comes first: the metrics server serves its certificate.
	caSecret, authority, serving, err := loadPKI(ctx, cfg, mgrScheme, opts)
	if err != nil {
		return nil, err
	}
	syncPeriod := opts.SyncPeriod
	mgrOpts := ctrl.Options{
		Scheme:                  mgrScheme,
		Metrics:                 metricsServerOptions(opts.MetricsAddr, opts.MetricsSecure, serving),
		HealthProbeBindAddress:  opts.HealthAddr,
		PprofBindAddress:        opts.PprofAddr,
		LeaderElection:          opts.LeaderElection,
		LeaderElectionID:        shard.leaseName,
		LeaderElectionNamespace: opts.Namespace,
		// Nothing reads managedFields (patches are merge patches): leaving
		// them out of the cache keeps a large namespace's Stacks smaller.
		// In the namespaced install mode every watch and cached list is
		// made in the watched namespaces only (one informer per namespace
		// and kind), where the controller's RoleBindings are.
		// A shard caches its own Stacks only (sharding.go).
		Cache: cache.Options{SyncPeriod: &syncPeriod, DefaultTransform: cache.TransformStripManagedFields(), DefaultNamespaces: cacheNamespaces(namespaces),
			ByObject: cacheByObject(shard)},
		// Secrets hold state, plans and credentials: never cache them all in
		// the controller's memory; read them directly when needed.
		// Secrets are read when needed, never cached wholesale; so are the
		// few objects of API servers, which are watched by metadata only.
		Client: client.Options{Cache: &client.CacheOptions{DisableFor: []client.Object{
			&corev1.Secret{}, &appsv1.Deployment{}, &corev1.Service{}, &corev1.ServiceAccount{},
			&rbacv1.Role{}, &rbacv1.RoleBinding{},
		}}},
		// Names are validated per process; tests start the controller more than once.
		Controller: ctrlconfig.Controller{RecoverPanic: ptr(true), SkipNameValidation: ptr(true)},
	}
	opts.LeaderElectionTiming.apply(&mgrOpts)
	mgr, err := ctrl.NewManager(cfg, mgrOpts)
	if err != nil {
		return nil, fmt.Errorf("failed to create manager: %w", err)
	}
	if namespaces != nil {
		mgr.GetLogger().Info("watching only the listed namespaces (--watch-namespaces)", "namespaces", namespaces)
	}
	if shard.sharded() {
		mgr.GetLogger().Info("reconciling one shard (--watch-label-selector)", "selector", shard.String(), "shard", shard.id, "lease", shard.leaseName)
	}
	if err := mgr.AddHealthzCheck("ping", healthz.Ping); err != nil {
		return nil, err
	}
	if err := mgr.AddReadyzCheck("ping", healthz.Ping); err != nil {
		return nil, err
	}

	if err := casecret.AddToManager(mgr, caSecret, authority, 0, 0); err != nil {
		return nil, err
	}

	resolver := &settings.Resolver{Reader: mgr.GetClient(), OperatorNamespace: opts.Namespace, Builtin: settings.BuiltinDefaults(opts.defaultRunnerImage())}
	backends := backend.New(mgr.GetClient(), resolver.ResolveNamespace)
	postgresHosts := &settings.PostgresHostPolicy{OperatorNamespace: opts.Namespace, Allowed: opts.PostgresAllowedHosts, Reader: mgr.GetAPIReader()}
	backends.PostgresHosts = postgresHosts
	if err := mgr.Add(backends); err != nil {
		return nil, err
	}

	// Side servers: every replica serves, the stores do the concurrency control.
	artifactURL, err := opts.artifactServerURL()
	if err != nil {
		return nil, err
	}
	// A runner's certificate works only while its run is its Stack's current run.
	runnerPods, err := launcher.NewRunnerPodCache(mgr.GetConfig(), mgr.GetScheme(), mgr.GetRESTMapper(), namespaces)
	if err != nil {
		return nil, err
	}
	if err := mgr.Add(runnerPods); err != nil {
		return nil, err
	}
	currentRuns := &launcher.StackRuns{Stacks: mgr.GetClient(), Pods: runnerPods, Live: mgr.GetAPIReader()}
	artifacts := artifactserver.NewServer(opts.Artifact, mgr.GetClient(), mgr.GetAPIReader(), serving, authority)
	artifacts.CheckRuns(currentRuns)
	if err := mgr.Add(artifacts); err != nil {
		return nil, err
	}
	stateURL, err := opts.stateServerURL()
	if err != nil {
		return nil, err
	}
	stateTLS := pki.ServerTLSConfig(serving, authority, nil)
	if err := mgr.Add(httpbackend.NewServer(opts.State, &backend.Router{Backends: backends}, currentRuns, stateTLS)); err != nil {
		return nil, err
	}

	if opts.WebhookAddr != "0" && opts.WebhookAddr != "" {
		// A delivery may concern any shard's Stacks: a shard lists the
		// namespace's Stacks from the API server, not its cache.
		var stacks client.Reader = mgr.GetClient()
		if shard.sharded() {
			stacks = mgr.GetAPIReader()
		}
		receiver := webhook.New(stacks, mgr.GetClient(), webhook.Options{})
		if err := mgr.Add(webhook.NewServer(opts.WebhookAddr, receiver)); err != nil {
			return nil, err
		}
	}

	// Reconcilers: leader only.
	if err := program.SetupWithManager(mgr, program.Options{ArtifactBaseURL: artifactURL, Selector: shard.selector}); err != nil {
		return nil, fmt.Errorf("failed to set up the Program controller: %w", err)
	}
	clientset, err := kubernetes.NewForConfig(scheme.Protobuf(mgr.GetConfig()))
	if err != nil {
		return nil, fmt.Errorf("failed to create clientset: %w", err)
	}
	runs, err := launcher.New(launcher.Options{Client: clientset, Authority: authority, DefaultImage: opts.defaultRunnerImage(), Namespaces: namespaces, Shard: shard.id})
	if err != nil {
		return nil, err
	}
	// The launcher's shared watch of runner pods ends with the manager.
	if err := mgr.Add(manager.RunnableFunc(func(ctx context.Context) error {
		<-ctx.Done()
		runs.Stop()
		return nil
	})); err != nil {
		return nil, err
	}
	// Warm runner pods (spec.runner.warm): started by the leader, adopted by the next one.
	stackNamespaces, err := warmpool.WatchStackNamespaces(ctx, mgr.GetCache())
	if err != nil {
		return nil, err
	}
	demand := &warmpool.NamespaceDemand{Reader: mgr.GetClient(), Stacks: stackNamespaces, Resolver: resolver, ProviderMirror: opts.RunnerProviderMirror}
	warm := warmpool.New(warmpool.Options{Launcher: warmpool.Pods{Launcher: runs}, Demand: demand.Wants})
	if err := mgr.Add(warm); err != nil {
		return nil, err
	}
	apiServers := &config.APIServerSettings{Issuer: authority, Image: opts.Image}
	configOpts := config.Options{Resolver: resolver, Migrator: backends, Runs: runs, API: apiServers, PostgresHosts: postgresHosts, Selector: shard.selector}
	if shard.sharded() {
		configOpts.Stacks = mgr.GetAPIReader() // a config governs every shard's Stacks
	}
	if err := config.SetupWithManager(mgr, configOpts); err != nil {
		return nil, fmt.Errorf("failed to set up the TerraceConfig controller: %w", err)
	}
	artifactHosts, err := artifact.ParseHostAllowlist(opts.SourceArtifactHosts)
	if err != nil {
		return nil, fmt.Errorf("--source-artifact-hosts: %w", err)
	}
	recorder, err := stackRecorder(mgr, opts)
	if err != nil {
		return nil, err
	}
	if opts.Notifications {
		if err := mgr.Add(notify.NewNotifier(mgr.GetConfig(), notify.NotifierOptions{
			Namespace: opts.Namespace, ConfigMapName: opts.NotificationsConfigMap, SecretName: opts.NotificationsSecret,
			StackNamespaces: namespaces, StackSelector: shard.String(), Log: mgr.GetLogger().WithName("notifications"),
		})); err != nil {
			return nil, err
		}
	}
	stacks := &stack.Reconciler{
		Client:    mgr.GetClient(),
		APIReader: mgr.GetAPIReader(),
		Recorder:  recorder,
		Configs:   resolver,
		Runs:      stack.LauncherRuns{Launcher: runs, ProviderMirror: opts.RunnerProviderMirror, Warm: warm},
		Stores:    backends,
		Programs:  artifacts.Programs(),
		Options: stack.Options{
			OperatorNamespace:       opts.Namespace,
			StateServerURL:          stateURL,
			AllowCrossNamespaceRefs: opts.AllowCrossNamespaceRefs,
			SourceArtifactHosts:     artifactHosts,
			MaxConcurrentReconciles: opts.MaxConcurrentRuns,
			MaxConcurrentRuns:       opts.MaxConcurrentRuns,
			MaxRunsPerNamespace:     opts.MaxRunsPerNamespace,
			MaxRunTimeout:           opts.MaxRunTimeout,
			MaxStateBytes:           opts.maxStateBytes(),
			Sharded:                 shard.sharded(),
		},
	}
	if err := stacks.SetupWithManager(ctx, mgr); err != nil {
		return nil, fmt.Errorf("failed to set up the Stack controller: %w", err)
	}
	pullRequests := &stack.PullRequestReconciler{Stacks: stacks, Runs: stack.LauncherPullRequestRuns{Launcher: runs}, ProviderMirror: opts.RunnerProviderMirror}
	if err := pullRequests.SetupWithManager(mgr); err != nil {
		return nil, fmt.Errorf("failed to set up the pull-request controller: %w", err)
	}
	return mgr, nil
}

// stackRecorder is the Stack controller's event recorder: Kubernetes
// Events, and with --events-address the same events in Flux's format to a
// notification-controller.
func stackRecorder(mgr ctrl.Manager, opts Options) (events.EventRecorder, error) {
	kube := mgr.GetEventRecorder(stack.ControllerName)
	if opts.EventsAddress == "" {
		return kube, nil
	}
	flux, err := notify.NewFluxRecorder(kube, mgr.GetScheme(), opts.EventsAddress, stack.ControllerName, mgr.GetLogger().WithName("events"))
	if err != nil {
		return nil, err
	}
	if err := mgr.Add(flux); err != nil {
		return nil, err
	}
	return flux, nil
}

// loadPKI loads (or creates) the controller CA and returns its Secret's
// store, to keep it in sync and rotating once the manager runs
// (casecret.AddToManager), and the serving certificate source of the side
// servers and the metrics server.
func loadPKI(ctx context.Context, cfg *rest.Config, s *runtime.Scheme, opts Options) (*casecret.Store, *pki.Authority, *pki.IssuedCertificate, error) {
	// The manager's client is not usable before Start, and the manager needs
	// the serving certificate: a client of its own.
	direct, err := client.New(cfg, client.Options{Scheme: s})
	if err != nil {
		return nil, nil, nil, fmt.Errorf("failed to create client: %w", err)
	}
	caSecret := &casecret.Store{Client: direct, Key: types.NamespacedName{Namespace: opts.Namespace, Name: opts.CASecretName}}
	authority, err := caSecret.LoadOrCreate(ctx, pki.Options{})
	if err != nil {
		return nil, nil, nil, fmt.Errorf("failed to load the controller CA from Secret %s/%s: %w", opts.Namespace, opts.CASecretName, err)
	}
	var ips []net.IP
	for _, s := range opts.ServerIPs {
		ip := net.ParseIP(s)
		if ip == nil {
			return nil, nil, nil, fmt.Errorf("--server-ips: %q is not an IP address", s)
		}
		ips = append(ips, ip)
	}
	serving := pki.NewIssuedCertificate(authority, pki.LeafRequest{
		Identity: pki.ControllerIdentity, DNSNames: opts.ServingDNSNames(), IPAddresses: ips,
	})
	return caSecret, authority, serving, nil
}

// cacheNamespaces restricts the manager's cache to namespaces; nil (every
// namespace) leaves it cluster-wide.
func cacheNamespaces(namespaces []string) map[string]cache.Config {
	if len(namespaces) == 0 {
		return nil
	}
	out := make(map[string]cache.Config, len(namespaces))
	for _, ns := range namespaces {
		out[ns] = cache.Config{}
	}
	return out
}

// cacheByObject is what the cache keeps of some kinds: Secrets by
// identity only (keepSecretIdentity), and, in a shard, its own Stacks only.
func cacheByObject(s shard) map[client.Object]cache.ByObject {
	byObject := map[client.Object]cache.ByObject{&corev1.Secret{}: {Transform: keepSecretIdentity}}
	if s.sharded() {
		byObject[&terracev1.Stack{}] = cache.ByObject{Label: s.selector}
	}
	return byObject
}

// keepSecretIdentity is the cache's transform of Secrets. The one watch of
// Secrets, the TerraceConfig controller's (metadata only), needs a Secret's
// namespace and name to find the config that names it, and every read of a
// Secret goes to the API server (Client.Cache.DisableFor); the labels,
// annotations and owners of every state and output Secret were about
// 20 MiB of the controller's heap at 10,000 Stacks.
func keepSecretIdentity(obj any) (any, error) {
	m, ok := obj.(*metav1.PartialObjectMetadata)
	if !ok {
		return cache.TransformStripManagedFields()(obj)
	}
	m.ObjectMeta = metav1.ObjectMeta{
		Name: m.Name, Namespace: m.Namespace, UID: m.UID, ResourceVersion: m.ResourceVersion,
		Generation: m.Generation, DeletionTimestamp: m.DeletionTimestamp,
	}
	return m, nil
}

func ptr[T any](v T) *T { return &v }
