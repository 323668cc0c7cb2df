// Package devnode is a small kubelet and scheduler for Terrace's own pods.
// It registers a Ready Node, binds pending pods to it, pulls each
// container's image from its registry, unpacks it once per digest, and runs
// the image's entrypoint as a process (launch.go), each pod on its own
// loopback address, so that the controller's production code path (pods,
// Secrets, probes, pod IPs, exit codes) runs unchanged without Docker.
// docs/dev-cluster.md describes the contract a pod's process sees.
package devnode

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"reflect"
	"sync"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"

	"github.com/terrace-dev/terrace/internal/scheme"
)

// Options configure a devnode.
type Options struct {
	// NodeName is the Node's name; "devnode" when empty.
	NodeName string
	// Binary, when set, opts in to running containers of the image
	// repositories in Images with this local terrace binary instead of
	// pulling their image: quick for unit tests, but it skips the image.
	Binary string
	// Images are the repositories mapped to Binary: a repository, or
	// "*/name" for any repository ending in "/name". DefaultImages when
	// empty and Binary is set.
	Images []string
	// ImageDir keeps pulled images unpacked by digest
	// (<ImageDir>/sha256-<hex>/rootfs); Dir/images when empty. It may be
	// shared by nodes and outlive them.
	ImageDir string
	// RegistryRewrites pulls the images of a registry (key, such as
	// "ghcr.io") from another (value, such as "127.0.0.1:5000"), same
	// repository and tag, without falling back: the dev cluster's loopback
	// registry stands in for the published one.
	RegistryRewrites map[string]string
	// Dir holds pod directories (pods/<uid>) and logs
	// (logs/<namespace>_<pod>_<uid>/<container>/<restart>.log). Required.
	Dir string
	// PodSubnet is the loopback range pod addresses come from, such as
	// "127.0.0.0/24"; a random 127.x.y.0/24 when empty.
	PodSubnet string
	// Env is added to every container's environment before the pod's own
	// variables (for example TERRACE_TOFU, or PATH with tofu on it).
	Env []corev1.EnvVar
	// ServingCertPEM and ServingKeyPEM, with ClientCAPEM, start the log
	// server the API server calls for `kubectl logs`; it accepts only client
	// certificates signed by ClientCAPEM. No log server when unset.
	ServingCertPEM, ServingKeyPEM, ClientCAPEM []byte
	// ShutdownGrace caps each pod's grace period when devnode stops; 10 s
	// when zero.
	ShutdownGrace time.Duration
	// Log receives devnode's own messages; discarded when unset.
	Log logr.Logger
}

// Node is a running devnode.
type Node struct {
	opts   Options
	client kubernetes.Interface
	log    logr.Logger
	ips    *ipPool

	apiURL, apiHost, apiPort string
	path                     string // PATH for host-binary pods: the binary's directory first
	images                   *imageStore

	mu      sync.Mutex
	workers map[types.UID]*podWorker
	// finished remembers pods whose worker ended, so that a late event for
	// a pod being removed does not start it again.
	finished map[types.UID]time.Time
	wg       sync.WaitGroup

	logPort int
	ready   chan struct{}
}

// New checks the options and prepares a Node for cfg's cluster.
func New(cfg *rest.Config, opts Options) (*Node, error) {
	if opts.NodeName == "" {
		opts.NodeName = "devnode"
	}
	if len(opts.Images) == 0 && opts.Binary != "" {
		opts.Images = DefaultImages
	}
	if opts.ImageDir == "" {
		opts.ImageDir = filepath.Join(opts.Dir, "images")
	}
	if opts.ShutdownGrace == 0 {
		opts.ShutdownGrace = 10 * time.Second
	}
	if opts.Log.GetSink() == nil {
		opts.Log = logr.Discard()
	}
	if opts.Dir == "" {
		return nil, errors.New("devnode needs a directory for pods and logs")
	}
	path := os.Getenv("PATH")
	if opts.Binary != "" {
		bin, err := filepath.Abs(opts.Binary)
		if err != nil {
			return nil, fmt.Errorf("failed to resolve terrace binary: %w", err)
		}
		if info, err := os.Stat(bin); err != nil || info.IsDir() {
			return nil, fmt.Errorf("terrace binary %q is missing: build it with `make build`", opts.Binary)
		}
		opts.Binary = bin
		path = filepath.Dir(bin) + string(os.PathListSeparator) + path
	}
	ips, err := newIPPool(opts.PodSubnet)
	if err != nil {
		return nil, err
	}
	u, err := url.Parse(cfg.Host)
	if err != nil || u.Host == "" {
		return nil, fmt.Errorf("failed to parse API server address %q", cfg.Host)
	}
	host, port, err := net.SplitHostPort(u.Host)
	if err != nil {
		host, port = u.Host, "443"
	}
	client, err := kubernetes.NewForConfig(scheme.Protobuf(cfg))
	if err != nil {
		return nil, fmt.Errorf("failed to create clientset: %w", err)
	}
	return &Node{
		opts:     opts,
		client:   client,
		log:      opts.Log.WithValues("node", opts.NodeName),
		ips:      ips,
		apiURL:   "https://" + u.Host,
		apiHost:  host,
		apiPort:  port,
		path:     path,
		images:   newImageStore(opts.ImageDir, opts.RegistryRewrites),
		workers:  map[types.UID]*podWorker{},
		finished: map[types.UID]time.Time{},
		ready:    make(chan struct{}),
	}, nil
}

// runsHostBinary reports whether c runs the local terrace binary (opt-in)
// rather than its pulled image.
func (n *Node) runsHostBinary(c *corev1.Container) bool {
	return n.opts.Binary != "" && imageMatches(c.Image, n.opts.Images)
}

// Name is the Node's name.
func (n *Node) Name() string { return n.opts.NodeName }

// PodSubnet is the loopback range pods get their addresses from.
func (n *Node) PodSubnet() string { return n.ips.prefix.String() }

// Ready is closed once the Node is registered and pods are being watched.
func (n *Node) Ready() <-chan struct{} { return n.ready }

// Pids lists the process ids of the containers running now.
func (n *Node) Pids() []int {
	n.mu.Lock()
	workers := make([]*podWorker, 0, len(n.workers))
	for _, w := range n.workers {
		workers = append(workers, w)
	}
	n.mu.Unlock()
	var pids []int
	for _, w := range workers {
		w.mu.Lock()
		for _, c := range append(append([]*containerState(nil), w.state.initContainers...), w.state.containers...) {
			if c.runningSince != nil {
				pids = append(pids, c.pid)
			}
		}
		w.mu.Unlock()
	}
	return pids
}

// Run registers the Node, schedules and runs pods until ctx ends, then
// stops every pod's processes (SIGTERM, SIGKILL after the grace period,
// capped by ShutdownGrace) before returning.
func (n *Node) Run(ctx context.Context) error {
	if err := os.MkdirAll(n.opts.Dir, 0o755); err != nil {
		return fmt.Errorf("failed to create %s: %w", n.opts.Dir, err)
	}
	var stopLogs func()
	if len(n.opts.ServingCertPEM) > 0 {
		var err error
		if stopLogs, err = n.serveLogs(); err != nil {
			return err
		}
		defer stopLogs()
	}
	go n.images.prune()
	if err := n.register(ctx); err != nil {
		return err
	}

	queue := workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[types.NamespacedName]())
	defer queue.ShutDown()
	own := informers.NewSharedInformerFactoryWithOptions(n.client, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", n.opts.NodeName).String()
	}))
	pending := informers.NewSharedInformerFactoryWithOptions(n.client, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.FieldSelector = "spec.nodeName=,status.phase!=Succeeded,status.phase!=Failed"
	}))
	if _, err := own.Core().V1().Pods().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { n.podChanged(ctx, obj) },
		UpdateFunc: func(_, obj any) { n.podChanged(ctx, obj) },
		DeleteFunc: n.podDeleted,
	}); err != nil {
		return fmt.Errorf("failed to watch pods: %w", err)
	}
	enqueue := func(obj any) {
		if pod, ok := obj.(*corev1.Pod); ok {
			queue.Add(types.NamespacedName{Namespace: pod.Namespace, Name: pod.Name})
		}
	}
	if _, err := pending.Core().V1().Pods().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    enqueue,
		UpdateFunc: func(_, obj any) { enqueue(obj) },
	}); err != nil {
		return fmt.Errorf("failed to watch pending pods: %w", err)
	}
	own.Start(ctx.Done())
	pending.Start(ctx.Done())
	for _, synced := range []map[reflect.Type]bool{own.WaitForCacheSync(ctx.Done()), pending.WaitForCacheSync(ctx.Done())} {
		for _, ok := range synced {
			if !ok && ctx.Err() == nil {
				return errors.New("failed to sync the pod caches")
			}
		}
	}

	var background sync.WaitGroup
	background.Add(2)
	go func() { defer background.Done(); n.heartbeat(ctx) }()
	go func() { defer background.Done(); n.schedule(ctx, queue, pending.Core().V1().Pods().Lister()) }()
	close(n.ready)
	n.log.Info("node ready", "podSubnet", n.PodSubnet())

	<-ctx.Done()
	queue.ShutDown()
	n.shutdown()
	own.Shutdown()
	pending.Shutdown()
	background.Wait()
	return nil
}

// shutdown stops every pod's processes and waits for the workers.
func (n *Node) shutdown() {
	deadline := time.Now().Add(n.opts.ShutdownGrace)
	n.mu.Lock()
	for _, w := range n.workers {
		pod := w.latest()
		d := time.Now().Add(terminationGrace(pod))
		if d.After(deadline) {
			d = deadline
		}
		w.stop(d, false)
	}
	n.mu.Unlock()
	n.wg.Wait()
}

func (n *Node) podChanged(ctx context.Context, obj any) {
	pod, ok := obj.(*corev1.Pod)
	if !ok || ctx.Err() != nil {
		return
	}
	n.mu.Lock()
	if _, done := n.finished[pod.UID]; done {
		n.mu.Unlock()
		return
	}
	w, ok := n.workers[pod.UID]
	if !ok {
		w = newPodWorker(n, pod)
		n.workers[pod.UID] = w
		n.wg.Add(1)
		go func() {
			defer n.wg.Done()
			w.run(ctx)
			n.mu.Lock()
			delete(n.workers, w.uid)
			for uid, at := range n.finished {
				if time.Since(at) > 10*time.Minute {
					delete(n.finished, uid)
				}
			}
			n.finished[w.uid] = time.Now()
			n.mu.Unlock()
		}()
	}
	n.mu.Unlock()
	w.observe(pod)
}

func (n *Node) podDeleted(obj any) {
	if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = tomb.Obj
	}
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return
	}
	n.mu.Lock()
	w := n.workers[pod.UID]
	delete(n.finished, pod.UID)
	n.mu.Unlock()
	if w != nil {
		// Gone from the API (force-deleted): stop at once.
		w.forget()
	}
}

// worker finds the running worker of a pod by name.
func (n *Node) worker(namespace, name string) *podWorker {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, w := range n.workers {
		if w.key == namespace+"/"+name {
			return w
		}
	}
	return nil
}

// schedule binds pending pods that devnode can take to this Node.
func (n *Node) schedule(ctx context.Context, queue workqueue.TypedRateLimitingInterface[types.NamespacedName], lister corelisters.PodLister) {
	for {
		key, shutdown := queue.Get()
		if shutdown {
			return
		}
		err := n.bind(ctx, key, lister)
		if err != nil && ctx.Err() == nil {
			n.log.Info("failed to bind pod, retrying", "pod", key.String(), "error", err.Error())
			queue.AddRateLimited(key)
		} else {
			queue.Forget(key)
		}
		queue.Done(key)
	}
}

func (n *Node) bind(ctx context.Context, key types.NamespacedName, lister corelisters.PodLister) error {
	pod, err := lister.Pods(key.Namespace).Get(key.Name)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	if pod.Spec.NodeName != "" || pod.DeletionTimestamp != nil ||
		(pod.Spec.SchedulerName != "" && pod.Spec.SchedulerName != corev1.DefaultSchedulerName) {
		return nil
	}
	for k, v := range pod.Spec.NodeSelector {
		if n.labels()[k] != v {
			return nil // meant for another node
		}
	}
	err = n.client.CoreV1().Pods(pod.Namespace).Bind(ctx, &corev1.Binding{
		ObjectMeta: metav1.ObjectMeta{Name: pod.Name, UID: pod.UID},
		Target:     corev1.ObjectReference{Kind: "Node", Name: n.opts.NodeName},
	}, metav1.CreateOptions{})
	if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
		return nil // bound by someone else, or gone
	}
	if err != nil {
		return fmt.Errorf("failed to bind: %w", err)
	}
	n.log.V(1).Info("bound pod", "pod", key.String())
	return nil
}
