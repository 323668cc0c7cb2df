package notify

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/argoproj/notifications-engine/pkg/api"
	"github.com/argoproj/notifications-engine/pkg/controller"
	"github.com/argoproj/notifications-engine/pkg/services"
	"github.com/argoproj/notifications-engine/pkg/subscriptions"
	"github.com/go-logr/logr"
	"github.com/sirupsen/logrus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	coreinformers "k8s.io/client-go/informers/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
)

// The notification controller reads its ConfigMap and Secret in the
// operator's namespace (the ClusterRole terrace-controller has these rights
// everywhere; the namespaced mode binds it there too) and patches a Stack's
// annotations to remember what it has sent.
// +kubebuilder:rbac:groups="",resources=configmaps;secrets,verbs=get;list;watch
// +kubebuilder:rbac:groups=terrace.dev,resources=stacks,verbs=get;list;watch;patch

const (
	// AnnotationPrefix is the prefix of the subscription annotations,
	// notifications.terrace.dev/subscribe.<trigger>.<service>: <recipients>,
	// and of notified.notifications.terrace.dev, where the controller keeps
	// what it has sent.
	AnnotationPrefix = "notifications.terrace.dev"
	// DefaultConfigMapName holds services, triggers, templates and global
	// subscriptions, in the operator's namespace.
	DefaultConfigMapName = "terrace-notifications-cm"
	// DefaultSecretName holds the services' credentials ($key in the
	// ConfigMap), in the operator's namespace.
	DefaultSecretName = "terrace-notifications-secret"
	// resync evaluates every Stack again this often: a delivery that failed
	// is tried again then, if the trigger still holds.
	resync = 5 * time.Minute
)

// NotifierOptions configure the notification controller.
type NotifierOptions struct {
	// Namespace is the operator's: the only place services are defined.
	Namespace string
	// ConfigMapName and SecretName default to DefaultConfigMapName and
	// DefaultSecretName.
	ConfigMapName, SecretName string
	// StackNamespaces are the namespaces whose Stacks are watched; empty
	// means every namespace.
	StackNamespaces []string
	// StackSelector, when set, is a label selector the watched Stacks must
	// match: a controller shard's --watch-label-selector, so that each
	// Stack is notified about by one shard only.
	StackSelector string
	Log           logr.Logger
}

// Notifier sends notifications about Stacks with
// github.com/argoproj/notifications-engine, the way Argo CD does about
// Applications: services (Slack, Teams, webhooks...), triggers and
// templates in a ConfigMap, credentials in a Secret, both in the operator's
// namespace only; a Stack's annotations merely subscribe it to a trigger on
// one of those services. It is a manager Runnable that runs on the leader.
type Notifier struct {
	config *rest.Config
	opts   NotifierOptions
}

// NewNotifier returns the notification controller of the cluster cfg.
func NewNotifier(cfg *rest.Config, opts NotifierOptions) *Notifier {
	if opts.ConfigMapName == "" {
		opts.ConfigMapName = DefaultConfigMapName
	}
	if opts.SecretName == "" {
		opts.SecretName = DefaultSecretName
	}
	// The engine's annotation prefix and log level are process-wide; the
	// engine logs every evaluation at info level, its errors are logged
	// again through the event callback.
	subscriptions.SetAnnotationPrefix(AnnotationPrefix)
	logrus.SetLevel(logrus.WarnLevel)
	return &Notifier{config: cfg, opts: opts}
}

// stacksResource is what the engine watches and patches.
var stacksResource = terracev1.GroupVersion.WithResource("stacks")

// Start runs the controller until ctx ends.
func (n *Notifier) Start(ctx context.Context) error {
	kube, err := kubernetes.NewForConfig(n.config)
	if err != nil {
		return fmt.Errorf("failed to create the notification controller's client: %w", err)
	}
	dyn, err := dynamic.NewForConfig(n.config)
	if err != nil {
		return fmt.Errorf("failed to create the notification controller's client: %w", err)
	}
	byName := func(name string) func(*metav1.ListOptions) {
		return func(o *metav1.ListOptions) { o.FieldSelector = "metadata.name=" + name }
	}
	indexers := cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc}
	cms := coreinformers.NewFilteredConfigMapInformer(kube, n.opts.Namespace, resync, indexers, byName(n.opts.ConfigMapName))
	secrets := coreinformers.NewFilteredSecretInformer(kube, n.opts.Namespace, resync, indexers, byName(n.opts.SecretName))
	factory := api.NewFactory(api.Settings{
		ConfigMapName:    n.opts.ConfigMapName,
		SecretName:       n.opts.SecretName,
		DefaultNamespace: n.opts.Namespace,
		InitGetVars: func(cfg *api.Config, cm *corev1.ConfigMap, _ *corev1.Secret) (api.GetVars, error) {
			addDefaults(cfg, cm)
			return func(obj map[string]any, _ services.Destination) map[string]any { return stackVars(obj) }, nil
		},
	}, n.opts.Namespace, secrets, cms)

	for _, inf := range []cache.SharedIndexInformer{cms, secrets} {
		go inf.RunWithContext(ctx)
	}
	if !cache.WaitForCacheSync(ctx.Done(), cms.HasSynced, secrets.HasSynced) {
		return nil // ctx ended
	}
	// Stacks are watched only while the ConfigMap exists: without it
	// nothing can be sent, and the engine's informer would keep a second,
	// unstructured copy of every Stack for nothing.
	changed := make(chan struct{}, 1)
	poke := func(any) {
		select {
		case changed <- struct{}{}:
		default:
		}
	}
	if _, err := cms.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: poke, DeleteFunc: poke}); err != nil {
		return fmt.Errorf("failed to watch the notifications ConfigMap: %w", err)
	}
	configMapKey := n.opts.Namespace + "/" + n.opts.ConfigMapName
	var watching stackWatch
	defer watching.stop()
	if _, configured, _ := cms.GetStore().GetByKey(configMapKey); !configured {
		n.opts.Log.Info("not watching Stacks until the notifications ConfigMap exists", "configMap", configMapKey)
	}
	for {
		_, configured, _ := cms.GetStore().GetByKey(configMapKey)
		switch {
		case configured && !watching.active():
			watching = n.startStackControllers(ctx, dyn, factory)
		case !configured && watching.active():
			watching.stop()
			n.opts.Log.Info("not watching Stacks: the notifications ConfigMap is gone", "configMap", configMapKey)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-changed:
		}
	}
}

// stackWatch is the engine's controllers over the Stacks, while they run.
type stackWatch struct {
	cancel context.CancelFunc
	// running counts the informers' and controllers' goroutines.
	running *sync.WaitGroup
}

func (w *stackWatch) active() bool { return w.cancel != nil }

// stop ends the controllers and their informers and waits for them.
func (w *stackWatch) stop() {
	if w.cancel != nil {
		w.cancel()
		w.running.Wait()
		*w = stackWatch{}
	}
}

// startStackControllers watches the Stacks and runs the engine's
// controllers over them until ctx ends or the watch is stopped.
func (n *Notifier) startStackControllers(ctx context.Context, dyn dynamic.Interface, factory api.Factory) stackWatch {
	ctx, cancel := context.WithCancel(ctx)
	namespaces := n.opts.StackNamespaces
	if len(namespaces) == 0 {
		namespaces = []string{metav1.NamespaceAll}
	}
	wg := &sync.WaitGroup{}
	var informers []cache.SharedIndexInformer
	var controllers []controller.NotificationController
	for _, ns := range namespaces {
		stacks := stackInformer(dyn.Resource(stacksResource).Namespace(ns), n.opts.StackSelector)
		informers = append(informers, stacks)
		controllers = append(controllers, controller.NewController(dyn.Resource(stacksResource), stacks, factory,
			controller.WithEventCallback(n.report), controller.WithAlterDestinations(withoutUnnamedServices)))
	}
	for _, inf := range informers {
		wg.Go(func() { inf.RunWithContext(ctx) })
	}
	wg.Go(func() {
		synced := make([]cache.InformerSynced, len(informers))
		for i, inf := range informers {
			synced[i] = inf.HasSynced
		}
		if !cache.WaitForCacheSync(ctx.Done(), synced...) {
			return // ctx ended
		}
		n.opts.Log.Info("sending notifications", "configMap", n.opts.Namespace+"/"+n.opts.ConfigMapName, "secret", n.opts.Namespace+"/"+n.opts.SecretName)
		for _, c := range controllers {
			wg.Go(func() { c.Run(1, ctx.Done()) })
		}
	})
	return stackWatch{cancel: cancel, running: wg}
}

// stackInformer watches Stacks as unstructured objects, apart from the
// manager's typed cache: the engine writes the objects it patched back into
// its informer's store.
func stackInformer(stacks dynamic.ResourceInterface, selector string) cache.SharedIndexInformer {
	inf := cache.NewSharedIndexInformer(&cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.LabelSelector = selector
			return stacks.List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.LabelSelector = selector
			return stacks.Watch(ctx, o)
		},
	}, &unstructured.Unstructured{}, resync, cache.Indexers{})
	_ = inf.SetTransform(func(obj any) (any, error) {
		if u, ok := obj.(*unstructured.Unstructured); ok {
			u.SetManagedFields(nil)
		}
		return obj, nil
	})
	return inf
}

// report logs what one look at a Stack sent and what failed.
func (n *Notifier) report(seq controller.NotificationEventSequence) {
	log := n.opts.Log.WithValues("stack", seq.Key)
	for _, d := range seq.Delivered {
		if !d.AlreadyNotified {
			log.Info("notification sent", "trigger", d.Trigger, "service", d.Destination.Service, "recipient", d.Destination.Recipient)
		}
	}
	for _, err := range seq.Errors {
		log.Error(err, "notification failed")
	}
	for _, err := range seq.Warnings {
		log.Info("notification problem", "problem", err.Error())
	}
}

// withoutUnnamedServices drops destinations without a service. The engine
// (v0.5.0) reads every other annotation of a Stack as a subscription of the
// previous subscription's recipients to no service, on the default
// triggers, depending on map order; sending to it only fails.
func withoutUnnamedServices(_ metav1.Object, dests services.Destinations, _ api.Config) services.Destinations {
	out := services.Destinations{}
	for trigger, list := range dests {
		for _, d := range list {
			if d.Service != "" {
				out[trigger] = append(out[trigger], d)
			}
		}
	}
	return out
}
