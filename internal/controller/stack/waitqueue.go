package stack

import (
	"strings"

	"k8s.io/apimachinery/pkg/types"
)

// waitQueue is one namespace's queue of Stacks waiting for a run slot,
// first come first served, that knows each waiter's place. A fleet queues
// thousands of Stacks at once, each asking again at its recheck: finding a
// waiter by scanning the queue at every recheck was a fifth of the
// controller's CPU with 10,000 Stacks queued behind four slots.
type waitQueue struct {
	ws []slotWaiter
	// arrival numbers the waiters in the order they came: ws[i] arrived
	// as number first+i.
	first   int
	arrival map[types.NamespacedName]int
}

func newWaitQueue() *waitQueue {
	return &waitQueue{arrival: map[types.NamespacedName]int{}}
}

func (w *waitQueue) len() int { return len(w.ws) }

// place is key's index in the queue: how many wait before it.
func (w *waitQueue) place(key types.NamespacedName) (int, bool) {
	n, ok := w.arrival[key]
	return n - w.first, ok
}

// push queues key last and returns its place.
func (w *waitQueue) push(key types.NamespacedName) int {
	w.arrival[key] = w.first + len(w.ws)
	w.ws = append(w.ws, slotWaiter{key: key})
	return len(w.ws) - 1
}

// pop takes the first waiter out.
func (w *waitQueue) pop() slotWaiter {
	head := w.ws[0]
	w.ws = w.ws[1:]
	w.first++
	delete(w.arrival, head.key)
	return head
}

// remove takes key out wherever it is. Only the head leaves often (its
// slot came); another waiter leaves when it takes a slot nobody else
// could, which renumbers the queue.
func (w *waitQueue) remove(key types.NamespacedName) {
	i, ok := w.place(key)
	switch {
	case !ok:
	case i == 0:
		w.pop()
	default:
		w.keepOnly(func(sw slotWaiter) bool { return sw.key != key })
	}
}

// keepOnly keeps the waiters keep says yes to, in order.
func (w *waitQueue) keepOnly(keep func(slotWaiter) bool) {
	var kept []slotWaiter // allocated at the first waiter that goes
	for i, sw := range w.ws {
		switch {
		case keep(sw):
			if kept != nil {
				kept = append(kept, sw)
			}
		case kept == nil:
			kept = append(make([]slotWaiter, 0, len(w.ws)), w.ws[:i]...)
		}
	}
	if kept == nil {
		return
	}
	w.ws, w.first = kept, 0
	clear(w.arrival)
	for i, sw := range kept {
		w.arrival[sw.key] = i
	}
}

// String lists the waiters in order (test failures print the queues).
func (w *waitQueue) String() string {
	keys := make([]string, len(w.ws))
	for i, sw := range w.ws {
		keys[i] = sw.key.String()
	}
	return "[" + strings.Join(keys, " ") + "]"
}
