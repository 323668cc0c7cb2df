package stack

import (
	"context"
	"sync"
	"time"

	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrlreconcile "sigs.k8s.io/controller-runtime/pkg/reconcile"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
)

// retryLimiter is the Stack controller's rate limiter: after a transient
// failure (a returned error) a Stack is retried after its own
// spec.retryInterval, doubled per consecutive failure up to
// spec.maxRetryInterval, as the API promises, instead of
// controller-runtime's generic 5 ms..16 min.
type retryLimiter struct {
	stacks client.Reader

	mu       sync.Mutex
	failures map[ctrlreconcile.Request]int64
}

var _ workqueue.TypedRateLimiter[ctrlreconcile.Request] = (*retryLimiter)(nil)

func newRetryLimiter(stacks client.Reader) *retryLimiter {
	return &retryLimiter{stacks: stacks, failures: map[ctrlreconcile.Request]int64{}}
}

// When counts a failure of req and says how long to wait before the retry.
func (l *retryLimiter) When(req ctrlreconcile.Request) time.Duration {
	l.mu.Lock()
	l.failures[req]++
	n := l.failures[req]
	l.mu.Unlock()
	stack := &terracev1.Stack{}
	// The spec only: a Stack the cache does not have gets the defaults.
	_ = l.stacks.Get(context.Background(), req.NamespacedName, stack)
	return retryBackoff(stack, n)
}

// Forget ends the run of failures of req (it succeeded, or settled).
func (l *retryLimiter) Forget(req ctrlreconcile.Request) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.failures, req)
}

// NumRequeues is the number of consecutive failures of req.
func (l *retryLimiter) NumRequeues(req ctrlreconcile.Request) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return int(l.failures[req])
}
