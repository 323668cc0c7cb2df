package stack

import (
	"context"
	"sync"

	"sigs.k8s.io/controller-runtime/pkg/client"
)

// suiteHooks let one test act on one Stack's status patches and runners,
// keyed by namespace/name, and count what the suite's runners saw.
type suiteHooks struct {
	mu          sync.Mutex
	statusPatch map[string]func(client.Object) error
	started     map[string]func()
	cleanups    map[string]int
	open        map[string]map[*processSession]bool
	// closedIdle says, per Stack and in order, whether each closed
	// runner had been marked idle.
	closedIdle map[string][]bool
}

// onStatusPatch calls f before each status patch of the Stack; an error
// from f fails the patch. Set nil to remove it.
func (h *suiteHooks) onStatusPatch(namespace, name string, f func(client.Object) error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.statusPatch == nil {
		h.statusPatch = map[string]func(client.Object) error{}
	}
	h.statusPatch[namespace+"/"+name] = f
}

// onRunnerStarted calls f when a run of the Stack has started its runner.
func (h *suiteHooks) onRunnerStarted(namespace, name string, f func()) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.started == nil {
		h.started = map[string]func(){}
	}
	h.started[namespace+"/"+name] = f
}

func (h *suiteHooks) statusPatching(obj client.Object) error {
	h.mu.Lock()
	f := h.statusPatch[obj.GetNamespace()+"/"+obj.GetName()]
	h.mu.Unlock()
	if f == nil {
		return nil
	}
	return f(obj)
}

func (h *suiteHooks) runnerStarted(namespace, name string) {
	h.mu.Lock()
	f := h.started[namespace+"/"+name]
	h.mu.Unlock()
	if f != nil {
		f()
	}
}

func (h *suiteHooks) cleanedUp(namespace, name string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.cleanups == nil {
		h.cleanups = map[string]int{}
	}
	h.cleanups[namespace+"/"+name]++
}

// cleanupCount is how often the Stack's runs asked to clean up earlier runs' pods.
func (h *suiteHooks) cleanupCount(namespace, name string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.cleanups[namespace+"/"+name]
}

func (h *suiteHooks) sessionOpened(s *processSession) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.open == nil {
		h.open = map[string]map[*processSession]bool{}
	}
	if h.open[s.stack] == nil {
		h.open[s.stack] = map[*processSession]bool{}
	}
	h.open[s.stack][s] = true
}

func (h *suiteHooks) sessionClosed(s *processSession) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.open[s.stack], s)
	if h.closedIdle == nil {
		h.closedIdle = map[string][]bool{}
	}
	h.closedIdle[s.stack] = append(h.closedIdle[s.stack], s.idle.Load())
}

// closedRunners says, in order, whether each closed runner of the Stack
// had been marked idle.
func (h *suiteHooks) closedRunners(namespace, name string) []bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]bool(nil), h.closedIdle[namespace+"/"+name]...)
}

// openSessions is how many of the Stack's runners are started and not closed.
func (h *suiteHooks) openSessions(namespace, name string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.open[namespace+"/"+name])
}

// hookedClient is the reconciler's client with the suite's status hooks.
type hookedClient struct{ client.Client }

func (c hookedClient) Status() client.SubResourceWriter { return hookedStatus{c.Client.Status()} }

type hookedStatus struct{ client.SubResourceWriter }

func (w hookedStatus) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
	if err := suite.hooks.statusPatching(obj); err != nil {
		return err
	}
	return w.SubResourceWriter.Patch(ctx, obj, patch, opts...)
}
