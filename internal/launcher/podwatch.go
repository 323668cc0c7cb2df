package launcher

import (
	"context"
	"errors"
	"fmt"
	"sync"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// byStackIndex indexes runner pods by "namespace/stack-label".
const byStackIndex = "terrace.dev/stack"

// podWatch is the launcher's one informer on runner pods, shared by every
// run: a run costs no List and no watch of its own, and Cleanup and
// ActiveRuns read the cache instead of listing by label selector, which
// would grow with the namespace. It starts with the first use. Restricted
// to namespaces (the controller's --watch-namespaces), it is one informer
// per namespace, so no List or watch is ever made cluster-wide.
type podWatch struct {
	client     kubernetes.Interface
	namespaces []string // empty: every namespace

	once      sync.Once
	informers map[string]cache.SharedIndexInformer // by namespace; metav1.NamespaceAll when every namespace
	cancel    context.CancelFunc
	done      chan struct{}

	mu   sync.Mutex
	runs map[string]*Run // namespace/pod name → the run that owns the pod
}

func newPodWatch(client kubernetes.Interface, namespaces []string) *podWatch {
	return &podWatch{client: client, namespaces: namespaces, runs: map[string]*Run{}, done: make(chan struct{})}
}

// runnerPodSelector matches every runner pod Terrace makes, in any namespace.
func runnerPodSelector() string {
	return labels.SelectorFromSet(labels.Set{LabelManagedBy: ManagedByTerrace, LabelComponent: ComponentRunner}).String()
}

// start starts the informers once.
func (w *podWatch) start() {
	w.once.Do(func() {
		namespaces := w.namespaces
		if len(namespaces) == 0 {
			namespaces = []string{metav1.NamespaceAll}
		}
		w.informers = make(map[string]cache.SharedIndexInformer, len(namespaces))
		for _, ns := range namespaces {
			factory := informers.NewSharedInformerFactoryWithOptions(w.client, 0,
				informers.WithNamespace(ns),
				informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = runnerPodSelector() }),
				informers.WithTransform(stripManagedFields))
			informer := factory.Core().V1().Pods().Informer()
			if err := informer.AddIndexers(cache.Indexers{byStackIndex: indexByStack}); err != nil {
				panic("launcher: cannot index runner pods: " + err.Error()) // only fails once started
			}
			_, _ = informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
				AddFunc:    func(obj any) { w.dispatch(asPod(obj), false) },
				UpdateFunc: func(_, obj any) { w.dispatch(asPod(obj), false) },
				DeleteFunc: func(obj any) { w.dispatch(asPod(obj), true) },
			})
			w.informers[ns] = informer
		}
		ctx, cancel := context.WithCancel(context.Background())
		w.mu.Lock()
		w.cancel = cancel
		w.mu.Unlock()
		var running sync.WaitGroup
		for _, informer := range w.informers {
			running.Go(func() { informer.RunWithContext(ctx) })
		}
		go func() {
			running.Wait()
			close(w.done)
		}()
	})
}

// informerFor is the informer holding namespace's runner pods.
func (w *podWatch) informerFor(namespace string) (cache.SharedIndexInformer, error) {
	w.start()
	if all, ok := w.informers[metav1.NamespaceAll]; ok {
		return all, nil
	}
	if informer, ok := w.informers[namespace]; ok {
		return informer, nil
	}
	return nil, fmt.Errorf("namespace %s is not one the controller watches (--watch-namespaces)", namespace)
}

// stop ends the informers, if they started.
func (w *podWatch) stop() {
	w.mu.Lock()
	cancel := w.cancel
	w.mu.Unlock()
	if cancel != nil {
		cancel()
		<-w.done
	}
}

// stripManagedFields keeps the cache small: the launcher never reads them.
func stripManagedFields(obj any) (any, error) {
	if pod, ok := obj.(*corev1.Pod); ok {
		pod.ManagedFields = nil
	}
	return obj, nil
}

func indexByStack(obj any) ([]string, error) {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return nil, nil
	}
	return []string{pod.Namespace + "/" + pod.Labels[LabelStack]}, nil
}

// register routes the pod's events to run and replays what the cache
// already holds of it (the pod may have been seen before Create returned).
func (w *podWatch) register(run *Run) {
	w.start()
	key := run.pod.String()
	w.mu.Lock()
	w.runs[key] = run
	w.mu.Unlock()
	informer, err := w.informerFor(run.pod.Namespace)
	if err != nil {
		return // no pod of it can be seen; creating one there is refused first
	}
	if obj, exists, _ := informer.GetStore().GetByKey(key); exists {
		run.observe(asPod(obj), false)
	}
}

// replace routes the pod's events from a warm run to the run that claimed
// it, and replays the pod's latest state to it.
func (w *podWatch) replace(warm, claimed *Run) {
	key := claimed.pod.String()
	w.mu.Lock()
	if w.runs[key] == warm {
		w.runs[key] = claimed
	}
	w.mu.Unlock()
	warm.cancel(errClaimed)
	var obj any
	exists := false
	if informer, err := w.informerFor(claimed.pod.Namespace); err == nil {
		obj, exists, _ = informer.GetStore().GetByKey(key)
	}
	if !exists {
		claimed.observe(nil, true)
		return
	}
	claimed.observe(asPod(obj), false)
}

func (w *podWatch) unregister(run *Run) {
	key := run.pod.String()
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.runs[key] == run {
		delete(w.runs, key)
	}
}

func (w *podWatch) dispatch(pod *corev1.Pod, deleted bool) {
	if pod == nil {
		return
	}
	w.mu.Lock()
	run := w.runs[pod.Namespace+"/"+pod.Name]
	w.mu.Unlock()
	if run != nil {
		run.observe(pod, deleted)
	}
}

// synced waits until the cache holds every runner pod that existed when
// the informers started.
func (w *podWatch) synced(ctx context.Context) error {
	w.start()
	hasSynced := make([]cache.InformerSynced, 0, len(w.informers))
	for _, informer := range w.informers {
		hasSynced = append(hasSynced, informer.HasSynced)
	}
	if !cache.WaitForCacheSync(ctx.Done(), hasSynced...) {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("failed to read the runner pods: %w", err)
		}
		return errors.New("failed to read the runner pods: the watch stopped")
	}
	return nil
}

// stackPods are the cached runner pods of a Stack (copies are not made:
// callers must not modify them).
func (w *podWatch) stackPods(ctx context.Context, namespace, stack string) ([]*corev1.Pod, error) {
	if err := w.synced(ctx); err != nil {
		return nil, err
	}
	informer, err := w.informerFor(namespace)
	if err != nil {
		return nil, fmt.Errorf("failed to read the runner pods of Stack %s/%s: %w", namespace, stack, err)
	}
	objs, err := informer.GetIndexer().ByIndex(byStackIndex, namespace+"/"+StackLabelValue(stack))
	if err != nil {
		return nil, fmt.Errorf("failed to read the runner pods of Stack %s/%s: %w", namespace, stack, err)
	}
	return podsOf(objs), nil
}

// namespacePods are the cached runner pods of a namespace.
func (w *podWatch) namespacePods(ctx context.Context, namespace string) ([]*corev1.Pod, error) {
	if err := w.synced(ctx); err != nil {
		return nil, err
	}
	if namespace == "" {
		var all []*corev1.Pod
		for _, informer := range w.informers {
			all = append(all, podsOf(informer.GetStore().List())...)
		}
		return all, nil
	}
	informer, err := w.informerFor(namespace)
	if err != nil {
		return nil, fmt.Errorf("failed to read the runner pods of namespace %s: %w", namespace, err)
	}
	objs, err := informer.GetIndexer().ByIndex(cache.NamespaceIndex, namespace)
	if err != nil {
		return nil, fmt.Errorf("failed to read the runner pods of namespace %s: %w", namespace, err)
	}
	return podsOf(objs), nil
}

func podsOf(objs []any) []*corev1.Pod {
	pods := make([]*corev1.Pod, 0, len(objs))
	for _, o := range objs {
		if pod, ok := o.(*corev1.Pod); ok {
			pods = append(pods, pod)
		}
	}
	return pods
}
