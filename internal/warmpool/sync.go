package warmpool

import (
	"context"
	"time"

	corev1 "k8s.io/api/core/v1"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/terrace-dev/terrace/internal/launcher"
)

// dropUnwanted forgets dead pods, returns reservations no run came for,
// and deletes pods of classes no longer wanted (the config dropped warm or
// changed the class, the namespace lost its Stacks or went) or too old.
func (p *Pool) dropUnwanted(ctx context.Context, wanted map[string]Want) {
	p.mu.Lock()
	var remove []*warmPod
	for key, w := range p.pods {
		if w.run == nil {
			continue // starting: judged once it is ready
		}
		if w.run.Err() != nil {
			delete(p.pods, key)
			continue
		}
		if w.reservedBy != "" && time.Since(w.reservedAt) > reservationTimeout {
			w.reservedBy = ""
		}
		_, want := wanted[w.namespace+"/"+w.class]
		if w.reservedBy == "" && (!want || time.Since(w.created) > launcher.MaxWarmAge) {
			delete(p.pods, key)
			remove = append(remove, w)
		}
	}
	p.mu.Unlock()
	for _, w := range remove {
		ctrl.LoggerFrom(ctx).Info("removing warm runner pod", "namespace", w.namespace, "pod", w.name, "class", w.class)
		if err := w.run.Close(context.WithoutCancel(ctx)); err != nil {
			ctrl.LoggerFrom(ctx).Error(err, "failed to remove warm runner pod", "pod", w.name)
		}
	}
}

// adoptOrRemove looks at the unclaimed warm pods in the cache that the pool
// does not hold (a former leader's): those of a wanted class are adopted
// while the class is short, the others deleted.
func (p *Pool) adoptOrRemove(ctx context.Context, wanted map[string]Want) {
	pods, err := p.opts.Launcher.WarmPods(ctx, "")
	if err != nil {
		ctrl.LoggerFrom(ctx).Error(err, "failed to read the warm runner pods")
		return
	}
	p.forgetTaken(pods)
	for _, pod := range pods {
		key := pod.Namespace + "/" + pod.Name
		class := pod.Labels[launcher.LabelWarmClass]
		if pod.DeletionTimestamp != nil {
			continue
		}
		p.mu.Lock()
		_, held := p.pods[key]
		if _, taken := p.taken[key]; taken {
			held = true // a run's now, whatever the cache says yet
		}
		want, wantedClass := wanted[pod.Namespace+"/"+class]
		short := wantedClass && p.countLocked(pod.Namespace, class) < want.Count
		if !held && short {
			p.pods[key] = &warmPod{namespace: pod.Namespace, class: class, name: pod.Name, created: pod.CreationTimestamp.Time}
		}
		p.mu.Unlock()
		switch {
		case held:
		case short:
			go p.adopt(ctx, key, pod)
		default:
			if err := p.opts.Launcher.DeleteWarm(ctx, pod); err != nil {
				ctrl.LoggerFrom(ctx).Error(err, "failed to remove a warm runner pod", "pod", key)
			}
		}
	}
}

// forgetTaken drops the taken pods the cache no longer shows as warm
// (claimed, or gone).
func (p *Pool) forgetTaken(warm []*corev1.Pod) {
	listed := make(map[string]bool, len(warm))
	for _, pod := range warm {
		listed[pod.Namespace+"/"+pod.Name] = true
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for key := range p.taken {
		if !listed[key] {
			delete(p.taken, key)
		}
	}
}

func (p *Pool) adopt(ctx context.Context, key string, pod *corev1.Pod) {
	startCtx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	run, err := p.opts.Launcher.AdoptWarm(startCtx, pod)
	p.settle(ctx, key, run, err)
}

// countLocked counts the pool's unreserved pods of a class, starting ones included.
func (p *Pool) countLocked(namespace, class string) int {
	n := 0
	for _, w := range p.pods {
		if w.namespace == namespace && w.class == class && w.reservedBy == "" {
			n++
		}
	}
	return n
}

// fill starts the pods a class is short of, in the background.
func (p *Pool) fill(ctx context.Context, want Want) {
	classKey := want.Namespace + "/" + want.Class
	for {
		p.mu.Lock()
		short := want.Count - p.countLocked(want.Namespace, want.Class)
		backoff := time.Since(p.failed[classKey]) < failureBackoff
		if short <= 0 || backoff || p.starting >= p.opts.MaxStarting {
			p.mu.Unlock()
			return
		}
		p.starting++
		// Held under the pod's own name from the start: a sync meanwhile
		// sees the pod in the cache as the pool's, not a former leader's
		// to adopt or delete.
		runID := launcher.NewRunID()
		key := want.Namespace + "/" + launcher.WarmPodName(runID)
		p.pods[key] = &warmPod{namespace: want.Namespace, class: want.Class, name: launcher.WarmPodName(runID), created: time.Now()}
		p.mu.Unlock()
		go p.start(ctx, key, runID, want)
	}
}

func (p *Pool) start(ctx context.Context, key, runID string, want Want) {
	startCtx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	run, err := p.opts.Launcher.StartWarm(startCtx, launcher.WarmSpec{Namespace: want.Namespace, RunID: runID, Run: want.Spec})
	p.mu.Lock()
	p.starting--
	if err != nil {
		p.failed[want.Namespace+"/"+want.Class] = time.Now()
	}
	p.mu.Unlock()
	p.settle(ctx, key, run, err)
}

// settle records a started or adopted pod under its own name, or forgets
// the placeholder of one that failed.
func (p *Pool) settle(ctx context.Context, key string, run Warm, err error) {
	p.mu.Lock()
	placeholder := p.pods[key]
	delete(p.pods, key)
	if err == nil && placeholder != nil {
		placeholder.run = run
		placeholder.name = run.Pod().Name
		p.pods[run.Pod().Namespace+"/"+run.Pod().Name] = placeholder
	}
	p.mu.Unlock()
	if err != nil {
		ctrl.LoggerFrom(ctx).Error(err, "failed to start a warm runner pod", "key", key)
		return
	}
	if placeholder == nil {
		_ = run.Close(context.WithoutCancel(ctx)) // dropped meanwhile
		return
	}
	ctrl.LoggerFrom(ctx).V(1).Info("warm runner ready", "pod", run.Pod().Namespace+"/"+run.Pod().Name, "class", placeholder.class)
	// A pod that dies while warm is replaced at once; one a run took ends
	// (claimed) while that run goes on, and is replaced when it ends.
	podKey := run.Pod().Namespace + "/" + run.Pod().Name
	go func() {
		select {
		case <-run.Done():
			if p.holds(podKey) {
				p.wake()
			}
		case <-ctx.Done():
		}
	}()
	p.wake()
}
