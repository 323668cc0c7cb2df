package launcher

import (
	"context"
	"fmt"
	"slices"
	"sync"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
)

// StackRuns tells the state and artifact servers (their RunChecker)
// whether a run is current; it knows runs by their runner pods, so it lives
// with them. A run is current while the Stack's status.currentRun names it (the controller records each run there
// before starting it, so an earlier run is never current again, and clears
// it once every command of the run returned) and the very runner pod its
// certificate was issued for exists, by UID, and is not retained (a
// finished run's pod is deleted; a terminating pod may still save the
// state tofu was interrupted in). A pod created again under the run's pod
// name, with its labels and a copy of its TLS Secret, has another UID:
// the run is over for good.
//
// Reads go to the caches first; when they say no, the API server decides,
// so a run that has just started is never refused for a stale cache. A run
// the API server refuses can never become current again: that answer is
// remembered, so a stale certificate cannot turn its requests into API load.
type StackRuns struct {
	// Stacks reads Stacks, usually the manager's cached client.
	Stacks client.Reader
	// Pods reads runner pod metadata, usually NewRunnerPodCache.
	Pods client.Reader
	// Live reads from the API server (the manager's API reader).
	Live client.Reader

	mu    sync.Mutex
	ended map[string]bool
}

// maxEndedRuns bounds the memory of refused runs; it starts over when full.
const maxEndedRuns = 10000

// IsCurrentRun implements RunChecker.
func (s *StackRuns) IsCurrentRun(ctx context.Context, namespace, stack, runID, podUID string) (bool, error) {
	return s.isCurrentRun(ctx, runRef{namespace: namespace, stack: stack, runID: runID, podUID: types.UID(podUID)})
}

// IsCurrentPullRequestRun implements RunChecker.
func (s *StackRuns) IsCurrentPullRequestRun(ctx context.Context, namespace, stack, runID, podUID string) (bool, error) {
	return s.isCurrentRun(ctx, runRef{namespace: namespace, stack: stack, runID: runID, podUID: types.UID(podUID), pullRequest: true})
}

func (s *StackRuns) isCurrentRun(ctx context.Context, run runRef) (bool, error) {
	namespace, stack, runID := run.namespace, run.stack, run.runID
	if run.podUID == "" {
		// A certificate bound to no pod: issued before runs were bound to
		// their pods, or not for a run at all.
		return false, nil
	}
	key := namespace + "/" + stack + "/" + runID
	if run.pullRequest {
		key += "/read-only"
	}
	s.mu.Lock()
	ended := s.ended[key]
	s.mu.Unlock()
	if ended {
		return false, nil
	}
	ok, podName, err := isCurrent(ctx, s.Stacks, s.Pods, run, "")
	if err == nil && ok {
		return true, nil
	}
	// The cache may know the pod's name and only lag behind its labels or
	// the Stack's status: the API server is then asked for that name alone.
	ok, _, err = isCurrent(ctx, s.Live, s.Live, run, podName)
	if err != nil || ok {
		return ok, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ended == nil || len(s.ended) >= maxEndedRuns {
		s.ended = map[string]bool{}
	}
	s.ended[key] = true
	return false, nil
}

// runRef is a run as its certificate names it.
type runRef struct {
	namespace, stack, runID string
	podUID                  types.UID
	// pullRequest: a read-only run, current while status.pullRequests
	// names it (status.currentRun never does).
	pullRequest bool
}

// namedBy reports whether st's status names run as current.
func (run runRef) namedBy(st *terracev1.Stack) bool {
	if !run.pullRequest {
		return st.Status.CurrentRun == run.runID
	}
	return slices.ContainsFunc(st.Status.PullRequests, func(p terracev1.PullRequestPlan) bool { return p.RunID == run.runID })
}

// isCurrent reads the Stack and, when its status names the run, the run's
// pod from stacks and pods. The pod is looked for under podName when
// given, else under both names a run's pod can have; foundPod is the name
// it was found under, also when its UID or labels say it is not the run's.
func isCurrent(ctx context.Context, stacks, pods client.Reader, run runRef, podName string) (current bool, foundPod string, err error) {
	namespace, stack, runID := run.namespace, run.stack, run.runID
	st := &terracev1.Stack{}
	if err := stacks.Get(ctx, types.NamespacedName{Namespace: namespace, Name: stack}, st); err != nil {
		if apierrors.IsNotFound(err) {
			return false, "", nil
		}
		return false, "", fmt.Errorf("failed to read Stack %s/%s: %w", namespace, stack, err)
	}
	if run.runID == "" || !run.namedBy(st) {
		return false, "", nil
	}
	pod := runnerPodMetadata()
	names := []string{podName}
	if podName == "" {
		// A run's pod is named after its Stack and run, or, when the run
		// claimed a warm pod, after the run alone.
		names = []string{PodName(stack, runID), WarmPodName(runID)}
	}
	for _, name := range names {
		err = pods.Get(ctx, types.NamespacedName{Namespace: namespace, Name: name}, pod)
		if err == nil {
			foundPod = name
			break
		}
		if !apierrors.IsNotFound(err) {
			return false, "", fmt.Errorf("failed to read the runner pod of run %s: %w", runID, err)
		}
	}
	if foundPod == "" {
		return false, "", nil
	}
	l := pod.GetLabels()
	return pod.GetUID() == run.podUID && l[LabelRun] == runID && l[LabelStack] == StackLabelValue(stack) &&
		l[LabelComponent] == ComponentRunner && pod.GetAnnotations()[AnnotationRetained] != "true", foundPod, nil
}

func runnerPodMetadata() *metav1.PartialObjectMetadata {
	pod := &metav1.PartialObjectMetadata{}
	pod.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("Pod"))
	return pod
}

// NewRunnerPodCache watches the metadata of Terrace's runner pods, and
// nothing else, in namespaces (every namespace when empty: the controller's
// --watch-namespaces). Add it to the manager (it runs on every replica) and
// pass it as StackRuns.Pods.
//
// Its one informer is registered here, so it starts and syncs with the
// cache. Left to the first read, it started under the first run after each
// controller start, whose fetch then waited about 100 ms for the sync (the
// poll period of client-go's WaitForCacheSync). A read of anything else
// fails instead of starting an informer of its own.
func NewRunnerPodCache(cfg *rest.Config, scheme *runtime.Scheme, mapper meta.RESTMapper, namespaces []string) (*RunnerPodCache, error) {
	opts := cache.Options{Scheme: scheme, Mapper: mapper, ReaderFailOnMissingInformer: true}
	if len(namespaces) > 0 {
		opts.DefaultNamespaces = map[string]cache.Config{}
		for _, ns := range namespaces {
			opts.DefaultNamespaces[ns] = cache.Config{}
		}
	}
	opts.DefaultLabelSelector = labels.SelectorFromSet(labels.Set{LabelManagedBy: ManagedByTerrace, LabelComponent: ComponentRunner})
	opts.DefaultTransform = cache.TransformStripManagedFields()
	c, err := cache.New(cfg, opts)
	if err != nil {
		return nil, fmt.Errorf("failed to create the runner pod cache: %w", err)
	}
	if _, err := c.GetInformer(context.Background(), runnerPodMetadata()); err != nil {
		return nil, fmt.Errorf("failed to create the runner pod informer: %w", err)
	}
	return &RunnerPodCache{Cache: c}, nil
}

// RunnerPodCache is a cache.Cache that runs on every replica, not only the leader.
type RunnerPodCache struct{ cache.Cache }

// NeedLeaderElection implements manager.LeaderElectionRunnable.
func (*RunnerPodCache) NeedLeaderElection() bool { return false }
