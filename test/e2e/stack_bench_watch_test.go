package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/scheme"
)

// watchAllReady starts a watch of the namespace's Stacks now, before they
// are created, and returns a wait for n of them Ready that answers when
// the watch says so: the clock stops at the status write that made the
// last Stack Ready, not at the next poll (which added up to 100 ms to a
// 1-Stack measurement). It also returns when each Stack was first seen
// Ready. The API server ends a watch after its timeout (30 to 60 minutes):
// the wait then watches on from the last event it read; a watch that
// cannot resume (its resourceVersion compacted away) falls back to polling.
func (e *stackEnv) watchAllReady(b *testing.B, n int) func(timeout time.Duration) (time.Time, []time.Time) {
	b.Helper()
	wc, err := client.NewWithWatch(e.dev.Cluster.Config, client.Options{Scheme: scheme.New()})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	w, err := wc.Watch(ctx, &terracev1.StackList{}, client.InNamespace(e.ns))
	if err != nil {
		cancel()
		b.Fatal(err)
	}
	// Read from the start: events read only once every Stack was created
	// would be timed at the end of the creating.
	type result struct {
		end    time.Time
		firsts []time.Time
		closed bool
	}
	out := make(chan result, 1)
	go func() {
		ready, seen := map[string]bool{}, map[string]bool{}
		var firsts []time.Time
		lastVersion, expired := "", false
		events := w.ResultChan()
		for {
			ev, open := <-events
			if !open {
				if expired || ctx.Err() != nil {
					break
				}
				resumed, err := wc.Watch(ctx, &terracev1.StackList{}, client.InNamespace(e.ns),
					&client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: lastVersion}})
				if err != nil {
					break
				}
				events = resumed.ResultChan()
				continue
			}
			st, isStack := ev.Object.(*terracev1.Stack)
			if ev.Type == watch.Error {
				expired = true // a 410 Gone: the watch ends next
			}
			if !isStack || ev.Type == watch.Error {
				continue
			}
			lastVersion = st.ResourceVersion
			if ev.Type != watch.Deleted && readyAt(st) == nil {
				ready[st.Name] = true
				if !seen[st.Name] {
					seen[st.Name] = true
					firsts = append(firsts, time.Now())
				}
			} else {
				delete(ready, st.Name)
			}
			if len(ready) == n {
				out <- result{end: time.Now(), firsts: firsts}
				return
			}
		}
		out <- result{firsts: firsts, closed: true}
	}()
	return func(timeout time.Duration) (time.Time, []time.Time) {
		defer cancel() // ends the watch, resumed or not
		select {
		case r := <-out:
			if r.closed {
				e.pollAllReady(b, n, timeout)
				return time.Now(), r.firsts
			}
			return r.end, r.firsts
		case <-time.After(timeout):
			b.Fatalf("timed out after %s waiting for %d Stacks Ready", timeout, n)
			return time.Time{}, nil
		}
	}
}

// pollAllReady waits, polling, until n Stacks of the namespace are Ready.
func (e *stackEnv) pollAllReady(b *testing.B, n int, timeout time.Duration) {
	b.Helper()
	eventually(b, timeout, "every Stack Ready", func() error {
		var list terracev1.StackList
		if err := e.c.List(context.Background(), &list, client.InNamespace(e.ns)); err != nil {
			return err
		}
		ready := 0
		for i := range list.Items {
			if readyAt(&list.Items[i]) == nil {
				ready++
			}
		}
		if ready != n {
			return fmt.Errorf("%d of %d Ready", ready, n)
		}
		return nil
	})
}
