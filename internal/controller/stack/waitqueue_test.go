package stack

import (
	"fmt"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
)

func TestWaitQueueKnowsEveryPlace(t *testing.T) {
	q := newWaitQueue()
	for _, k := range []string{"a/1", "a/2", "a/3", "a/4", "a/5"} {
		q.push(slotKey(k))
	}
	wantPlaces := func(step string, want ...string) {
		t.Helper()
		if got := q.String(); got != fmt.Sprint(want) {
			t.Fatalf("%s: queue %s, want %v", step, got, want)
		}
		for i, k := range want {
			if place, ok := q.place(slotKey(k)); !ok || place != i {
				t.Fatalf("%s: %s at place %d (queued %v), want %d", step, k, place, ok, i)
			}
		}
	}
	if got := q.pop().key; got != slotKey("a/1") {
		t.Fatalf("popped %s, want a/1", got)
	}
	wantPlaces("after the head left", "a/2", "a/3", "a/4", "a/5")
	q.remove(slotKey("a/4"))
	wantPlaces("after one in the middle left", "a/2", "a/3", "a/5")
	q.remove(slotKey("a/2"))
	q.remove(slotKey("never/1"))
	wantPlaces("after the head was removed", "a/3", "a/5")
	if place := q.push(slotKey("a/6")); place != 2 {
		t.Fatalf("a newcomer at place %d, want 2", place)
	}
	q.keepOnly(func(w slotWaiter) bool { return w.key != slotKey("a/5") })
	wantPlaces("after keepOnly", "a/3", "a/6")
	for _, k := range []string{"a/1", "a/2", "a/4", "a/5"} {
		if _, ok := q.place(slotKey(k)); ok {
			t.Errorf("%s left but still has a place", k)
		}
	}
}

// A waiter in the middle that stops asking leaves; those behind it move up.
func TestAWaiterThatStopsAskingLeavesFromTheMiddle(t *testing.T) {
	q := newRunSlots(1, 1, slotReservationTTL, queuedWaiterTTL)
	now := time.Unix(1_700_000_000, 0)
	q.acquire(slotKey("a/run"), now)
	for _, k := range []string{"a/1", "a/2", "a/3"} {
		q.acquire(slotKey(k), now)
	}
	// a/1 and a/3 keep asking every 10 s; a/2, with one Stack before it
	// and one slot a namespace, was to ask every 20 s and leaves after
	// three of those without asking.
	var ans slotAnswer
	for range 7 {
		now = now.Add(10 * time.Second)
		q.acquire(slotKey("a/1"), now)
		ans, _ = q.acquire(slotKey("a/3"), now)
	}
	if ans.ahead != 1 || q.waiting["a"].String() != "[a/1 a/3]" {
		t.Fatalf("queue %s, a/3 with %d ahead; want [a/1 a/3] and 1", q.waiting["a"], ans.ahead)
	}
	if woken := q.release(slotKey("a/run"), now); len(woken) != 1 || woken[0] != slotKey("a/1") {
		t.Fatalf("woken %v, want a/1", woken)
	}
}

// BenchmarkQueuedRecheck is what one queued Stack's recheck costs the run
// queue with 10,000 Stacks queued behind four slots, against 100 queued
// in the same run: a recheck ought to cost the same however long the
// queue.
//
//	go test ./internal/controller/stack/ -run '^$' -bench QueuedRecheck
func BenchmarkQueuedRecheck(b *testing.B) {
	perRecheck := func(waiters int) time.Duration {
		q := newRunSlots(4, 4, slotReservationTTL, queuedWaiterTTL)
		now := time.Unix(1_700_000_000, 0)
		for i := range 4 {
			q.acquire(slotKey(fmt.Sprintf("fleet/run%d", i)), now)
		}
		keys := make([]types.NamespacedName, waiters)
		for i := range keys {
			keys[i] = slotKey(fmt.Sprintf("fleet/s%d", i))
			q.queueIfNoSlot(keys[i], now)
		}
		// Every waiter asks again in turn, the clock moving on 1 ms a
		// recheck: none stops asking, so none leaves.
		const rechecks = 20_000
		start := time.Now()
		for i := range rechecks {
			now = now.Add(time.Millisecond)
			if _, queued, _ := q.queueIfNoSlot(keys[i%waiters], now); !queued {
				b.Fatalf("%s left the queue", keys[i%waiters])
			}
		}
		return time.Since(start) / rechecks
	}
	var short, long time.Duration
	runs := 0
	for b.Loop() {
		short += perRecheck(100)
		long += perRecheck(10_000)
		runs++
	}
	b.ReportMetric(float64(short.Nanoseconds())/float64(runs), "ns/recheck-100-queued")
	b.ReportMetric(float64(long.Nanoseconds())/float64(runs), "ns/recheck-10000-queued")
	b.ReportMetric(float64(long)/float64(short), "ratio-10000/100")
}
