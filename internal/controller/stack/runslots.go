package stack

import (
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/types"
)

// runSlots shares the controller's run slots among namespaces (issue 44,
// item 5). A run holds a slot from its start to its final status; at most
// total runs hold one at once, at most perNamespace of them of one
// namespace, so that one tenant can never hold every slot. A run that
// finds no slot for it waits in its namespace's queue (first come, first
// served within a namespace); a slot that frees goes to the namespaces
// with waiting runs in turn (round robin), not to whichever Stack asked
// first: a namespace with a hundred waiting Stacks gets one slot in turn
// like a namespace with one.
//
// A freed slot is reserved for the waiter it went to until that Stack's
// reconcile comes to take it (it is woken at once); a reservation not
// taken within reservationTTL (the Stack no longer needs a run, or was
// deleted) goes to the next waiter. A waiter that stops asking (its Stack
// requeues while it waits, less often the further back it is: recheckAt)
// leaves the queue after three of its rechecks (waiterTTL at the head).
//
// runSlots is not safe for concurrent use: runScheduler holds its lock.
type runSlots struct {
	total, perNamespace       int
	reservationTTL, waiterTTL time.Duration

	holders  map[types.NamespacedName]bool
	reserved map[types.NamespacedName]time.Time // → when the reservation lapses
	waiting  map[string]*waitQueue              // namespace → its waiters, in order
	// ring holds the namespaces with waiters, in the order they first
	// waited; next is the one whose turn is next.
	ring []string
	next int
	// staleAt is the earliest a waiter may have stopped asking (zero with
	// none waiting): the queues are looked through for such waiters only
	// from then on, not at every request.
	staleAt time.Time
}

// slotWaiter is a Stack waiting for a slot, and how long it may go
// without asking again before it leaves the queue.
type slotWaiter struct {
	key      types.NamespacedName
	lastSeen time.Time
	ttl      time.Duration
}

// expiry is when the waiter has stopped asking, unless it asks again
// before.
func (w slotWaiter) expiry() time.Time { return w.lastSeen.Add(w.ttl) }

// slotAnswer is what acquire said.
type slotAnswer struct {
	granted bool
	// For a waiter: the slots taken (held or reserved) in all and by its
	// namespace, the limits, and how many of its namespace's Stacks wait
	// before it (logged, not in the status).
	inUse, namespaceInUse int
	total, perNamespace   int
	ahead                 int
	// recheck is when the waiter is to ask again (recheckAt).
	recheck time.Duration
}

func newRunSlots(total, perNamespace int, reservationTTL, waiterTTL time.Duration) *runSlots {
	if total < 1 {
		total = 1
	}
	if perNamespace < 1 || perNamespace > total {
		perNamespace = total
	}
	return &runSlots{
		total: total, perNamespace: perNamespace, reservationTTL: reservationTTL, waiterTTL: waiterTTL,
		holders: map[types.NamespacedName]bool{}, reserved: map[types.NamespacedName]time.Time{},
		waiting: map[string]*waitQueue{},
	}
}

// defaultRunsPerNamespace is one namespace's share of total slots when the
// operator sets none: all but one, so that another namespace always finds
// a slot no namespace can take (with a single slot, that one).
func defaultRunsPerNamespace(total int) int {
	return max(1, total-1)
}

// acquire gives key a slot, or queues it. It returns the Stacks a slot
// was reserved for meanwhile (lapsed reservations and waiters passed on),
// to be woken.
func (q *runSlots) acquire(key types.NamespacedName, now time.Time) (slotAnswer, []types.NamespacedName) {
	wake := q.sweep(now)
	switch {
	case q.holders[key]:
	case !q.reserved[key].IsZero():
		delete(q.reserved, key)
		q.holders[key] = true
	case q.inUse() < q.total && q.namespaceInUse(key.Namespace) < q.perNamespace:
		// Every free slot a waiter could take was reserved for one by
		// sweep: what is free now is nobody's turn.
		q.holders[key] = true
	default:
		return q.wait(key, now), wake
	}
	q.dropWaiter(key)
	return slotAnswer{granted: true}, wake
}

// queueIfNoSlot is acquire without taking a slot: it queues key (or
// refreshes its place) when acquire would, and otherwise leaves all as
// it is.
func (q *runSlots) queueIfNoSlot(key types.NamespacedName, now time.Time) (slotAnswer, bool, []types.NamespacedName) {
	wake := q.sweep(now)
	if q.holders[key] || !q.reserved[key].IsZero() || (q.inUse() < q.total && q.namespaceInUse(key.Namespace) < q.perNamespace) {
		return slotAnswer{}, false, wake
	}
	return q.wait(key, now), true, wake
}

// recheckAt is how soon a waiter with ahead Stacks before it in its
// namespace's queue asks again: the base period (a third of waiterTTL) at
// the head, one more base period for each of the namespace's run slots'
// worth of Stacks before it, at most maxQueuedRecheck. However far back,
// it is woken at once when a slot is reserved for it.
func (q *runSlots) recheckAt(ahead int) time.Duration {
	base := q.waiterTTL / 3
	return min(base*time.Duration(1+ahead/q.perNamespace), max(base, maxQueuedRecheck))
}

// release frees key's slot (or its reservation) and passes what is free
// on to the waiters, whom it returns to be woken.
func (q *runSlots) release(key types.NamespacedName, now time.Time) []types.NamespacedName {
	delete(q.holders, key)
	delete(q.reserved, key)
	return q.sweep(now)
}

// wait queues key (or refreshes its place) and says where it stands.
func (q *runSlots) wait(key types.NamespacedName, now time.Time) slotAnswer {
	ns := key.Namespace
	queue := q.waiting[ns]
	if queue == nil {
		queue = newWaitQueue()
		q.waiting[ns] = queue
		q.ring = append(q.ring, ns)
	}
	ahead, queued := queue.place(key)
	if !queued {
		ahead = queue.push(key)
	}
	recheck := q.recheckAt(ahead)
	w := &queue.ws[ahead]
	w.lastSeen, w.ttl = now, 3*recheck
	q.noteExpiry(w.expiry())
	return slotAnswer{inUse: q.inUse(), namespaceInUse: q.namespaceInUse(ns), total: q.total, perNamespace: q.perNamespace, ahead: ahead, recheck: recheck}
}

// sweep drops lapsed reservations and waiters that stopped asking, then
// reserves every free slot a waiter may take, namespaces in turn. It
// returns the Stacks it reserved a slot for.
func (q *runSlots) sweep(now time.Time) []types.NamespacedName {
	for key, until := range q.reserved {
		if now.After(until) {
			delete(q.reserved, key)
		}
	}
	if !q.staleAt.IsZero() && now.After(q.staleAt) {
		q.dropStaleWaiters(now)
	}
	var woken []types.NamespacedName
	for q.inUse() < q.total {
		i, ok := q.nextTurn()
		if !ok {
			break
		}
		ns := q.ring[i]
		w := q.waiting[ns].pop()
		q.reserved[w.key] = now.Add(q.reservationTTL)
		woken = append(woken, w.key)
		q.next = i + 1
		q.forgetIfEmpty(ns)
	}
	return woken
}

// dropStaleWaiters drops every waiter that has not asked again within its
// ttl, and notes when the next of the others may stop asking.
func (q *runSlots) dropStaleWaiters(now time.Time) {
	q.staleAt = time.Time{}
	for ns, queue := range q.waiting {
		queue.keepOnly(func(w slotWaiter) bool {
			if now.After(w.expiry()) {
				return false
			}
			q.noteExpiry(w.expiry())
			return true
		})
		q.forgetIfEmpty(ns)
	}
}

// noteExpiry moves staleAt to t if t is earlier.
func (q *runSlots) noteExpiry(t time.Time) {
	if q.staleAt.IsZero() || t.Before(q.staleAt) {
		q.staleAt = t
	}
}

// nextTurn is the ring index of the next namespace, from q.next on, that
// has a waiter and room under its cap.
func (q *runSlots) nextTurn() (int, bool) {
	for n := range len(q.ring) {
		i := (q.next + n) % len(q.ring)
		if q.namespaceInUse(q.ring[i]) < q.perNamespace {
			return i, true
		}
	}
	return 0, false
}

// forgetIfEmpty takes ns out of the ring when none of its Stacks waits
// (the turn stays with the namespace after it).
func (q *runSlots) forgetIfEmpty(ns string) {
	if queue := q.waiting[ns]; queue != nil && queue.len() > 0 {
		return
	}
	delete(q.waiting, ns)
	for i, r := range q.ring {
		if r == ns {
			q.ring = append(q.ring[:i], q.ring[i+1:]...)
			if i < q.next {
				q.next--
			}
			break
		}
	}
	if q.next >= len(q.ring) {
		q.next = 0
	}
}

func (q *runSlots) dropWaiter(key types.NamespacedName) {
	if queue := q.waiting[key.Namespace]; queue != nil {
		queue.remove(key)
		q.forgetIfEmpty(key.Namespace)
	}
}

func (q *runSlots) inUse() int { return len(q.holders) + len(q.reserved) }

// queued counts the waiters of every namespace.
func (q *runSlots) queued() int {
	n := 0
	for _, w := range q.waiting {
		n += w.len()
	}
	return n
}

func (q *runSlots) namespaceInUse(ns string) int {
	n := 0
	for key := range q.holders {
		if key.Namespace == ns {
			n++
		}
	}
	for key := range q.reserved {
		if key.Namespace == ns {
			n++
		}
	}
	return n
}

// message says why a run waits, and what it waits for.
func (a slotAnswer) message(namespace string) string {
	var why string
	if a.namespaceInUse >= a.perNamespace {
		why = fmt.Sprintf("namespace %s already has %d runs going, the most one namespace may run at once (--max-runs-per-namespace=%d)", namespace, a.namespaceInUse, a.perNamespace)
	} else {
		why = fmt.Sprintf("all %d run slots are taken (--max-concurrent-runs=%d)", a.inUse, a.total)
	}
	// No place in the queue: it changes with every run that ends, and a
	// queued Stack's status would be rewritten at every recheck for it.
	return fmt.Sprintf("run queued: %s; it starts when a slot frees, namespaces with queued runs taking turns", why)
}
