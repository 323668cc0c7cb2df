// Package operator assembles the Terrace controller process: one manager with
// the reconcilers (leader only), the artifact and state servers (every
// replica) and the PKI that secures them.
package operator

import (
	"fmt"
	"net"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/spf13/pflag"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/terrace-dev/terrace/internal/artifact/artifactserver"
	"github.com/terrace-dev/terrace/internal/notify"
	"github.com/terrace-dev/terrace/internal/state/httpbackend"
	"github.com/terrace-dev/terrace/internal/version"
	"github.com/terrace-dev/terrace/internal/webhook"
)

// Options configure the controller process. They bind their own flags.
type Options struct {
	// Namespace the operator runs in: its CA Secret, default TerraceConfig
	// and leader lease live there.
	Namespace string
	// MetricsAddr serves Prometheus metrics; "0" disables.
	MetricsAddr string
	// MetricsSecure serves them over HTTPS to authenticated, authorized
	// callers only (metricsServerOptions); false serves plain HTTP to
	// anyone, for a controller run outside a cluster on loopback.
	MetricsSecure bool
	// HealthAddr serves /healthz and /readyz.
	HealthAddr string
	// PprofAddr serves Go's /debug/pprof profiles; empty (the default)
	// serves none. For finding where memory or CPU goes, never public.
	PprofAddr string
	// LeaderElection makes only one replica run the reconcilers.
	LeaderElection bool
	// LeaderElectionTiming is the lease's; zero fields keep
	// controller-runtime's (15 s lease, 10 s renew deadline, 2 s retry).
	LeaderElectionTiming LeaderElectionTiming
	// AllowCrossNamespaceRefs lets Stacks reference sources and dependencies in other namespaces.
	AllowCrossNamespaceRefs bool
	// SourceArtifactHosts are the hosts (host or host:port) the controller
	// downloads Flux artifacts from: source-controller's Service by default.
	SourceArtifactHosts []string
	// CASecretName is the Secret holding the controller CA.
	CASecretName string
	// ServerDNSNames and ServerIPs go into the serving certificate of the
	// artifact and state servers, for clients that check hostnames (tofu).
	// Empty ServerDNSNames means the Service's names in Namespace
	// (ServingDNSNames).
	ServerDNSNames []string
	ServerIPs      []string
	// Image is the controller's own image: the Installations API servers
	// run it, always (a TerraceConfig cannot change it). Default:
	// version.ImageReference(), the image this binary was released as.
	Image string
	// RunnerImage is the runner image when no TerraceConfig names one;
	// empty means Image.
	RunnerImage string
	// RunnerProviderMirror is a directory, inside runner pods, that
	// providers are installed from exclusively (offline clusters, tests).
	RunnerProviderMirror string
	// MaxConcurrentRuns bounds the runs going on at once, across all
	// namespaces, and is the Stack controller's number of workers (a run
	// holds a slot, not a worker).
	MaxConcurrentRuns int
	// MaxRunsPerNamespace bounds one namespace's runs at once; 0 is one
	// less than MaxConcurrentRuns (at least 1), so that no namespace holds
	// every slot. Queued runs get freed slots namespace by namespace.
	MaxRunsPerNamespace int
	// MaxRunTimeout is the longest spec.timeout a Stack may set (a longer
	// one is refused, RunTimeoutTooLong); 0 sets no limit.
	MaxRunTimeout time.Duration
	// SyncPeriod bounds how long the cache may go without a full resync.
	SyncPeriod time.Duration
	// PostgresAllowedHosts are the PostgreSQL servers ("host", "host:port"
	// or a unix socket directory) a namespace's TerraceConfig may name,
	// besides the operator config's own server (config.PostgresHostPolicy).
	PostgresAllowedHosts []string
	// WatchNamespaces, when set, are the only namespaces the controller
	// watches, lists and acts in, Namespace always among them: the cache
	// of the manager, the runner pod watches and so every reconciler. Empty
	// means every namespace. The namespaced install mode grants the
	// controller's rights in exactly these namespaces (docs/security.md,
	// Install modes); WatchedNamespaces checks and completes the list.
	WatchNamespaces []string
	// WatchLabelSelector makes the controller one shard of several, as
	// Flux's controllers shard (--watch-label-selector): it reconciles
	// only the Stacks, Programs and TerraceConfigs whose labels match, and
	// caches no other Stack. Empty (the default) reconciles every one.
	// sharding.go says what every shard still reads and serves.
	WatchLabelSelector string
	// ServiceName is the Service in front of this controller's pods in
	// Namespace: runners are told to reach the artifact and state servers
	// there, and the serving certificate names it. A shard has a Service of
	// its own (the chart's terrace-controller-<shard>).
	ServiceName string
	// EventsAddress is a Flux notification-controller's event endpoint
	// (Flux's --events-address): every Stack event is also posted there
	// in Flux's event format (notify.FluxRecorder). Empty posts nowhere.
	EventsAddress string
	// Notifications runs the notification controller (notify.Notifier):
	// Slack, Teams, webhooks... defined in NotificationsConfigMap and
	// NotificationsSecret in Namespace, which Stacks subscribe to by
	// annotation. Without the ConfigMap it sends nothing.
	Notifications          bool
	NotificationsConfigMap string
	NotificationsSecret    string

	// WebhookAddr is where every replica serves the forges' webhooks
	// (internal/webhook, POST /hooks/{namespace}); "0" serves none.
	WebhookAddr string

	// Artifact configures the Program artifact server.
	Artifact artifactserver.ServerOptions
	// State configures the Terraform http state server.
	State httpbackend.Options
}

// DefaultMaxRunTimeout is --max-run-timeout's default: how long one run
// may hold one of the shared run slots.
const DefaultMaxRunTimeout = 2 * time.Hour

// defaultRunnerImage is the runner image when no TerraceConfig names one.
func (o Options) defaultRunnerImage() string {
	if o.RunnerImage != "" {
		return o.RunnerImage
	}
	return o.Image
}

// stateServerURL is where runners reach the state server.
func (o Options) stateServerURL() (string, error) {
	if o.State.AdvertisedURL != "" {
		return strings.TrimSuffix(o.State.AdvertisedURL, "/"), nil
	}
	_, port, err := net.SplitHostPort(o.State.ListenAddress)
	if err != nil {
		return "", fmt.Errorf("failed to read the port of --state-server-bind-address %q: %w", o.State.ListenAddress, err)
	}
	return "https://" + o.serviceName() + "." + o.Namespace + ".svc:" + port, nil
}

// artifactServerURL is where runners reach the artifact server.
func (o Options) artifactServerURL() (string, error) {
	a := o.Artifact
	if a.BaseURL == "" && o.serviceName() != artifactserver.DefaultServiceName {
		_, port, err := net.SplitHostPort(a.ListenAddress)
		if err != nil {
			return "", fmt.Errorf("failed to read the port of --artifact-bind-address %q: %w", a.ListenAddress, err)
		}
		a.BaseURL = "https://" + o.serviceName() + "." + o.Namespace + ".svc:" + port
	}
	return a.AdvertisedBaseURL(o.Namespace)
}

// serviceName is ServiceName, or the default Service's.
func (o Options) serviceName() string {
	if o.ServiceName != "" {
		return o.ServiceName
	}
	return artifactserver.DefaultServiceName
}

// DefaultOptions returns the options for an in-cluster controller.
func DefaultOptions() Options {
	ns := os.Getenv("POD_NAMESPACE")
	if ns == "" {
		ns = "terrace-system"
	}
	o := Options{
		Namespace:              ns,
		MetricsAddr:            ":8443",
		MetricsSecure:          true,
		HealthAddr:             ":8081",
		LeaderElection:         true,
		CASecretName:           "terrace-ca",
		ServiceName:            artifactserver.DefaultServiceName,
		ServerIPs:              []string{"127.0.0.1"},
		Image:                  version.ImageReference(),
		SyncPeriod:             10 * time.Hour,
		MaxConcurrentRuns:      4,
		MaxRunTimeout:          DefaultMaxRunTimeout,
		Notifications:          true,
		NotificationsConfigMap: notify.DefaultConfigMapName,
		NotificationsSecret:    notify.DefaultSecretName,
		WebhookAddr:            webhook.DefaultListenAddress,
		Artifact:               artifactserver.ServerOptions{ListenAddress: artifactserver.DefaultListenAddress, CacheBytes: artifactserver.DefaultCacheBytes},
		State:                  httpbackend.DefaultOptions(),
	}
	o.SourceArtifactHosts = DefaultSourceArtifactHosts()
	return o
}

// DefaultSourceArtifactHosts are the names of Flux source-controller's
// Service, which advertises artifact URLs under them.
func DefaultSourceArtifactHosts() []string {
	return []string{"source-controller.flux-system.svc.cluster.local", "source-controller.flux-system.svc"}
}

// ServingDNSNames are the DNS names of the serving certificate: the
// explicit ServerDNSNames, else those of the Service in front of the
// controller in Namespace — decided after flags are parsed, so that
// --namespace and the advertised URLs always agree with the certificate.
func (o Options) ServingDNSNames() []string {
	if len(o.ServerDNSNames) > 0 {
		return o.ServerDNSNames
	}
	svc := o.serviceName()
	return []string{svc, svc + "." + o.Namespace, svc + "." + o.Namespace + ".svc", "localhost"}
}

// BindFlags binds the options to fs.
func (o *Options) BindFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.Namespace, "namespace", o.Namespace, "namespace the operator runs in (its CA Secret, default TerraceConfig and leader lease)")
	fs.StringVar(&o.MetricsAddr, "metrics-addr", o.MetricsAddr, "address of the Prometheus metrics endpoint (HTTPS); 0 disables it")
	fs.BoolVar(&o.MetricsSecure, "metrics-secure", o.MetricsSecure, "serve metrics over HTTPS, only to callers whose bearer token the Kubernetes API accepts and who may get the non-resource URL /metrics (ClusterRole "+MetricsReaderRole+"); false serves plain HTTP to anyone: only for a controller outside a cluster on a loopback address")
	fs.StringVar(&o.HealthAddr, "health-addr", o.HealthAddr, "address of the /healthz and /readyz endpoints")
	fs.StringVar(&o.PprofAddr, "pprof-addr", o.PprofAddr, "address of Go's /debug/pprof profiles, e.g. 127.0.0.1:6060; empty serves none")
	fs.BoolVar(&o.LeaderElection, "leader-elect", o.LeaderElection, "run reconcilers on the elected leader only (servers run on every replica)")
	fs.DurationVar(&o.LeaderElectionTiming.LeaseDuration, "leader-elect-lease-duration", o.LeaderElectionTiming.LeaseDuration, "how long a replica waits after the leader's last renewal before taking the lease (0: 15s); how long a dead leader's work waits")
	fs.DurationVar(&o.LeaderElectionTiming.RenewDeadline, "leader-elect-renew-deadline", o.LeaderElectionTiming.RenewDeadline, "how long the leader keeps trying to renew before it gives up leading (0: 10s); below the lease duration")
	fs.DurationVar(&o.LeaderElectionTiming.RetryPeriod, "leader-elect-retry-period", o.LeaderElectionTiming.RetryPeriod, "how often replicas try to take or renew the lease (0: 2s)")
	fs.BoolVar(&o.AllowCrossNamespaceRefs, "allow-cross-namespace-refs", o.AllowCrossNamespaceRefs, "allow Stacks to reference sources and Stacks in other namespaces")
	fs.StringSliceVar(&o.SourceArtifactHosts, "source-artifact-hosts", o.SourceArtifactHosts, "hosts (host or host:port) the controller may download Flux artifacts from; a Flux source whose status.artifact.url names another host is refused before connecting")
	fs.StringVar(&o.CASecretName, "ca-secret", o.CASecretName, "name of the Secret, in --namespace, holding the controller CA")
	fs.StringSliceVar(&o.ServerDNSNames, "server-dns-names", o.ServerDNSNames, "DNS names in the artifact and state servers' certificate (default: the Service terrace-controller's names in --namespace, and localhost)")
	fs.StringSliceVar(&o.ServerIPs, "server-ips", o.ServerIPs, "IP addresses in the artifact and state servers' certificate")
	fs.StringVar(&o.Image, "image", o.Image, "the controller's own image, which the Installations API servers run (no TerraceConfig can change it)")
	fs.StringVar(&o.RunnerImage, "runner-image", o.RunnerImage, "runner image used when no TerraceConfig names one (default: --image)")
	fs.DurationVar(&o.SyncPeriod, "sync-period", o.SyncPeriod, "longest time between full resyncs of the cache")
	fs.StringVar(&o.RunnerProviderMirror, "runner-provider-mirror", o.RunnerProviderMirror, "directory in runner pods that providers are installed from, exclusively")
	fs.IntVar(&o.MaxConcurrentRuns, "max-concurrent-runs", o.MaxConcurrentRuns, "how many Stacks may run at once, across all namespaces (also the Stack controller's workers)")
	fs.IntVar(&o.MaxRunsPerNamespace, "max-runs-per-namespace", o.MaxRunsPerNamespace, "how many Stacks of one namespace may run at once; more wait (RunQueued) and freed slots go to namespaces with waiting runs in turn (0: one less than --max-concurrent-runs, at least 1)")
	fs.DurationVar(&o.MaxRunTimeout, "max-run-timeout", o.MaxRunTimeout, "the longest spec.timeout a Stack may set: a Stack above it is refused (Stalled, RunTimeoutTooLong) and a destroy run is cut to it; 0 sets no limit")
	fs.StringSliceVar(&o.WatchNamespaces, "watch-namespaces", o.WatchNamespaces, "the only namespaces the controller watches and acts in (the namespaced install mode, with the controller's rights bound in these namespaces only); --namespace is always added; empty: every namespace. kube-system, kube-public and kube-node-lease are refused")
	fs.StringVar(&o.WatchLabelSelector, "watch-label-selector", o.WatchLabelSelector, "run as one shard of several, as Flux's controllers shard: reconcile only the Stacks, Programs and TerraceConfigs whose labels match this selector, e.g. 'sharding.fluxcd.io/key=shard1', and '!sharding.fluxcd.io/key' for the main controller of the unlabelled ones (docs/sharding.md); empty: every one")
	fs.StringVar(&o.ServiceName, "service-name", o.ServiceName, "the Service, in --namespace, in front of this controller's pods: runners reach the artifact and state servers there unless --artifact-base-url or --state-server-advertised-url say otherwise, and the serving certificate names it")
	fs.StringSliceVar(&o.PostgresAllowedHosts, "postgres-allowed-hosts", o.PostgresAllowedHosts, "PostgreSQL servers (host, host:port, or a unix socket directory) a namespace's TerraceConfig may name, besides the TCP server of the operator namespace's config; unix sockets only when listed")
	fs.StringVar(&o.EventsAddress, "events-address", o.EventsAddress, "a Flux notification-controller's event endpoint, e.g. http://notification-controller.flux-system.svc.cluster.local./: every Stack event is also posted there in Flux's event format; empty posts nowhere")
	fs.BoolVar(&o.Notifications, "notifications", o.Notifications, "send notifications (Slack, Teams, webhooks) that Stacks subscribe to by annotation, with the services, triggers and templates of --notifications-configmap")
	fs.StringVar(&o.NotificationsConfigMap, "notifications-configmap", o.NotificationsConfigMap, "ConfigMap, in --namespace, of the notification services, triggers, templates and subscriptions")
	fs.StringVar(&o.NotificationsSecret, "notifications-secret", o.NotificationsSecret, "Secret, in --namespace, of the notification services' credentials ($key in the ConfigMap)")
	fs.StringVar(&o.WebhookAddr, "webhook-bind-address", o.WebhookAddr, "address of the receiver of the forges' push and pull-request webhooks (POST /hooks/{namespace}, plain HTTP: put TLS at an Ingress); 0 serves none")
	o.Artifact.BindFlags(fs)
	o.State.BindFlags(fs)
}

// LocalOptions are the options of a controller running outside the cluster
// next to its runners, as `terrace dev` and the end-to-end tests run it: no
// leader election, no metrics or health ports, and side servers on the given
// addresses (IP:port; the IPs go into their certificate) that runner pods
// reach directly, such as the host's end of the dev node's link.
func LocalOptions(namespace, artifactAddr, stateAddr string) Options {
	o := DefaultOptions()
	o.Namespace = namespace
	o.MetricsAddr, o.HealthAddr, o.WebhookAddr = "0", "0", "0"
	o.LeaderElection = false
	o.ServerIPs = nil
	for _, addr := range []string{artifactAddr, stateAddr} {
		if host, _, err := net.SplitHostPort(addr); err == nil && !slices.Contains(o.ServerIPs, host) {
			o.ServerIPs = append(o.ServerIPs, host)
		}
	}
	o.Image = "ghcr.io/terrace-dev/terrace:dev"
	o.Artifact.ListenAddress, o.Artifact.BaseURL = artifactAddr, "https://"+artifactAddr
	o.State.ListenAddress, o.State.AdvertisedURL = stateAddr, "https://"+stateAddr
	return o
}

// maxStateBytes is the state server's limit, as NewServer defaults it.
func (o Options) maxStateBytes() int64 {
	if o.State.MaxStateBytes <= 0 {
		return httpbackend.DefaultMaxStateBytes
	}
	return o.State.MaxStateBytes
}

// LeaderElectionTiming is the leader lease's timing (the flags
// --leader-elect-lease-duration, -renew-deadline, -retry-period, as Flux's
// controllers have). Zero fields keep controller-runtime's defaults.
type LeaderElectionTiming struct {
	LeaseDuration time.Duration
	RenewDeadline time.Duration
	RetryPeriod   time.Duration
}

// apply sets the non-zero fields on the manager's options.
func (l LeaderElectionTiming) apply(o *ctrl.Options) {
	for _, f := range []struct {
		d   time.Duration
		set **time.Duration
	}{{l.LeaseDuration, &o.LeaseDuration}, {l.RenewDeadline, &o.RenewDeadline}, {l.RetryPeriod, &o.RetryPeriod}} {
		if f.d > 0 {
			*f.set = &f.d
		}
	}
}
