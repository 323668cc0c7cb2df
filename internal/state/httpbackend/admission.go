package httpbackend

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/semaphore"
)

// Bodies up to smallBodyBytes (lock infos, the states of most Stacks) are
// admitted from a budget of their own, as their bytes arrive: a flood of
// large uploads must not stall another namespace's ordinary requests, and
// a flood of small ones must not add up to more than that budget.
const smallBodyBytes = 1 << 20

// errBusy says a transfer was not admitted: too many bytes in flight.
var errBusy = errors.New("the state server is busy with other states")

// admission bounds the bytes the server holds at once for one kind of
// transfer (large states, or small bodies), in total (a weighted
// semaphore) and per namespace (so one tenant cannot take the whole
// budget). Every state the server reads or writes is held in memory
// whole, a few times over while the store encodes it.
type admission struct {
	// kind names the budget in messages; gauge shows its use.
	kind         string
	gauge        prometheus.Gauge
	total        *semaphore.Weighted
	budget       int64
	perNamespace int64
	wait         time.Duration

	mu   sync.Mutex
	held map[string]int64
}

func newAdmission(kind string, gauge prometheus.Gauge, budget, perNamespace int64, wait time.Duration) *admission {
	if perNamespace <= 0 || perNamespace > budget {
		perNamespace = budget
	}
	return &admission{kind: kind, gauge: gauge, total: semaphore.NewWeighted(budget), budget: budget, perNamespace: perNamespace, wait: wait, held: map[string]int64{}}
}

// acquire admits n bytes for namespace, waiting up to the admission wait
// for others to finish. It returns errBusy when they do not; release
// gives the bytes back.
func (a *admission) acquire(ctx context.Context, namespace string, n int64) (release func(), err error) {
	if n <= 0 {
		return func() {}, nil
	}
	// A transfer larger than the whole budget (only when the budget is set
	// below the largest state) may still run, alone.
	n = min(n, a.budget)
	a.mu.Lock()
	if a.held[namespace]+n > a.perNamespace {
		a.mu.Unlock()
		return nil, fmt.Errorf("%w: namespace %s already has %d bytes of %s in flight (limit %d)", errBusy, namespace, a.held[namespace], a.kind, a.perNamespace)
	}
	a.held[namespace] += n
	a.mu.Unlock()
	undo := func() {
		a.mu.Lock()
		defer a.mu.Unlock()
		if a.held[namespace] -= n; a.held[namespace] <= 0 {
			delete(a.held, namespace)
		}
	}
	waitCtx, cancel := context.WithTimeout(ctx, a.wait)
	defer cancel()
	if err := a.total.Acquire(waitCtx, n); err != nil {
		undo()
		return nil, fmt.Errorf("%w: its limit of %d bytes of %s in flight is reached", errBusy, a.budget, a.kind)
	}
	a.gauge.Add(float64(n))
	var once sync.Once
	return func() {
		once.Do(func() {
			a.total.Release(n)
			a.gauge.Sub(float64(n))
			undo()
		})
	}, nil
}
