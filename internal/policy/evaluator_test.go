package policy

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"runtime/metrics"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// TestPolicyUsingMemoryWithinTheBoundDecides: a policy that builds a
// sizeable value (a million numbers, about 40 MiB in OPA) still decides,
// and evaluations side by side each get their answer.
func TestPolicyUsingMemoryWithinTheBoundDecides(t *testing.T) {
	set, err := Compile(context.Background(), []Module{{Name: "a.rego", Source: `package terrace

warn contains sprintf("%d numbers", [count(numbers.range(1, 1000000))]) if { true }

deny contains "terraform_data" if {
	some rc in input.resource_changes
	rc.type == "terraform_data"
}
`}})
	if err != nil {
		t.Fatal(err)
	}
	errs := make(chan error, 3)
	for range 3 {
		go func() {
			d, err := set.Evaluate(context.Background(), []byte(planJSON))
			if err == nil && (strings.Join(d.Warnings, ",") != "1000000 numbers" || strings.Join(d.Violations, ",") != "terraform_data") {
				err = errors.New("decision " + strings.Join(d.Violations, ",") + " / " + strings.Join(d.Warnings, ","))
			}
			errs <- err
		}()
	}
	for range 3 {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
}

// TestLargePlanGetsMemoryForItself: the bound grows with the plan, so a
// plan of several MiB, which OPA holds at about thirty times its size,
// still decides; the bound stops at MaxEvalMemory.
func TestLargePlanGetsMemoryForItself(t *testing.T) {
	set, err := Compile(context.Background(), []Module{{Name: "a.rego", Source: `package terrace

warn contains sprintf("%d changes", [count(input.resource_changes)]) if { true }
`}})
	if err != nil {
		t.Fatal(err)
	}
	var plan strings.Builder
	plan.WriteString(`{"resource_changes":[`)
	n := 0
	for ; plan.Len() < 8<<20; n++ {
		if n > 0 {
			plan.WriteString(",")
		}
		fmt.Fprintf(&plan, `{"address":"terraform_data.r%d","type":"terraform_data","change":{"actions":["create"],"after":{"input":{"name":"r%d","tags":{"a":"b"},"list":[1,2,3]}}}}`, n, n)
	}
	plan.WriteString("]}")
	d, err := set.Evaluate(context.Background(), []byte(plan.String()))
	if err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf("%d changes", n); strings.Join(d.Warnings, ",") != want {
		t.Fatalf("warnings %v, want %s", d.Warnings, want)
	}
	if evalMemory(1<<20) != MinEvalMemory+evalMemoryPerPlanByte<<20 || evalMemory(32<<20) != MaxEvalMemory {
		t.Errorf("bounds: %d MiB for 1 MiB, %d MiB for 32 MiB", evalMemory(1<<20)>>20, evalMemory(32<<20)>>20)
	}
}

// TestMemoryBudgetWaitsForMemory: evaluations share MaxEvalMemory; one
// that does not fit waits until another gives its memory back, or until
// its context ends.
func TestMemoryBudgetWaitsForMemory(t *testing.T) {
	b := newMemoryBudget(100)
	ctx := context.Background()
	if err := b.acquire(ctx, 70); err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	if err := b.acquire(short, 40); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("acquired 40 of the 30 left: %v", err)
	}
	got := make(chan error, 1)
	go func() { got <- b.acquire(ctx, 40) }()
	b.release(70)
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the waiting acquire did not get the released memory")
	}
}

// TestEvaluateSaysWhyAPolicyFailed: a run-time error of the policy comes
// back from the evaluator as the policy's own error.
func TestEvaluateSaysWhyAPolicyFailed(t *testing.T) {
	set, err := Compile(context.Background(), []Module{{Name: "a.rego", Source: `package terrace

deny contains x if { x := to_number(input.format_version) }
`}})
	if err != nil {
		t.Fatal(err)
	}
	_, err = set.Evaluate(context.Background(), []byte(`{"format_version":"not a number"}`))
	if err == nil || !strings.Contains(err.Error(), "to_number") {
		t.Fatalf("error %v, want the builtin's", err)
	}
}

// heapWatch samples this process's live heap until stopped.
type heapWatch struct {
	base, peak atomic.Uint64
	done       chan struct{}
	finished   chan struct{}
}

func watchHeap(t *testing.T) *heapWatch {
	t.Helper()
	runtime.GC()
	w := &heapWatch{done: make(chan struct{}), finished: make(chan struct{})}
	w.base.Store(heapObjects())
	go func() {
		defer close(w.finished)
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for {
			if h := heapObjects(); h > w.peak.Load() {
				w.peak.Store(h)
			}
			select {
			case <-w.done:
				return
			case <-tick.C:
			}
		}
	}()
	return w
}

// stop returns how far the heap rose above where it started.
func (w *heapWatch) stop() uint64 {
	close(w.done)
	<-w.finished
	if w.peak.Load() < w.base.Load() {
		return 0
	}
	return w.peak.Load() - w.base.Load()
}

func heapObjects() uint64 {
	s := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}
