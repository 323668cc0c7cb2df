package launcher

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/terrace-dev/terrace/internal/pki"
	"github.com/terrace-dev/terrace/internal/runner"
)

// Run is one started runner. Close it when the run ends.
type Run struct {
	launcher *Launcher
	spec     RunSpec
	key      string
	pod      types.NamespacedName
	uid      types.UID
	secret   string
	identity pki.Identity
	ctx      context.Context
	cancel   context.CancelCauseFunc
	// runningCh is closed once the runner container runs and has an IP.
	runningCh   chan struct{}
	runningOnce sync.Once

	// labelled is closed once a claimed warm pod carries the run's
	// labels, owner and deadline, with labelErr set when it could not be
	// given them; nil for a pod started for the run, labelled at creation.
	labelled chan struct{}
	labelErr error

	mu            sync.Mutex
	podIP         string
	last          *corev1.Pod // latest observed pod, for messages
	client        *runner.Client
	startDuration time.Duration

	// idle is set by MarkIdle: nothing runs in the pod, so Close removes
	// it without a grace period.
	idle atomic.Bool

	closeOnce sync.Once
	closeErr  error
}

func newRun(l *Launcher, spec RunSpec, key string, pod *corev1.Pod, secret string, identity pki.Identity, parent context.Context) *Run {
	ctx, cancel := context.WithCancelCause(parent)
	return &Run{
		launcher: l, spec: spec, key: key,
		pod:      types.NamespacedName{Namespace: pod.Namespace, Name: pod.Name},
		uid:      pod.UID,
		secret:   secret,
		identity: identity,
		ctx:      ctx, cancel: cancel,
		runningCh: make(chan struct{}),
		last:      pod,
	}
}

// ID is the run ID.
func (r *Run) ID() string { return r.spec.RunID }

// Labelled waits until the run's pod carries the run's labels, owner and
// deadline: at once for a pod started for the run, after the claim's
// relabel for a warm pod (Claim returns before it). The state server takes
// the run's certificate only from a pod labelled with the run, so nothing
// that reaches the state server (tofu init and later) may start before
// Labelled returned nil. On an error the run cannot go on: Close it.
func (r *Run) Labelled(ctx context.Context) error {
	if r.labelled == nil {
		return nil
	}
	select {
	case <-r.labelled:
		return r.labelErr
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// Identity is the runner's certificate identity (terrace://runner/ns/stack/runID).
func (r *Run) Identity() pki.Identity { return r.identity }

// Pod names the runner pod.
func (r *Run) Pod() types.NamespacedName { return r.pod }

// PodIP is the address the runner was dialled at.
func (r *Run) PodIP() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.podIP
}

// Client is the connected runner client; it stays valid until Close.
func (r *Run) Client() *runner.Client {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.client
}

// ObservedPod is a copy of the run's pod as the launcher's watch last saw
// it (its status: phase, container states, image IDs), without an API call.
func (r *Run) ObservedPod() *corev1.Pod {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.last == nil {
		return nil
	}
	return r.last.DeepCopy()
}

// StartDuration is how long Start took, from issuing the certificate to a
// runner answering over mutual TLS.
func (r *Run) StartDuration() time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.startDuration
}

// Context is a child of the ctx given to Start that is cancelled as soon as
// the runner dies, with a *TerminatedError as its context.Cause (or
// ErrClosed after Close). Use it for every call to the runner so that a
// dead runner aborts the calls at once.
func (r *Run) Context() context.Context { return r.ctx }

// Done is closed when Context() is: the runner died, the run was closed,
// or the ctx given to Start ended.
func (r *Run) Done() <-chan struct{} { return r.ctx.Done() }

// Err is nil while the run is live; afterwards why it ended: a
// *TerminatedError (errors.As) when the runner died, ErrClosed, or the
// error of the ctx given to Start.
func (r *Run) Err() error {
	if r.ctx.Err() == nil {
		return nil
	}
	return context.Cause(r.ctx)
}

// MarkIdle says that every command sent to the runner returned its result:
// no tofu runs in the pod, so Close deletes it at once (grace period 0).
// That spares the node's final status write and its delete of the pod
// object, two API writes on every run's path. A run that failed or was cut
// short does not say so: its pod gets its termination grace, in which the
// runner interrupts a tofu that may still run so that it saves its state
// and releases its lock.
func (r *Run) MarkIdle() { r.idle.Store(true) }

// Close ends the run: it stops watching, closes the connection and deletes
// the pod (its Secret, owned by it, goes with it), or, with Retain, marks the pod retained. Deleting
// the pod sends the runner SIGTERM; tofu gets its grace period to release
// the state lock, unless the run is idle (MarkIdle). Close is idempotent.
func (r *Run) Close(ctx context.Context) error {
	r.closeOnce.Do(func() {
		r.cancel(ErrClosed)
		r.launcher.pods.unregister(r)
		if c := r.Client(); c != nil {
			_ = c.Close()
		}
		if r.spec.Retain {
			r.closeErr = r.launcher.retain(ctx, r.pod.Namespace, r.spec.Stack.Name, r.pod.Name)
		} else {
			// The TLS Secret is the pod's: it goes with it.
			r.closeErr = r.launcher.deletePod(ctx, r.pod.Namespace, r.pod.Name, r.uid, r.idle.Load())
		}
		r.launcher.setActive(r.key, false)
	})
	return r.closeErr
}

// start waits until the runner's container runs, then dials it: the health
// check over mutual TLS, retried with a short backoff while the runner
// binds its port, is the readiness test, so no probe period is waited for.
func (r *Run) start(ctx context.Context, started time.Time) error {
	r.launcher.pods.register(r)
	timer := time.NewTimer(r.launcher.opts.StartTimeout - time.Since(started))
	defer timer.Stop()
	select {
	case <-r.runningCh:
	case <-r.ctx.Done():
		return r.startError(ctx)
	case <-timer.C:
		return fmt.Errorf("runner pod %s was not ready within %s: %s", r.pod, r.launcher.opts.StartTimeout, r.waitingFor())
	}

	ip := r.PodIP()
	client, err := r.launcher.dial(r.ctx, ip, r.identity, r.uid, r.deathNoticingCalls()...)
	if err != nil {
		return err
	}
	r.mu.Lock()
	r.client = client
	r.mu.Unlock()
	// A handshake refused for the wrong identity is retried until the
	// deadline, so bound it by what is left of the start timeout.
	waitCtx, cancel := context.WithTimeout(r.ctx, r.launcher.opts.StartTimeout-time.Since(started))
	defer cancel()
	if err := client.WaitReady(waitCtx); err != nil {
		if r.ctx.Err() != nil {
			return r.startError(ctx)
		}
		return fmt.Errorf("runner pod %s is running but does not answer over mutual TLS as %s at %s: %w", r.pod, r.identity, ip, err)
	}
	r.mu.Lock()
	r.startDuration = time.Since(started)
	r.mu.Unlock()
	return nil
}

// startError explains why the run ended while starting.
func (r *Run) startError(ctx context.Context) error {
	cause := context.Cause(r.ctx)
	var term *TerminatedError
	if errors.As(cause, &term) {
		return fmt.Errorf("runner pod stopped before it was ready: %w", cause)
	}
	if ctx.Err() != nil {
		return fmt.Errorf("gave up waiting for runner pod %s (%s): %w", r.pod, r.waitingFor(), context.Cause(ctx))
	}
	return cause
}

// waitingFor summarises what the pod is waiting for, from its status.
func (r *Run) waitingFor() string {
	r.mu.Lock()
	pod := r.last
	r.mu.Unlock()
	if pod == nil {
		return "no status yet"
	}
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse {
			return fmt.Sprintf("not scheduled: %s: %s", c.Reason, c.Message)
		}
	}
	for _, cs := range pod.Status.ContainerStatuses {
		if w := cs.State.Waiting; w != nil && w.Reason != "" {
			if w.Message != "" {
				return fmt.Sprintf("container %s waiting: %s: %s", cs.Name, w.Reason, w.Message)
			}
			return fmt.Sprintf("container %s waiting: %s", cs.Name, w.Reason)
		}
		if cs.State.Running != nil && !cs.Ready {
			return fmt.Sprintf("container %s running but not ready", cs.Name)
		}
	}
	if pod.Spec.NodeName == "" {
		return "not scheduled yet"
	}
	return fmt.Sprintf("phase %s", pod.Status.Phase)
}

func asPod(obj any) *corev1.Pod {
	if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = tomb.Obj
	}
	pod, _ := obj.(*corev1.Pod)
	return pod
}

// observe reacts to one state of the pod: readiness releases Start, the
// pod's end cancels the run with the reason.
func (r *Run) observe(pod *corev1.Pod, deleted bool) {
	if pod != nil && pod.UID != r.uid {
		if !deleted {
			return // another pod of the same name: ours is gone, its delete event says so
		}
		pod = nil
	}
	if pod != nil {
		r.mu.Lock()
		r.last = pod
		r.mu.Unlock()
	}
	if term := terminated(r.pod.String(), pod, deleted); term != nil {
		if r.ctx.Err() == nil {
			ctrl.LoggerFrom(r.ctx).Info("runner pod stopped", "pod", r.pod.String(), "reason", term.Reason)
		}
		r.cancel(term)
		return
	}
	if pod.Status.PodIP != "" && (containerRunning(pod) || podReady(pod)) {
		r.runningOnce.Do(func() {
			r.mu.Lock()
			r.podIP = pod.Status.PodIP
			r.mu.Unlock()
			close(r.runningCh)
		})
	}
}

// containerRunning says the runner container's process has started: it
// may not listen yet, which the dial's backoff covers.
func containerRunning(pod *corev1.Pod) bool {
	for _, cs := range pod.Status.ContainerStatuses {
		if cs.Name == containerName {
			return cs.State.Running != nil
		}
	}
	return false
}

func podReady(pod *corev1.Pod) bool {
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
