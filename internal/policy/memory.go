package policy

import (
	"context"
	"sync"
)

// An evaluation's memory bound grows with its plan: OPA holds the plan as
// decoded Go values and then as its own terms, about thirty times the
// JSON's size, before a policy allocates anything of its own.
const (
	// MinEvalMemory is what every evaluation may use, whatever the plan.
	MinEvalMemory = 256 << 20
	// MaxEvalMemory bounds one evaluation, and all running at once
	// together: the most the policies take of the controller container's
	// memory (plus each evaluator's binary, about 90 MiB resident).
	MaxEvalMemory = 1 << 30
	// evalMemoryPerPlanByte is added per byte of plan JSON.
	evalMemoryPerPlanByte = 48
)

// evalMemory is the bound of one evaluation of a plan JSON of planBytes.
func evalMemory(planBytes int64) int64 {
	return min(MaxEvalMemory, MinEvalMemory+evalMemoryPerPlanByte*planBytes)
}

// memoryBudget hands out bytes of a fixed total; acquire waits until the
// bytes asked for are free.
type memoryBudget struct {
	mu   sync.Mutex
	free int64
	// freed is closed, and replaced, whenever bytes come back.
	freed chan struct{}
}

func newMemoryBudget(total int64) *memoryBudget {
	return &memoryBudget{free: total, freed: make(chan struct{})}
}

func (b *memoryBudget) acquire(ctx context.Context, n int64) error {
	for {
		b.mu.Lock()
		if b.free >= n {
			b.free -= n
			b.mu.Unlock()
			return nil
		}
		freed := b.freed
		b.mu.Unlock()
		select {
		case <-freed:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func (b *memoryBudget) release(n int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.free += n
	close(b.freed)
	b.freed = make(chan struct{})
}
