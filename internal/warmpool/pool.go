// Package warmpool keeps warm runner pods: single-use runner pods started
// ahead of demand, per namespace and runner class, as TerraceConfig
// spec.runner.warm asks. A run reserves one (its run ID is then the warm
// pod's), claims it through the launcher, and a replacement starts in the
// background: at once in a burst of runs, else once that run ends. A warm
// pod is never handed out twice: once reserved it leaves the pool for
// good, claimed or deleted.
//
// The pool is level-driven: each sync compares what is wanted (Demand)
// with the warm pods it holds and the unclaimed warm pods in the launcher's
// cache (a former leader's are adopted or removed), then starts or deletes
// pods. It syncs when a pod dies, is reserved in a burst or its run ends,
// and every Resync.
package warmpool

import (
	"context"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/terrace-dev/terrace/internal/launcher"
)

// Defaults of Options.
const (
	DefaultResync      = 10 * time.Second
	DefaultMaxStarting = 4
	// failureBackoff keeps a class whose pods fail to start (a missing
	// ServiceAccount, a namespace being deleted) from a storm of creates.
	failureBackoff = 30 * time.Second
	// reservationTimeout returns a reserved pod whose run never came for
	// it: it was never claimed, so it is as fresh as it was.
	reservationTimeout = 2 * time.Minute
	startTimeout       = 5 * time.Minute
)

// Want is the warm pods wanted for one runner class of a namespace.
type Want struct {
	Namespace string
	// Class is launcher.Class(Spec).
	Class string
	Count int
	// Spec is the RunSpec of a run of the class (Stack and RunID unset).
	Spec launcher.RunSpec
}

// Warm is a started warm pod, connected; *launcher.Run is one.
type Warm interface {
	// ID is the ID of the run that may claim it.
	ID() string
	Pod() types.NamespacedName
	// Err is non-nil once the pod died or was closed; Done is closed then.
	Err() error
	Done() <-chan struct{}
	// Close deletes the pod.
	Close(ctx context.Context) error
}

// Launcher starts, adopts and lists warm pods; Pods adapts *launcher.Launcher.
type Launcher interface {
	StartWarm(ctx context.Context, spec launcher.WarmSpec) (Warm, error)
	AdoptWarm(ctx context.Context, pod *corev1.Pod) (Warm, error)
	WarmPods(ctx context.Context, namespace string) ([]*corev1.Pod, error)
	DeleteWarm(ctx context.Context, pod *corev1.Pod) error
}

// Pods is the Launcher of a *launcher.Launcher.
type Pods struct{ *launcher.Launcher }

// StartWarm implements Launcher.
func (p Pods) StartWarm(ctx context.Context, spec launcher.WarmSpec) (Warm, error) {
	return orNil(p.Launcher.StartWarm(ctx, spec))
}

// AdoptWarm implements Launcher.
func (p Pods) AdoptWarm(ctx context.Context, pod *corev1.Pod) (Warm, error) {
	return orNil(p.Launcher.AdoptWarm(ctx, pod))
}

// orNil keeps a nil *launcher.Run from becoming a non-nil Warm.
func orNil(run *launcher.Run, err error) (Warm, error) {
	if err != nil {
		return nil, err
	}
	return run, nil
}

// Options configure a Pool.
type Options struct {
	Launcher Launcher
	// Demand returns what is wanted now; see NamespaceDemand.
	Demand func(ctx context.Context) ([]Want, error)
	// Resync is the longest time between syncs; DefaultResync by default.
	Resync time.Duration
	// MaxStarting bounds warm pods starting at once; DefaultMaxStarting by default.
	MaxStarting int
}

// Pool is the set of warm pods. It is safe for concurrent use; run it with
// Start (a manager Runnable, leader only: it creates pods).
type Pool struct {
	opts Options
	kick chan struct{}

	mu       sync.Mutex
	pods     map[string]*warmPod // namespace/pod name
	starting int
	failed   map[string]time.Time // namespace/class → last failed start
	// taken are the pods handed to runs (namespace/pod name → when): until
	// the cache shows a pod claimed it still looks warm, and must be
	// neither adopted nor removed.
	taken map[string]time.Time
	// inUse counts the pods handed out whose runs have not ended.
	inUse int
}

// warmPod is one pod of the pool: starting (run nil), ready, or reserved.
type warmPod struct {
	namespace, class, name string
	run                    Warm
	created                time.Time
	// reservedBy is the namespace/name of the Stack whose run reserved it.
	reservedBy string
	reservedAt time.Time
}

// New returns a pool; nothing starts before Start.
func New(opts Options) *Pool {
	if opts.Resync <= 0 {
		opts.Resync = DefaultResync
	}
	if opts.MaxStarting <= 0 {
		opts.MaxStarting = DefaultMaxStarting
	}
	return &Pool{opts: opts, kick: make(chan struct{}, 1), pods: map[string]*warmPod{}, failed: map[string]time.Time{}, taken: map[string]time.Time{}}
}

// NeedLeaderElection implements manager.LeaderElectionRunnable: only the
// leader starts pods.
func (*Pool) NeedLeaderElection() bool { return true }

// Start syncs until ctx ends, then deletes nothing: warm pods outlive a
// leader change, and the next leader adopts them.
func (p *Pool) Start(ctx context.Context) error {
	ticker := time.NewTicker(p.opts.Resync)
	defer ticker.Stop()
	for {
		p.sync(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-ticker.C:
		case <-p.kick:
		}
	}
}

// Sync runs one sync now (for tests and callers that cannot wait).
func (p *Pool) Sync(ctx context.Context) { p.sync(ctx) }

func (p *Pool) wake() {
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

// Reserve takes a ready warm pod of the class for the run of stack
// (namespace/name) that is about to start, and returns its run ID, which
// the run must use; "" when none is ready (the run starts a pod of its own).
func (p *Pool) Reserve(namespace, class, stack string) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, w := range p.pods {
		if w.namespace != namespace || w.class != class || w.run == nil || w.reservedBy != "" || w.run.Err() != nil {
			continue
		}
		// A lone run's replacement starts when the run ends (RunEnded) or
		// at the next sync: started now, it would take the CPU the run
		// needs. In a burst (another warm run reserved or going on), it
		// starts now, so that the runs after this one find warm pods too.
		if p.inUse > 0 || p.reservedLocked() > 0 {
			p.wake()
		}
		w.reservedBy, w.reservedAt = stack, time.Now()
		return w.run.ID()
	}
	return ""
}

// Take hands over the warm pod that stack's run runID reserved, and removes
// it from the pool; nil when there is none (it died, or the reservation
// timed out): the run then starts a pod of its own under the same ID.
func (p *Pool) Take(namespace, stack, runID string) Warm {
	p.mu.Lock()
	defer p.mu.Unlock()
	key := namespace + "/" + launcher.WarmPodName(runID)
	w := p.pods[key]
	if w == nil || w.reservedBy != stack || w.run == nil {
		return nil
	}
	delete(p.pods, key)
	p.taken[key] = time.Now()
	if w.run.Err() != nil {
		p.wake() // it died reserved: no run will end on it
		return nil
	}
	p.inUse++
	return w.run
}

// reservedLocked counts the pods reserved and not yet taken.
func (p *Pool) reservedLocked() int {
	n := 0
	for _, w := range p.pods {
		if w.reservedBy != "" {
			n++
		}
	}
	return n
}

// RunEnded tells the pool that the run on a pod it handed out (Take)
// ended, or could not claim it: the pod's replacement starts now.
func (p *Pool) RunEnded() {
	p.mu.Lock()
	p.inUse = max(p.inUse-1, 0)
	p.mu.Unlock()
	p.wake()
}

// holds says whether the pool still holds the pod at key (not taken).
func (p *Pool) holds(key string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	_, ok := p.pods[key]
	return ok
}

// Ready counts the ready, unreserved warm pods of a namespace.
func (p *Pool) Ready(namespace string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, w := range p.pods {
		if w.namespace == namespace && w.run != nil && w.reservedBy == "" && w.run.Err() == nil {
			n++
		}
	}
	return n
}

// sync brings the pool to what Demand wants.
func (p *Pool) sync(ctx context.Context) {
	log := ctrl.LoggerFrom(ctx).WithName("warmpool")
	wants, err := p.opts.Demand(ctx)
	if err != nil {
		log.Error(err, "failed to read how many warm runners are wanted")
		return
	}
	wanted := map[string]Want{}
	for _, w := range wants {
		if w.Count > 0 {
			wanted[w.Namespace+"/"+w.Class] = w
		}
	}
	p.dropUnwanted(ctx, wanted)
	p.adoptOrRemove(ctx, wanted)
	for _, w := range wants {
		p.fill(ctx, w)
	}
}
